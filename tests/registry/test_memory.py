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


async def test_a_quiet_watcher_is_not_told_of_compaction_of_other_prefixes() -> None:
    registry = MemoryRegistry(history=2)
    async with registry.watch("placement/") as events:
        for i in range(5):
            await registry.put(f"apps/a{i}", b"x")  # none of these concern the watcher
        await registry.put("placement/a0", b"y")
        (event,) = await take_events(events, 1)
    assert event.kv.key == "placement/a0"


async def idle_watch(registry: MemoryRegistry, scope: trio.CancelScope) -> None:
    """Watch a prefix nothing writes to, until ``scope`` is cancelled."""
    with scope:
        async with registry.watch("apps/") as events:
            await take_events(events, 1, within=1000)


async def test_a_lease_granted_later_still_lapses_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One watcher (the first to wait) times the lease deadlines for all: a lease granted
    # later with an earlier deadline must wake it, though no write concerns its prefix.
    registry = MemoryRegistry()
    long = await registry.grant(100)
    await registry.put(node_key("n1"), b"alive", lease=long.id)
    t0 = trio.current_time()
    keeper = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(idle_watch, registry, keeper)
        await trio.sleep(1)  # it waits first: it times the deadlines (the next at 100 s)
        async with registry.watch("nodes/") as events:
            short = await registry.grant(5)
            await registry.put(node_key("n2"), b"alive", lease=short.id)
            put, gone = await take_events(events, 2, within=200)
        keeper.cancel()
    assert (put.type, gone.type, gone.kv.key) == (EventType.PUT, EventType.DELETE, "nodes/n2")
    assert trio.current_time() - t0 == 6


async def test_when_the_timing_watch_ends_another_watcher_takes_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    lease = await registry.grant(30)
    await registry.put(node_key("n1"), b"alive", lease=lease.id)
    t0 = trio.current_time()
    keeper = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(idle_watch, registry, keeper)
        await trio.sleep(1)  # it waits first: it times the deadlines
        async with registry.watch("nodes/") as events:
            keeper.cancel()  # its watch ends; this one must take the deadlines over
            (gone,) = await take_events(events, 1, within=100)
    assert gone.kv.key == "nodes/n1"
    assert trio.current_time() - t0 == 30
