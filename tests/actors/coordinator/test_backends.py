"""The single-coordinator and fencing guarantees against every registry backend.

Memory and SQLite run in virtual time (SQLite's lease clock is trio's clock);
etcd keeps its own clock, so its variants run in real time with a short TTL
(etcd grants whole seconds) and are skipped without an etcd — failed instead
when ``CORRAL_REQUIRE_ETCD=1``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from corral.actors.coordinator import KickCoordinator
from corral.registry import (
    AppRecord,
    MemoryRegistry,
    PlacementRecord,
    Registry,
    SQLiteRegistry,
    app_key,
    decode_record,
    placement_key,
)
from corral.testing import open_cluster


@asynccontextmanager
async def sqlite_registry(path: Path) -> AsyncIterator[Registry]:
    registry = await SQLiteRegistry.open(path / "registry.db", clock=trio.current_time)
    try:
        yield registry
    finally:
        await registry.aclose()


@asynccontextmanager
async def etcd_registry() -> AsyncIterator[Registry]:
    from corral.testing import open_test_etcd_registry

    async with open_test_etcd_registry() as registry:
        yield registry


async def check_contention(registry: Registry, *, ttl: float, slack: float) -> None:
    """Three nodes: one coordinator at any instant, across a clean stop and a crash."""
    tick = ttl / 3
    async with open_cluster(3, registry=registry, lease_ttl=ttl) as cluster:
        samples: list[list[str]] = []

        async def monitor() -> None:
            while True:
                samples.append(await cluster.coordinators())
                await trio.sleep(tick / 10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor)
            first = await cluster.wait_for_coordinator()
            await trio.sleep(tick)

            t0 = trio.current_time()
            await cluster.stop(first)
            second = await cluster.wait_for_coordinator(exclude={first}, poll=0.01)
            assert trio.current_time() - t0 < slack  # within one round, not a TTL

            await trio.sleep(tick / 2)
            t1 = trio.current_time()
            await cluster.kill(second)
            third = await cluster.wait_for_coordinator(exclude={first, second}, poll=0.01)
            took = trio.current_time() - t1
            assert ttl - tick - slack <= took <= ttl + tick + slack
            await trio.sleep(tick)
            nursery.cancel_scope.cancel()

        assert max(len(s) for s in samples) == 1
        assert await cluster.coordinators() == [third]
        intervals = cluster.assert_single_coordinator()
        assert [i.node for i in intervals] == [first, second, third]


async def check_fencing(registry: Registry, *, ttl: float, slack: float) -> None:
    """A holder whose write hangs past its lease writes nothing when it lands."""
    async with open_cluster(3, registry=registry, lease_ttl=ttl) as cluster:
        old = await cluster.wait_for_coordinator()
        cluster.cut_registry(old, hang=True, ops={"txn"})
        await cluster.registry.put(app_key("alpha"), AppRecord("alpha").encode())
        await cluster.node(old).coordinator.tell(KickCoordinator("test"))
        await trio.sleep(slack)
        await cluster.registry.delete(app_key("alpha"))
        new = await cluster.wait_for_coordinator(exclude={old}, within=2 * ttl, poll=0.01)
        await cluster.registry.put(app_key("beta"), AppRecord("beta").encode())
        await cluster.node(new).coordinator.tell(KickCoordinator("test"))
        await trio.sleep(slack)
        failed = cluster.registry.failed_txns

        cluster.restore_registry(old)
        await trio.sleep(slack)
        assert cluster.registry.failed_txns == failed + 1
        assert await cluster.registry.get(placement_key("alpha")) is None
        kv = await cluster.registry.get(placement_key("beta"))
        assert kv is not None
        beta = decode_record(kv.key, kv.value)
        assert isinstance(beta, PlacementRecord)
        new_state = await cluster.coordinator_state(new)
        old_state = await cluster.coordinator_state(old)
        assert new_state is not None
        assert old_state is not None
        assert beta.fence == new_state.fence
        assert old_state.coordinating is False
        assert old_state.holder == new
        cluster.assert_single_coordinator()


async def test_contention_memory(autojump_clock: object) -> None:
    await check_contention(MemoryRegistry(), ttl=45.0, slack=0.05)


async def test_fencing_memory(autojump_clock: object) -> None:
    await check_fencing(MemoryRegistry(), ttl=45.0, slack=1.0)


async def test_contention_sqlite(autojump_clock: object, tmp_path: Path) -> None:
    async with sqlite_registry(tmp_path) as registry:
        await check_contention(registry, ttl=45.0, slack=0.2)


async def test_fencing_sqlite(autojump_clock: object, tmp_path: Path) -> None:
    async with sqlite_registry(tmp_path) as registry:
        await check_fencing(registry, ttl=45.0, slack=1.0)


@pytest.mark.etcd
async def test_contention_etcd() -> None:
    async with etcd_registry() as registry:
        await check_contention(registry, ttl=3.0, slack=0.9)


@pytest.mark.etcd
async def test_fencing_etcd() -> None:
    async with etcd_registry() as registry:
        await check_fencing(registry, ttl=3.0, slack=0.5)
