"""A new lease holder never publishes a table emptier than the last one while its own
inputs are still arriving (issue 26): a render may drop a served domain only when its
inputs explain it, never because a placed node's record has not been read yet."""

from __future__ import annotations

from collections.abc import Sequence

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.membership import SwimConfig
from corral.actors.planner import Policy
from corral.actors.routing import (
    GetRoutingState,
    Instance,
    NodeRoutes,
    RouteTable,
    RoutingInputs,
    decode_table_json,
    next_table,
    render_routes,
    routing_renderer_child_spec,
)
from corral.actors.routing._hold import awaited_nodes, decide_publish, incomplete_records
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    ROUTING_KEY,
    AppRecord,
    CoordinatorLease,
    Deployment,
    EventType,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    app_key,
    node_key,
    placement_key,
)
from corral.supervision import ChildSpec, SupervisorSpec, open_actor_system
from corral.testing import Cluster, NodeContext, agent_node_children, open_cluster, until

NODES = ["n1", "n2", "n3", "n4"]
APPS = ["a", "b", "c"]
READY = Instance(24001, running=True, ready=True)
STOPPED = Instance(24001, running=False, ready=False, state="exited")


def host(node: str) -> str:
    return f"10.0.0.{NODES.index(node) + 1}"


def table_of(inputs: RoutingInputs) -> RouteTable:
    table = next_table(None, render_routes(inputs), fence=1)
    assert table is not None
    return table


# ----------------------------------------------------------------- the pure decision

#: One app: its placement, and per placed node what its record says (None: no record).
app_worlds = st.dictionaries(
    st.sampled_from(APPS),
    st.dictionaries(st.sampled_from(NODES), st.sampled_from([READY, STOPPED]), min_size=1),
)


def complete_inputs(world: dict[str, dict[str, Instance]]) -> RoutingInputs:
    """Every placed node has its record."""
    nodes: dict[str, dict[str, Instance]] = {}
    for app, placed in world.items():
        for node, instance in placed.items():
            nodes.setdefault(node, {})[app] = instance
    return RoutingInputs(
        app_domains={app: [f"{app}.test"] for app in world},
        placements={app: sorted(placed) for app, placed in world.items()},
        nodes={n: NodeRoutes(host(n), instances) for n, instances in nodes.items()},
    )


def without_records(
    inputs: RoutingInputs, gone: Sequence[str], bare: Sequence[str] = ()
) -> RoutingInputs:
    """``inputs`` with the records of ``gone`` not there yet, and those of ``bare``
    written again without what they serve (a lapsed node registering again)."""
    return RoutingInputs(
        app_domains=inputs.app_domains,
        placements=inputs.placements,
        nodes={
            n: NodeRoutes(r.advertise_host) if n in bare else r
            for n, r in inputs.nodes.items()
            if n not in gone
        },
        member_states=inputs.member_states,
    )


@settings(max_examples=300, deadline=None)
@given(app_worlds, st.sets(st.sampled_from(NODES)), st.sets(st.sampled_from(NODES)))
def test_records_still_arriving_never_drop_a_served_domain(
    world: dict[str, dict[str, Instance]], not_read_yet: set[str], bare: set[str]
) -> None:
    """The last table was rendered from complete inputs; the new holder reads the same
    world with some node records not there yet and some written again bare. Its table is
    published only when it keeps every domain the last one served."""
    complete = complete_inputs(world)
    last = table_of(complete)
    partial = without_records(complete, sorted(not_read_yet), sorted(bare))
    rendered = render_routes(partial)
    awaited = awaited_nodes(partial, missing_since={}, now=0.0, settle=10.0)
    assert awaited == incomplete_records(partial)
    assert not_read_yet & set(complete.nodes) <= awaited
    decision = decide_publish(last, partial, rendered, awaited)
    assert decision.publish == (set(last.domains) <= set(rendered.domains))
    if not decision.publish:
        assert set(decision.unexplained) == set(last.domains) - set(rendered.domains)
        assert "held:" in decision.why
    # Complete inputs: the render is published as it is.
    assert decide_publish(last, complete, render_routes(complete), frozenset()).publish


@settings(max_examples=300, deadline=None)
@given(
    app_worlds,
    st.sets(st.sampled_from(APPS)),
    st.sets(st.sampled_from(NODES)),
    st.dictionaries(st.sampled_from(NODES), st.sampled_from(["alive", "suspect", "dead", "left"])),
)
def test_a_published_table_drops_only_domains_its_inputs_explain(
    world: dict[str, dict[str, Instance]],
    deleted: set[str],
    not_read_yet: set[str],
    states: dict[str, str],
) -> None:
    """Apps deleted, records missing, SWIM states: whatever the mix, a published table
    drops a served domain only when no app claims it, or every node placed for its app
    has a record or is dead/left in SWIM."""
    last = table_of(complete_inputs(world))
    kept = {app: placed for app, placed in world.items() if app not in deleted}
    complete = complete_inputs(kept)
    partial = without_records(
        RoutingInputs(
            app_domains=complete.app_domains,
            placements=complete.placements,
            nodes=complete.nodes,
            member_states=states,
        ),
        sorted(not_read_yet),
    )
    rendered = render_routes(partial)
    awaited = awaited_nodes(partial, missing_since={}, now=0.0, settle=10.0)
    decision = decide_publish(last, partial, rendered, awaited)
    if decision.publish:
        for domain in set(last.domains) - set(rendered.domains):
            app = domain.removesuffix(".test")
            if app in deleted:
                continue
            for node in partial.placements[app]:
                assert node in partial.nodes or states.get(node) in ("dead", "left")
    else:
        assert decision.unexplained
        for domain, nodes in decision.unexplained.items():
            assert domain.removesuffix(".test") not in deleted
            assert nodes <= not_read_yet


def test_a_missing_record_is_awaited_until_swim_says_gone_or_the_settle_time_ends() -> None:
    inputs = RoutingInputs(
        app_domains={"a": ["a.test"]},
        placements={"a": ["n1", "n2", "n3"]},
        nodes={},
        member_states={"n1": "alive", "n2": "dead", "n3": "suspect"},
    )
    since = {"n1": 100.0, "n3": 95.0}
    assert awaited_nodes(inputs, missing_since=since, now=100.0, settle=10.0) == {"n1", "n3"}
    # n3 has been missing 10 s: its absence is its answer now.
    assert awaited_nodes(inputs, missing_since=since, now=105.0, settle=10.0) == {"n1"}
    assert awaited_nodes(inputs, missing_since=since, now=110.0, settle=10.0) == frozenset()


def test_a_deleted_app_leaves_at_once_even_while_records_are_awaited() -> None:
    world = {"a": {"n1": READY}, "b": {"n2": READY}}
    last = table_of(complete_inputs(world))
    inputs = without_records(complete_inputs({"a": {"n1": READY}}), ["n1"])
    # "a" waits for n1's record: held, naming it; "b" alone leaving is explained.
    held = decide_publish(last, inputs, render_routes(inputs), frozenset({"n1"}))
    assert not held.publish
    assert dict(held.unexplained) == {"a.test": frozenset({"n1"})}
    assert "a.test" in held.why
    assert "n1" in held.why
    only_b_gone = complete_inputs({"a": {"n1": READY}})
    assert decide_publish(last, only_b_gone, render_routes(only_b_gone), frozenset({"n9"})).publish


# ----------------------------------------------------------------- a real hand-over

TTL = 4.0  # the coordinator lease, as issue 26 ran it
NODE_TTL = 2.0  # node records lapse before the lease moves
R1 = "1" * 64


def with_routing(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
    return [
        *agent_node_children(ctx),
        routing_renderer_child_spec(
            ctx.node_id, ctx.registry, membership=ctx.membership, resync=1.0
        ),
    ]


async def test_a_new_holder_keeps_every_domain_with_a_live_backend_while_records_arrive(
    autojump_clock: object,
) -> None:
    """The holder dies while a node's registry link is down (its record lapsed; it still
    runs its app and SWIM hears it). The successor's tables keep that node's domain
    until the record is back, and the one it first publishes has every domain that
    still has a running instance."""
    tables: list[RouteTable] = []

    async def watch_routing(
        cluster: Cluster, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        start = await cluster.registry.revision() + 1
        async with cluster.registry.watch(ROUTING_KEY, start) as events:
            task_status.started()
            async for event in events:
                if event.type is EventType.PUT:
                    tables.append(decode_table_json(event.kv.value))

    async with (
        open_cluster(
            3,
            lease_ttl=TTL,
            node_lease_ttl=NODE_TTL,
            children=with_routing,
            swim=SwimConfig(),
            policy=Policy(grace_period_s=120.0),
        ) as cluster,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(watch_routing, cluster)
        holder = await cluster.wait_for_coordinator()
        await cluster.wait_for_members(within=30)
        for app in APPS:
            deployment = Deployment(R1, [app, "--serve"])
            await cluster.put_app(
                AppRecord(app, replicas=1, domains=[f"{app}.test"], deployment=deployment)
            )
        await until(lambda: tables and len(tables[-1].domains) == len(APPS), within=30)
        where = {app: nodes[0] for app, nodes in cluster.instances().items()}
        others = [n for n in cluster.running if n != holder]
        # The node whose record will be late: one that serves some app.
        late = next(n for n in others if n in where.values())
        successor = next(n for n in others if n != late)
        live = {f"{app}.test" for app, node in where.items() if node != holder}
        assert live, where

        cluster.cut_registry(late)
        await cluster.kill(holder)
        killed_at = trio.current_time()
        await until(lambda: _no_record(cluster, late), within=NODE_TTL + 2)
        assert await cluster.wait_for_coordinator(exclude={holder}, within=3 * TTL) == successor
        became = trio.current_time()
        await trio.sleep(2.0)  # the successor renders with the late node's record missing
        assert await cluster.node_record(late) is None
        cluster.restore_registry(late)
        await until(lambda: _has_record(cluster, late), within=3 * NODE_TTL)
        # A new app: the successor has something to publish, from complete inputs now.
        deployment = Deployment(R1, ["d", "--serve"])
        await cluster.put_app(AppRecord("d", replicas=1, domains=["d.test"], deployment=deployment))
        await until(lambda: "d.test" in tables[-1].domains, within=30)
        nursery.cancel_scope.cancel()

    first_fence = tables[0].fence
    successors = [t for t in tables if t.fence != first_fence]
    assert successors, "the successor never published a table"
    for table in successors:
        assert live <= set(table.domains), (table, live)
    assert became - killed_at <= TTL + 1
    # It said why it held the table back, naming the late node.
    held = [e for node, e in cluster.events("routing.held") if node == successor]
    assert held
    assert late in str(held[0].fields["why"])


async def _no_record(cluster: Cluster, node: str) -> bool:
    return await cluster.node_record(node) is None


async def _has_record(cluster: Cluster, node: str) -> bool:
    return await cluster.node_record(node) is not None


async def test_a_record_missing_past_the_settle_time_is_an_answer(
    autojump_clock: object,
) -> None:
    """Without SWIM a record that never comes back holds the table for the settle time
    only: then the domain leaves, at that time (not at the next resync), and the held
    render is not retried in a busy loop meanwhile."""
    registry = MemoryRegistry()
    await registry.put(app_key("a"), AppRecord("a", domains=["a.test"]).encode())
    await registry.put(app_key("b"), AppRecord("b", domains=["b.test"]).encode())
    for app, node in (("a", "n1"), ("b", "n2")):
        await registry.put(
            placement_key(app), PlacementRecord([node], decided_at=0.0, fence=1).encode()
        )
        serving = {app: ServingEntry("r" * 64, 24001, 24501, state="running", ready=True)}
        record = NodeRecord(node, advertise_host=host(node), serving=serving)
        await registry.put(node_key(node), record.encode())
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())

    async def domains_are(expected: set[str]) -> bool:
        kv = await registry.get(ROUTING_KEY)
        return kv is not None and set(decode_table_json(kv.value).domains) == expected

    settle = 10.0
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry, resync=60.0, settle=settle))
        await until(lambda: domains_are({"a.test", "b.test"}), within=5)
        passes_before = (await system.ref("/routing").ask(GetRoutingState())).passes
        t0 = trio.current_time()
        await registry.delete(node_key("n2"))  # lapsed, and never registers again
        gone_at = await until(lambda: domains_are({"a.test"}), within=60)
        assert settle <= gone_at - t0 <= settle + 0.2
        state = await system.ref("/routing").ask(GetRoutingState())
        assert state.passes - passes_before <= 3  # the change, the settle time, at most one more
        events = [e for e in system.events() if e.kind == "routing.held"]
        assert len(events) == 1
        assert "b.test" in str(events[0].fields["why"])
