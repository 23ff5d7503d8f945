"""Every package of corral says exactly what it exports.

For each package under ``corral/``: ``__all__`` is sorted the way ruff (RUF022)
sorts it, every name in it resolves, and every public name the package's
``__init__`` binds itself (imports, definitions, assignments; read with ast) is
in it, and nothing else. Subpackages reached as attributes are not names the
``__init__`` binds, so they are not required. The per-package export tests add
what matters about particular names.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from types import ModuleType

import pytest

import corral


def _packages() -> list[str]:
    names = [corral.__name__]
    for info in pkgutil.walk_packages(corral.__path__, prefix="corral."):
        if info.ispkg:
            names.append(info.name)
    return sorted(names)


def _bound_names(package: ModuleType) -> set[str]:
    """The names the package's ``__init__`` binds at module level."""
    assert package.__file__ is not None
    with open(package.__file__, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            # ``import a.b`` binds ``a``; a module imported for the package's own use
            # is not an export.
            continue
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _ruff_order(name: str) -> tuple[bool, str]:
    # RUF022: SCREAMING_CASE constants first, then the rest in ASCII order.
    return (not name.isupper(), name)


PACKAGES = _packages()


def test_every_package_is_checked() -> None:
    assert {"corral.registry", "corral.actors.planner", "corral.transport"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_lists_exactly_the_public_names(name: str) -> None:
    package = importlib.import_module(name)
    exported = getattr(package, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__ list; add one (sorted)"
    assert exported == sorted(exported, key=_ruff_order), (
        f"{name}.__all__ is not sorted; sort it as ruff's RUF022 does (ruff check --fix)"
    )
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"
    missing = [each for each in exported if not hasattr(package, each)]
    assert not missing, f"{name}.__all__ lists {len(missing)} name(s) it lacks: {missing}"
    bound = _bound_names(package)
    unlisted = sorted(each for each in bound - set(exported) if not each.startswith("_"))
    assert not unlisted, (
        f"{name} binds {len(unlisted)} public name(s) not in __all__: {unlisted}; "
        "export them or make them private (_name)"
    )
    extra = sorted(set(exported) - bound)
    assert not extra, (
        f"{name}.__all__ lists {len(extra)} name(s) its __init__ does not bind: {extra}"
    )
