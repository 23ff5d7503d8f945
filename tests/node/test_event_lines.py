"""EventLines (the event streams' shared encoder) answers as the plain scan does."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from corral.node.server._events import EventLines

#: How many events the log keeps (EventLog's deque is 1,000 long).
KEPT = 20


def log(seqs: list[int]) -> list[dict[str, Any]]:
    return [{"seq": seq, "kind": "k", "fields": {"n": seq}} for seq in seqs]


def plain(events: list[dict[str, Any]], last: int, most: float) -> list[dict[str, Any]]:
    """What a stream sent before: every event after ``last``, at most ``most``."""
    newer = [event for event in events if event["seq"] > last]
    return newer if math.isinf(most) else newer[: int(most)]


@given(
    st.lists(
        st.tuples(
            st.integers(0, 30),  # events logged since the last poll
            st.integers(-1, 120),  # the last seq the stream sent
            st.one_of(st.just(math.inf), st.integers(1, 50)),  # how many it may still send
        )
    )
)
def test_every_answer_is_the_plain_scans(polls: list[tuple[int, int, float]]) -> None:
    current: list[dict[str, Any]] = []
    logged = 0
    lines = EventLines(lambda: current)
    for new, last, most in polls:
        current = (current + log(list(range(logged + 1, logged + new + 1))))[-KEPT:]
        logged += new
        chunk, new_last, count = lines.after(last, most)
        expected = plain(current, last, most)
        assert [json.loads(line) for line in chunk.splitlines()] == expected
        assert count == len(expected)
        assert new_last == (expected[-1]["seq"] if expected else last)
        assert len(lines._encoded) <= 2 * KEPT  # what it keeps encoded stays bounded


def test_a_follower_gets_each_event_once_in_order() -> None:
    events = log([1, 2, 3])
    lines = EventLines(lambda: events)
    chunk, last, _ = lines.after(-1)
    events += log([4, 5])
    more, last, _ = lines.after(last)
    nothing, same, count = lines.after(last)
    seen = [json.loads(line)["seq"] for line in (chunk + more).splitlines()]
    assert seen == [1, 2, 3, 4, 5]
    assert (nothing, same, count) == (b"", 5, 0)
