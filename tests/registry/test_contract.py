"""The registry contract: every backend (memory, SQLite, SQLite with synced commits,
etcd) passes the public conformance suite, ``corral.testing.check_registry``."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from corral.testing import RegistryHarness, check_registry


async def test_the_backend_passes_the_registry_contract(
    make_backend: Callable[[], AbstractAsyncContextManager[RegistryHarness]],
) -> None:
    await check_registry(make_backend)
