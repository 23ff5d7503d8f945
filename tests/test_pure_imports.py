"""The pure decision modules import no trio, clock, randomness or sockets.

"Pure decisions, thin I/O shells": these modules are given the time, the random
choices and the I/O results by their callers. This reads their import statements
(with ast, not by importing them) and follows every import of a corral module, so
a pure module that imports a helper that imports trio fails too. Imports under
``if TYPE_CHECKING:`` never run and are not followed; ``random`` is allowed only
to name ``random.Random``, the type of an injected generator.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = frozenset({"trio", "time", "random", "socket"})

PURE_MODULES = (
    # the planner
    "corral.actors.planner._planner",
    "corral.actors.planner._rank",
    "corral.actors.planner._types",
    "corral.actors.planner._document",
    # the reconciler's plan and its backoff
    "corral.actors.reconciler._plan",
    "corral.actors.reconciler._backoff",
    # port choice
    "corral.actors.port_allocator._book",
    # routing render
    "corral.actors.routing._render",
    "corral.actors.routing._hold",
    # the SWIM machine and its messages
    "corral.actors.membership._swim",
    "corral.actors.membership._messages",
    # the coordinator's inputs and membership view
    "corral.actors.coordinator._inputs",
    "corral.actors.coordinator._membership",
    "corral.actors.coordinator._rollout",
    "corral.actors.coordinator._writes",
    "corral.actors.coordinator._reports",
    "corral.actors.coordinator._state",
    # artifacts: manifest, digest and unpacking rules
    "corral.node.artifacts._artifacts",
    # the node's configuration (flags, environment, file) and the registry URL it names
    "corral.node._config",
    "corral.registry._url",
    # smaller decision modules that say they are pure
    "corral.actors.process_supervisor._policy",
    "corral.registry._logic",
    "corral.registry._records",
    "corral.supervision._policy",
    "corral.supervision._route",
    "corral.transport._codec",
    "corral.transport._schema",
    "corral.transport._ws_rules",
)


def _source(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    raise LookupError(f"{module} is not a module of this tree (looked for {base}.py)")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_package(module: str) -> bool:
    return _source(module).name == "__init__.py"


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_source(module).read_text(encoding="utf-8"))


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _defining_module(package: str, name: str) -> str:
    """The corral module a package's ``__init__`` takes ``name`` from (the package
    itself when ``__init__`` defines it, or it is a submodule's name)."""
    try:
        _source(f"{package}.{name}")
    except LookupError:
        pass
    else:
        return f"{package}.{name}"
    for node in _tree(package).body:
        if isinstance(node, ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            origin = _absolute(package, node)
            if origin.startswith("corral") and _is_package(origin) and origin != package:
                return _defining_module(origin, name)
            return origin
    return package


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        found.append(node)
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(tree)
    return found


def _only_takes_a_generator(module: str) -> bool:
    """``random`` is only named as ``random.Random``: the module is handed a seeded
    generator (the injected randomness) and draws nothing itself."""
    uses = [
        node.attr
        for node in _runtime_nodes(_tree(module))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "random"
    ]
    return all(attr == "Random" for attr in uses)


def _imports(module: str) -> list[str]:
    """The modules ``module`` imports at run time. A name taken from a corral
    package counts as imported from the module that defines it (what the package
    ``__init__`` re-exports besides is the shell's business, not this module's)."""
    found: list[str] = []
    for node in _runtime_nodes(_tree(module)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _absolute(module, node)
            if name.startswith("corral") and _is_package(name):
                found.extend(_defining_module(name, alias.name) for alias in node.names)
            else:
                found.append(name)
    return found


@cache
def _reaches(module: str) -> dict[str, tuple[str, ...]]:
    """Each forbidden top-level module reached from ``module``, with the chain of
    corral modules that leads to it."""
    reached: dict[str, tuple[str, ...]] = {}
    seen = {module}
    frontier: list[tuple[str, tuple[str, ...]]] = [(module, (module,))]
    while frontier:
        current, chain = frontier.pop()
        for name in _imports(current):
            top = name.partition(".")[0]
            if top == "random" and name == "random" and _only_takes_a_generator(current):
                continue
            if top in FORBIDDEN:
                reached.setdefault(top, chain)
            elif top == "corral" and name not in seen:
                seen.add(name)
                frontier.append((name, (*chain, name)))
    return reached


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_imports_no_trio_clock_randomness_or_socket(module: str) -> None:
    reached = _reaches(module)
    assert not reached, "; ".join(
        f"{module} imports {top} via {' -> '.join(chain)}" for top, chain in sorted(reached.items())
    )


def test_the_check_sees_a_forbidden_import_through_a_corral_module() -> None:
    # The SQLite backend is an I/O shell: it imports trio and time, directly.
    assert {"trio", "time"} <= set(_reaches("corral.registry._sqlite"))
    # A module reaching trio only through another corral module is caught too.
    chain = _reaches("corral.actors.reconciler._agent")["trio"]
    assert chain == ("corral.actors.reconciler._agent", "corral.actors.reconciler._actor")
    # A name taken from a package is followed to the module that defines it.
    assert _defining_module("corral.registry", "SQLiteRegistry") == "corral.registry._sqlite"
