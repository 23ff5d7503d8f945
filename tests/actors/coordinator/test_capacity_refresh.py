"""A capacity refresh (free memory and disk moving, as every node writes every 30 s) is
no planner input unless it can change a decision: the next pass is skipped."""

from __future__ import annotations

from collections.abc import Callable

import trio

from corral.actors.coordinator import coordinator_child_spec
from corral.actors.node_record import node_registration_child_spec
from corral.registry import AppRecord, MeasuredCapacity
from corral.supervision import ChildSpec, SupervisorSpec
from corral.testing import NodeContext, open_cluster

TTL = 45.0
TICK = TTL / 3
REFRESH = 5.0


Children = Callable[[NodeContext], list[ChildSpec | SupervisorSpec]]


def refreshing_children(measured: dict[str, MeasuredCapacity]) -> Children:
    def children(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
        return [
            node_registration_child_spec(
                ctx.identity,
                ctx.registry,
                capacity_probe=lambda: measured[ctx.node_id],
                wall_clock=ctx.wall_clock,
                lease_ttl=ctx.node_lease_ttl,
                capacity_interval=REFRESH,
            ),
            coordinator_child_spec(
                ctx.node_id, ctx.registry, ctx.policy, ctx.lease_ttl, ctx.wall_clock
            ),
        ]

    return children


async def run_refreshes(apps: list[AppRecord]) -> tuple[int, int, int]:
    """Settle ``apps``, then let free memory drift: (applied, skipped, capacity writes)."""
    ids = ["node-1", "node-2", "node-3"]
    measured = {i: MeasuredCapacity(8192, 6000, 100_000, 60_000) for i in ids}
    children = refreshing_children(measured)
    async with open_cluster(ids, lease_ttl=TTL, children=children) as cluster:
        holder = await cluster.wait_for_coordinator()
        for app in apps:
            await cluster.put_app(app)
        await trio.sleep(2 * TICK)
        before = await cluster.coordinator_state(holder)
        assert before is not None
        cluster.registry.reset()
        for step in range(12):
            for i in ids:
                free = 6000 - 100 * (step + 1)
                measured[i] = MeasuredCapacity(8192, free, 100_000, 60_000 - step)
            await trio.sleep(REFRESH)
        writes = cluster.registry.writes_under("nodes/")
        after = await cluster.coordinator_state(holder)
        assert after is not None
        return (
            after.passes.applied - before.passes.applied,
            after.passes.skipped - before.passes.skipped,
            writes,
        )


async def test_a_capacity_refresh_without_resource_apps_leaves_passes_skipped(
    autojump_clock: object,
) -> None:
    applied, skipped, writes = await run_refreshes([AppRecord("web", replicas=2)])
    assert writes > 0  # the nodes did write their drifting capacity
    assert applied == 0
    assert skipped >= 4


async def test_a_capacity_refresh_with_resource_apps_still_decides_nothing_new(
    autojump_clock: object,
) -> None:
    apps = [AppRecord("web", replicas=2), AppRecord("db", replicas=1, memory_mb=512)]
    applied, skipped, writes = await run_refreshes(apps)
    assert writes > 0
    assert applied == 0
    assert skipped >= 4
