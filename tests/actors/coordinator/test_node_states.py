"""node_states: records + membership + down entries -> the planner's nodes (pure)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import MEMBER_STATES, MemberStatus, fence_guard
from corral.actors.coordinator._membership import MemberState, NodeStates, node_states
from corral.actors.coordinator._writes import plan_down_writes
from corral.actors.planner import NodeCapacity
from corral.registry import (
    Compare,
    Delete,
    MeasuredCapacity,
    NodeDown,
    NodeIntent,
    NodeRecord,
    Put,
    down_key,
)

NOW = 1000.0
GRACE = 300.0
CAP = MeasuredCapacity(1024, 512, 10_000, 9_000)
REC = NodeRecord("n1", labels={"zone": "a"}, rack="r1", datacenter="d1", capacity=CAP,
                 started_at=10.0)
ENTRY = NodeDown("n1", 900.0, {"zone": "a"}, "r1", "d1", CAP)
LAPSED_ENTRY = NodeDown("n1", None, {"zone": "a"}, "r1", "d1", CAP)


def decide(
    *,
    record: bool = True,
    member: MemberStatus | None = None,
    wired: bool = True,
    entry: NodeDown | None = None,
    placed: bool = True,
    remembered: bool = True,
    intent: NodeIntent | None = None,
) -> NodeStates:
    return node_states(
        {"n1": REC} if record else {},
        intents={} if intent is None else {"n1": intent},
        down={} if entry is None else {"n1": entry},
        placed={"n1"} if placed else set(),
        now=NOW,
        grace_period_s=GRACE,
        membership=({} if member is None else {"n1": member}) if wired else None,
        remembered={"n1": REC} if remembered else {},
    )


# record?, membership (None: no view of it), entry read, placed? -> state, down_since, write
TABLE = [
    # Live record: the record, or what membership says.
    (True, None, None, True, "alive", None, "none"),
    (True, MemberStatus("alive", 3), None, True, "alive", None, "none"),
    (True, MemberStatus("suspect", 3), None, True, "suspect", None, "none"),
    (True, MemberStatus("dead", 3), None, True, "down", NOW, "entry"),
    # The same spell goes on; the incarnation it did not know is filled in.
    (True, MemberStatus("dead", 3), ENTRY, True, "down", 900.0, "entry"),
    (True, MemberStatus("dead", 3), dataclasses.replace(ENTRY, incarnation=3), True, "down",
     900.0, "none"),
    # A live, renewing record contradicts a leave: only a withdrawn record confirms it.
    (True, MemberStatus("left", 3), None, True, "alive", None, "none"),
    # Back before the grace lapsed: alive again, the entry goes.
    (True, None, ENTRY, True, "alive", None, "delete"),
    (True, MemberStatus("alive", 4), ENTRY, True, "alive", None, "delete"),
    # Lapsed record: a blip while membership reaches it, else down.
    (False, MemberStatus("alive", 3), None, True, "alive", None, "lapsed-entry"),
    (False, MemberStatus("alive", 3), LAPSED_ENTRY, True, "alive", None, "none"),
    (False, MemberStatus("suspect", 3), None, True, "down", NOW, "entry"),
    (False, MemberStatus("dead", 3), None, True, "down", NOW, "entry"),
    (False, None, None, True, "down", NOW, "entry"),
    (False, None, LAPSED_ENTRY, True, "down", NOW, "entry"),
    # A successor coordinator keeps the grace clock it finds.
    (False, None, ENTRY, True, "down", 900.0, "none"),
    (False, MemberStatus("left", 3), None, True, "left", None, "none"),
    (False, MemberStatus("left", 3), ENTRY, True, "left", None, "delete"),
]


@pytest.mark.parametrize(
    ("record", "member", "entry", "placed", "state", "down_since", "write"), TABLE
)
def test_the_state_table(
    record: bool,
    member: MemberStatus | None,
    entry: NodeDown | None,
    placed: bool,
    state: str,
    down_since: float | None,
    write: str,
) -> None:
    decided = decide(record=record, member=member, entry=entry, placed=placed)
    incarnation = None if member is None or state != "down" else member.incarnation
    (info,) = decided.nodes
    assert (info.state, info.down_since) == (state, down_since)
    # MeasuredCapacity and labels come from the record, or the last known one.
    assert dict(info.labels) == {"zone": "a"}
    assert (info.rack, info.datacenter) == ("r1", "d1")
    assert info.capacity == NodeCapacity(1024, 512, 10_000, 9_000)
    expected = {
        "none": {},
        "delete": {"n1": None},
        "entry": {"n1": NodeDown("n1", down_since, {"zone": "a"}, "r1", "d1", CAP, incarnation)},
        "lapsed-entry": {"n1": LAPSED_ENTRY},
    }[write]
    assert dict(decided.down_writes) == expected
    (status,) = decided.statuses
    assert status.state == state
    assert status.down_since == down_since
    assert status.record is record
    assert status.incarnation == (None if member is None else member.incarnation)
    assert status.grace_until == (None if down_since is None else down_since + GRACE)


def test_without_membership_a_lapsed_record_is_down_for_the_grace() -> None:
    decided = decide(record=False, wired=False)
    (info,) = decided.nodes
    assert (info.state, info.down_since) == ("down", NOW)
    assert decided.next_deadline == NOW + GRACE
    (status,) = decided.statuses
    assert status.incarnation is None
    assert "membership has no view of it" in status.reason
    assert status.since == NOW


def test_a_lapsed_node_nothing_names_is_forgotten_and_its_entry_deleted() -> None:
    decided = decide(record=False, member=None, entry=ENTRY, placed=False)
    assert decided.nodes == ()
    assert decided.statuses == ()
    assert dict(decided.down_writes) == {"n1": None}
    assert decided.remembered == {}
    assert decided.next_deadline is None


def test_a_successor_knows_a_lapsed_node_from_its_entry_alone() -> None:
    decided = decide(record=False, entry=ENTRY, remembered=False)
    (info,) = decided.nodes
    assert (info.state, info.down_since, dict(info.labels)) == ("down", 900.0, {"zone": "a"})
    assert info.capacity == NodeCapacity(1024, 512, 10_000, 9_000)
    assert decided.next_deadline == 900.0 + GRACE
    assert decided.remembered["n1"].labels == {"zone": "a"}


def test_a_node_known_from_nothing_is_down_without_labels() -> None:
    decided = decide(record=False, remembered=False)
    (info,) = decided.nodes
    assert (info.state, info.down_since, dict(info.labels), info.capacity) == (
        "down", NOW, {}, None,
    )


def test_a_grace_already_past_is_no_deadline() -> None:
    old = NodeDown("n1", NOW - GRACE - 1)
    decided = decide(record=False, entry=old)
    assert decided.next_deadline is None
    assert decided.nodes[0].down_since == NOW - GRACE - 1  # the planner relocates now


@pytest.mark.parametrize(
    ("member", "record", "intent", "state"),
    [
        (MemberStatus("suspect"), True, NodeIntent(cordoned=True), "cordoned"),
        (MemberStatus("dead"), True, NodeIntent(cordoned=True), "down"),  # not pinned to it
        (MemberStatus("dead"), True, NodeIntent(draining=True), "left"),
        (None, False, NodeIntent(draining=True, force=True), "left"),
        (MemberStatus("alive"), False, NodeIntent(cordoned=True), "cordoned"),
    ],
)
def test_intent_goes_on_top(
    member: MemberStatus | None, record: bool, intent: NodeIntent, state: str
) -> None:
    decided = decide(record=record, member=member, intent=intent)
    (info,) = decided.nodes
    assert info.state == state
    assert info.drain_forced == intent.force
    if state != "down":
        assert info.down_since is None
    assert "operator" in decided.statuses[0].reason or state == "down"


def test_since_is_membership_s_or_the_record_s_start() -> None:
    assert decide(member=MemberStatus("suspect", 2, since=990.0)).statuses[0].since == 990.0
    assert decide(member=None).statuses[0].since == 10.0


def test_member_status_is_checked() -> None:
    with pytest.raises(ValueError, match="one of alive"):
        MemberStatus("gone")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="incarnation"):
        MemberStatus("alive", -1)
    with pytest.raises(ValueError, match="finite"):
        MemberStatus("alive", 0, float("nan"))


def test_down_writes_are_fenced_and_guarded_on_what_was_read() -> None:
    (batch,) = plan_down_writes(
        {"n1": ENTRY, "n2": None, "n3": None}, {"n2": 7}, fence=5, max_writes=10
    )
    assert batch.compares == (
        fence_guard(5),
        Compare.absent(down_key("n1")),
        Compare.mod_revision_is(down_key("n2"), 7),
    )
    assert batch.operations == (Put(down_key("n1"), ENTRY.encode()), Delete(down_key("n2")))
    assert dict(batch.entries) == {"n1": ENTRY, "n2": None}  # n3 was never read: dropped
    assert len(plan_down_writes({"a": ENTRY, "b": ENTRY, "c": ENTRY}, {}, fence=1,
                                max_writes=2)) == 2
    with pytest.raises(ValueError, match="fence"):
        plan_down_writes({}, {}, fence=0)


# --------------------------------------------------------------------------- properties

NODES = ["n1", "n2", "n3", "n4"]
members = st.one_of(
    st.none(),
    st.builds(MemberStatus, st.sampled_from(MEMBER_STATES), st.integers(0, 3)),
)
entries = st.one_of(
    st.none(),
    st.builds(
        lambda down_since, zone: NodeDown("x", down_since, {"zone": zone}),
        st.one_of(st.none(), st.floats(0, NOW)),
        st.sampled_from(["a", "b"]),
    ),
)
worlds = st.fixed_dictionaries(
    {
        node: st.tuples(st.booleans(), members, entries, st.booleans(), st.booleans())
        for node in NODES
    }
)


World = dict[str, tuple[bool, MemberStatus | None, NodeDown | None, bool, bool]]
Inputs = tuple[
    dict[str, NodeRecord], dict[str, NodeDown], dict[str, MemberStatus], set[str],
    dict[str, NodeRecord],
]


def world_inputs(world: World) -> Inputs:
    """Per node: record live?, membership, entry, placed?, remembered?"""
    records = {n: NodeRecord(n, labels={"zone": "r"}) for n, w in world.items() if w[0]}
    down = {
        n: NodeDown(n, w[2].down_since, dict(w[2].labels))
        for n, w in world.items()
        if w[2] is not None
    }
    membership = {n: w[1] for n, w in world.items() if w[1] is not None}
    placed = {n for n, w in world.items() if w[3]}
    remembered = {n: NodeRecord(n, labels={"zone": "m"}) for n, w in world.items() if w[4]}
    return records, down, membership, placed, remembered


@settings(max_examples=200, deadline=None)
@given(world=worlds, later=st.floats(0, 10_000))
def test_a_second_pass_over_what_the_first_wrote_writes_nothing_and_keeps_the_clock(
    world: World,
    later: float,
) -> None:
    records, down, membership, placed, remembered = world_inputs(world)
    first = node_states(
        records, intents={}, down=down, placed=placed, now=NOW, grace_period_s=GRACE,
        membership=membership, remembered=remembered,
    )
    written = dict(down)
    for node, entry in first.down_writes.items():
        if entry is None:
            written.pop(node, None)
        else:
            written[node] = entry
    # A successor (no memory) or the same coordinator, any time later: same nodes.
    for memory in (first.remembered, {}):
        second = node_states(
            records, intents={}, down=written, placed=placed, now=NOW + later,
            grace_period_s=GRACE, membership=membership, remembered=memory,
        )
        assert dict(second.down_writes) == {}
        assert [(i.id, i.state, i.down_since) for i in second.nodes] == [
            (i.id, i.state, i.down_since) for i in first.nodes
        ]


@settings(max_examples=200, deadline=None)
@given(world=worlds)
def test_the_rules_hold_for_every_node(world: World) -> None:
    records, down, membership, placed, remembered = world_inputs(world)
    decided = node_states(
        records, intents={}, down=down, placed=placed, now=NOW, grace_period_s=GRACE,
        membership=membership, remembered=remembered,
    )
    by_id = {info.id: info for info in decided.nodes}
    assert list(by_id) == sorted(by_id)
    for node in NODES:
        member = membership.get(node)
        if node not in records and node not in placed:
            assert node not in by_id  # bounded: nothing left to protect
            assert node not in decided.remembered
            assert decided.down_writes.get(node, "kept") in (None, "kept")
            continue
        info = by_id[node]
        if member is not None and member.state == "left":
            assert info.state == ("alive" if node in records else "left")
        elif member is not None and member.state == "dead":
            assert info.state == "down"
        elif node not in records:
            assert info.state == ("alive" if member is not None and member.state == "alive"
                                  else "down")
        else:
            assert info.state == ("alive" if member is None else member.state)
        if info.state == "down":
            kept = down[node].down_since if node in down else None
            assert info.down_since == (NOW if kept is None else kept)
            assert info.down_since is not None
            assert info.down_since <= NOW
        else:
            assert info.down_since is None
        # Labels: the live record, else memory, else the entry.
        expected = (
            "r" if node in records else "m" if node in remembered else
            (down[node].labels["zone"] if node in down else None)
        )
        assert info.labels.get("zone") == expected
        # An entry is kept exactly for down nodes and reachable lapsed ones.
        has_entry = (
            node in down and decided.down_writes.get(node, "kept") is not None
        ) or decided.down_writes.get(node) is not None
        assert has_entry == (info.state == "down" or (node not in records and info.state != "left"))


def test_a_death_of_a_later_incarnation_starts_a_new_grace() -> None:
    # Declared dead at incarnation 3: the entry's clock starts then.
    first = decide(member=MemberStatus("dead", 3))
    written = first.down_writes["n1"]
    assert written is not None
    assert (written.down_since, written.incarnation) == (NOW, 3)
    # It refuted (alive at 4), ran, and died again at 4 before any pass deleted the
    # entry: the old clock would move its work at once; a new grace starts instead.
    later = decide(member=MemberStatus("dead", 4), entry=NodeDown(
        "n1", NOW - GRACE - 1, {"zone": "a"}, "r1", "d1", CAP, incarnation=3))
    (status,) = later.statuses
    assert status.down_since == NOW
    assert status.grace_until == NOW + GRACE
    again = later.down_writes["n1"]
    assert again is not None
    assert (again.down_since, again.incarnation) == (NOW, 4)
    # The same death seen again (a successor, or the next pass) keeps its clock.
    same = decide(member=MemberStatus("dead", 3), entry=NodeDown(
        "n1", 900.0, {"zone": "a"}, "r1", "d1", CAP, incarnation=3))
    assert same.statuses[0].down_since == 900.0
    assert "n1" not in same.down_writes


# --------------------------------------------------------------------------- spells


def test_a_down_spell_after_an_unseen_comeback_starts_its_own_clock() -> None:
    # Suspect with its record lapsed: down, the spell begun at incarnation 3 ...
    first = decide(record=False, member=MemberStatus("suspect", 3))
    entry = first.down_writes["n1"]
    assert entry is not None
    assert (entry.down_since, entry.incarnation) == (NOW, 3)
    # ... then back (it refuted: 4) and down again with no pass in between: the entry's
    # clock is an earlier spell's, whatever membership says now.
    old = dataclasses.replace(entry, down_since=NOW - GRACE - 1)
    for member in (MemberStatus("suspect", 4), MemberStatus("dead", 4)):
        again = decide(record=False, member=member, entry=old)
        assert again.nodes[0].down_since == NOW
        written = again.down_writes["n1"]
        assert written is not None
        assert (written.down_since, written.incarnation) == (NOW, 4)
    # The same spell (incarnation 3, suspect then dead) keeps its clock.
    same = decide(record=False, member=MemberStatus("dead", 3), entry=old)
    assert same.nodes[0].down_since == NOW - GRACE - 1
    assert dict(same.down_writes) == {}


def test_a_new_life_s_record_ends_the_spell_of_the_old_one() -> None:
    old = NodeDown("n1", NOW - GRACE - 1, {"zone": "a"}, "r1", "d1", CAP, 3, instance="life-1")
    restarted = dataclasses.replace(REC, instance="life-2")
    decided = node_states(
        {"n1": restarted}, intents={}, down={"n1": old}, placed={"n1"}, now=NOW,
        grace_period_s=GRACE, membership={"n1": MemberStatus("dead", 3)},
    )
    assert decided.nodes[0].down_since == NOW
    written = decided.down_writes["n1"]
    assert written is not None
    assert (written.down_since, written.instance) == (NOW, "life-2")
    # Its own life's record keeps the clock.
    same = node_states(
        {"n1": dataclasses.replace(REC, instance="life-1")}, intents={}, down={"n1": old},
        placed={"n1"}, now=NOW, grace_period_s=GRACE, membership={"n1": MemberStatus("dead", 3)},
    )
    assert same.nodes[0].down_since == NOW - GRACE - 1


def test_a_successor_s_hearsay_at_a_lower_incarnation_keeps_the_clock() -> None:
    # A successor's SWIM that knows the node only by hearsay has it at incarnation 0: no
    # evidence it came back, so the grace clock is not restarted.
    entry = dataclasses.replace(ENTRY, incarnation=1_740_800_000_000_000)
    decided = decide(record=False, member=MemberStatus("dead", 0), entry=entry, remembered=False)
    assert decided.nodes[0].down_since == 900.0
    assert dict(decided.down_writes) == {}


# One node's true history: epochs, each begun when it came back (a higher incarnation, maybe
# a new life), up for a while then maybe down; a pass observes it now and then (maybe none in
# an epoch), maybe in a successor with no memory. What a pass sees: (seconds since the
# previous pass, record live?, membership state or None, a successor?).
Seen = tuple[float, bool, MemberState | None, bool]
gaps = st.floats(0.5, 2 * GRACE)
up_states: list[MemberState | None] = [None, "alive", "suspect"]
down_states: list[MemberState | None] = [None, "suspect", "dead"]
seen_up = st.tuples(gaps, st.booleans(), st.sampled_from(up_states), st.booleans())
seen_down = st.tuples(gaps, st.booleans(), st.sampled_from(down_states), st.booleans())
epochs = st.lists(
    st.tuples(st.booleans(), st.lists(seen_up, max_size=3), st.lists(seen_down, max_size=4)),
    min_size=1,
    max_size=5,
)


def _with_evidence(seen: list[Seen]) -> bool:
    # Neither a record nor a membership view: nothing tells this epoch from the last one.
    return all(record or member is not None for _, record, member, _ in seen)


@settings(max_examples=300, deadline=None)
@given(history=epochs)
def test_work_never_moves_before_a_grace_after_the_current_spell_began(
    history: list[tuple[bool, list[Seen], list[Seen]]],
) -> None:
    now = NOW
    life, incarnation = 1, 5
    down: dict[str, NodeDown] = {}
    memory: dict[str, NodeRecord] = {}
    for number, (new_life, ups, downs) in enumerate(history):
        if number:  # it came back: only it raises its incarnation; a new life starts above
            life, incarnation = (
                (life + 1, incarnation + 1000) if new_life else (life, incarnation + 1)
            )
        # Down, its record stays live for a while, then lapses and does not come back.
        downs = sorted(downs, key=lambda seen: not seen[1])
        if not _with_evidence(ups + downs):
            continue
        began: float | None = None  # the epoch's first pass: it came back before it
        clock: float | None = None  # the down_since of the last pass, if it said down
        for gap, live, state, successor in ups + downs:
            now += gap
            began = now if began is None else began
            record = dataclasses.replace(REC, instance=f"life-{life}")
            decided = node_states(
                {"n1": record} if live else {}, intents={}, down=down, placed={"n1"}, now=now,
                grace_period_s=GRACE,
                membership={} if state is None else {"n1": MemberStatus(state, incarnation)},
                remembered={} if successor else memory,
            )
            (info,) = decided.nodes
            if info.state == "down":
                assert info.down_since is not None
                # No clock of an earlier epoch: the work moves a grace after this one's
                # spell began, at the earliest.
                assert info.down_since >= began
                # One spell, one clock: a later pass or a successor keeps it.
                assert clock is None or info.down_since == clock
                clock = info.down_since
            else:
                clock = None
            for node, entry in decided.down_writes.items():
                if entry is None:
                    down.pop(node, None)
                else:
                    down[node] = entry
            memory = dict(decided.remembered)
