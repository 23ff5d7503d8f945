"""No module imports from a layer above it.

Read with ast (every import statement, those inside functions too, since a
command's lazy import is still a dependency): the inspector never imports the
node service, and inside ``corral.node`` the command line stands on the server,
the server on the artifacts, and all three on the node's shared ground
(``corral/node/_*.py``: errors, requests, config, identity, logging).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: package (as a path under the root) -> packages its modules must never import
NEVER = {
    "corral/inspector": ("corral.node",),
    "corral/node/artifacts": ("corral.node.server", "corral.node.cli"),
    "corral/node/server": ("corral.node.cli",),
}
GROUND = ("corral.node.artifacts", "corral.node.server", "corral.node.cli")


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _offences(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in _imported(path)
        if any(name == each or name.startswith(f"{each}.") for each in forbidden)
    )


@pytest.mark.parametrize("package", sorted(NEVER))
def test_a_package_imports_nothing_from_a_layer_above(package: str) -> None:
    paths = sorted((ROOT / package).rglob("*.py"))
    assert paths, f"{package} has no modules; was it moved? update NEVER"
    offences = _offences(paths, NEVER[package])
    assert not offences, f"{len(offences)} import(s) up a layer: {offences}"


def test_the_node_ground_imports_none_of_its_sub_packages() -> None:
    paths = sorted(p for p in (ROOT / "corral/node").glob("_*.py") if p.name != "__init__.py")
    assert {p.name for p in paths} >= {"_errors.py", "_requests.py", "_config.py"}
    offences = _offences(paths, GROUND)
    assert not offences, f"{len(offences)} import(s) up a layer: {offences}"


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from corral.node.cli._format import printable\n")
    assert "corral.node.cli._format" in _imported(module)
