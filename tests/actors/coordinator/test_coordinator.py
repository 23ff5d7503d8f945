"""The Coordinator actor on the in-process cluster, memory registry, virtual time."""

from __future__ import annotations

import trio

from corral.actors.coordinator import GetCoordinatorState, KickCoordinator
from corral.actors.coordinator import coordinator_child_spec as coordinator_spec
from corral.actors.planner import Policy
from corral.registry import (
    AppRecord,
    NodeIntent,
    app_key,
    intent_key,
)
from corral.supervision import ChildSpec, SupervisorSpec
from corral.testing import Cluster, NodeContext, open_cluster

TTL = 45.0
TICK = TTL / 3


def applied_passes(cluster: Cluster, node: str) -> list[dict[str, object]]:
    return [
        e.fields
        for n, e in cluster.events("coordinator.pass")
        if n == node and e.fields["outcome"] != "skipped"
    ]


async def test_one_coordinator_across_crashes_and_clean_stops(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        samples: list[list[str]] = []

        async def monitor() -> None:
            while True:
                samples.append(await cluster.coordinators())
                await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor)
            first = await cluster.wait_for_coordinator()
            await trio.sleep(2 * TICK + 1)

            # A clean stop hands over within one round: no virtual time passes.
            t0 = trio.current_time()
            await cluster.stop(first)
            second = await cluster.wait_for_coordinator(exclude={first}, poll=0.001)
            assert trio.current_time() - t0 < 0.01

            # A crash: nothing is handed back, the successor waits out the TTL.
            await trio.sleep(TICK / 2)
            state = await cluster.coordinator_state(second)
            assert state is not None
            t1 = trio.current_time()
            await cluster.kill(second)
            third = await cluster.wait_for_coordinator(exclude={first, second}, poll=0.01)
            took = trio.current_time() - t1
            assert TTL - TICK <= took <= TTL + 0.05  # lapses a TTL after its last renewal

            # The crashed node comes back: a follower now, and the fence only grows.
            await cluster.restart(second)
            await cluster.restart(first)
            await trio.sleep(3 * TICK)
            nursery.cancel_scope.cancel()

        assert await cluster.coordinators() == [third]
        assert max(len(s) for s in samples) == 1
        intervals = cluster.assert_single_coordinator()
        assert [i.node for i in intervals] == [first, second, third]
        states = await cluster.coordinator_states()
        assert {s.holder for s in states.values() if s} == {third}


async def test_paused_holder_writes_nothing_after_its_lease_lapsed(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        old = await cluster.wait_for_coordinator()
        old_state = await cluster.coordinator_state(old)
        assert old_state is not None
        old_fence = old_state.fence

        # The holder's next write hangs in flight (a paused process, a partition).
        cluster.cut_registry(old, hang=True, ops={"txn"})
        await cluster.put_app(AppRecord("alpha"))
        await cluster.node(old).coordinator.tell(KickCoordinator("test"))
        await trio.sleep(1.0)
        # The operator deletes the app before the stuck write lands: nothing but
        # the fence guard now stands between that write and the registry.
        await cluster.registry.delete(app_key("alpha"))

        new = await cluster.wait_for_coordinator(exclude={old}, poll=0.01)
        new_state = await cluster.coordinator_state(new)
        assert new_state is not None
        assert new_state.fence > old_fence
        failed_before = cluster.registry.failed_txns

        cluster.restore_registry(old)  # the stale write arrives now
        await trio.sleep(1.0)
        assert cluster.registry.failed_txns == failed_before + 1
        assert await cluster.placement("alpha") is None
        old_after = await cluster.coordinator_state(old)
        assert old_after is not None
        assert old_after.coordinating is False
        assert old_after.holder == new
        lost = [e for n, e in cluster.events("coordinator.lost") if n == old]
        assert len(lost) == 1
        assert "rejected" in lost[0].fields["error"]
        cluster.assert_single_coordinator()


async def test_lost_renewal_stops_coordinating_before_the_next_write(
    autojump_clock: object,
) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        old = await cluster.wait_for_coordinator()
        await trio.sleep(1.0)
        cluster.cut_registry(old)  # refused: the next renewal fails
        await cluster.put_app(AppRecord("beta"))
        await trio.sleep(TICK)
        state = await cluster.coordinator_state(old)
        assert state is not None
        assert state.coordinating is False
        assert state.last_pass is None or state.last_pass.counts.get("writes", 0) == 0
        new = await cluster.wait_for_coordinator(exclude={old}, poll=0.01)
        await trio.sleep(1.0)
        record = await cluster.placement("beta")
        assert record is not None
        new_state = await cluster.coordinator_state(new)
        assert new_state is not None
        assert record.fence == new_state.fence
        cluster.restore_registry(old)
        await trio.sleep(2 * TICK)
        assert await cluster.coordinators() == [new]
        cluster.assert_single_coordinator()


async def test_unchanged_ticks_write_nothing(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("web", replicas=2))
        await cluster.put_app(AppRecord("api", replicas="all"))
        await trio.sleep(TICK + 1)
        assert (await cluster.placement("web")) is not None
        before = await cluster.coordinator_state(holder)
        assert before is not None
        cluster.registry.reset()

        await trio.sleep(10 * TICK)
        assert cluster.registry.writes == 0
        assert cluster.registry.failed_txns == 0
        after = await cluster.coordinator_state(holder)
        assert after is not None
        assert after.passes.applied == before.passes.applied
        assert after.passes.skipped == before.passes.skipped + 10
        assert after.last_pass.skipped is True
        assert after.last_pass.digest == before.last_pass.digest

        # A deploy (new revision, domains, labels) is not a planner input: still nothing.
        web = AppRecord("web", replicas=2, domains=["web.example"], labels={"rev": "2"})
        await cluster.put_app(web)
        cluster.registry.reset()
        await trio.sleep(2 * TICK)
        assert cluster.registry.writes == 0
        final = await cluster.coordinator_state(holder)
        assert final is not None
        assert final.passes.applied == before.passes.applied


async def test_adding_a_node_triggers_exactly_one_pass(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("everywhere", replicas="all"))
        await trio.sleep(2 * TICK)
        record = await cluster.placement("everywhere")
        assert record is not None
        assert record.nodes == ["node-1", "node-2", "node-3"]
        passes = len(applied_passes(cluster, holder))

        await cluster.add_node("node-4")
        await trio.sleep(5 * TICK)
        new_passes = applied_passes(cluster, holder)[passes:]
        assert len(new_passes) == 1
        assert new_passes[0]["writes"] == 1
        record = await cluster.placement("everywhere")
        assert record is not None
        assert record.nodes == ["node-1", "node-2", "node-3", "node-4"]
        assert record.placed_at["node-4"] > record.placed_at["node-1"]


async def test_selector_matching_nothing_is_unplaced_never_written(
    autojump_clock: object,
) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("gpu-job", selector={"gpu": "yes"}))
        await trio.sleep(3 * TICK + 1)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert [u.app for u in state.unplaced] == ["gpu-job"]
        (unplaced,) = state.unplaced
        assert unplaced.reason == "placement-unavailable"
        assert "gpu" in unplaced.message
        assert await cluster.placement("gpu-job") is None
        # Reported by the pass that ran; the skipped ticks after it do not repeat it
        # within the cooldown (see test_events for the rule).
        pending = [e for n, e in cluster.events("placement.pending") if n == holder]
        assert len(pending) == 1
        assert pending[0].fields["message"] == unplaced.message
        assert pending[0].fields["skipped"] is False

        # A node carrying the label joins: the app is placed, and no longer listed.
        await cluster.add_node("node-9", labels={"gpu": "yes"})
        await trio.sleep(TICK + 1)
        record = await cluster.placement("gpu-job")
        assert record is not None
        assert record.nodes == ["node-9"]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.unplaced == ()


async def test_no_live_node_reports_placement_unavailable(autojump_clock: object) -> None:
    def coordinators_only(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
        return [coordinator_spec(ctx.node_id, ctx.registry, ctx.policy, ctx.lease_ttl)]

    async with open_cluster(1, lease_ttl=TTL, children=coordinators_only) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("lonely"))
        await trio.sleep(TICK + 1)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        # The watch ran the deciding pass at once; the tick after it skipped.
        decided = [e.fields for _, e in cluster.events("coordinator.pass")][-1]
        assert decided["outcome"] == "placement-unavailable"
        assert decided["trigger"] == "watch"
        assert "no live node" in decided["error"]
        assert state.last_pass.outcome == "skipped"
        assert [u.app for u in state.unplaced] == ["lonely"]
        assert await cluster.placement("lonely") is None
        assert cluster.events("placement.unavailable")


async def test_undecodable_key_pauses_the_pass(autojump_clock: object) -> None:
    async with open_cluster(2, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.registry.put(app_key("future"), b'{"v": 2, "name": "future"}')
        await cluster.put_app(AppRecord("now"))
        await trio.sleep(TICK + 1)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.last_pass.outcome in ("paused", "skipped")
        assert state.paused is not None
        assert await cluster.placement("now") is None
        (paused,) = [e for _, e in cluster.events("placement.paused")]
        assert paused.fields["keys"] == ["apps/future"]
        await cluster.registry.delete(app_key("future"))
        await trio.sleep(TICK)
        assert await cluster.placement("now") is not None


async def test_drain_and_cordon_intents_feed_node_states(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("all-of-them", replicas="all"))
        await trio.sleep(TICK + 1)
        await cluster.registry.put(intent_key("node-2"), NodeIntent(draining=True).encode())
        await trio.sleep(TICK)
        record = await cluster.placement("all-of-them")
        assert record is not None
        assert record.nodes == ["node-1", "node-3"]
        # Cordoned keeps its work but takes none: a new app skips it.
        await cluster.registry.put(intent_key("node-3"), NodeIntent(cordoned=True).encode())
        await cluster.put_app(AppRecord("later", replicas="all"))
        await trio.sleep(TICK)
        assert (await cluster.placement("all-of-them")).nodes == [  # type: ignore[union-attr]
            "node-1",
            "node-3",
        ]
        assert (await cluster.placement("later")).nodes == ["node-1"]  # type: ignore[union-attr]


async def test_deferred_moves_are_events_and_keep_passes_running(autojump_clock: object) -> None:
    # A short grace: the lost node's work is due to move soon after it is down.
    policy = Policy(disruption_budget=0, grace_period_s=1.0)
    async with open_cluster(3, lease_ttl=TTL, policy=policy) as cluster:
        holder = await cluster.wait_for_coordinator()
        names = [f"single-{i}" for i in range(6)]
        for name in names:
            await cluster.put_app(AppRecord(name, replicas=1))
        await trio.sleep(TICK + 1)
        placed = {name: await cluster.placement(name) for name in names}
        # One app that does not run on the coordinator's own node.
        app, where = next(
            (name, record.nodes[0])
            for name, record in placed.items()
            if record is not None and record.nodes != [holder]
        )
        await cluster.kill(where)
        await trio.sleep(TTL + 2 * TICK)  # its record lapses; the move is held back
        deferred = [e for _, e in cluster.events("placement.deferred")]
        assert deferred
        assert app in {e.fields["app"] for e in deferred}
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.last_pass.skipped is False  # waiting on time: never skipped
        assert (await cluster.placement(app)).nodes == [where]  # type: ignore[union-attr]
        named = [d for d in state.deferred if d.app == app]
        assert [(d.node, d.until) for d in named] == [(where, None)]  # budget: no end
        assert named[0].reason.startswith("disruption budget")
        # The passes keep running, but the same deferral is said once (within the cooldown).
        assert len([e for e in deferred if e.fields["app"] == app]) == 1


async def test_restarted_holder_reclaims_its_own_stale_lease(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.kill(holder)
        t0 = trio.current_time()
        await cluster.restart(holder)
        await cluster.wait_for_coordinator(poll=0.01)
        assert trio.current_time() - t0 < 1.0  # not a whole TTL
        cluster.assert_single_coordinator()


async def test_state_answers_for_followers(autojump_clock: object) -> None:
    async with open_cluster(2, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        follower = next(n for n in cluster.running if n != holder)
        state = await cluster.node(follower).coordinator.ask(GetCoordinatorState())
        holder_state = await cluster.coordinator_state(holder)
        assert holder_state is not None
        assert state.coordinating is False
        assert state.holder == holder
        assert state.fence == holder_state.fence
        assert state.last_pass is None
        assert state.unplaced == ()
