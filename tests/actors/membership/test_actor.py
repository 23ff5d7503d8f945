"""SwimMembership over the memory transport, on virtual time, with faults."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio

from corral.actors.membership import (
    MEMBERSHIP,
    GetMembership,
    SwimConfig,
    membership_child_spec,
    registry_seeds,
    suspicion_bounds,
)
from corral.actors.membership._actor import Leave, MembershipView
from corral.actors.membership._messages import MAX_UPDATES_PER_MESSAGE, Gossip, Update
from corral.registry import MemoryRegistry
from corral.supervision import ActorSystem, open_actor_system
from corral.transport import MemoryNetwork

LAN = SwimConfig()


class Cluster:
    def __init__(self, network: MemoryNetwork, systems: dict[str, ActorSystem]) -> None:
        self.network = network
        self.systems = systems

    async def view(self, node: str) -> MembershipView:
        view = await self.systems[node].ref(f"/{MEMBERSHIP}").ask(GetMembership())
        assert isinstance(view, MembershipView)
        return view

    async def states(self, observer: str) -> dict[str, str]:
        return {m.node: m.state for m in (await self.view(observer)).members}

    def events(self, node: str, kind: str) -> list[dict[str, object]]:
        return [e.fields for e in self.systems[node].events() if e.kind == kind]


@asynccontextmanager
async def cluster(n: int, config: SwimConfig = LAN, seed: int = 0) -> AsyncIterator[Cluster]:
    network = MemoryNetwork(random=random.Random(seed))
    ids = [f"n{i}" for i in range(n)]

    async def seeds() -> Iterable[str]:
        return ids

    systems: dict[str, ActorSystem] = {}
    async with AsyncExitStack() as stack:
        for i, node in enumerate(ids):
            spec = membership_child_spec(
                seeds=seeds,
                config=config,
                rng_factory=lambda i=i: random.Random(seed * 1000 + i),  # type: ignore[misc]
            )
            systems[node] = await stack.enter_async_context(
                open_actor_system(node, network.connect(node), children=[spec])
            )
        yield Cluster(network, systems)


async def test_a_cluster_forms_and_every_view_is_all_alive(autojump_clock: object) -> None:
    async with cluster(4) as c:
        await trio.sleep(5.0)
        for node in c.systems:
            view = await c.view(node)
            assert view.node == node
            assert view.health == 0
            assert {m.node: m.state for m in view.members} == dict.fromkeys(c.systems, "alive")
        joined = {e["member"] for e in c.events("n0", "member.alive")}
        assert joined == {"n1", "n2", "n3"}


async def test_a_killed_member_goes_down_on_every_other(autojump_clock: object) -> None:
    async with cluster(5) as c:
        await trio.sleep(10.0)
        c.network.kill("n2")
        killed_at = trio.current_time()
        _, longest, _ = suspicion_bounds(LAN, 5)
        bound = 5 * LAN.probe_interval + longest + 5.0
        down_at: dict[str, float] = {}
        while len(down_at) < 4 and trio.current_time() - killed_at <= bound:
            await trio.sleep(0.25)
            for node in ("n0", "n1", "n3", "n4"):
                if node not in down_at and (await c.states(node))["n2"] == "dead":
                    down_at[node] = trio.current_time() - killed_at
        assert sorted(down_at) == ["n0", "n1", "n3", "n4"]
        assert max(down_at.values()) <= bound
        # Each survivor says who reported the death; nobody else went down.
        for node in down_at:
            downs = c.events(node, "member.down")
            assert [e["member"] for e in downs] == ["n2"]
            assert downs[0]["reporter"] in {"n0", "n1", "n3", "n4"}
            suspects = c.events(node, "member.suspect")
            assert {e["member"] for e in suspects} == {"n2"}


async def test_a_member_stalled_less_than_the_suspicion_timeout_is_at_most_suspect(
    autojump_clock: object,
) -> None:
    async with cluster(5, seed=3) as c:
        await trio.sleep(10.0)
        low, _, _ = suspicion_bounds(LAN, 5)
        c.network.set_drop_rate(0.02)
        c.network.set_delay(0.05)
        # Cut off (its frames lost both ways) for half the shortest suspicion timeout.
        c.network.partition({"n3"}, {"n0", "n1", "n2", "n4"})
        await trio.sleep(low / 2)
        c.network.heal()
        await trio.sleep(30.0)
        for node in c.systems:
            assert set((await c.states(node)).values()) == {"alive"}, node
            assert c.events(node, "member.down") == []
            assert c.events(node, "member.left") == []
        # It was suspected, refuted, and is alive again at a higher incarnation.
        assert (await c.view("n3")).incarnation >= 1
        assert any(e["member"] == "n3" for e in c.events("n0", "member.suspect"))
        back = [
            e
            for e in c.events("n0", "member.alive")
            if e["previous"] == "suspect" and e["member"] == "n3"
        ]
        assert back
        assert back[-1]["incarnation"] == (await c.view("n3")).incarnation


async def test_a_node_that_stops_leaves_and_the_others_record_it(autojump_clock: object) -> None:
    async with cluster(3) as c:
        await trio.sleep(5.0)
        await c.systems["n1"].ref(f"/{MEMBERSHIP}").ask(Leave())
        await trio.sleep(0.5)
        for node in ("n0", "n2"):
            assert (await c.states(node))["n1"] == "left"
            (left,) = c.events(node, "member.left")
            assert left["member"] == "n1"
            assert left["reporter"] == "n1"
        # Nobody waits out a suspicion, nobody declares it down.
        await trio.sleep(30.0)
        assert c.events("n0", "member.down") == []


async def test_hostile_messages_are_refused_and_the_actor_keeps_working(
    autojump_clock: object,
) -> None:
    async with cluster(3) as c:
        await trio.sleep(3.0)
        flood = tuple(Update(f"x{i}", "alive", 0, "n2") for i in range(MAX_UPDATES_PER_MESSAGE + 1))
        target = c.systems["n2"].ref(f"/{MEMBERSHIP}", node="n0")
        await target.tell(Gossip("n2", flood))
        await target.tell(Gossip("n2", (Update("n9", "alive", -5, "n2"),)))
        await trio.sleep(3.0)
        states = await c.states("n0")
        assert sorted(states) == ["n0", "n1", "n2"]
        assert set(states.values()) == {"alive"}


async def test_registry_seeds_name_the_nodes_with_records(autojump_clock: object) -> None:
    from corral.actors.node_record import NodeIdentity
    from corral.actors.node_record._record import fresh_record
    from corral.registry import Put, node_key

    registry = MemoryRegistry()
    for node in ("b", "a"):
        record = fresh_record(
            NodeIdentity(node_id=node, peer_address=f"127.0.0.1:{9000 + ord(node)}"),
            capacity=None,
            started_at=0.0,
            previous=None,
        )
        await registry.txn([], [Put(node_key(node), record.encode())])
    assert list(await registry_seeds(registry)()) == ["a", "b"]


def test_the_child_spec_names_the_actor_membership() -> None:
    spec = membership_child_spec(seeds=None)
    assert spec.name == MEMBERSHIP
    with pytest.raises(ValueError, match="rejoin_interval"):
        membership_child_spec(seeds=None, rejoin_interval=0).factory()


async def test_nodes_that_missed_each_others_records_meet_within_seconds(
    autojump_clock: object,
) -> None:
    # a and b start at once: each one's first registry read misses the other's record
    # and finds only c's. c, later, finds both. a and b hear of each other only from c.
    network = MemoryNetwork(random=random.Random(3))
    first_read = {"a": ["a", "c"], "b": ["b", "c"], "c": ["a", "b", "c"]}
    reads: dict[str, int] = dict.fromkeys(first_read, 0)

    def seeds_of(node: str) -> Callable[[], Awaitable[Iterable[str]]]:
        async def seeds() -> Iterable[str]:
            reads[node] += 1
            return first_read[node] if reads[node] == 1 else ["a", "b", "c"]

        return seeds

    async with AsyncExitStack() as stack:
        systems = {
            node: await stack.enter_async_context(
                open_actor_system(
                    node,
                    network.connect(node),
                    children=[membership_child_spec(seeds=seeds_of(node))],
                )
            )
            for node in first_read
        }
        # Well within the 10 s between routine reads: c's word that the other is alive
        # makes each read the registry again early.
        await trio.sleep(3.0)
        for node, other in (("a", "b"), ("b", "a")):
            view = await systems[node].ref(f"/{MEMBERSHIP}").ask(GetMembership())
            assert isinstance(view, MembershipView)
            assert view.state_of(other) == "alive", (node, view.members)
            member = next(m for m in view.members if m.node == other)
            assert member.incarnation > 0, "it spoke to us first-hand"


async def test_the_view_reaches_the_hook_and_answers_a_remote_ask(autojump_clock: object) -> None:
    network = MemoryNetwork(random=random.Random(1))
    views: list[MembershipView] = []

    async def seeds() -> Iterable[str]:
        return ["a", "b"]

    async with (
        open_actor_system(
            "a",
            network.connect("a"),
            children=[membership_child_spec(seeds=seeds, on_view=views.append)],
        ) as a,
        open_actor_system("b", network.connect("b"), children=[membership_child_spec(seeds=None)]),
    ):
        await trio.sleep(3.0)
        assert views
        assert views[-1].state_of("b") == "alive"
        remote = await a.ref(f"/{MEMBERSHIP}", node="b").ask(GetMembership())
        assert isinstance(remote, MembershipView)
        assert remote.node == "b"
        assert [m.node for m in remote.members] == ["a", "b"]
        assert remote.state_of("zz") is None


async def test_views_converge_after_a_partition_heals(autojump_clock: object) -> None:
    async with cluster(4, seed=2) as c:
        await trio.sleep(5.0)
        c.network.partition({"n0", "n1"}, {"n2", "n3"})
        await trio.sleep(60.0)
        assert (await c.states("n0"))["n2"] == "dead"
        assert (await c.states("n3"))["n1"] == "dead"
        c.network.heal()
        # The seeds are offered our view again every rejoin interval (10 s).
        await trio.sleep(30.0)
        for node in c.systems:
            assert set((await c.states(node)).values()) == {"alive"}, node
        back = [e for e in c.events("n0", "member.alive") if e["previous"] == "dead"]
        assert {e["member"] for e in back} == {"n2", "n3"}
