"""The registry contract harness: one ``backend`` fixture, parametrized over every backend.

Lease time is driven by a ManualClock on memory and SQLite (no waiting), and by
etcd's own clock on etcd (short real TTLs, bounded waits). ``etcd`` is the etcd
named by ``CORRAL_TEST_ETCD``; ``etcd-tls`` is a private etcd this session
starts with TLS, client certificates and auth (see ``run_secure_etcd``), whose
auth tokens expire after a second or two, so the suite also covers logging in
again.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from corral.registry import MemoryRegistry, Registry, SQLiteRegistry
from corral.testing import (
    ManualClock,
    RegistryHarness,
    SecureEtcd,
    etcd_endpoint_from_env,
    open_test_etcd_registry,
    run_secure_etcd,
)

BACKENDS = [
    "memory",
    "sqlite",
    "sqlite-full",
    # alone: the contract counts revisions, which every namespace's writes move
    pytest.param("etcd", marks=[pytest.mark.etcd, pytest.mark.etcd_alone]),
    pytest.param("etcd-tls", marks=pytest.mark.etcd),
]


@pytest.fixture(scope="session")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    """One TLS + auth etcd for the session, stopped by pid at its end; skips (or,
    in CI, fails) without an etcd binary."""
    with run_secure_etcd(tmp_path_factory.mktemp("secure-etcd")) as etcd:
        yield etcd


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """The backend's name; skips (or, in CI, fails) etcd when there is none.

    A plain fixture, so pytest reports the skip reason."""
    name: str = request.param
    if name == "etcd":
        etcd_endpoint_from_env()
    elif name == "etcd-tls":
        request.getfixturevalue("secure_etcd")
    return name


@pytest.fixture
def etcd_endpoint() -> str:
    """``host:port`` of the test etcd; skips (or, in CI, fails) without one."""
    return etcd_endpoint_from_env()


@asynccontextmanager
async def open_backend(
    name: str, db_path: Path, secure: SecureEtcd | None = None
) -> AsyncIterator[RegistryHarness]:
    """A fresh registry of backend ``name`` (SQLite: in a new file at ``db_path``;
    ``etcd-tls``: on ``secure``)."""
    if name in ("etcd", "etcd-tls"):
        async with open_test_etcd_registry(secure=secure if name == "etcd-tls" else None) as etcd:
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


def _secure_for(backend_name: str, request: pytest.FixtureRequest) -> SecureEtcd | None:
    if backend_name != "etcd-tls":
        return None
    secure: SecureEtcd = request.getfixturevalue("secure_etcd")
    return secure


@pytest.fixture
def make_backend(
    backend_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[], AbstractAsyncContextManager[RegistryHarness]]:
    """A factory of fresh registries of the backend under test (for ``check_registry``)."""
    numbers = itertools.count(1)
    secure = _secure_for(backend_name, request)
    return lambda: open_backend(
        backend_name, tmp_path / f"registry-{next(numbers)}.db", secure
    )


@pytest.fixture
async def backend(
    backend_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[RegistryHarness]:
    secure = _secure_for(backend_name, request)
    async with open_backend(backend_name, tmp_path / "registry.db", secure) as harness:
        yield harness
