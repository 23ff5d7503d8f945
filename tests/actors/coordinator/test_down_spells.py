"""Each down spell starts its own grace clock (issue 26: a kill moved work before the grace,
the ``down_since`` of an earlier spell reused), on the in-process cluster with SWIM on every
node (memory transport and registry, virtual time):

* a node cut off (its record lapses, SWIM finds it), back, then killed: its work moves a
  grace after the kill's spell began, not after the cut's;
* the same when no coordinator saw it back (the lease holder crashed while it came back and
  was lost again): the successor starts a new clock from the entry's incarnation;
* a one-way cut of another host (it hears the others, nobody hears it), healed, then a kill:
  the killed node's work moves a grace after its own spell began, and the cut host keeps
  everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import trio

from corral.actors.membership import SwimConfig, suspicion_bounds
from corral.actors.planner import Policy
from corral.registry import AppRecord, NodeDown, decode_record, down_key
from corral.testing import Cluster, open_cluster, virtual_wall_clock

NODES = 4
TTL = 15.0  # coordinator lease: a crashed holder's lapses within it
TICK = TTL / 3
NODE_TTL = 3.0  # node records lapse before SWIM's suspicion timeout ends
GRACE = 60.0
SWIM = SwimConfig()
_, MAX_SUSPICION, _ = suspicion_bounds(SWIM, NODES)
#: Killed or cut off -> down in the holder's view: a probe round, then the suspicion timeout.
DETECT = NODES * SWIM.probe_interval + MAX_SUSPICION
APPS = [f"single-{i}" for i in range(8)]


@asynccontextmanager
async def swim_cluster() -> AsyncIterator[Cluster]:
    async with open_cluster(
        NODES,
        lease_ttl=TTL,
        node_lease_ttl=NODE_TTL,
        policy=Policy(grace_period_s=GRACE),
        swim=SWIM,
    ) as cluster:
        yield cluster


async def until(predicate: Callable[[], object], *, within: float, poll: float = 0.05) -> float:
    """Wait until ``predicate`` (sync or async) is truthy; the trio time it became so."""
    with trio.fail_after(within):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return trio.current_time()
            await trio.sleep(poll)


async def down_entry(cluster: Cluster, node: str) -> NodeDown | None:
    kv = await cluster.registry.get(down_key(node))
    if kv is None:
        return None
    record = decode_record(kv.key, kv.value)
    assert isinstance(record, NodeDown)
    return record


async def no_entry(cluster: Cluster, node: str) -> bool:
    return await down_entry(cluster, node) is None


async def down_since(cluster: Cluster, node: str) -> float | None:
    entry = await down_entry(cluster, node)
    return None if entry is None else entry.down_since


async def placed_on(cluster: Cluster, node: str) -> list[str]:
    named = []
    for app in APPS:
        record = await cluster.placement(app)
        if record is not None and node in record.nodes:
            named.append(app)
    return named


async def none_left(cluster: Cluster, node: str) -> bool:
    return not await placed_on(cluster, node)


def trio_time_of(wall: float) -> float:
    return wall - (virtual_wall_clock() - trio.current_time())


def incarnation_of(cluster: Cluster, observer: str, node: str) -> tuple[str, int] | None:
    status = cluster.feeds[observer].statuses().get(node)
    return None if status is None else (status.state, status.incarnation)


def alive_above(cluster: Cluster, observers: Iterable[str], node: str, incarnation: int) -> bool:
    """Whether every observer's SWIM has ``node`` alive above ``incarnation`` (it refuted)."""
    for observer in observers:
        seen = incarnation_of(cluster, observer, node)
        if seen is None or seen[0] != "alive" or seen[1] <= incarnation:
            return False
    return True


async def setup(cluster: Cluster) -> tuple[str, str, list[str]]:
    """SWIM converged and the apps placed: the holder, a victim (not the holder) with work,
    and the victim's apps."""
    holder = await cluster.wait_for_coordinator()
    await cluster.wait_for_members(within=30)
    for app in APPS:
        await cluster.put_app(AppRecord(app, replicas=1))
    await trio.sleep(TICK + 1)
    for node in cluster.running:
        if node != holder and await placed_on(cluster, node):
            return holder, node, await placed_on(cluster, node)
    raise AssertionError("no app landed on a node other than the coordinator's")


async def cut_off(cluster: Cluster, victim: str) -> NodeDown:
    """Cut ``victim`` from the network and the registry until the lease holder has it down
    (SWIM suspects it, its record lapses); the entry written."""
    cluster.partition([victim], [n for n in cluster.running if n != victim])
    cluster.cut_registry(victim)
    await until(lambda: down_since(cluster, victim), within=NODE_TTL + DETECT)
    entry = await down_entry(cluster, victim)
    assert entry is not None
    return entry


async def moves_a_grace_after_its_spell_began(
    cluster: Cluster, victim: str, killed_at: float
) -> NodeDown:
    """After a kill at ``killed_at``: the victim's entry is a spell begun after the kill (no
    earlier spell's), and its work moves exactly a grace after it, so no earlier than a
    grace after the kill."""
    killed_wall = killed_at + (virtual_wall_clock() - trio.current_time())

    async def new_spell_or_moved() -> bool:
        return await _later_than(cluster, victim, killed_wall) or await none_left(
            cluster, victim
        )

    await until(new_spell_or_moved, within=TTL + DETECT + NODE_TTL)
    waited = trio.current_time() - killed_at
    assert await placed_on(cluster, victim), (
        f"its work moved {waited:.1f} s after the kill, within the grace ({GRACE} s)"
    )
    entry = await down_entry(cluster, victim)
    assert entry is not None
    assert entry.down_since is not None
    began = trio_time_of(entry.down_since)
    # It keeps its work through the grace, and it moves when the grace lapses.
    moved_at = await until(lambda: none_left(cluster, victim), within=GRACE + 1)
    assert GRACE <= moved_at - began <= GRACE + 0.5
    assert moved_at - killed_at >= GRACE
    return entry


async def _later_than(cluster: Cluster, node: str, wall: float) -> bool:
    since = await down_since(cluster, node)
    return since is not None and since > wall


async def test_cut_off_back_then_killed_moves_a_grace_after_the_kill(
    autojump_clock: object,
) -> None:
    async with swim_cluster() as cluster:
        holder, victim, apps = await setup(cluster)
        first = await cut_off(cluster, victim)
        assert first.down_since is not None
        before = incarnation_of(cluster, holder, victim)
        assert before is not None
        # Back within the grace: it refutes, renews its record, and its entry goes.
        cluster.heal()
        cluster.restore_registry(victim)
        await until(lambda: alive_above(cluster, [holder], victim, before[1]), within=DETECT)
        await until(lambda: no_entry(cluster, victim), within=TICK)
        assert await placed_on(cluster, victim) == apps
        # A while later (the cut's grace long past), it is killed.
        await trio.sleep(GRACE)
        await cluster.kill(victim)
        killed_at = trio.current_time()
        await moves_a_grace_after_its_spell_began(cluster, victim, killed_at)


async def test_a_comeback_no_coordinator_saw_starts_a_new_grace(autojump_clock: object) -> None:
    async with swim_cluster() as cluster:
        holder, victim, _ = await setup(cluster)
        before = incarnation_of(cluster, holder, victim)
        assert before is not None
        first = await cut_off(cluster, victim)
        assert first.down_since is not None
        await trio.sleep(GRACE / 2)  # down for half its grace
        # The lease holder crashes: nobody coordinates until its lease lapses ...
        await cluster.kill(holder)
        witnesses = [n for n in cluster.running if n != victim]
        # ... while the victim comes back (it refutes its death at a higher incarnation) ...
        cluster.heal()
        cluster.restore_registry(victim)
        await until(lambda: alive_above(cluster, witnesses, victim, before[1]), within=DETECT)
        assert await cluster.coordinators() == []  # nobody saw it back
        assert await down_entry(cluster, victim) == first
        # ... and is lost again before a successor took over.
        await cluster.kill(victim)
        killed_at = trio.current_time()
        await cluster.wait_for_coordinator(exclude={holder})
        # Reusing the cut's clock would move its work a grace after the cut: about half a
        # grace after the kill.
        second = await moves_a_grace_after_its_spell_began(cluster, victim, killed_at)
        # The new spell is reported as such.
        downs = [
            e.fields["down_since"]
            for _, e in cluster.events("node.down")
            if e.fields["node"] == victim
        ]
        assert downs == [first.down_since, second.down_since]


async def test_a_one_way_cut_of_another_host_then_a_kill_moves_after_the_grace(
    autojump_clock: object,
) -> None:
    async with swim_cluster() as cluster:
        holder, victim, _ = await setup(cluster)
        cut = next(n for n in cluster.running if n not in (holder, victim))
        cut_apps = await placed_on(cluster, cut)
        assert cut_apps
        others = [n for n in cluster.running if n != cut]
        # The cut host hears the others, nobody hears it: the others find it dead ...
        cluster.network.cut_one_way([cut], others)
        await until(lambda: down_since(cluster, cut), within=DETECT)
        entry = await down_entry(cluster, cut)
        assert entry is not None
        assert entry.down_since is not None
        await trio.sleep(GRACE / 4)
        # ... and when it is heard again it is alive, its entry gone, its work kept.
        cluster.network.heal()
        await until(lambda: no_entry(cluster, cut), within=DETECT)
        await until(
            lambda: {s.state for s in cluster.feeds[holder].statuses().values()} == {"alive"},
            within=DETECT,
        )
        assert await placed_on(cluster, cut) == cut_apps
        # Later another host is killed: its own spell, its own grace.
        await trio.sleep(GRACE)
        await cluster.kill(victim)
        killed_at = trio.current_time()
        await moves_a_grace_after_its_spell_began(cluster, victim, killed_at)
        assert set(cut_apps) <= set(await placed_on(cluster, cut))
        assert await down_entry(cluster, cut) is None
