"""The coordinator reacts to registry changes between ticks: one debounced pass per burst,
with no help from the node service (the harness never kicks it)."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from corral.actors.coordinator._actor import DEFAULT_WATCH_DEBOUNCE
from corral.registry import (
    PLACEMENT_PREFIX,
    AppRecord,
    Compare,
    MemoryRegistry,
    NodeIntent,
    Put,
    TxnOp,
    TxnResult,
    app_key,
    intent_key,
)
from corral.testing import Cluster, open_cluster

TTL = 45.0
TICK = TTL / 3
DEBOUNCE = DEFAULT_WATCH_DEBOUNCE


def passes(cluster: Cluster, node: str) -> list[tuple[float, dict[str, object]]]:
    """(time, fields) of every pass that was not skipped, on ``node``."""
    return [(e.time, dict(e.fields)) for n, e in cluster.events("coordinator.pass") if n == node]


async def settle(cluster: Cluster) -> str:
    """Place one app everywhere; return the holder, between two of its ticks."""
    holder = await cluster.wait_for_coordinator()
    await cluster.put_app(AppRecord("everywhere", replicas="all"))
    await trio.sleep(2 * TICK + TICK / 3)
    return holder


async def just_after(delay: float) -> None:
    """Sleep ``delay``, then a hair more: what was due at ``delay`` has happened."""
    await trio.sleep(delay)
    await trio.sleep(0.001)


async def test_a_joining_node_gets_its_work_one_debounce_after_it_registers(
    autojump_clock: object,
) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await settle(cluster)
        before = len(passes(cluster, holder))
        t0 = trio.current_time()
        await cluster.add_node("node-4")
        assert trio.current_time() == t0  # registering took no virtual time

        await trio.sleep(DEBOUNCE / 2)
        record = await cluster.placement("everywhere")
        assert record is not None
        assert "node-4" not in record.nodes  # still gathering the burst
        await just_after(DEBOUNCE / 2)
        record = await cluster.placement("everywhere")
        assert record is not None
        assert record.nodes == ["node-1", "node-2", "node-3", "node-4"]

        await trio.sleep(5 * TICK)
        new = passes(cluster, holder)[before:]
        assert len(new) == 1  # exactly one pass, its own write triggering nothing
        when, fields = new[0]
        assert when == t0 + DEBOUNCE  # well before the next tick (TICK = 15 s)
        assert fields["trigger"] == "watch"
        assert fields["writes"] == 1


async def test_a_burst_of_changes_is_one_pass(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await settle(cluster)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        counts = state.passes
        before = len(passes(cluster, holder))
        t0 = trio.current_time()
        for i in range(5):
            await cluster.put_app(AppRecord(f"app-{i}", replicas=1))
            await trio.sleep(DEBOUNCE / 10)
        await trio.sleep(TICK / 2)  # no tick in between

        new = passes(cluster, holder)[before:]
        assert [(when, fields["trigger"]) for when, fields in new] == [(t0 + DEBOUNCE, "watch")]
        for i in range(5):
            assert await cluster.placement(f"app-{i}") is not None
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.passes.applied == counts.applied + 1
        assert state.passes.skipped == counts.skipped  # its own writes: not news


async def test_changes_that_decide_nothing_write_nothing(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await settle(cluster)
        cluster.registry.reset()
        before = len(passes(cluster, holder))
        # A new revision, domains, labels: not planner inputs. Looked at, skipped.
        await cluster.put_app(
            AppRecord("everywhere", replicas="all", domains=["e.example"], labels={"r": "2"})
        )
        await just_after(DEBOUNCE)
        assert cluster.registry.writes_under("placement/") == 0
        assert passes(cluster, holder)[before:] == []
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.last_pass.trigger == "watch"
        assert state.last_pass.skipped is True


async def test_the_successor_watches_too(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await settle(cluster)
        await cluster.stop(holder)
        successor = await cluster.wait_for_coordinator(exclude={holder}, poll=0.01)
        await trio.sleep(TICK / 3)  # between ticks
        draining = next(n for n in cluster.running if n != successor)
        t0 = trio.current_time()
        await cluster.registry.put(intent_key(draining), NodeIntent(draining=True).encode())
        await just_after(DEBOUNCE)
        record = await cluster.placement("everywhere")
        assert record is not None
        assert draining not in record.nodes
        when, fields = passes(cluster, successor)[-1]
        assert (when, fields["trigger"]) == (t0 + DEBOUNCE, "watch")
        # The old holder's watch ended with it: only the successor passed.
        assert all(when < t0 for when, _ in passes(cluster, holder))


class AppLandsDuringPlacementWrite(MemoryRegistry):
    """A registry where ``late`` is deployed while the coordinator's first placement
    write is in flight, and the coordinator's watch delivers it before that write
    returns (on a three-member etcd across hosts, a write takes long enough for that)."""

    def __init__(self, late: AppRecord) -> None:
        super().__init__()
        self.late: AppRecord | None = late

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        result = await super().txn(compares, on_success, on_failure)
        places = any(
            isinstance(op, Put) and op.key.startswith(PLACEMENT_PREFIX) for op in on_success
        )
        if places and self.late is not None:
            late, self.late = self.late, None
            await super().put(app_key(late.name), late.encode())
            await trio.sleep(DEBOUNCE / 10)  # the watch delivers it meanwhile
        return result


async def test_an_app_deployed_while_a_pass_writes_is_placed_by_the_next_pass(
    autojump_clock: object,
) -> None:
    # Seen on the many-hosts bed (issue 26): the pass's digest, taken after its writes,
    # covered the app that arrived meanwhile, so every later pass skipped it as decided
    # and the app stayed unplaced until the lease moved.
    registry = AppLandsDuringPlacementWrite(AppRecord("late", replicas="all"))
    async with open_cluster(3, lease_ttl=TTL, registry=registry) as cluster:
        await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("first", replicas=1))
        await trio.sleep(DEBOUNCE + 2 * TICK)  # its watch pass and two ticks
        assert registry.late is None  # it did land during the placement write
        first = await cluster.placement("first")
        assert first is not None
        late = await cluster.placement("late")
        assert late is not None, "late was left unplaced"
        assert late.nodes == ["node-1", "node-2", "node-3"]
    await registry.aclose()
