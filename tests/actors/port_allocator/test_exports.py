from __future__ import annotations

import corral.actors.port_allocator as package


def isort_order(name: str) -> tuple[int, str]:
    """ruff's __all__ order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_exported() -> None:
    assert package.__all__ == sorted(package.__all__, key=isort_order)
    for name in package.__all__:
        assert hasattr(package, name)
