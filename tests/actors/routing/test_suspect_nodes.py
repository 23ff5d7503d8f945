"""Instances on a node SWIM holds suspect leave the routing table and keep their work."""

from __future__ import annotations

from collections.abc import Mapping

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import MemberStatus
from corral.actors.routing import (
    Instance,
    MembershipChanged,
    NodeRoutes,
    RoutingInputs,
    decode_table_json,
    render_routes,
    routing_renderer_child_spec,
)
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    ROUTING_KEY,
    AppRecord,
    CoordinatorLease,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    app_key,
    node_key,
    placement_key,
)
from corral.supervision import open_actor_system

NODES = ["n1", "n2", "n3"]
REV = "a" * 64


def url(node: str) -> str:
    return f"http://10.0.0.{NODES.index(node) + 1}:24001"


def inputs_for(serving: set[str], states: Mapping[str, str]) -> RoutingInputs:
    """shop placed on every node, ready on ``serving``; SWIM as ``states`` says."""
    ready = Instance(24001, running=True, ready=True)
    return RoutingInputs(
        app_domains={"shop": ["shop.test"]},
        placements={"shop": list(NODES)},
        nodes={
            n: NodeRoutes(f"10.0.0.{NODES.index(n) + 1}", {"shop": ready} if n in serving else {})
            for n in NODES
        },
        member_states=states,
    )


def test_an_instance_on_a_suspect_node_is_held_back_and_back_when_alive() -> None:
    every = set(NODES)
    assert render_routes(inputs_for(every, {})).domains["shop.test"] == tuple(map(url, NODES))
    suspect = render_routes(inputs_for(every, {"n1": "alive", "n2": "suspect"}))
    assert suspect.domains["shop.test"] == (url("n1"), url("n3"))
    [held] = suspect.held_back
    assert (held.app, held.node) == ("shop", "n2")
    assert "SWIM holds the node suspect" in held.why
    assert "keeping its work" in held.why
    # Declared dead while its record lasts: out too, naming the state.
    dead = render_routes(inputs_for(every, {"n2": "dead"}))
    assert dead.domains["shop.test"] == (url("n1"), url("n3"))
    assert "SWIM holds the node dead" in dead.held_back[0].why
    # Alive again (refuted): listed again, nothing held back.
    back = render_routes(inputs_for(every, {"n2": "alive"}))
    assert back.domains["shop.test"] == tuple(map(url, NODES))
    assert back.held_back == ()


def test_when_every_instance_is_on_a_suspect_node_all_are_kept_rather_than_404() -> None:
    """A suspect node may only be slow, and a proxy's health checks skip a stalled one;
    leaving the domain out would be a certain 404."""
    rendered = render_routes(inputs_for({"n2", "n3"}, {"n2": "suspect", "n3": "dead"}))
    assert rendered.domains["shop.test"] == (url("n2"), url("n3"))
    assert [h.node for h in rendered.held_back] == ["n1"]  # n1 does not serve shop: as before


@settings(max_examples=200)
@given(
    st.sets(st.sampled_from(NODES)),
    st.dictionaries(st.sampled_from(NODES), st.sampled_from(["alive", "suspect", "dead", "left"])),
)
def test_suspect_nodes_are_listed_only_when_no_other_instance_serves(
    serving: set[str], states: dict[str, str]
) -> None:
    rendered = render_routes(inputs_for(serving, states))
    reachable = {url(n) for n in serving if states.get(n, "alive") not in ("suspect", "dead")}
    every = {url(n) for n in serving}
    listed = set(rendered.domains.get("shop.test", ()))
    assert listed == (reachable or every)
    held = {h.node for h in rendered.held_back if "SWIM holds" in h.why}
    assert held == ({n for n in serving if url(n) not in reachable} if reachable else set())
    # Without a SWIM view, records alone decide, as before.
    assert set(render_routes(inputs_for(serving, {})).domains.get("shop.test", ())) == every


async def test_the_renderer_drops_a_suspect_node_at_once_and_its_placement_stays(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The lease holder's renderer reads its node's SWIM view on every pass; a change of the
    view (MembershipChanged, told by the membership actor) renders at once, not at resync."""
    registry = MemoryRegistry()
    await registry.put(app_key("shop"), AppRecord("shop", domains=["shop.test"]).encode())
    await registry.put(
        placement_key("shop"), PlacementRecord(list(NODES), decided_at=0.0, fence=1).encode()
    )
    for n in NODES:
        serving = {"shop": ServingEntry(REV, 24001, 24501, state="running", ready=True)}
        record = NodeRecord(n, advertise_host=f"10.0.0.{NODES.index(n) + 1}", serving=serving)
        await registry.put(node_key(n), record.encode())
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    placement_before = await registry.get(placement_key("shop"))
    view: dict[str, MemberStatus] = {n: MemberStatus("alive") for n in NODES}

    async def backends() -> tuple[str, ...]:
        kv = await registry.get(ROUTING_KEY)
        return () if kv is None else decode_table_json(kv.value).domains.get("shop.test", ())

    async def after_tell(want: tuple[str, ...]) -> float:
        t0 = trio.current_time()
        system.ref("/routing").tell_nowait(MembershipChanged())
        with trio.fail_after(60):
            while await backends() != want:
                await trio.sleep(0.01)
        return trio.current_time() - t0

    async with open_actor_system("n1") as system:
        await system.spawn(
            routing_renderer_child_spec("n1", registry, membership=lambda: dict(view), resync=30)
        )
        with trio.fail_after(60):
            while await backends() != tuple(map(url, NODES)):
                await trio.sleep(0.01)

        view["n2"] = MemberStatus("suspect", 1)
        assert await after_tell((url("n1"), url("n3"))) < 1.0  # not the 30 s resync
        kv = await registry.get(ROUTING_KEY)
        assert kv is not None
        held = decode_table_json(kv.value).held_back
        assert [(h.node, "suspect" in h.why) for h in held] == [("n2", True)]

        view["n2"] = MemberStatus("alive", 2)  # it refuted: traffic again
        assert await after_tell(tuple(map(url, NODES))) < 1.0
        # Its work never moved: the renderer writes only the table.
        placement_after = await registry.get(placement_key("shop"))
        assert placement_after is not None
        assert placement_before is not None
        assert placement_after.mod_revision == placement_before.mod_revision
        system.ref("/routing")  # the actor is still there
