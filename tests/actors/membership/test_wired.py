"""SWIM wired into the coordinator, on the in-process cluster (memory transport and
registry, virtual time): every node runs ``/node/membership`` and its coordinator reads its
own SWIM view, as ``corral node run`` wires them.

* a member that stalls for less than the suspicion timeout is at most suspect: nothing moves;
* a killed member goes down (SWIM dead), and its work moves exactly once, after the grace;
* a coordinator hand-off during the grace keeps ``down_since``;
* the registry cut off from one live node moves nothing: SWIM still reaches it;
* a clean stop leaves: its work moves at once, no grace;
* a peer holding the secret forges evictions (issue 25, item 1): a made-up node id is
  not admitted, a message claiming another node's id is refused by the kernel, a
  registered forger's hearsay above the victim's own incarnation is not believed, and
  its dead/suspect at the real incarnation is refuted within one suspicion timeout;
  no placement moves;
* a node restarted right after a clean stop is alive everywhere at once, and an
  impostor under a stopped node's id cannot push it out of reach of its next life.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

import trio

from corral.actors.coordinator import NodeStatus
from corral.actors.membership import GetMembership, SwimConfig, suspicion_bounds
from corral.actors.membership._actor import MembershipView
from corral.actors.membership._messages import (
    MAX_INCARNATION,
    Gossip,
    Ping,
    StateSync,
    SwimMessage,
    Update,
)
from corral.actors.membership._swim import incarnation_ceiling
from corral.actors.planner import Policy
from corral.registry import AppRecord, NodeDown, NodeRecord, decode_record, down_key, node_key
from corral.supervision import ActorSystem, SupervisionError, open_actor_system
from corral.testing import Cluster, open_cluster, until, virtual_wall_clock
from corral.transport import MemoryNetwork, TransportError

TTL = 45.0  # coordinator lease
NODE_TTL = 15.0  # node records
TICK = TTL / 3
GRACE = 60.0
POLICY = Policy(grace_period_s=GRACE)
SWIM = SwimConfig()
NODES = 4
MIN_SUSPICION, MAX_SUSPICION, _ = suspicion_bounds(SWIM, NODES)
APPS = [f"single-{i}" for i in range(8)]


async def down_entry(cluster: Cluster, node: str) -> NodeDown | None:
    kv = await cluster.registry.get(down_key(node))
    if kv is None:
        return None
    record = decode_record(kv.key, kv.value)
    assert isinstance(record, NodeDown)
    return record


async def placed_on(cluster: Cluster, node: str) -> list[str]:
    named = []
    for app in APPS:
        record = await cluster.placement(app)
        if record is not None and node in record.nodes:
            named.append(app)
    return named


async def status_of(cluster: Cluster, holder: str, node: str) -> NodeStatus:
    state = await cluster.coordinator_state(holder)
    assert state is not None
    (status,) = [s for s in state.node_states if s.node == node]
    return status


def trio_time_of(wall: float) -> float:
    return wall - (virtual_wall_clock() - trio.current_time())


def cluster_of(network: MemoryNetwork | None = None) -> AbstractAsyncContextManager[Cluster]:
    return open_cluster(
        NODES,
        lease_ttl=TTL,
        node_lease_ttl=NODE_TTL,
        policy=POLICY,
        swim=SWIM,
        network=network,
    )


async def setup(cluster: Cluster) -> tuple[str, str, list[str]]:
    """SWIM converged and the apps placed; the holder, a victim (not the holder) with
    work, and the victim's apps."""
    holder = await cluster.wait_for_coordinator()
    await cluster.wait_for_members(within=30)
    for app in APPS:
        await cluster.put_app(AppRecord(app, replicas=1))
    await trio.sleep(TICK + 1)
    for node in cluster.running:
        if node != holder and await placed_on(cluster, node):
            return holder, node, await placed_on(cluster, node)
    raise AssertionError("no app landed on a node other than the coordinator's")


def states_seen(cluster: Cluster, node: str) -> set[str]:
    """Every state any node's SWIM reported ``node`` in (member.* events)."""
    return {
        event.kind.removeprefix("member.")
        for _, event in cluster.events()
        if event.kind.startswith("member.") and event.fields.get("member") == node
    }


async def test_a_stall_shorter_than_the_suspicion_timeout_is_at_most_suspect(
    autojump_clock: object,
) -> None:
    network = MemoryNetwork(random=random.Random(7))
    async with cluster_of(network) as cluster:
        holder, victim, apps = await setup(cluster)
        network.set_delay(0.02)
        network.set_drop_rate(0.02)
        cluster.registry.reset()
        # A SIGSTOP-like stall: no message and no registry call gets through for a while.
        others = [n for n in cluster.running if n != victim]
        cluster.partition({victim}, others)
        cluster.cut_registry(victim, hang=True)
        await trio.sleep(MIN_SUSPICION / 2)
        cluster.heal()
        cluster.restore_registry(victim)
        await trio.sleep(MAX_SUSPICION + GRACE + TICK)
        assert "down" not in states_seen(cluster, victim)
        assert states_seen(cluster, victim) <= {"alive", "suspect"}
        assert cluster.registry.writes_under("placement/") == 0
        assert await down_entry(cluster, victim) is None
        assert await placed_on(cluster, victim) == apps
        status = await status_of(cluster, holder, victim)
        assert status.state == "alive"
        since = status.since
        assert isinstance(since, float)
        assert since <= virtual_wall_clock()  # SWIM's wall clock is the harness's
        assert cluster.events("node.down") == []


async def test_a_killed_member_is_down_then_its_work_moves_once_after_the_grace(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        await cluster.kill(victim)
        killed_at = trio.current_time()

        bound = SWIM.probe_interval * 3 + MAX_SUSPICION
        await until(lambda: down_entry(cluster, victim), within=bound)
        entry = await down_entry(cluster, victim)
        assert entry is not None
        assert entry.down_since is not None
        down_at = trio_time_of(entry.down_since)
        # Found by SWIM (probe, then the suspicion timeout), well before its record lapses.
        assert down_at - killed_at <= bound
        assert down_at - killed_at < NODE_TTL
        status = await status_of(cluster, holder, victim)
        assert status.state == "down"
        assert status.reason == "membership declared it dead"
        assert isinstance(status.incarnation, int)
        assert "down" in states_seen(cluster, victim)

        assert cluster.registry.writes_under("placement/") == 0
        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE + 2)
        assert GRACE <= moved_at - down_at <= GRACE + 0.5
        assert cluster.registry.writes_under("placement/") == len(apps)
        await trio.sleep(3 * TICK)
        assert cluster.registry.writes_under("placement/") == len(apps)  # exactly once


async def _none_left(cluster: Cluster, node: str) -> bool:
    return not await placed_on(cluster, node)


async def test_a_coordinator_hand_off_during_the_grace_keeps_down_since(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        holder, victim, _ = await setup(cluster)
        await cluster.kill(victim)
        await until(lambda: down_entry(cluster, victim), within=3 + MAX_SUSPICION)
        entry = await down_entry(cluster, victim)
        assert entry is not None
        assert entry.down_since is not None
        await trio.sleep(GRACE / 3)
        # The holder stops cleanly mid-grace: it hands the lease back and leaves SWIM.
        await cluster.stop(holder)
        successor = await cluster.wait_for_coordinator(exclude={holder})
        await until(lambda: _state_in(cluster, successor, victim, "down"), within=TICK + 1)
        status = await status_of(cluster, successor, victim)
        assert status.down_since == entry.down_since  # not restarted by the successor
        after = await down_entry(cluster, victim)
        assert after is not None
        assert after.down_since == entry.down_since
        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE)
        assert GRACE <= moved_at - trio_time_of(entry.down_since) <= GRACE + 0.5


async def _state_in(cluster: Cluster, holder: str, node: str, state: str) -> bool:
    current = await cluster.coordinator_state(holder)
    if current is None or not current.coordinating:
        return False
    return any(s.node == node and s.state == state for s in current.node_states)


async def test_the_registry_cut_off_from_a_live_node_moves_nothing(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        cluster.cut_registry(victim)
        await until(lambda: _no_record(cluster, victim), within=NODE_TTL + 2)
        await trio.sleep(GRACE + TICK)
        status = await status_of(cluster, holder, victim)
        assert status.state == "alive"
        assert status.record is False
        assert "lapsed but membership still reaches it" in str(status.reason)
        assert cluster.registry.writes_under("placement/") == 0
        assert await placed_on(cluster, victim) == apps
        assert cluster.events("node.down") == []
        assert states_seen(cluster, victim) == {"alive"}


async def _no_record(cluster: Cluster, node: str) -> bool:
    return await cluster.node_record(node) is None


async def test_a_clean_stop_leaves_and_its_work_moves_at_once(autojump_clock: object) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        stopped_at = trio.current_time()
        await cluster.stop(victim)
        moved_at = await until(lambda: _none_left(cluster, victim), within=GRACE)
        assert moved_at - stopped_at <= 2.0  # not the grace: it left
        assert "left" in states_seen(cluster, victim)
        assert "down" not in states_seen(cluster, victim)
        assert cluster.registry.writes_under("placement/") == len(apps)
        assert cluster.events("node.down") == []
        left = [e for n, e in cluster.events("member.left") if n == holder]
        assert left
        assert left[0].fields["member"] == victim


async def test_a_killed_member_back_within_the_grace_is_alive_and_kept_its_work(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        cluster.registry.reset()
        await cluster.kill(victim)
        await until(lambda: down_entry(cluster, victim), within=3 + MAX_SUSPICION)
        await trio.sleep(GRACE / 4)
        await cluster.restart(victim)  # a new life: it refutes the old death
        await until(lambda: _state_in(cluster, holder, victim, "alive"), within=GRACE / 2)
        status = await status_of(cluster, holder, victim)
        assert isinstance(status.incarnation, int)
        assert status.incarnation >= 1
        await until(lambda: _no_entry(cluster, victim), within=TICK + 1)
        await trio.sleep(GRACE)
        assert cluster.registry.writes_under("placement/") == 0
        assert await placed_on(cluster, victim) == apps


async def test_a_node_restarted_after_a_clean_stop_is_alive_at_once_everywhere(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        _holder, victim, _apps = await setup(cluster)
        before = max(inc for _, inc in incarnations_of(cluster, victim).values())
        await cluster.stop(victim)

        def left_everywhere() -> bool:
            seen = incarnations_of(cluster, victim).values()
            return all(state == "left" for state, _ in seen)

        await until(left_everywhere, within=2.0)
        await cluster.restart(victim)  # at once: the same virtual millisecond, maybe
        restarted = trio.current_time()

        def alive_everywhere() -> bool:
            seen = incarnations_of(cluster, victim).values()
            return all(state == "alive" and inc > before for state, inc in seen)

        back = await until(alive_everywhere, within=SWIM.probe_interval * 10)
        # Its new life starts above the old one's goodbye: no refutation round is needed.
        assert back - restarted <= SWIM.probe_interval


async def _no_entry(cluster: Cluster, node: str) -> bool:
    return await down_entry(cluster, node) is None


# ---------------------------------------------------------------------- forging peers

MEMBERSHIP_PATH = "/node/membership"


async def forge(
    system: ActorSystem, targets: Sequence[str], messages: Sequence[SwimMessage]
) -> None:
    """Tell each target node's membership actor every message (losses are the forger's)."""
    for target in targets:
        for msg in messages:
            try:
                await system.ref(MEMBERSHIP_PATH, node=target).tell(msg)
            except (TransportError, SupervisionError):
                pass


async def forge_for(
    system: ActorSystem, cluster: Cluster, messages: Sequence[SwimMessage], seconds: float
) -> None:
    """Forge every second for ``seconds``."""
    end = trio.current_time() + seconds
    while trio.current_time() < end:
        await forge(system, cluster.running, messages)
        await trio.sleep(1.0)


def incarnations_of(cluster: Cluster, node: str) -> dict[str, tuple[str, int]]:
    """Every other running node's (state, incarnation) of ``node``."""
    return {
        observer: (status.state, status.incarnation)
        for observer in cluster.running
        if observer != node
        for member, status in cluster.feeds[observer].statuses().items()
        if member == node
    }


async def views_of(cluster: Cluster, node: str) -> dict[str, tuple[str, int]]:
    """Every other running node's (state, incarnation) of ``node``, asked of its
    membership actor."""
    seen: dict[str, tuple[str, int]] = {}
    for observer in cluster.running:
        if observer == node:
            continue
        view = await cluster.node(observer).membership.ask(GetMembership())
        assert isinstance(view, MembershipView)
        for member in view.members:
            if member.node == node:
                seen[observer] = (member.state, member.incarnation)
    return seen


def evictions(victim: str, forger: str, claimer: str) -> list[SwimMessage]:
    """The issue's forgery and its variants, sent by ``forger``; the last two claim to
    come from ``claimer`` and from the victim itself."""
    cap = MAX_INCARNATION
    return [
        Gossip(forger, (Update(victim, "left", cap, victim),)),
        Gossip(forger, (Update(victim, "dead", cap, forger),)),
        Gossip(forger, (Update(victim, "suspect", cap, forger),)),
        Gossip(forger, (Update(victim, "alive", cap, victim),)),
        Gossip(forger, (Update(victim, "dead", 2**40, forger), Update(victim, "left", 0, victim))),
        StateSync(forger, (Update(victim, "left", cap, victim),), reply=True),
        Gossip(claimer, (Update(victim, "left", cap, victim),), cap),
        Ping(1, victim, claimer, (Update(victim, "left", cap, victim),), cap),
    ]


async def test_a_made_up_node_id_forging_evictions_moves_nothing(autojump_clock: object) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        claimer = next(n for n in cluster.running if n not in (holder, victim))
        before = await views_of(cluster, victim)
        assert {state for state, _ in before.values()} == {"alive"}
        cluster.registry.reset()
        async with open_actor_system("evil", cluster.network.connect("evil")) as evil:
            await forge_for(evil, cluster, evictions(victim, "evil", claimer), MAX_SUSPICION + 5)
        await trio.sleep(MAX_SUSPICION)
        assert await views_of(cluster, victim) == before
        assert states_seen(cluster, victim) == {"alive"}
        assert all("evil" not in cluster.member_states(n) for n in cluster.running)
        assert cluster.registry.writes_under("placement/") == 0
        assert await placed_on(cluster, victim) == apps
        # The kernel refused every message that spoke as another node.
        refused = [
            event
            for _, event in cluster.events("transport.rejected")
            if "may speak only as itself" in str(event.fields.get("reason"))
        ]
        assert refused


async def test_a_registered_forgers_hearsay_moves_nothing(autojump_clock: object) -> None:
    async with cluster_of() as cluster:
        holder, victim, apps = await setup(cluster)
        claimer = next(n for n in cluster.running if n not in (holder, victim))
        # The forger has a record: it is admitted as a member, and every claim it makes
        # about another node is hearsay.
        await cluster.registry.put(node_key("mallory"), NodeRecord(id="mallory").encode())
        before = await views_of(cluster, victim)
        cluster.registry.reset()
        async with open_actor_system("mallory", cluster.network.connect("mallory")) as mallory:
            await forge_for(
                mallory, cluster, evictions(victim, "mallory", claimer), MAX_SUSPICION + 5
            )
            assert await views_of(cluster, victim) == before
            assert states_seen(cluster, victim) == {"alive"}
            # Suspect and dead at the victim's real incarnation are ordinary SWIM: the
            # victim hears it and refutes, within one suspicion timeout.
            (incarnation,) = {inc for _, inc in before.values()}
            accused = trio.current_time()
            await forge(
                mallory,
                cluster.running,
                [
                    Gossip("mallory", (Update(victim, "dead", incarnation, "mallory"),)),
                    Gossip("mallory", (Update(victim, "suspect", incarnation, "mallory"),)),
                ],
            )

            async def all_alive_again() -> bool:
                seen = (await views_of(cluster, victim)).values()
                return all(state == "alive" and inc > incarnation for state, inc in seen)

            back = await until(all_alive_again, within=MIN_SUSPICION)
            assert back - accused < MIN_SUSPICION
        assert states_seen(cluster, victim) <= {"alive", "suspect", "down"}
        assert "left" not in states_seen(cluster, victim)
        assert cluster.registry.writes_under("placement/") == 0
        assert await placed_on(cluster, victim) == apps


async def test_an_impostor_under_a_stopped_nodes_id_does_not_outlive_its_restart(
    autojump_clock: object,
) -> None:
    async with cluster_of() as cluster:
        _holder, victim, _apps = await setup(cluster)
        await cluster.stop(victim)
        # A process holding the secret takes the stopped node's id (it is still a known
        # member): its word about that id is first-hand, so it is capped by the ceiling
        # an honest node could reach, not by anything it says.
        ceiling = incarnation_ceiling(virtual_wall_clock())
        async with open_actor_system(victim, cluster.network.connect(victim)) as impostor:
            await forge(
                impostor,
                cluster.running,
                [
                    Gossip(victim, (), MAX_INCARNATION),
                    Gossip(victim, (Update(victim, "alive", MAX_INCARNATION, victim),), ceiling),
                ],
            )
            await trio.sleep(1.0)
        assert all(inc <= ceiling for _, inc in (await views_of(cluster, victim)).values())
        await cluster.restart(victim)
        restarted = trio.current_time()

        async def alive_above_the_impostor() -> bool:
            # Asked of each membership actor: a raised incarnation with no change of state
            # is no transition, so the feed may still show the one before.
            seen = (await views_of(cluster, victim)).values()
            return bool(seen) and all(state == "alive" and inc > ceiling for state, inc in seen)

        back = await until(alive_above_the_impostor, within=MIN_SUSPICION)
        assert back - restarted < MIN_SUSPICION
