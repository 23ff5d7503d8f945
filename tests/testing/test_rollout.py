"""Rolling deploys through whole in-process nodes (registration, coordinator, routing
renderer, agent on in-memory processes) in virtual time: a redeploy restarts at most
``max_parallel`` instances at a time, each once, each out of the routing table before
it stops; a coordinator hand-off continues the rollout; a revision never ready halts
it with the rest untouched; a rollback rolls back the same way."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

import pytest
import trio

from corral.actors.process_supervisor._memory import Behaviour
from corral.actors.routing import decode_table_json, routing_renderer_child_spec
from corral.node.server._operations import apply_rollback
from corral.registry import (
    OUT_OF_TABLE_STEPS,
    ROUTING_KEY,
    AppRecord,
    Compare,
    Deployment,
    Get,
    MemoryRegistry,
    PlacementRecord,
    ProxyRecord,
    RolloutOptions,
    RolloutRecord,
    TxnOp,
    TxnResult,
    decode_record,
    placement_key,
    proxy_key,
)
from corral.supervision import ChildSpec, SupervisorSpec
from corral.testing import (
    Cluster,
    CountingRegistry,
    NodeContext,
    agent_node_children,
    open_cluster,
    until,
    virtual_wall_clock,
)

APP = "shop"
R1, R2 = "1" * 64, "2" * 64
V1 = Deployment(R1, ["shop", "--serve"])
V2 = Deployment(R2, ["shop", "--serve"])
TTL = 45.0


def with_routing(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
    """The agent's children plus the RoutingRenderer (the lease holder renders)."""
    return [*agent_node_children(ctx), routing_renderer_child_spec(ctx.node_id, ctx.registry)]


class Recorder:
    """Every placement rollout record and routing table written, with the time."""

    def __init__(self) -> None:
        self.rollouts: list[tuple[float, RolloutRecord | None]] = []
        self.tables: list[tuple[float, frozenset[str]]] = []

    async def run(self, cluster: Cluster, task_status: trio.TaskStatus[None]) -> None:
        start = await cluster.registry.revision() + 1
        async with trio.open_nursery() as nursery:
            await nursery.start(self._placements, cluster, start)
            await nursery.start(self._routing, cluster, start)
            task_status.started()

    async def _placements(
        self, cluster: Cluster, start: int, task_status: trio.TaskStatus[None]
    ) -> None:
        async with cluster.registry.watch(placement_key(APP), start) as events:
            task_status.started()
            async for event in events:
                record = decode_record(event.kv.key, event.kv.value) if event.kv.value else None
                if isinstance(record, PlacementRecord):
                    self.rollouts.append((trio.current_time(), record.rollout))

    async def _routing(
        self, cluster: Cluster, start: int, task_status: trio.TaskStatus[None]
    ) -> None:
        async with cluster.registry.watch(ROUTING_KEY, start) as events:
            task_status.started()
            async for event in events:
                if event.kv.key == ROUTING_KEY and event.kv.value:
                    table = decode_table_json(event.kv.value)
                    urls = frozenset(u for us in table.domains.values() for u in us)
                    self.tables.append((trio.current_time(), urls))


def revisions(cluster: Cluster, nodes: Sequence[str]) -> dict[str, list[str]]:
    """node -> the revisions of its live processes of the app."""
    return {
        node: [p.spec.revision for p in cluster.node(node).launcher.alive() if p.spec.app == APP]
        for node in nodes
    }


def starts(cluster: Cluster, node: str) -> list[str]:
    """The revisions of every process of the app the node started, in order."""
    return [p.spec.revision for p in cluster.node(node).launcher.processes(APP)]


async def url_of(cluster: Cluster, node: str) -> str:
    record = await cluster.node_record(node)
    assert record is not None
    return f"http://{record.advertise_host}:{record.serving[APP].public_port}"


async def deployed(
    cluster: Cluster,
    nodes: Sequence[str],
    options: RolloutOptions,
    selector: dict[str, str] | None = None,
) -> AppRecord:
    """Deploy V1 on every node and wait until each serves it, ready."""
    app = AppRecord(
        APP,
        replicas=len(nodes),
        deployment=V1,
        domains=["shop.test"],
        rollout=options,
        selector=selector or {},
    )
    await cluster.put_app(app)

    async def all_ready() -> bool:
        for node in nodes:
            record = await cluster.node_record(node)
            entry = None if record is None else record.serving.get(APP)
            if entry is None or not entry.ready:
                return False
        return True

    with trio.fail_after(TTL):
        while not await all_ready():
            await trio.sleep(0.2)
    return app


async def redeploy(cluster: Cluster, app: AppRecord, deployment: Deployment) -> AppRecord:
    new = dataclasses.replace(app, deployment=deployment, previous_deployment=app.deployment)
    await cluster.put_app(new)
    return new


async def settled(cluster: Cluster, nodes: Sequence[str], revision: str, within: float) -> None:
    """Wait until every node runs ``revision`` and the placement carries no rollout."""
    with trio.fail_after(within):
        while True:
            placement = await cluster.placement(APP)
            running = revisions(cluster, nodes)
            if (
                placement is not None
                and placement.rollout is None
                and all(running[n] == [revision] for n in nodes)
            ):
                return
            await trio.sleep(0.2)


def exits(cluster: Cluster, node: str) -> list[float]:
    return [
        event.time
        for event in cluster.node(node).launcher.timeline
        if event.app == APP and event.kind == "exit"
    ]


@pytest.mark.parametrize("max_parallel", [1, 2])
async def test_a_redeploy_rolls_at_most_max_parallel_at_a_time_each_node_once(
    autojump_clock: object, max_parallel: int
) -> None:
    options = RolloutOptions(max_parallel=max_parallel, drain_ms=2000)
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        nodes = cluster.running
        app = await deployed(cluster, nodes, options)
        urls = {node: await url_of(cluster, node) for node in nodes}
        recorder = Recorder()
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run, cluster)
            began = trio.current_time()
            await redeploy(cluster, app, V2)
            await settled(cluster, nodes, R2, within=120)
            nursery.cancel_scope.cancel()

        # Each node restarted exactly once, onto the new revision, on the same ports.
        for node in nodes:
            assert starts(cluster, node) == [R1, R2]
            first, second = cluster.node(node).launcher.processes(APP)
            assert (first.spec.public_port, first.spec.internal_port) == (
                second.spec.public_port,
                second.spec.internal_port,
            )
        # Never more than max_parallel out of the table or restarting ...
        records = [r for _, r in recorder.rollouts if r is not None]
        assert records, "the redeploy never wrote a rollout"
        for record in records:
            assert len(record.out_of_table()) <= max_parallel
        # ... so at every instant at least the others run.
        after = [count for when, count in cluster.running_counts(APP) if when >= began]
        assert min(after) >= len(nodes) - max_parallel
        # Each node left the routing table before its old process stopped (by the drain).
        for node in nodes:
            (stopped,) = exits(cluster, node)
            out = [when for when, table in recorder.tables if urls[node] not in table]
            assert out, f"{node} was never taken out of the table"
            assert out[0] + 2.0 <= stopped
        # The last table lists every node again.
        assert recorder.tables[-1][1] == frozenset(urls.values())
        kinds = [e.kind for _, e in cluster.events() if e.kind.startswith("deploy.")]
        assert kinds[0] == "deploy.rolling"
        assert kinds[-1] == "deploy.done"
        assert kinds.count("deploy.done") == 1


async def test_a_coordinator_hand_off_mid_rollout_restarts_no_node_twice(
    autojump_clock: object,
) -> None:
    options = RolloutOptions(max_parallel=1, drain_ms=5000)
    async with open_cluster(["coord"], lease_ttl=TTL, children=with_routing) as cluster:
        assert await cluster.wait_for_coordinator() == "coord"
        nodes = ["node-1", "node-2", "node-3"]
        for node in nodes:
            await cluster.add_node(node, labels={"runs": "apps"})
        app = await deployed(cluster, nodes, options, selector={"runs": "apps"})
        await redeploy(cluster, app, V2)

        async def midway() -> bool:
            placement = await cluster.placement(APP)
            rollout = None if placement is None else placement.rollout
            if rollout is None:
                return False
            steps = [entry.step for entry in rollout.nodes.values()]
            return steps.count("done") == 1 and any(s in OUT_OF_TABLE_STEPS for s in steps)

        with trio.fail_after(60):
            while not await midway():
                await trio.sleep(0.1)
        placement = await cluster.placement(APP)
        assert placement is not None
        assert placement.rollout is not None
        (finished,) = [n for n, e in placement.rollout.nodes.items() if e.step == "done"]

        await cluster.stop("coord")  # a clean hand-back: another node takes over
        successor = await cluster.wait_for_coordinator(within=10)
        assert successor in nodes
        await settled(cluster, nodes, R2, within=120)
        for node in nodes:
            assert starts(cluster, node) == [R1, R2], node
        assert starts(cluster, finished) == [R1, R2]
        successor_events = [e.kind for e in cluster.node(successor).events()]
        assert "deploy.done" in successor_events


async def test_a_revision_never_ready_halts_and_leaves_the_rest_on_the_old_one(
    autojump_clock: object,
) -> None:
    options = RolloutOptions(max_parallel=1, drain_ms=1000, ready_timeout_ms=10_000)
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        nodes = cluster.running
        app = await deployed(cluster, nodes, options)
        for node in nodes:
            cluster.node(node).launcher.behave(APP, Behaviour(ready_after=None))
        app = await redeploy(cluster, app, V2)

        async def halted() -> RolloutRecord | None:
            placement = await cluster.placement(APP)
            rollout = None if placement is None else placement.rollout
            return rollout if rollout is not None and rollout.halted else None

        with trio.fail_after(60):
            while (rollout := await halted()) is None:
                await trio.sleep(0.2)
        (tried,) = [n for n, e in rollout.nodes.items() if e.revision == R2]
        assert f"on node {tried}" in rollout.halted
        assert "was not ready" in rollout.halted
        await trio.sleep(60)  # nothing more is admitted
        running = revisions(cluster, nodes)
        assert running[tried] == [R2]
        assert all(running[n] == [R1] for n in nodes if n != tried)
        for node in nodes:
            if node != tried:
                assert starts(cluster, node) == [R1]
        (halt,) = [e for _, e in cluster.events("deploy.halted")]
        assert halt.fields["app"] == APP
        assert halt.fields["reason"] == rollout.halted
        holder = await cluster.wait_for_coordinator()
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (shown,) = state.rollouts
        assert shown.app == APP
        assert shown.status == f"halted: {shown.rollout.halted}"
        assert shown.rollout == rollout

        # A rollback rolls the tried node back; the others never restart.
        for node in nodes:
            cluster.node(node).launcher.behave(APP, Behaviour())
        await cluster.put_app(apply_rollback(app))
        await settled(cluster, nodes, R1, within=120)
        assert starts(cluster, tried) == [R1, R2, R1]
        for node in nodes:
            if node != tried:
                assert starts(cluster, node) == [R1]


async def test_a_rollback_after_a_finished_rollout_rolls_back_node_by_node(
    autojump_clock: object,
) -> None:
    options = RolloutOptions(max_parallel=1, drain_ms=500)
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        nodes = cluster.running
        app = await deployed(cluster, nodes, options)
        app = await redeploy(cluster, app, V2)
        await settled(cluster, nodes, R2, within=120)
        began = trio.current_time()
        await cluster.put_app(apply_rollback(app))
        await settled(cluster, nodes, R1, within=120)
        for node in nodes:
            assert starts(cluster, node) == [R1, R2, R1]
        after = [count for when, count in cluster.running_counts(APP) if when >= began]
        assert min(after) >= 2
        assert [e.fields["revision"] for _, e in cluster.events("deploy.done")] == [R2, R1]


async def test_a_one_instance_app_restarts_in_place_without_waiting_on_a_drain(
    autojump_clock: object,
) -> None:
    options = RolloutOptions(max_parallel=1, drain_ms=30_000)
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        app = AppRecord(APP, replicas=1, deployment=V1, domains=["shop.test"], rollout=options)
        await cluster.put_app(app)
        await until(lambda: len(cluster.instances().get(APP, [])) == 1, within=TTL, poll=0.1)
        (node,) = cluster.instances()[APP]
        await trio.sleep(2.0)
        began = trio.current_time()
        await redeploy(cluster, app, V2)
        await settled(cluster, [node], R2, within=60)
        # Nothing else serves it: no drain to wait out, just the restart and readiness.
        assert trio.current_time() - began < 10
        assert starts(cluster, node) == [R1, R2]
        assert cluster.instances()[APP] == [node]


@pytest.mark.parametrize("proxy_does", ["applies", "nothing", "stops-reporting"])
async def test_a_node_out_of_the_table_waits_for_every_proxy_or_the_drain(
    autojump_clock: object, proxy_does: str
) -> None:
    """A registered proxy that applies each table a second late lets the rollout go
    on a second after the take-out; one that applies nothing holds it the drain;
    one whose record is no longer refreshed (its process is gone) is not waited for."""
    applies = proxy_does == "applies"
    drain = 10.0
    options = RolloutOptions(max_parallel=1, drain_ms=int(drain * 1000))
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        nodes = cluster.running
        app = await deployed(cluster, nodes, options)

        async def proxy(task_status: trio.TaskStatus[None]) -> None:
            """``proxies/p1``: applies every table one second after it is written."""
            start = await cluster.registry.revision() + 1
            async with cluster.registry.watch(ROUTING_KEY, start) as events:
                record = ProxyRecord("p1", "haproxy", "127.0.0.1:1", 0, 0)
                if proxy_does == "stops-reporting":
                    silent_since = virtual_wall_clock() - 60
                    record = dataclasses.replace(
                        record, reported_at=silent_since, report_every=5.0
                    )
                await cluster.registry.put(proxy_key("p1"), record.encode())
                task_status.started()
                async for event in events:
                    if not applies or event.kv.key != ROUTING_KEY:
                        continue
                    table = decode_table_json(event.kv.value)
                    await trio.sleep(1.0)
                    record = dataclasses.replace(
                        record, applied_fence=table.fence, applied_revision=table.revision
                    )
                    await cluster.registry.put(proxy_key("p1"), record.encode())

        recorder = Recorder()
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy)
            await nursery.start(recorder.run, cluster)
            await redeploy(cluster, app, V2)
            await settled(cluster, nodes, R2, within=200)
            nursery.cancel_scope.cancel()

        first = min(nodes)  # the lowest id goes first
        steps = [
            (r.nodes[first].step, r.nodes[first].since)
            for _, r in recorder.rollouts
            if r is not None and first in r.nodes
        ]
        out = next(since for step, since in steps if step == "out-of-table")
        draining = next(since for step, since in steps if step == "draining")
        if applies:
            assert 1.0 <= draining - out < 2.0  # the proxy's second, and a pass's debounce
        elif proxy_does == "stops-reporting":
            assert draining - out < 1.0  # no live proxy to wait for
        else:
            assert draining - out == drain


class ReadRecorder(CountingRegistry):
    """Counts the keys read by transactions (a Get's key or prefix)."""

    def __init__(self, inner: MemoryRegistry) -> None:
        super().__init__(inner)
        self.reads: Counter[str] = Counter()

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        for op in on_success:
            if isinstance(op, Get):
                self.reads[op.key] += 1
        return await super().txn(compares, on_success, on_failure)


async def test_an_idle_coordinator_never_reads_the_routing_table_or_the_proxies(
    autojump_clock: object,
) -> None:
    registry = ReadRecorder(MemoryRegistry())
    try:
        async with open_cluster(
            3, lease_ttl=TTL, children=with_routing, registry=registry
        ) as cluster:
            app = await deployed(cluster, cluster.running, RolloutOptions(drain_ms=500))
            await trio.sleep(5.0)
            registry.reads.clear()
            passes = len(cluster.events("coordinator.pass"))
            await trio.sleep(10 * TTL)  # ticks, capacity refreshes, renders: nothing rolls
            assert registry.reads["apps/"] > 0  # passes did run
            # (the renderer reads the table it replaces; the coordinator's read of the
            # table goes with the proxies)
            assert registry.reads["proxies/"] == 0
            # A redeploy reads them while it rolls, then no more.
            await redeploy(cluster, app, V2)
            await settled(cluster, cluster.running, R2, within=120)
            assert registry.reads["proxies/"] > 0
            await trio.sleep(1.0)
            registry.reads.clear()
            await trio.sleep(5 * TTL)
            assert registry.reads["proxies/"] == 0
            assert len(cluster.events("coordinator.pass")) >= passes
    finally:
        await registry.aclose()


async def test_the_last_pass_counts_the_rollout_records_it_moved_on(
    autojump_clock: object,
) -> None:
    options = RolloutOptions(max_parallel=1, drain_ms=1000)
    async with open_cluster(3, lease_ttl=TTL, children=with_routing) as cluster:
        nodes = cluster.running
        app = await deployed(cluster, nodes, options)
        seen: list[tuple[str, int]] = []

        async def watch_passes() -> None:
            while True:
                for state in (await cluster.coordinator_states()).values():
                    if state is not None and state.coordinating and state.last_pass:
                        last = state.last_pass
                        seen.append((last.outcome, last.counts.get("rollout_writes", 0)))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_passes)
            await redeploy(cluster, app, V2)
            await settled(cluster, nodes, R2, within=120)
            nursery.cancel_scope.cancel()
        # Passes whose placement inputs had not moved still advanced the rollout, and
        # the state says so instead of showing a pass that did nothing.
        assert any(outcome == "skipped" and writes > 0 for outcome, writes in seen), seen


@dataclasses.dataclass(frozen=True)
class RegistryCut:
    """The coordinator's host cut from the registry (``hang``: its calls wait and land
    when it is back; else they fail) for ``cut_for`` seconds, the deploy made
    ``deploy_after`` seconds into the cut, and every other node's registry access
    failing for the first ``stall`` seconds of it (a stalled registry endpoint: their
    node records lapse too)."""

    hang: bool
    deploy_after: float
    stall: float
    cut_for: float


def not_serving(cluster: Cluster, nodes: Sequence[str], ready_after: float, since: float) -> int:
    """The most instances out at once since ``since``: each from its process's exit until
    its next process is ready (``ready_after`` seconds after its start)."""
    edges: list[tuple[float, int]] = []
    for node in nodes:
        timeline = [e for e in cluster.node(node).launcher.timeline if e.app == APP]
        for stop in (e.time for e in timeline if e.kind == "exit" and e.time >= since):
            start = min((e.time for e in timeline if e.kind == "start" and e.time >= stop),
                        default=math.inf)
            edges += [(stop, 1), (start + ready_after, -1)]
    out = most = 0
    for _, step in sorted(edges):
        out += step
        most = max(most, out)
    return most


@pytest.mark.parametrize(
    "cut",
    [
        # a successor begins the rollout from a view the stall emptied of node records
        RegistryCut(hang=True, deploy_after=1.5, stall=8.0, cut_for=7.5),
        # the old holder's own record lapsed: it is named nothing until it is back
        RegistryCut(hang=True, deploy_after=0.9, stall=0.0, cut_for=11.6),
        RegistryCut(hang=False, deploy_after=1.2, stall=2.0, cut_for=3.0),
        # the cut comes mid-rollout
        RegistryCut(hang=False, deploy_after=-3.0, stall=8.0, cut_for=12.0),
    ],
)
async def test_a_registry_cut_moving_the_lease_mid_deploy_keeps_max_parallel(
    autojump_clock: object, cut: RegistryCut
) -> None:
    """Issue 26: a host cut during a rolling deploy moved the lease, and all four
    instances restarted within 2 s. Node records lapse in the cut and come back without
    their instances listed; a coordinator took each such node for one running nothing
    and named it the new revision, so its reconciler restarted it outside the width."""
    ready_after, lease_ttl = 6.0, 4.0
    options = RolloutOptions(max_parallel=1, drain_ms=1000, ready_timeout_ms=60_000)
    async with open_cluster(4, lease_ttl=lease_ttl, children=with_routing) as cluster:
        nodes = cluster.running
        app = AppRecord(APP, replicas="all", deployment=V1, domains=["shop.test"],
                        rollout=options)
        await cluster.put_app(app)
        await until(
            lambda: len(revisions_running(cluster, nodes, R1)) == len(nodes), within=TTL, poll=0.1
        )
        await trio.sleep(2 * lease_ttl)  # every node record lists its instance
        for node in nodes:
            cluster.node(node).launcher.behave(APP, Behaviour(ready_after=ready_after))
        began = trio.current_time()

        async def deploy() -> None:
            await trio.sleep(max(0.0, cut.deploy_after))
            await redeploy(cluster, app, V2)

        async def cut_off() -> None:
            await trio.sleep(max(0.0, -cut.deploy_after))
            holder = await cluster.wait_for_coordinator()
            cluster.cut_registry(holder, hang=cut.hang)
            others = [node for node in nodes if node != holder]
            for node in others if cut.stall else ():
                cluster.cut_registry(node)
            await trio.sleep(cut.stall)
            for node in others if cut.stall else ():
                cluster.restore_registry(node)
            await trio.sleep(max(0.0, cut.cut_for - cut.stall))
            cluster.restore_registry(holder)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deploy)
            nursery.start_soon(cut_off)
        await settled(cluster, nodes, R2, within=120)

        assert not_serving(cluster, nodes, ready_after, began) == options.max_parallel
        for node in nodes:
            assert starts(cluster, node) == [R1, R2], node
        # the lease lapsed and was taken again, under a new fence (by another node, or
        # by the old holder once back), never held twice at once
        assert len(cluster.assert_single_coordinator()) >= 2


def revisions_running(cluster: Cluster, nodes: Sequence[str], revision: str) -> list[str]:
    return [node for node, running in revisions(cluster, nodes).items() if running == [revision]]
