"""The registry contract harness: one ``backend`` fixture, parametrized over every backend.

Lease time is driven by a ManualClock on memory and SQLite (no waiting), and by
etcd's own clock on etcd (short real TTLs, bounded waits).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.registry import MemoryRegistry, Registry
from corral.registry._sqlite import SQLiteRegistry
from corral.registry._testing import (
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


@pytest.fixture
async def backend(backend_name: str, tmp_path: Path) -> AsyncIterator[RegistryHarness]:
    name = backend_name
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
            tmp_path / "registry.db",
            clock=clock,
            poll_interval=0.01,
            synchronous="FULL" if name == "sqlite-full" else "NORMAL",
        )
    try:
        yield RegistryHarness(name, registry, clock)
    finally:
        await registry.aclose()
