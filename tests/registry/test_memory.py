"""MemoryRegistry in virtual time: leases expire at exactly their deadline."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from corral.registry import (
    EventType,
    LeaseNotFound,
    MemoryRegistry,
    RevisionCompacted,
    node_key,
)
from corral.testing import take_events


async def test_a_45s_lease_key_vanishes_at_exactly_45s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    t0 = trio.current_time()
    lease = await registry.grant(45)
    await registry.put(node_key("n1"), b"alive", lease=lease.id)
    await trio.sleep(44.999)
    assert await registry.get(node_key("n1")) is not None
    await trio.sleep(0.001)
    assert trio.current_time() - t0 == pytest.approx(45, abs=1e-9)
    assert await registry.get(node_key("n1")) is None
    with pytest.raises(LeaseNotFound):
        await registry.keepalive(lease.id)


async def test_a_blocked_watcher_sees_the_expiry_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    lease = await registry.grant(45)
    await registry.put(node_key("n1"), b"alive", lease=lease.id)
    t0 = trio.current_time()
    async with registry.watch("nodes/") as events:
        (event,) = await take_events(events, 1, within=100)
    assert trio.current_time() - t0 == 45
    assert event.type is EventType.DELETE
    assert event.kv.key == "nodes/n1"


async def test_keepalive_moves_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    registry = MemoryRegistry()
    t0 = trio.current_time()
    lease = await registry.grant(45)
    await registry.put(node_key("n1"), b"alive", lease=lease.id)
    await trio.sleep(30)
    assert await registry.keepalive(lease.id) == 45
    async with registry.watch("nodes/") as events:
        await take_events(events, 1, within=100)
    assert trio.current_time() - t0 == 75


async def test_a_watch_from_compacted_history_is_refused() -> None:
    registry = MemoryRegistry(history=3)
    for i in range(5):
        await registry.put(f"apps/a{i}", b"x")
    with pytest.raises(RevisionCompacted) as caught:
        async with registry.watch("apps/", 1):
            pass
    assert caught.value.requested == 1
    assert caught.value.compacted >= 1
    async with registry.watch("apps/", await registry.revision() - 2) as events:
        got = await take_events(events, 3)
    assert [e.kv.key for e in got] == ["apps/a2", "apps/a3", "apps/a4"]


async def test_a_watcher_that_falls_behind_compaction_is_told() -> None:
    registry = MemoryRegistry(history=2)
    async with registry.watch("apps/") as events:
        for i in range(4):
            await registry.put(f"apps/a{i}", b"x")
        with pytest.raises(RevisionCompacted):
            await take_events(events, 1)


async def test_a_closed_registry_refuses_work() -> None:
    registry = MemoryRegistry()
    await registry.aclose()
    await registry.aclose()  # idempotent
    with pytest.raises(trio.ClosedResourceError):
        await registry.get("apps/a")


async def test_close_wakes_watchers() -> None:
    registry = MemoryRegistry()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def watcher() -> None:
                async with registry.watch("apps/") as events:
                    with pytest.raises(trio.ClosedResourceError):
                        await take_events(events, 1)

            nursery.start_soon(watcher)
            await trio.testing.wait_all_tasks_blocked()
            await registry.aclose()


async def test_a_lease_needs_a_positive_ttl() -> None:
    registry = MemoryRegistry()
    with pytest.raises(ValueError, match="> 0"):
        await registry.grant(0)
