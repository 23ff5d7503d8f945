"""The pure port book: candidates, pairs, quarantine."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.port_allocator import InvalidPortRange, PlacementUnavailable
from corral.actors.port_allocator._book import (
    PortBook,
    PortPair,
    PortRange,
    Quarantined,
    draw_pair,
    internal_candidates,
    pair_from_json,
    pair_to_json,
    placement_unavailable,
)

SMALL = PortRange(100, 109)


@pytest.mark.parametrize(("start", "end"), [(0, 10), (10, 9), (65000, 65536), (-1, 5)])
def test_invalid_ranges_are_refused_with_the_flags_named(start: int, end: int) -> None:
    with pytest.raises(InvalidPortRange, match="--port-range-start"):
        PortRange(start, end)


def test_default_range() -> None:
    assert (PortRange().start, PortRange().end, PortRange().size) == (24000, 24998, 999)


def test_candidates_skip_other_apps_ports_and_their_quarantine() -> None:
    book = PortBook(
        {"a": PortPair(100, 105), "b": PortPair(101, 102)},
        {103: Quarantined("c", until=50.0), 104: Quarantined("a", until=50.0)},
    )
    # for a: b's ports and c's quarantine are out, a's own quarantine is not, a's own
    # current pair is not a candidate for a new one
    assert book.candidates(SMALL, "a", now=10.0) == [104, 106, 107, 108, 109]
    assert book.candidates(SMALL, "c", now=10.0) == [103, 106, 107, 108, 109]
    # quarantine ends
    assert 103 in book.candidates(SMALL, "a", now=50.0)
    assert book.candidates(SMALL, "a", now=10.0, exclude=[106]) == [104, 107, 108, 109]


def test_release_quarantines_and_expire_forgets() -> None:
    book = PortBook({"a": PortPair(100, 105)})
    released = book.release("a", now=10.0, quarantine=600.0)
    assert released.holdings == {}
    assert released.quarantine == {100: Quarantined("a", 610.0), 105: Quarantined("a", 610.0)}
    assert released.expire(609.0) is released
    assert released.expire(610.0).quarantine == {}


def test_with_pair_refuses_a_port_of_another_app_or_in_its_quarantine() -> None:
    book = PortBook({"a": PortPair(100, 105)}, {107: Quarantined("c", until=50.0)})
    with pytest.raises(ValueError, match="not free"):
        book.with_pair("b", PortPair(100, 106), now=0.0, quarantine=1.0)
    with pytest.raises(ValueError, match="not free"):
        book.with_pair("b", PortPair(107, 106), now=0.0, quarantine=1.0)
    with pytest.raises(ValueError, match="twice"):
        book.with_pair("b", PortPair(106, 106), now=0.0, quarantine=1.0)
    moved = book.with_pair("a", PortPair(101, 108), now=0.0, quarantine=5.0)
    assert moved.holdings["a"] == PortPair(101, 108)
    assert moved.quarantine[100] == Quarantined("a", 5.0)
    assert moved.quarantine[105] == Quarantined("a", 5.0)


def test_internal_is_never_the_public_port_plus_one() -> None:
    assert internal_candidates([5, 6, 7, 9], 6) == [5, 9]
    assert draw_pair([5, 6], random.Random(0).choice) == PortPair(6, 5)
    with pytest.raises(ValueError, match="no two ports"):
        draw_pair([5], random.Random(0).choice)


@settings(max_examples=80, deadline=None)
@given(
    ports=st.sets(st.integers(1, 60), min_size=2, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_drawn_pairs_are_valid_candidates(ports: set[int], seed: int) -> None:
    candidates = sorted(ports)
    try:
        pair = draw_pair(candidates, random.Random(seed).choice)
    except ValueError:
        assert all(not internal_candidates(candidates, p) for p in candidates)
        return
    assert pair.public in ports
    assert pair.internal in ports
    assert pair.internal not in (pair.public, pair.public + 1)


def test_placement_unavailable_names_the_range_and_counts() -> None:
    error = placement_unavailable(SMALL, free=1, held=6, quarantined=2, taken=1)
    assert isinstance(error, PlacementUnavailable)
    assert error.code == "placement-unavailable"
    assert "100-109" in str(error)
    assert "6 held" in str(error)
    assert "2 in quarantine" in str(error)


def test_documents_round_trip() -> None:
    book = PortBook({}, {100: Quarantined("a", 12.5)})
    assert PortBook.quarantine_from_json(json.loads(json.dumps(book.quarantine_to_json()))) == {
        100: Quarantined("a", 12.5)
    }
    assert pair_from_json("a", pair_to_json("a", PortPair(1, 3))) == PortPair(1, 3)
    with pytest.raises(ValueError, match="app 'b'"):
        pair_from_json("b", pair_to_json("a", PortPair(1, 3)))
    with pytest.raises(ValueError, match="quarantine"):
        PortBook.quarantine_from_json({"v": 2})


# --------------------------------------------------------------------------- property

APPS = ["a", "b", "c", "d"]
QUARANTINE = 100.0
op = st.one_of(
    st.tuples(st.just("assign"), st.sampled_from(APPS)),
    st.tuples(st.just("unassign"), st.sampled_from(APPS)),
    st.tuples(st.just("delete"), st.sampled_from(APPS)),
    st.tuples(st.just("restart"), st.just("")),
    st.tuples(st.just("wait"), st.sampled_from(["10", "60", "150"])),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=40), seed=st.integers(0, 2**32 - 1))
def test_no_shared_port_and_no_move_inside_quarantine(
    ops: list[tuple[str, str]], seed: int
) -> None:
    """Across assign/unassign/delete/restart/wait on a tiny range: no two apps hold one
    port, and a port released by one app goes to no other before its quarantine ends."""
    rng = random.Random(seed)
    port_range = PortRange(100, 107)
    book, now = PortBook(), 0.0
    released: dict[int, tuple[str, float]] = {}  # port -> (app, when), the test's own memory
    for kind, arg in ops:
        if kind == "assign" and arg not in book.holdings:
            candidates = book.candidates(port_range, arg, now)
            try:
                pair = draw_pair(candidates, rng.choice)
            except ValueError:
                continue
            book = book.with_pair(arg, pair, now=now, quarantine=QUARANTINE)
            for port in pair.ports:
                if port in released and released[port][0] != arg:
                    assert now - released[port][1] >= QUARANTINE, (port, released[port], now)
        elif kind == "delete" and arg in book.holdings:
            for port in book.holdings[arg].ports:
                released[port] = (arg, now)
            book = book.release(arg, now=now, quarantine=QUARANTINE)
        elif kind == "restart":
            quarantine = PortBook.quarantine_from_json(
                json.loads(json.dumps(book.quarantine_to_json()))
            )
            holdings = {
                app: pair_from_json(app, json.loads(json.dumps(pair_to_json(app, pair))))
                for app, pair in book.holdings.items()
            }
            book = PortBook(holdings, quarantine).expire(now)
        elif kind == "wait":
            now += float(arg)
            book = book.expire(now)
        held = [p for pair in book.holdings.values() for p in pair.ports]
        assert len(held) == len(set(held))
