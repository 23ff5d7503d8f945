"""Down nodes and their grace period on the in-process cluster (memory registry, virtual
time): a lost node keeps its work until the grace lapses, then it moves exactly once; a
registry blip moves nothing; the grace clock survives a coordinator hand-off; a node back
in time keeps everything."""

from __future__ import annotations

import trio

from corral.actors.coordinator import MemberStatus
from corral.actors.planner import Policy
from corral.registry import AppRecord, NodeDown, decode_record, down_key
from corral.testing import Cluster, open_cluster, until, virtual_wall_clock

TTL = 45.0  # coordinator lease and node records
TICK = TTL / 3
GRACE = 60.0
POLICY = Policy(grace_period_s=GRACE)
APPS = [f"single-{i}" for i in range(8)]


async def down_entry(cluster: Cluster, node: str) -> NodeDown | None:
    kv = await cluster.registry.get(down_key(node))
    if kv is None:
        return None
    record = decode_record(kv.key, kv.value)
    assert isinstance(record, NodeDown)
    return record


async def placed_on(cluster: Cluster, node: str) -> list[str]:
    """The apps whose placement names ``node``."""
    named = []
    for app in APPS:
        record = await cluster.placement(app)
        if record is not None and node in record.nodes:
            named.append(app)
    return named


async def setup(cluster: Cluster) -> tuple[str, str, list[str]]:
    """Place the apps; return the holder, a victim (not the holder) and its apps."""
    holder = await cluster.wait_for_coordinator()
    for app in APPS:
        await cluster.put_app(AppRecord(app, replicas=1))
    await trio.sleep(TICK + 1)
    for node in cluster.running:
        if node != holder and await placed_on(cluster, node):
            return holder, node, await placed_on(cluster, node)
    raise AssertionError("no app landed on a node other than the coordinator's")


def trio_time_of(wall: float) -> float:
    return wall - (virtual_wall_clock() - trio.current_time())


async def test_a_killed_node_is_down_then_its_apps_move_once_after_the_grace(
    autojump_clock: object,
) -> None:
    async with open_cluster(3, lease_ttl=TTL, policy=POLICY) as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        await cluster.kill(victim)
        killed_at = trio.current_time()

        # Its record lapses; with no membership view the coordinator says down, at once.
        await until(lambda: down_entry(cluster, victim), within=TTL + 2, poll=0.1)
        entry = await down_entry(cluster, victim)
        assert entry is not None
        assert entry.down_since is not None
        down_at = trio_time_of(entry.down_since)
        assert TTL * 2 / 3 <= down_at - killed_at <= TTL + 1
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (status,) = [s for s in state.node_states if s.node == victim]
        assert status.state == "down"
        assert status.down_since == entry.down_since
        assert status.grace_until == entry.down_since + GRACE
        assert status.incarnation is None
        assert status.record is False
        assert [n for n, e in cluster.events("node.down")] == [holder]

        # It keeps its work for the whole grace period ...
        assert cluster.registry.writes_under("placement/") == 0
        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE + 2, poll=0.05)
        # ... and it moves when the grace lapses, not a tick later, in one write per app.
        assert GRACE <= moved_at - down_at <= GRACE + 0.5
        assert cluster.registry.writes_under("placement/") == len(apps)
        await trio.sleep(3 * TICK)
        assert cluster.registry.writes_under("placement/") == len(apps)  # exactly once
        for app in apps:
            record = await cluster.placement(app)
            assert record is not None
            assert record.nodes
            assert victim not in record.nodes
        # Its work moved and its record is gone: the entry goes too (bounded growth).
        assert await down_entry(cluster, victim) is None
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert victim not in {s.node for s in state.node_states}


async def _none_left(cluster: Cluster, node: str) -> bool:
    return not await placed_on(cluster, node)


async def test_membership_dead_is_down_before_the_record_lapses(autojump_clock: object) -> None:
    view: dict[str, MemberStatus] = {}
    async with open_cluster(3, lease_ttl=TTL, policy=POLICY, membership=view) as cluster:
        holder, victim, apps = await setup(cluster)
        for node in cluster.running:
            view[node] = MemberStatus("alive", 1)
        cluster.registry.reset()
        await cluster.kill(victim)
        view[victim] = MemberStatus("dead", 1, since=virtual_wall_clock())
        killed_at = trio.current_time()
        await until(lambda: down_entry(cluster, victim), within=TICK + 1, poll=0.1)
        entry = await down_entry(cluster, victim)
        assert entry is not None
        assert entry.down_since is not None
        assert trio_time_of(entry.down_since) - killed_at <= TICK  # the next tick saw it
        state = await cluster.coordinator_state(holder)
        assert state is not None
        assert state.membership is True
        (status,) = [s for s in state.node_states if s.node == victim]
        assert (status.state, status.incarnation) == ("down", 1)
        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE + 2, poll=0.1)
        assert moved_at - trio_time_of(entry.down_since) >= GRACE
        assert cluster.registry.writes_under("placement/") == len(apps)


async def test_a_lapsed_record_that_membership_reaches_moves_nothing(
    autojump_clock: object,
) -> None:
    view: dict[str, MemberStatus] = {}
    async with open_cluster(3, lease_ttl=TTL, policy=POLICY, membership=view) as cluster:
        holder, victim, _apps = await setup(cluster)
        for node in cluster.running:
            view[node] = MemberStatus("alive", 1)
        cluster.registry.reset()
        # The registry is cut off from the victim: its record lapses, SWIM still reaches it.
        cluster.cut_registry(victim)
        await until(lambda: _lapsed(cluster, victim), within=TTL + 2, poll=0.1)
        await trio.sleep(GRACE * 3)
        assert cluster.registry.writes_under("placement/") == 0
        entry = await down_entry(cluster, victim)
        # Remembered for a successor (labels, capacity), never decided down.
        assert entry is not None
        assert entry.down_since is None
        assert entry.capacity is not None
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (status,) = [s for s in state.node_states if s.node == victim]
        assert (status.state, status.record) == ("alive", False)
        assert "lapsed" in status.reason
        # Reconnected: its record is back, the entry goes, still nothing moved.
        cluster.restore_registry(victim)
        await until(lambda: _no_entry(cluster, victim), within=TTL, poll=0.1)
        assert cluster.registry.writes_under("placement/") == 0


async def _lapsed(cluster: Cluster, node: str) -> bool:
    return await cluster.node_record(node) is None


async def _no_entry(cluster: Cluster, node: str) -> bool:
    return await down_entry(cluster, node) is None


async def test_a_hand_off_during_the_grace_keeps_down_since(autojump_clock: object) -> None:
    async with open_cluster(4, lease_ttl=TTL, policy=POLICY) as cluster:
        holder, victim, apps = await setup(cluster)
        await cluster.kill(victim)
        await until(lambda: down_entry(cluster, victim), within=TTL + 2, poll=0.1)
        entry = await down_entry(cluster, victim)
        assert entry is not None
        assert entry.down_since is not None
        deadline = trio_time_of(entry.down_since + GRACE)

        # Half way through the grace the coordinator hands off (a clean stop).
        await trio.sleep(GRACE / 2)
        await cluster.stop(holder)
        successor = await cluster.wait_for_coordinator(poll=0.01)
        assert successor not in (holder, victim)
        kept = await down_entry(cluster, victim)
        assert kept is not None
        assert kept.down_since == entry.down_since
        assert await placed_on(cluster, victim) == apps  # not forgotten either

        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE, poll=0.05)
        # The successor relocates at the original deadline, not a grace after taking over.
        assert deadline <= moved_at <= deadline + 0.5
        await trio.sleep(TICK)  # the next pass forgets it
        state = await cluster.coordinator_state(successor)
        assert state is not None
        statuses = {s.node: s for s in state.node_states}
        assert victim not in statuses  # relocated and forgotten
        assert statuses[holder].state == "down"  # the clean stop is a lost record too


async def test_a_node_back_before_the_grace_keeps_its_apps(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL, policy=POLICY) as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        await cluster.kill(victim)
        await until(lambda: down_entry(cluster, victim), within=TTL + 2, poll=0.1)
        await trio.sleep(GRACE / 2)
        await cluster.restart(victim)
        await until(lambda: _no_entry(cluster, victim), within=TICK, poll=0.1)
        await trio.sleep(GRACE * 2)
        assert await placed_on(cluster, victim) == apps
        assert cluster.registry.writes_under("placement/") == 0  # none of its apps moved
        assert await down_entry(cluster, victim) is None
        assert [n for n, _ in cluster.events("node.back")] == [holder]
        state = await cluster.coordinator_state(holder)
        assert state is not None
        (status,) = [s for s in state.node_states if s.node == victim]
        assert (status.state, status.down_since) == ("alive", None)


async def test_a_member_that_left_moves_at_once(autojump_clock: object) -> None:
    view: dict[str, MemberStatus] = {}
    async with open_cluster(3, lease_ttl=TTL, policy=POLICY, membership=view) as cluster:
        _holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        await cluster.stop(victim)
        view[victim] = MemberStatus("left", 2)
        left_at = trio.current_time()
        moved_at = await until(lambda: _none_left(cluster, victim), within=TICK + 1, poll=0.1)
        assert moved_at - left_at <= TICK + 0.5  # no grace for a graceful leave
        assert cluster.registry.writes_under("placement/") == len(apps)
        assert await down_entry(cluster, victim) is None
