"""Forged SWIM claims, on the pure machine: hearsay cannot evict a member for good.

A node that holds the cluster secret speaks only as itself (the kernel refuses a
message whose ``source`` is not the authenticated peer), so everything it says
about another member is hearsay. Hearsay never makes a member ``left``, never
raises a member's incarnation above what the member announced itself, is not
spread when not believed, and never moves this node's own incarnation past its own.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.membership import MemberState, SwimConfig
from corral.actors.membership._messages import (
    MAX_INCARNATION,
    Ack,
    Gossip,
    Ping,
    StateSync,
    SwimMessage,
    Update,
)
from corral.actors.membership._swim import Swim, incarnation_ceiling, life_incarnation

LAN = SwimConfig()
START = life_incarnation(1_800_000_000.0)  # this life began at a plausible unix time
B_ANNOUNCED = 7


def settled() -> Swim:
    """Node a, knowing b (which said it is at incarnation 7), c and d first-hand."""
    swim = Swim("a", LAN, random.Random(0), 0.0, incarnation=START)
    swim.receive(Gossip("b", (), B_ANNOUNCED), 0.0)
    swim.receive(Gossip("c", (), 3), 0.0)
    swim.receive(Gossip("d", (), 4), 0.0)
    return swim


def view(swim: Swim, node: str) -> tuple[MemberState, int]:
    member = swim.member(node)
    assert member is not None
    return member.state, member.incarnation


def spread_updates(swim: Swim, now: float) -> list[Update]:
    """Every update the machine sends over a few seconds of ticking."""
    sent: list[Update] = []
    t = now
    while t < now + 5.0:
        t = max(swim.next_deadline, t + 1e-6)
        for send in swim.tick(t).sends:
            sent.extend(getattr(send.message, "updates", ()))
            sent.extend(getattr(send.message, "members", ()))
    return sent


def test_the_issues_forgery_left_at_the_cap_changes_nothing() -> None:
    swim = settled()
    forged = Update("b", "left", MAX_INCARNATION, "b")
    step = swim.receive(Gossip("c", (forged,)), 1.0)
    assert step.transitions == ()
    assert view(swim, "b") == (MemberState.ALIVE, B_ANNOUNCED)
    # Not believed, not spread; b itself is asked instead.
    assert [s.to for s in step.sends if isinstance(s.message, Ping)] == ["b"]
    about_b = [u for u in spread_updates(swim, 1.0) if u.node == "b"]
    assert all(u.state != "left" and u.incarnation <= B_ANNOUNCED for u in about_b)


def test_a_member_saying_it_left_is_believed() -> None:
    swim = settled()
    step = swim.receive(Gossip("b", (Update("b", "left", B_ANNOUNCED + 1, "b"),)), 1.0)
    assert [t.state for t in step.transitions] == [MemberState.LEFT]
    assert view(swim, "b") == (MemberState.LEFT, B_ANNOUNCED + 1)


def test_hearsay_above_what_the_member_announced_is_checked_with_the_member() -> None:
    swim = settled()
    swim.receive(Gossip("c", (Update("b", "dead", 2**40, "c"),)), 1.0)
    swim.receive(Gossip("d", (Update("b", "suspect", 2**40, "d"),)), 1.2)
    assert view(swim, "b") == (MemberState.ALIVE, B_ANNOUNCED)
    # b answers the direct ping: its ack carries its incarnation, first-hand.
    swim.receive(Ack(99, "b", (), B_ANNOUNCED + 1), 1.3)
    assert view(swim, "b") == (MemberState.ALIVE, B_ANNOUNCED + 1)
    # A real refutation relayed by c is now at b's word: believed.
    swim.receive(Gossip("c", (Update("b", "suspect", B_ANNOUNCED + 1, "c"),)), 1.4)
    assert view(swim, "b") == (MemberState.SUSPECT, B_ANNOUNCED + 1)


def test_an_honest_dead_verdict_at_the_announced_incarnation_still_counts() -> None:
    swim = settled()
    step = swim.receive(Gossip("c", (Update("b", "dead", B_ANNOUNCED, "c"),)), 1.0)
    assert [t.state for t in step.transitions] == [MemberState.DEAD]


def test_a_claim_about_us_far_above_our_incarnation_is_not_refuted_past() -> None:
    swim = settled()
    for state in ("suspect", "dead", "left", "alive"):
        swim.receive(Gossip("c", (Update("a", state, MAX_INCARNATION, "c"),)), 1.0)  # type: ignore[arg-type]
        swim.receive(Gossip("c", (Update("a", state, START + 2**41, "c"),)), 1.0)  # type: ignore[arg-type]
    assert swim.incarnation == START
    # At our incarnation it is an accusation we refute, by one.
    swim.receive(Gossip("c", (Update("a", "dead", START, "c"),)), 2.0)
    assert swim.incarnation == START + 1
    # Just above it, it is about a life that started moments before this one: move past.
    swim.receive(Gossip("c", (Update("a", "left", START + 5, "c"),)), 3.0)
    assert swim.incarnation == START + 6


def test_a_restarted_life_is_alive_at_once_whatever_was_said_of_the_last() -> None:
    swim = settled()
    swim.receive(Gossip("b", (Update("b", "left", B_ANNOUNCED + 1, "b"),)), 1.0)
    # b's new life starts at the incarnation of its start time: above every earlier one.
    new_life = life_incarnation(1_800_000_100.0)
    step = swim.receive(Ping(1, "b", "a", (), new_life), 2.0)
    assert [t.state for t in step.transitions] == [MemberState.ALIVE]
    assert view(swim, "b") == (MemberState.ALIVE, new_life)


def test_an_impostors_claim_for_a_node_id_does_not_outlive_that_nodes_next_life() -> None:
    # An impostor holding the secret authenticates under b's id: what it says of b is
    # first-hand, but never above what an honest node could announce by now.
    now = 1_800_000_000.0
    swim = settled()
    swim.ceiling = incarnation_ceiling(now)
    swim.receive(Gossip("b", (), MAX_INCARNATION), 1.0)
    assert view(swim, "b") == (MemberState.ALIVE, B_ANNOUNCED)
    assert swim.stats["incarnation above the ceiling"] == 1
    swim.receive(Gossip("b", (), swim.ceiling), 1.0)
    assert view(swim, "b") == (MemberState.ALIVE, swim.ceiling)
    # b restarts (a minute later): its new life refutes past the impostor's claim.
    b = Swim("b", LAN, random.Random(1), 2.0, incarnation=life_incarnation(now + 60))
    b.receive(Gossip("a", (Update("b", "alive", swim.ceiling, "a"),)), 2.0)
    assert b.incarnation == swim.ceiling + 1
    swim.ceiling = incarnation_ceiling(now + 61)
    swim.receive(Gossip("b", (), b.incarnation), 3.0)
    assert view(swim, "b") == (MemberState.ALIVE, b.incarnation)


def test_a_node_id_not_admitted_never_becomes_a_member() -> None:
    swim = settled()
    swim.admit({"a", "b", "c", "d", "e"})
    swim.receive(Gossip("evil", (Update("b", "left", MAX_INCARNATION, "evil"),)), 1.0)
    swim.receive(Gossip("c", (Update("ghost", "alive", 5, "c"),)), 1.0)
    swim.receive(StateSync("evil", (Update("evil", "alive", 1, "evil"),), reply=True), 1.0)
    assert swim.member("evil") is None
    assert swim.member("ghost") is None
    assert view(swim, "b") == (MemberState.ALIVE, B_ANNOUNCED)
    assert swim.stats["not admitted"] == 2
    assert swim.stats["hearsay not admitted"] == 1  # the shell reads the registry again
    # An admitted node heard of by hearsay is alive, at no incarnation it announced yet.
    swim.receive(Gossip("c", (Update("e", "alive", 2**50, "c"),)), 1.0)
    assert view(swim, "e") == (MemberState.ALIVE, 0)


_subjects = st.sampled_from(["a", "b"])
_states = st.sampled_from(["alive", "suspect", "dead", "left"])
_incarnations = st.one_of(
    st.integers(0, 12), st.just(MAX_INCARNATION), st.integers(START - 2, START + 2)
)
_forged_updates = st.builds(
    Update,
    node=_subjects,
    state=_states,
    incarnation=_incarnations,
    reporter=st.sampled_from(["a", "b", "c", "d"]),
)


@st.composite
def _forged_messages(draw: st.DrawFn) -> SwimMessage:
    speaker = draw(st.sampled_from(["c", "d"]))
    updates = tuple(draw(st.lists(_forged_updates, min_size=1, max_size=4)))
    own = draw(st.integers(0, 20))
    kind = draw(st.sampled_from(["gossip", "ping", "ack", "sync"]))
    if kind == "gossip":
        return Gossip(speaker, updates, own)
    if kind == "ping":
        return Ping(draw(st.integers(0, 50)), speaker, "a", updates, own)
    if kind == "ack":
        return Ack(draw(st.integers(0, 50)), speaker, updates, own)
    return StateSync(speaker, updates, reply=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_forged_messages(), st.floats(0.0, 2.0)), max_size=30))
def test_no_forged_hearsay_raises_an_incarnation_or_makes_a_member_leave(
    script: list[tuple[SwimMessage, float]],
) -> None:
    swim = settled()
    now = 0.0
    refutations = 0
    for msg, gap in script:
        now += gap
        while swim.next_deadline <= now:
            swim.tick(swim.next_deadline)
        before = swim.incarnation
        step = swim.receive(msg, now)
        refutations += swim.incarnation - before
        state, incarnation = view(swim, "b")
        assert state is not MemberState.LEFT
        assert incarnation <= B_ANNOUNCED
        # Claims move our own incarnation only near this life's start: never to the cap.
        assert swim.incarnation < START + 2**41 + len(script) * 4
        assert view(swim, "a") == (MemberState.ALIVE, START + refutations)
        for send in step.sends:
            for update in (*getattr(send.message, "updates", ()),):
                if update.node == "b":
                    assert update.incarnation <= B_ANNOUNCED
                    assert update.state != "left"
