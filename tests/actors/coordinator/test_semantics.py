"""What the Coordinator does with each kind of planner answer (harness, memory registry,
virtual time): a paused pass, a shortfall, a retired app, a refused drain, refused
relocations."""

from __future__ import annotations

from typing import Any

import trio

from corral.actors.planner import Pause, Policy, Refusal
from corral.actors.planner._types import RefusedDrain
from corral.actors.reconciler._plan import STOP_NOT_SERVED
from corral.registry import (
    AppRecord,
    Deployment,
    EventType,
    NodeIntent,
    app_key,
    intent_key,
    placement_key,
)
from corral.testing import Cluster, agent_node_children, open_cluster, until

TTL = 45.0
TICK = TTL / 3
R1 = "1" * 64


async def placed_nodes(cluster: Cluster, app: str) -> list[str] | None:
    record = await cluster.placement(app)
    return None if record is None else list(record.nodes)


async def put_app(cluster: Cluster, name: str, **fields: Any) -> None:
    await cluster.put_app(AppRecord(name, **fields))


def deployed(**fields: Any) -> dict[str, Any]:
    return {"deployment": Deployment(R1, ["app"]), **fields}


def holder_events(cluster: Cluster, holder: str, kind: str) -> list[dict[str, Any]]:
    return [dict(e.fields) for n, e in cluster.events(kind) if n == holder]


async def test_a_paused_pass_writes_nothing_and_names_the_keys(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "web", replicas=2)
        await put_app(cluster, "api", replicas="all")
        await trio.sleep(TICK + 1)
        web = await cluster.placement("web")
        api = await cluster.placement("api")
        assert web is not None
        assert api is not None

        # A newer build's record appears; meanwhile "web" is retired and "api" deleted,
        # which an unpaused pass would act on. This one must not.
        await cluster.registry.put(app_key("future"), b'{"v": 2, "name": "future"}')
        await cluster.registry.put(placement_key("broken"), b"\x00 not a record")
        await put_app(cluster, "web", replicas=2, retired=True)
        await cluster.registry.delete(app_key("api"))
        await put_app(cluster, "new")
        cluster.registry.reset()
        await trio.sleep(2 * TICK)

        assert cluster.registry.writes_under("placement/") == 0
        assert await cluster.placement("web") == web
        assert await cluster.placement("api") == api
        assert await cluster.placement("new") is None
        paused = holder_events(cluster, holder, "placement.paused")
        assert paused
        assert paused[0]["keys"] == ["apps/future", "placement/broken"]
        assert "apps/future" in paused[0]["message"]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.last_pass.outcome in ("paused", "skipped")
        assert state.paused == Pause(tuple(paused[0]["keys"]), paused[0]["message"])
        assert holder_events(cluster, holder, "coordinator.pass")[-1]["outcome"] == "paused"

        # Once every key reads again, the pass acts: retired and deleted apps lose theirs.
        await cluster.registry.delete(app_key("future"))
        await cluster.registry.delete(placement_key("broken"))
        await trio.sleep(TICK)
        assert await cluster.placement("web") is None
        assert await cluster.placement("api") is None
        assert await cluster.placement("new") is not None
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.paused is None


async def test_a_shortfall_writes_what_fits_and_reports_the_rest(autojump_clock: object) -> None:
    fast = {"tier": "fast"}
    labels = {"node-1": fast, "node-2": fast}
    async with open_cluster(3, lease_ttl=TTL, labels=labels) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "db", replicas=3, selector=fast)
        await trio.sleep(TICK + 1)

        assert await placed_nodes(cluster, "db") == ["node-1", "node-2"]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (unplaced,) = state.unplaced
        assert unplaced.app == "db"
        assert unplaced.reason == "placement-unavailable"
        assert unplaced.message == (
            "cannot place 1 of 3 replica(s) of db: of 2 matching node(s): 2 already run it"
        )
        pending = holder_events(cluster, holder, "placement.pending")
        assert pending
        assert {e["message"] for e in pending} == {unplaced.message}
        assert all(e["app"] == "db" for e in pending)


async def test_a_retired_app_loses_its_record_first_and_stops(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL, children=agent_node_children) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "web", **deployed(replicas=2))
        await until(lambda: len(cluster.instances().get("web", [])) == 2, within=3 * TTL, poll=0.1)
        running = cluster.instances()["web"]
        assert await placed_nodes(cluster, "web") == running

        changes: list[tuple[int, EventType, str]] = []

        async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            start = await cluster.registry.revision() + 1
            async with cluster.registry.watch("placement/", start) as events:
                task_status.started()
                async for event in events:
                    changes.append((event.kv.mod_revision, event.type, event.kv.key))

        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            # One pass sees both: "web" retired and "api" new.
            await put_app(cluster, "web", **deployed(replicas=2, retired=True))
            await put_app(cluster, "api", **deployed(replicas=1))
            await until(lambda: len(changes) >= 2, within=3 * TTL, poll=0.1)
            await until(lambda: "web" not in cluster.instances(), within=3 * TTL, poll=0.1)
            nursery.cancel_scope.cancel()

        assert [(kind, key) for _, kind, key in changes] == [
            (EventType.DELETE, "placement/web"),
            (EventType.PUT, "placement/api"),
        ]
        assert changes[0][0] <= changes[1][0]  # the removal landed first (same txn, or before)
        assert await cluster.placement("web") is None
        stops = [(n, e.fields) for n, e in cluster.events("reconcile.stop")]
        assert sorted(n for n, _ in stops) == running
        assert {f["app"] for _, f in stops} == {"web"}
        assert {f["reason"] for _, f in stops} == {STOP_NOT_SERVED}
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.unplaced == ()  # retired is not unplaced


async def test_a_drain_that_would_interrupt_pinned_work_is_refused(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "db", replicas=1, pinned=True)
        await put_app(cluster, "web", replicas="all")
        await trio.sleep(TICK + 1)
        db_nodes = await placed_nodes(cluster, "db")
        assert db_nodes is not None
        (where,) = db_nodes
        web_before = await cluster.placement("web")

        cluster.registry.reset()
        await cluster.registry.put(intent_key(where), NodeIntent(draining=True).encode())
        await trio.sleep(TICK)

        assert cluster.registry.writes_under("placement/") == 0  # nothing moved
        assert await placed_nodes(cluster, "db") == [where]
        assert await cluster.placement("web") == web_before  # it keeps web too
        (refused,) = holder_events(cluster, holder, "placement.refused")
        assert refused["reason"] == "drain-would-interrupt-pinned"
        assert refused["drains"] == [{"node": where, "apps": ["db"]}]
        assert f"drain of {where} refused" in refused["message"]
        assert "db" in refused["message"]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.refused == Refusal(
            refused["reason"], refused["message"], (RefusedDrain(where, ("db",)),)
        )


async def test_refused_relocations_keep_and_strand_what_ran_on_vanished_nodes(
    autojump_clock: object,
) -> None:
    # A short grace: the lapsed nodes are down at once, and past their grace a second later.
    async with open_cluster(3, lease_ttl=TTL, policy=Policy(grace_period_s=1.0)) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "web", replicas="all")
        await trio.sleep(TICK + 1)
        assert await placed_nodes(cluster, "web") == ["node-1", "node-2", "node-3"]

        # Two of three node records lapse at once: the coordinator most likely lost sight
        # of them, so it keeps their work where it is and says so.
        others = [n for n in cluster.running if n != holder]
        for node in others:
            await cluster.kill(node)
        cluster.registry.reset()
        await trio.sleep(TTL + TICK + 1)

        assert cluster.registry.writes_under("placement/") == 0
        assert await placed_nodes(cluster, "web") == ["node-1", "node-2", "node-3"]
        refused = holder_events(cluster, holder, "placement.refused")
        assert refused
        assert refused[-1]["reason"] == "too-few-usable-nodes"
        assert "1 of 3 known node(s) usable" in refused[-1]["message"]
        stranded = holder_events(cluster, holder, "placement.stranded")
        assert {(e["app"], e["node"]) for e in stranded} == {("web", n) for n in others}
        assert all("relocations are refused" in e["reason"] for e in stranded)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert {(e.app, e.node) for e in state.stranded} == {("web", n) for n in others}
        assert state.refused.reason == "too-few-usable-nodes"


async def test_a_forced_drain_stops_pinned_work_and_never_starts_it_elsewhere(
    autojump_clock: object,
) -> None:
    async with open_cluster(3, lease_ttl=TTL, children=agent_node_children) as cluster:
        holder = await cluster.wait_for_coordinator()
        await put_app(cluster, "db", **deployed(replicas=1, pinned=True))
        await put_app(cluster, "logs", **deployed(replicas="all"))
        await until(
            lambda: "db" in cluster.instances() and "logs" in cluster.instances(),
            within=3 * TTL,
            poll=0.1,
        )
        (where,) = cluster.instances()["db"]
        forced = NodeIntent(cordoned=True, draining=True, force=True)
        await cluster.registry.put(intent_key(where), forced.encode())

        await until(lambda: "db" not in cluster.instances(), within=3 * TTL, poll=0.1)
        await until(
            lambda: where not in cluster.instances().get("logs", [where]), within=3 * TTL, poll=0.1
        )
        await trio.sleep(3 * TICK)  # later passes start it nowhere else either
        assert "db" not in cluster.instances()
        assert sorted(cluster.instances()["logs"]) == sorted(set(cluster.running) - {where})
        db_starts = {n for n, e in cluster.launch_timeline() if e.app == "db" and e.kind == "start"}
        assert db_starts == {where}
        record = await cluster.placement("db")
        assert record is not None
        assert record.nodes == []
        assert where in record.placed_at  # what remembers that the instance is its node's

        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.refused is None
        (stranded,) = state.stranded
        assert (stranded.app, stranded.node) == ("db", where)
        assert stranded.reason.startswith(
            f"the forced drain of {where} stopped it; db is pinned, so it is not started elsewhere"
        )
        assert state.unplaced == ()
        events = holder_events(cluster, holder, "placement.stranded")
        assert [(e["app"], e["node"]) for e in events] == [("db", where)]  # said once

        # Ending the drain starts it on its own node again.
        await cluster.registry.delete(intent_key(where))
        await until(lambda: cluster.instances().get("db") == [where], within=3 * TTL, poll=0.1)
        record = await cluster.placement("db")
        assert record is not None
        assert record.nodes == [where]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.stranded == ()
