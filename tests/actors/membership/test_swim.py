"""The pure SWIM + Lifeguard machine: every transition, with no event loop."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.membership import MemberState, SwimConfig, suspicion_bounds, suspicion_timeout
from corral.actors.membership._messages import (
    MAX_UPDATES_PER_MESSAGE,
    Ack,
    Gossip,
    Nack,
    Ping,
    PingReq,
    StateSync,
    SwimMessage,
    Update,
)
from corral.actors.membership._swim import Send, Step, Swim, Transition, retransmit_limit

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberState.ALIVE,
    MemberState.SUSPECT,
    MemberState.DEAD,
    MemberState.LEFT,
)
LAN = SwimConfig()


def machine(
    me: str = "a", others: tuple[str, ...] = ("b", "c"), config: SwimConfig = LAN, seed: int = 0
) -> Swim:
    swim = Swim(me, config, random.Random(seed), 0.0)
    swim.receive(Gossip(others[0], tuple(Update(n, "alive", 0, n) for n in others)), 0.0)
    return swim


def sends_of(step: Step, kind: type) -> list[Send]:
    return [s for s in step.sends if isinstance(s.message, kind)]


def run_probe_until_ping(swim: Swim, now: float) -> tuple[Ping, str, float]:
    """Tick at the next probe time and return the ping, its target and the time."""
    for _ in range(10_000):
        now = swim.next_deadline if swim.next_deadline > now else now
        step = swim.tick(now)
        pings = sends_of(step, Ping)
        if pings:
            ping = pings[0].message
            assert isinstance(ping, Ping)
            return ping, pings[0].to, now
        now += 1e-6
    raise AssertionError("no ping within 10 000 ticks")


def fail_probe(
    swim: Swim, now: float, pending: tuple[Ping, str, float] | None = None
) -> tuple[str, float, tuple[Ping, str, float] | None]:
    """Run one probe nobody answers: (its target, its end, the next probe's ping if it started)."""
    _, target, start = pending if pending is not None else run_probe_until_ping(swim, now)
    end = start + swim.probe_interval()
    t = start
    following = None
    while t < end:
        t = min(swim.next_deadline, end)
        step = swim.tick(t)
        pings = sends_of(step, Ping)
        if t == end and pings:
            assert isinstance(pings[0].message, Ping)
            following = (pings[0].message, pings[0].to, t)
    return target, end, following


# ---------------------------------------------------------------------- settings


def test_defaults_are_memberlists_lan_profile() -> None:
    assert (LAN.probe_interval, LAN.probe_timeout, LAN.indirect_checks) == (1.0, 0.5, 3)
    assert (LAN.suspicion_mult, LAN.suspicion_max_timeout_mult, LAN.awareness_max) == (4, 6, 8)
    assert (LAN.gossip_interval, LAN.gossip_nodes, LAN.retransmit_mult) == (0.2, 3, 4)
    assert LAN.lifeguard
    assert not LAN.plain().lifeguard


@pytest.mark.parametrize(
    ("field", "value"),
    [("probe_interval", 0.0), ("probe_timeout", 2.0), ("suspicion_mult", 0), ("max_piggyback", 65)],
)
def test_bad_settings_are_refused_with_the_field_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SwimConfig(**{field: value})  # type: ignore[arg-type]


def test_formulas() -> None:
    assert suspicion_timeout(LAN, 1) == 4.0
    assert suspicion_timeout(LAN, 10) == 4.0
    assert suspicion_timeout(LAN, 100) == pytest.approx(8.0)
    assert retransmit_limit(LAN, 8) == 4
    assert retransmit_limit(LAN, 64) == 8
    assert retransmit_limit(LAN, 256) == 12
    low, high, k = suspicion_bounds(LAN, 64)
    assert (low, high, k) == (
        pytest.approx(4 * math.log10(64)),
        pytest.approx(24 * math.log10(64)),
        2,
    )
    # Too few members to confirm, or Lifeguard off: the timer is the minimum.
    assert suspicion_bounds(LAN, 3) == (4.0, 4.0, 0)
    assert suspicion_bounds(LAN.plain(), 64)[1:] == (pytest.approx(4 * math.log10(64)), 0)


# ---------------------------------------------------------------------- joining


def test_a_newly_heard_member_is_a_transition_from_unknown_to_alive() -> None:
    swim = Swim("a", LAN, random.Random(0), 0.0)
    step = swim.receive(Gossip("b", (Update("b", "alive", 3, "b"),)), 1.0)
    assert step.transitions == (Transition("b", None, ALIVE, 3, "b", 1.0),)
    assert swim.member("b") is not None
    assert [v.node for v in swim.view()] == ["a", "b"]


def test_join_offers_our_view_to_unknown_seeds_and_they_answer_with_theirs() -> None:
    a = Swim("a", LAN, random.Random(0), 0.0)
    b = machine("b", ("c",))
    step = a.join(["a", "b", "b"], 0.0)
    assert [s.to for s in step.sends] == ["b"]
    offer = step.sends[0].message
    assert isinstance(offer, StateSync)
    assert offer.reply
    answer = b.receive(offer, 0.0)
    assert [t.node for t in answer.transitions] == ["a"]
    reply = answer.sends[0].message
    assert isinstance(reply, StateSync)
    assert not reply.reply
    learned = a.receive(reply, 0.0)
    assert sorted(t.node for t in learned.transitions) == ["b", "c"]
    # Known alive seeds are not offered to again.
    assert a.join(["b", "c"], 1.0).sends == ()


# ---------------------------------------------------------------------- probing


def test_an_acked_probe_changes_nothing() -> None:
    swim = machine()
    ping, target, now = run_probe_until_ping(swim, 0.0)
    assert ping.target == target
    assert target in ("b", "c")
    swim.receive(Ack(ping.seq, target), now + 0.01)
    end = now + 1.0
    assert swim.tick(end).transitions == ()
    assert swim.member(target).state is ALIVE  # type: ignore[union-attr]


def test_no_ack_asks_relays_then_suspects_then_declares_dead() -> None:
    swim = machine(others=("b", "c", "d", "e"))
    _ping, target, start = run_probe_until_ping(swim, 0.0)
    step = swim.tick(start + 0.5)
    reqs = sends_of(step, PingReq)
    assert len(reqs) == 3
    assert all(isinstance(r.message, PingReq) and r.message.target == target for r in reqs)
    assert all(r.to not in ("a", target) for r in reqs)
    assert all(r.message.nack for r in reqs)  # type: ignore[union-attr]
    step = swim.tick(start + 1.0)
    assert Transition(target, ALIVE, SUSPECT, 0, "a", start + 1.0) in step.transitions
    # Three nacks expected, none heard: our own health is in doubt.
    assert swim.health == 3
    deadline = swim.suspicion_deadline(target)
    _low, high, _ = suspicion_bounds(LAN, 5)
    assert deadline == pytest.approx(start + 1.0 + high)
    swim.tick(deadline - 0.001)
    assert swim.member(target).state is SUSPECT  # type: ignore[union-attr]
    step = swim.tick(deadline)  # type: ignore[arg-type]
    assert Transition(target, SUSPECT, DEAD, 0, "a", deadline) in step.transitions  # type: ignore[arg-type]


def test_an_indirect_ack_saves_the_target_and_nacks_spare_our_health() -> None:
    swim = machine(others=("b", "c", "d", "e"))
    ping, target, start = run_probe_until_ping(swim, 0.0)
    reqs = sends_of(swim.tick(start + 0.5), PingReq)
    swim.receive(Nack(ping.seq, reqs[0].to), start + 0.9)
    swim.receive(Nack(ping.seq, reqs[1].to), start + 0.9)
    step = swim.tick(start + 1.0)
    assert swim.member(target).state is SUSPECT  # type: ignore[union-attr]
    assert step.transitions[0].reporter == "a"
    assert swim.health == 1  # one of three nacks missing

    other = machine(others=("b", "c", "d", "e"))
    ping, target, start = run_probe_until_ping(other, 0.0)
    other.tick(start + 0.5)
    other.receive(Ack(ping.seq, "c"), start + 0.7)  # relayed by c
    assert other.tick(start + 1.0).transitions == ()
    assert other.member(target).state is ALIVE  # type: ignore[union-attr]


def test_a_relay_pings_for_the_asker_forwards_the_ack_or_nacks() -> None:
    relay = machine("r", ("a", "t"))
    step = relay.receive(PingReq(7, "a", "t", nack=True), 10.0)
    (ping,) = sends_of(step, Ping)
    assert ping.to == "t"
    assert isinstance(ping.message, Ping)
    step = relay.receive(Ack(ping.message.seq, "t"), 10.1)
    (ack,) = sends_of(step, Ack)
    assert ack.to == "a"
    assert ack.message.seq == 7
    # A silent target: a nack at 80 % of the probe timeout.
    step = relay.receive(PingReq(8, "a", "t", nack=True), 20.0)
    assert sends_of(relay.tick(20.0 + 0.39), Nack) == []
    (nack,) = sends_of(relay.tick(20.0 + 0.4), Nack)
    assert nack.to == "a"
    assert nack.message == Nack(8, "r")


def test_probe_order_is_a_shuffled_round_robin() -> None:
    others = tuple(f"n{i}" for i in range(7))
    swim = machine(others=others)
    now, targets = 0.0, []
    for _ in range(14):
        ping, target, now = run_probe_until_ping(swim, now)
        swim.receive(Ack(ping.seq, target), now)
        targets.append(target)
        now += 0.01
    assert sorted(targets[:7]) == sorted(others)
    assert sorted(targets[7:]) == sorted(others)


def test_a_ping_to_a_suspect_carries_the_suspicion_first() -> None:
    patient = dataclasses.replace(LAN, suspicion_mult=10)  # b stays suspect for the test
    for config, told in ((patient, True), (patient.plain(), False)):
        swim = machine(others=("b", "c", "d", "e"), config=config)
        swim.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 0.0)
        ping_to_b = None
        now = 0.0
        while ping_to_b is None and now < 9.5:
            now = round(now + 0.05, 2)
            for send in swim.tick(now).sends:
                msg = send.message
                if isinstance(msg, Ping):
                    if send.to == "b" and now >= 0.5:
                        ping_to_b = msg
                    swim.receive(Ack(msg.seq, send.to), now)
        assert ping_to_b is not None, "b was not probed in time"
        assert swim.member("b").state is SUSPECT  # type: ignore[union-attr]
        # The gossip ticks spent the queued update; only the buddy system still tells b.
        assert (Update("b", "suspect", 0, "c") in ping_to_b.updates) is told
        if told:
            assert ping_to_b.updates[0] == Update("b", "suspect", 0, "c")


# ---------------------------------------------------------------------- incarnations


def test_the_suspect_refutes_with_a_higher_incarnation() -> None:
    swim = machine()
    step = swim.receive(Gossip("b", (Update("a", "suspect", 0, "b"),)), 5.0)
    assert step.transitions == ()
    assert swim.incarnation == 1
    assert swim.health == 1
    ping, _, _ = run_probe_until_ping(swim, 5.0)
    assert Update("a", "alive", 1, "a") in ping.updates
    # A claim of death about an incarnation ahead of ours (an earlier life's): jump past it.
    swim.receive(Gossip("c", (Update("a", "dead", 6, "c"),)), 6.0)
    assert swim.incarnation == 7
    assert swim.member("a").state is ALIVE  # type: ignore[union-attr]
    # One far beyond this life's start is nobody's to make: it moves nothing (jumping
    # past it would let others drive us to the cap).
    swim.receive(Gossip("c", (Update("a", "dead", 2**45, "c"),)), 7.0)
    assert swim.incarnation == 7


def test_a_refutation_clears_the_suspicion_at_the_others() -> None:
    swim = machine()
    swim.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 1.0)
    assert swim.member("b").state is SUSPECT  # type: ignore[union-attr]
    step = swim.receive(Gossip("b", (Update("b", "alive", 1, "b"),)), 2.0)
    assert step.transitions == (Transition("b", SUSPECT, ALIVE, 1, "b", 2.0),)
    assert swim.suspicion_deadline("b") is None


@pytest.mark.parametrize(
    ("have", "claim", "speaker", "result"),
    [
        # hearsay: y relays a claim about b
        (("alive", 2), ("alive", 1), "y", (ALIVE, 2)),
        (("alive", 2), ("alive", 3), "y", (ALIVE, 2)),  # above what b announced
        (("alive", 2), ("suspect", 1), "y", (ALIVE, 2)),
        (("alive", 2), ("suspect", 2), "y", (SUSPECT, 2)),
        (("alive", 2), ("suspect", 3), "y", (ALIVE, 2)),  # above what b announced
        (("alive", 2), ("dead", 1), "y", (ALIVE, 2)),
        (("alive", 2), ("dead", 2), "y", (DEAD, 2)),
        (("alive", 2), ("left", 2), "y", (ALIVE, 2)),  # only b says b left
        (("suspect", 2), ("alive", 2), "y", (SUSPECT, 2)),
        (("suspect", 2), ("alive", 3), "y", (SUSPECT, 2)),
        (("suspect", 2), ("dead", 2), "y", (DEAD, 2)),
        (("dead", 2), ("alive", 2), "y", (DEAD, 2)),
        (("dead", 2), ("suspect", 3), "y", (DEAD, 2)),
        (("dead", 2), ("alive", 3), "y", (DEAD, 2)),
        (("dead", 2), ("left", 2), "y", (DEAD, 2)),
        (("left", 2), ("dead", 3), "y", (LEFT, 2)),
        (("left", 2), ("alive", 3), "y", (LEFT, 2)),
        # first-hand: b about itself
        (("alive", 2), ("alive", 3), "b", (ALIVE, 3)),
        (("suspect", 2), ("alive", 2), "b", (SUSPECT, 2)),
        (("suspect", 2), ("alive", 3), "b", (ALIVE, 3)),
        (("dead", 2), ("alive", 3), "b", (ALIVE, 3)),
        (("dead", 2), ("left", 2), "b", (LEFT, 2)),
        (("left", 2), ("alive", 3), "b", (ALIVE, 3)),
        (("alive", 2), ("left", 2), "b", (LEFT, 2)),
        (("alive", 2), ("dead", 2), "b", (ALIVE, 2)),  # no member says that of itself
    ],
)
def test_incarnation_ordering(
    have: tuple[str, int],
    claim: tuple[str, int],
    speaker: str,
    result: tuple[MemberState, int],
) -> None:
    swim = Swim("a", LAN, random.Random(0), 0.0)
    swim.receive(Gossip("b", (Update("b", "alive", have[1], "b"),), have[1]), 0.0)
    if have[0] == "left":
        swim.receive(Gossip("b", (Update("b", "left", have[1], "b"),), have[1]), 0.0)
    elif have[0] != "alive":
        swim.receive(Gossip("x", (Update("b", have[0], have[1], "x"),)), 0.0)  # type: ignore[arg-type]
    assert swim.member("b").state.value == have[0]  # type: ignore[union-attr]
    update = Update("b", claim[0], claim[1], speaker)  # type: ignore[arg-type]
    swim.receive(Gossip(speaker, (update,)), 1.0)
    view = swim.member("b")
    assert view is not None
    assert (view.state, view.incarnation) == result


def test_a_member_held_dead_that_talks_is_told_and_refutes_at_once() -> None:
    a = machine(others=("b", "c"))
    a.receive(Gossip("c", (Update("b", "dead", 0, "c"),)), 1.0)
    assert a.member("b").state is DEAD  # type: ignore[union-attr]
    b = machine("b", ("a", "c"))
    # b wakes from a pause and probes a, which holds it dead: a says so right away.
    step = a.receive(Ping(7, "b", "a"), 2.0)
    told = [s for s in sends_of(step, Gossip) if s.to == "b"]
    assert [t.message for t in told] == [Gossip("a", (Update("b", "dead", 0, "a"),))]
    b.receive(told[0].message, 2.0)
    assert b.incarnation == 1
    # Its refutation travels on what it sends next; a takes it and tells it no more.
    ping, _target, when = run_probe_until_ping(b, 2.0)
    assert Update("b", "alive", 1, "b") in ping.updates
    a.receive(Gossip("b", (Update("b", "alive", 1, "b"),)), when)
    assert a.member("b").state is ALIVE  # type: ignore[union-attr]
    assert sends_of(a.receive(Ping(8, "b", "a"), when + 1), Gossip) == []
    # A member that left, or one alive, is never told it is dead.
    assert sends_of(a.receive(Gossip("c", ()), when + 1), Gossip) == []


def test_graceful_leave_tells_everyone_and_they_record_left() -> None:
    a = machine()
    step = a.leave(3.0)
    assert sorted(s.to for s in step.sends) == ["b", "c"]
    assert step.wake_at == math.inf
    b = machine("b", ("a", "c"))
    got = b.receive(step.sends[0].message, 3.0)
    assert got.transitions == (Transition("a", ALIVE, LEFT, 1, "a", 3.0),)
    # A node that left answers nothing more.
    assert a.receive(Ping(1, "b", "a"), 4.0).sends == ()


# ---------------------------------------------------------------------- Lifeguard


def test_suspicion_timeout_shrinks_with_confirmations_to_the_minimum() -> None:
    swim = machine(others=("b", "c", "d", "e", "f", "g", "h", "i", "j", "k"))
    low, high, k = suspicion_bounds(LAN, 11)
    assert (low, high, k) == (
        pytest.approx(4.0 * math.log10(11)),
        pytest.approx(24 * math.log10(11)),
        2,
    )
    swim.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 10.0)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + high)
    # The original reporter does not count again; nor does any reporter twice.
    swim.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 11.0)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + high)
    swim.receive(Gossip("d", (Update("b", "suspect", 0, "d"),)), 12.0)
    one = high - math.log(2) / math.log(3) * (high - low)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + one)
    swim.receive(Gossip("d", (Update("b", "suspect", 0, "d"),)), 12.5)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + one)
    swim.receive(Gossip("e", (Update("b", "suspect", 0, "e"),)), 13.0)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + low)
    # k reached: more confirmations change nothing.
    swim.receive(Gossip("f", (Update("b", "suspect", 0, "f"),)), 13.5)
    assert swim.suspicion_deadline("b") == pytest.approx(10.0 + low)
    # A confirmation arriving after the minimum has passed ends the suspicion at once.
    late = machine(others=("b", "c", "d", "e", "f"))
    late.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 0.0)
    late.receive(Gossip("d", (Update("b", "suspect", 0, "d"),)), 20.0)
    late.receive(Gossip("e", (Update("b", "suspect", 0, "e"),)), 21.0)
    assert late.suspicion_deadline("b") == pytest.approx(suspicion_bounds(LAN, 6)[0])
    assert Transition("b", SUSPECT, DEAD, 0, "a", 21.0) in late.tick(21.0).transitions


def test_without_lifeguard_the_suspicion_timeout_is_fixed() -> None:
    swim = machine(others=("b", "c", "d", "e"), config=LAN.plain())
    swim.receive(Gossip("c", (Update("b", "suspect", 0, "c"),)), 10.0)
    swim.receive(Gossip("d", (Update("b", "suspect", 0, "d"),)), 11.0)
    assert swim.suspicion_deadline("b") == pytest.approx(14.0)


def test_local_health_is_bounded_and_stretches_interval_and_timeout() -> None:
    swim = machine(others=tuple("bcdefghi"))
    now, pending = 0.0, None
    for expected in (3, 6, 7):  # three nacks missing per failed probe, capped at 7
        _, now, pending = fail_probe(swim, now, pending)
        assert swim.health == expected
    assert swim.probe_interval() == 8.0
    assert swim.probe_timeout() == 4.0
    for expected in range(6, -1, -1):  # each answered probe heals by one
        ping, target, now = pending or run_probe_until_ping(swim, now)
        swim.receive(Ack(ping.seq, target), now)
        end = now + swim.probe_interval()
        pings = sends_of(swim.tick(end), Ping)
        pending = (pings[0].message, pings[0].to, end) if pings else None  # type: ignore[assignment]
        assert swim.health == expected
    assert swim.probe_interval() == 1.0
    plain = machine(others=("b", "c", "d", "e"), config=LAN.plain())
    now, pending = 0.0, None
    for _ in range(3):
        _, now, pending = fail_probe(plain, now, pending)
    assert plain.health == 0
    assert plain.probe_interval() == 1.0


def test_plain_swim_sends_no_nack_request() -> None:
    swim = machine(others=("b", "c", "d"), config=LAN.plain())
    _, _, start = run_probe_until_ping(swim, 0.0)
    reqs = sends_of(swim.tick(start + 0.5), PingReq)
    assert reqs
    assert not any(r.message.nack for r in reqs)


# ---------------------------------------------------------------------- dissemination


def test_an_update_is_piggybacked_at_most_the_retransmit_limit() -> None:
    others = tuple(f"n{i}" for i in range(9))
    swim = machine(others=others)
    swim.receive(Gossip("n1", (Update("n2", "suspect", 0, "n1"),)), 0.0)
    limit = retransmit_limit(LAN, 10)
    carried = 0
    now = 0.0
    for _ in range(40):
        ping, target, now = run_probe_until_ping(swim, now)
        swim.receive(Ack(ping.seq, target), now)
        carried += sum(1 for u in ping.updates if u.node == "n2" and u.state == "suspect")
        now += 0.01
    gossiped = swim.stats.get("Gossip", 0)
    assert carried <= limit
    assert 0 < carried + gossiped


def test_messages_over_the_bounds_are_refused_whole() -> None:
    swim = machine()
    flood = tuple(Update(f"x{i}", "alive", 0, "b") for i in range(MAX_UPDATES_PER_MESSAGE + 1))
    step = swim.receive(Gossip("b", flood), 1.0)
    assert step.transitions == ()
    assert swim.stats["refused"] == 1
    bad: list[SwimMessage] = [
        Gossip("b", (Update("", "alive", 0, "b"),)),
        Gossip("b", (Update("x/y", "alive", 0, "b"),)),
        Gossip("b", (Update("x", "alive", -1, "b"),)),
        Ping(1, "b" * 300, "a"),
    ]
    for msg in bad:
        assert swim.receive(msg, 1.0).transitions == ()
    assert swim.stats["refused"] == 5
    assert swim.member("x") is None


# ---------------------------------------------------------------------- properties

_updates = st.builds(
    Update,
    node=st.sampled_from(["a", "b", "c", "d"]),
    state=st.sampled_from(["alive", "suspect", "dead", "left"]),
    incarnation=st.integers(0, 5),
    reporter=st.sampled_from(["a", "b", "c", "d"]),
)
_messages = st.one_of(
    st.builds(Gossip, source=st.just("b"), updates=st.lists(_updates, max_size=4).map(tuple)),
    st.builds(Ping, seq=st.integers(0, 9), source=st.just("c"), target=st.just("a")),
    st.builds(Ack, seq=st.integers(0, 9), source=st.just("b")),
    st.builds(Nack, seq=st.integers(0, 9), source=st.just("d")),
    st.builds(
        PingReq, seq=st.integers(0, 9), source=st.just("b"), target=st.sampled_from(["c", "d"])
    ),
)


@settings(max_examples=150)
@given(st.lists(st.tuples(_messages, st.floats(0.0, 3.0)), max_size=40), st.booleans())
def test_any_message_sequence_keeps_the_invariants(
    script: list[tuple[SwimMessage, float]], lifeguard: bool
) -> None:
    config = LAN if lifeguard else LAN.plain()
    swim = machine(others=("b", "c", "d"), config=config)
    now = 0.0
    incarnation = 0
    for msg, gap in script:
        now += gap
        while swim.next_deadline <= now:
            swim.tick(swim.next_deadline)
        step = swim.receive(msg, now)
        assert step.wake_at > now or step.wake_at == swim.next_deadline
        assert 0 <= swim.health <= config.awareness_max - 1
        assert swim.incarnation >= incarnation
        incarnation = swim.incarnation
        me = swim.member("a")
        assert me is not None
        assert me.state is ALIVE
        for view in swim.view():
            assert (view.state is SUSPECT) == (swim.suspicion_deadline(view.node) is not None)
        for send in step.sends:
            updates = getattr(send.message, "updates", ())
            assert len(updates) <= config.max_piggyback
