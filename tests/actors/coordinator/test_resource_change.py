"""Redeploying a running app with other resources, through the coordinator: the change is
placed like a new app (in place when it fits, moved, or unplaced with the reason), and
what the nodes commit never goes past their totals (issue 25, item 12)."""

from __future__ import annotations

import dataclasses

import trio

from corral.actors.planner import AppSpec, NodeCapacity, Placement, allocatable
from corral.actors.planner import reserved_by_placements as reserved
from corral.registry import AppRecord, MeasuredCapacity, PlacementRecord
from corral.testing import open_cluster

from .test_capacity_refresh import TICK, TTL, refreshing_children

IDS = ["node-1", "node-2"]
TOTAL = 8192


async def committed(cluster: object, apps: list[AppRecord]) -> dict[str, int]:
    """Allocatable memory per node as ``corral node ls`` computes it from the records."""
    placements: dict[str, Placement] = {}
    for app in apps:
        record = await cluster.placement(app.name)  # type: ignore[attr-defined]
        if isinstance(record, PlacementRecord):
            placements[app.name] = Placement(nodes=tuple(record.nodes), reserved=record.reserved)
    specs = [AppSpec(a.name, memory_mb=a.memory_mb, disk_mb=a.disk_mb) for a in apps]
    memory, _ = reserved(specs, placements)
    cap = NodeCapacity(TOTAL, TOTAL, 100_000, 100_000)
    return {node: allocatable(cap, memory.get(node, 0), 0)[0] for node in IDS}


async def test_a_resource_change_fits_in_place_moves_or_is_left_unplaced(
    autojump_clock: object,
) -> None:
    measured = {i: MeasuredCapacity(TOTAL, TOTAL, 100_000, 100_000) for i in IDS}
    async with open_cluster(IDS, lease_ttl=TTL, children=refreshing_children(measured)) as cluster:
        holder = await cluster.wait_for_coordinator()
        db = AppRecord("db", replicas=1, memory_mb=6000)
        web = AppRecord("web", replicas=1, memory_mb=1024)
        await cluster.put_app(db)
        await trio.sleep(2 * TICK)
        await cluster.put_app(web)
        await trio.sleep(2 * TICK)
        db_node = (await cluster.placement("db")).nodes[0]  # type: ignore[union-attr]
        web_record = await cluster.placement("web")
        assert web_record is not None
        assert web_record.reserved == (1024, 0)
        (web_node,) = web_record.nodes
        assert web_node == db_node  # best fit packs it next to db
        other = next(n for n in IDS if n != db_node)

        # Grows where it runs: 1024 -> 2048 fits the node web runs on.
        web = dataclasses.replace(web, memory_mb=2048)
        await cluster.put_app(web)
        await trio.sleep(2 * TICK)
        record = await cluster.placement("web")
        assert record is not None
        assert (record.nodes, record.reserved) == ([web_node], (2048, 0))

        # Grows past its node (8192 - 6000 < 3000): moves to the other node at once.
        web = dataclasses.replace(web, memory_mb=3000)
        await cluster.put_app(web)
        assert min((await committed(cluster, [db, web])).values()) >= 0
        await trio.sleep(2 * TICK)
        record = await cluster.placement("web")
        assert record is not None
        assert (record.nodes, record.reserved) == ([other], (3000, 0))

        # Asks for more than any node has: removed, unplaced with the reason, and no
        # node ever shows a negative allocatable.
        web = dataclasses.replace(web, memory_mb=999_999)
        await cluster.put_app(web)
        assert min((await committed(cluster, [db, web])).values()) >= 0
        await trio.sleep(2 * TICK)
        assert await cluster.placement("web") is None
        assert min((await committed(cluster, [db, web])).values()) >= 0
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (unplaced,) = state.unplaced
        assert unplaced.message == (
            "cannot place web: of 2 matching node(s): 2 lack 999999 MiB of free memory"
        )

        # Back to a size one node can hold: placed again, as new work.
        web = dataclasses.replace(web, memory_mb=4000)
        await cluster.put_app(web)
        await trio.sleep(2 * TICK)
        record = await cluster.placement("web")
        assert record is not None
        assert (record.nodes, record.reserved) == ([other], (4000, 0))
        assert min((await committed(cluster, [db, web])).values()) >= 0
