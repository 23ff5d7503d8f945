"""The registry contract harness: one ``backend`` fixture, parametrized over every backend.

Lease time is driven by a ManualClock on memory and SQLite (no waiting), and by
etcd's own clock on etcd (short real TTLs, bounded waits).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from corral.registry import MemoryRegistry, Registry
from corral.registry._sqlite import SQLiteRegistry
from corral.testing import (
    ManualClock,
    RegistryHarness,
    etcd_endpoint_from_env,
    open_test_etcd_registry,
)

BACKENDS = [
    "memory",
    "sqlite",
    "sqlite-full",
    pytest.param("etcd", marks=pytest.mark.etcd),
]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """The backend's name; skips (or, in CI, fails) etcd when there is none.

    A plain fixture, so pytest reports the skip reason."""
    name: str = request.param
    if name == "etcd":
        etcd_endpoint_from_env()
    return name


@pytest.fixture
def etcd_endpoint() -> str:
    """``host:port`` of the test etcd; skips (or, in CI, fails) without one."""
    return etcd_endpoint_from_env()


@asynccontextmanager
async def open_backend(name: str, db_path: Path) -> AsyncIterator[RegistryHarness]:
    """A fresh registry of backend ``name`` (SQLite: in a new file at ``db_path``)."""
    if name == "etcd":
        async with open_test_etcd_registry() as etcd:
            yield RegistryHarness(name, etcd, None)
        return
    clock = ManualClock()
    registry: Registry
    if name == "memory":
        registry = MemoryRegistry(clock)
    else:
        registry = await SQLiteRegistry.open(
            db_path,
            clock=clock,
            poll_interval=0.01,
            synchronous="FULL" if name == "sqlite-full" else "NORMAL",
        )
    try:
        yield RegistryHarness(name, registry, clock)
    finally:
        await registry.aclose()


@pytest.fixture
def make_backend(
    backend_name: str, tmp_path: Path
) -> Callable[[], AbstractAsyncContextManager[RegistryHarness]]:
    """A factory of fresh registries of the backend under test (for ``check_registry``)."""
    numbers = itertools.count(1)
    return lambda: open_backend(backend_name, tmp_path / f"registry-{next(numbers)}.db")


@pytest.fixture
async def backend(backend_name: str, tmp_path: Path) -> AsyncIterator[RegistryHarness]:
    async with open_backend(backend_name, tmp_path / "registry.db") as harness:
        yield harness
