"""Three full nodes (registration, coordinator, agent on in-memory processes) in virtual
time: deploy, run on exactly the replicas, lose a node, re-place, no restart storm."""

from __future__ import annotations

import trio

from corral.actors.planner import Policy
from corral.registry import (
    AppRecord,
    Deployment,
    EventType,
    PlacementRecord,
    decode_record,
    placement_key,
)
from corral.testing import Cluster, agent_node_children, open_cluster, until

TTL = 45.0  # coordinator lease and node records
TICK = TTL / 3
GRACE = 5.0  # a lost node keeps its work this long after it is down
APP = "shop"
R1 = "1" * 64


async def serving_ports(cluster: Cluster, node: str) -> tuple[int, int] | None:
    record = await cluster.node_record(node)
    if record is None:
        return None
    entry = record.serving.get(APP)
    return None if entry is None else (entry.public_port, entry.internal_port)


def process_ports(cluster: Cluster, node: str) -> list[tuple[int, int]]:
    return [
        (p.spec.public_port, p.spec.internal_port)
        for p in cluster.node(node).launcher.processes(APP)
    ]


def starts(cluster: Cluster) -> dict[str, int]:
    counted: dict[str, int] = {}
    for node, event in cluster.launch_timeline():
        if event.app == APP and event.kind == "start":
            counted[node] = counted.get(node, 0) + 1
    return counted


async def test_three_nodes_run_replace_and_never_overrun_an_app(autojump_clock: object) -> None:
    policy = Policy(grace_period_s=GRACE)
    async with open_cluster(
        3, lease_ttl=TTL, children=agent_node_children, policy=policy
    ) as cluster:
        holder = await cluster.wait_for_coordinator()
        placements: list[tuple[float, EventType, list[str]]] = []

        async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            start = await cluster.registry.revision() + 1
            async with cluster.registry.watch(placement_key(APP), start) as events:
                task_status.started()
                async for event in events:
                    nodes: list[str] = []
                    if event.type is EventType.PUT:
                        record = decode_record(event.kv.key, event.kv.value)
                        assert isinstance(record, PlacementRecord)
                        nodes = list(record.nodes)
                    placements.append((trio.current_time(), event.type, nodes))

        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            deployment = Deployment(R1, ["shop", "--serve"])
            await cluster.put_app(AppRecord(APP, replicas=2, deployment=deployment))

            # Exactly two nodes run it, the two its placement names, on published ports.
            await until(
                lambda: len(cluster.instances().get(APP, [])) == 2, within=TICK + 5, poll=0.1
            )
            first = cluster.instances()[APP]
            await trio.sleep(1.0)  # the pass that started them publishes them
            assert [nodes for _, _, nodes in placements] == [first]
            ports = {}
            for node in first:
                (pair,) = process_ports(cluster, node)
                ports[node] = pair
                assert await serving_ports(cluster, node) == pair

            # Quiet for a while: coordinator ticks and reconcile passes change nothing.
            await trio.sleep(4 * TICK)
            assert starts(cluster) == dict.fromkeys(first, 1)
            assert len(placements) == 1

            # Lose a node that runs it (not the coordinator, so only the node record lapses).
            victim = next(n for n in first if n != holder)
            survivor = next(n for n in first if n != victim)
            spare = next(n for n in cluster.running if n not in first)
            await cluster.kill(victim)
            killed_at = trio.current_time()
            assert cluster.instances()[APP] == [survivor]

            moved_at = await until(
                lambda: cluster.instances().get(APP) == sorted([survivor, spare]),
                within=TTL + GRACE + 5,
                poll=0.1,
            )
            # Not before the victim's node record could lapse (its last keepalive was at
            # most a third of the TTL before the kill) and the grace passed; then at once
            # (the pass that saw the lapse decided it down; a timer ends its grace).
            assert TTL * 2 / 3 + GRACE <= moved_at - killed_at <= TTL + GRACE + 1
            (_, kind, nodes) = placements[-1]
            assert kind is EventType.PUT
            assert nodes == sorted([survivor, spare])
            assert len(placements) == 2  # one write moved it

            # Settle through full reconcile passes (every 60 s) and many ticks, then have
            # the victim come back: within the cooldown nothing moves back to it.
            await trio.sleep(90.0)
            await cluster.restart(victim)
            await trio.sleep(4 * TICK)
            nursery.cancel_scope.cancel()

        assert cluster.instances() == {APP: sorted([survivor, spare])}
        assert len(placements) == 2
        # Never more nodes than replicas running it, at any instant.
        counts = cluster.running_counts(APP)
        assert max(n for _, n in counts) == 2
        assert next(n for t, n in counts if t >= killed_at) == 1
        # No restart storm: each node started it once; the survivor kept its process
        # and its ports; the new node's ports are published.
        assert starts(cluster) == {survivor: 1, victim: 1, spare: 1}
        assert process_ports(cluster, survivor) == [ports[survivor]]
        assert await serving_ports(cluster, survivor) == ports[survivor]
        (spare_pair,) = process_ports(cluster, spare)
        assert await serving_ports(cluster, spare) == spare_pair
        assert await serving_ports(cluster, victim) is None  # a new life serves nothing
