"""What the coordinator reports, and how often: the events an operator reads in
``corral events``, and the deferred moves and policy in its state."""

from __future__ import annotations

import itertools

import trio

from corral.actors.planner import Policy
from corral.actors.planner._rank import rendezvous_score
from corral.registry import AppRecord
from corral.testing import VIRTUAL_EPOCH, Cluster, open_cluster

TTL = 45.0
TICK = TTL / 3


Timed = list[tuple[float, dict[str, object]]]


def holder_events(cluster: Cluster, holder: str, kind: str) -> Timed:
    return [(e.time, dict(e.fields)) for n, e in cluster.events(kind) if n == holder]


async def test_skipped_ticks_repeat_a_pending_app_once_per_cooldown(
    autojump_clock: object,
) -> None:
    cooldown = 4 * TICK
    async with open_cluster(3, lease_ttl=TTL, policy=Policy(cooldown_s=cooldown)) as cluster:
        holder = await cluster.wait_for_coordinator()
        await cluster.put_app(AppRecord("gpu-job", selector={"gpu": "yes"}))
        await trio.sleep(12 * TICK + 1)

        pending = holder_events(cluster, holder, "placement.pending")
        _, first = pending[0]
        assert first["skipped"] is False  # the pass that ran says it at once
        repeats = pending[1:]
        assert all(fields["skipped"] is True for _, fields in repeats)
        assert all(fields["message"] == first["message"] for _, fields in repeats)
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(pending)]
        # Not every skipped tick (a 15 s gap), but once a cooldown, at the first tick after.
        assert all(cooldown <= gap < cooldown + TICK for gap in gaps)
        assert len(pending) == 3  # 12 ticks: the pass, then two reminders
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.passes.skipped >= 11


def app_that_ranks_first_on(node: str, nodes: list[str]) -> str:
    """An app name whose rendezvous score is highest on ``node``."""
    for i in itertools.count():
        name = f"app-{i}"
        if max(nodes, key=lambda n: rendezvous_score(name, n)) == node:
            return name
    raise AssertionError("unreachable")


async def test_a_cooldown_deferral_is_named_in_the_state_and_reported_once(
    autojump_clock: object,
) -> None:
    cooldown = 10 * TICK
    async with open_cluster(3, lease_ttl=TTL, policy=Policy(cooldown_s=cooldown)) as cluster:
        holder = await cluster.wait_for_coordinator()
        name = app_that_ranks_first_on("node-4", ["node-1", "node-2", "node-3", "node-4"])
        await cluster.put_app(AppRecord(name, replicas=1))
        await trio.sleep(1)
        record = await cluster.placement(name)
        assert record is not None
        (where,) = record.nodes
        placed_at = record.placed_at[where]

        await cluster.add_node("node-4")  # ranks first, but the instance is in its cooldown
        await trio.sleep(1)
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.policy == Policy(cooldown_s=cooldown)
        (deferred,) = state.deferred
        assert deferred.app == name
        assert deferred.node == where
        assert deferred.reason.startswith("cooldown: placed ")
        assert deferred.until == placed_at + cooldown
        assert placed_at + cooldown > VIRTUAL_EPOCH + trio.current_time()

        # Every tick runs again (it waits on time), but says it once.
        await trio.sleep(6 * TICK)
        events = holder_events(cluster, holder, "placement.deferred")
        assert [(f["app"], f["node"], f["until"]) for _, f in events] == [
            (name, where, placed_at + cooldown)
        ]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert [d.app for d in state.deferred] == [name]

        # Once the cooldown is over the move goes, and nothing is deferred any more.
        await trio.sleep(5 * TICK)
        record = await cluster.placement(name)
        assert record is not None
        assert record.nodes == ["node-4"]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.deferred == ()
