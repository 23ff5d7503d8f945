"""The coordinator's report rate limit (pure): examples and hypothesis properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator._reports import ReportKey, ReportLog

COOLDOWN = 10.0
KEYS: tuple[ReportKey, ...] = (
    ("placement.pending", "web", ""),
    ("placement.pending", "db", ""),
    ("placement.deferred", "web", "n1"),
)

#: One report: (which key, what it says, seconds since the previous report, repeat).
Report = tuple[int, str, float, bool]
reports = st.lists(
    st.tuples(
        st.integers(0, len(KEYS) - 1),
        st.sampled_from(["a", "b"]),
        st.sampled_from([0.0, 0.5, 3.0, 9.99, 10.0, 25.0]),
        st.booleans(),
    ),
    max_size=40,
)
FAST = settings(max_examples=200, deadline=None)


def run(log: ReportLog, events: list[Report]) -> list[tuple[ReportKey, str, float, bool, bool]]:
    """Feed ``events`` in order: (key, says, time, repeat, admitted) each."""
    now, out = 0.0, []
    for index, says, gap, repeat in events:
        now += gap
        key = KEYS[index]
        out.append((key, says, now, repeat, log.admit(key, says, now, repeat=repeat)))
    return out


def test_a_repeat_goes_out_once_per_cooldown_unless_it_says_something_new() -> None:
    log = ReportLog(COOLDOWN)
    key = KEYS[0]
    assert log.admit(key, "no node has 4 GiB", 0.0)  # never said: out at once
    assert not log.admit(key, "no node has 4 GiB", 5.0)  # the same, within the cooldown
    assert log.admit(key, "no node has 8 GiB", 6.0)  # something new
    assert not log.admit(key, "no node has 8 GiB", 15.9)
    assert log.admit(key, "no node has 8 GiB", 16.0)  # a cooldown after the last one
    assert log.admit(key, "no node has 8 GiB", 16.5, repeat=False)  # new inputs: always
    log.keep_only("placement.pending", [])
    assert len(log) == 0
    assert log.admit(key, "no node has 8 GiB", 17.0)  # forgotten, back: out at once


def test_a_negative_cooldown_is_refused() -> None:
    with pytest.raises(ValueError, match="cooldown_s"):
        ReportLog(-1.0)


@FAST
@given(reports)
def test_same_says_repeats_are_a_cooldown_apart(events: list[Report]) -> None:
    admitted: dict[ReportKey, tuple[str, float]] = {}
    for key, says, now, repeat, ok in run(ReportLog(COOLDOWN), events):
        last = admitted.get(key)
        if ok:
            if repeat and last is not None and last[0] == says:
                assert now - last[1] >= COOLDOWN
            admitted[key] = (says, now)


@FAST
@given(reports)
def test_new_inputs_new_words_and_first_reports_always_go_out(events: list[Report]) -> None:
    seen: dict[ReportKey, str] = {}
    for key, says, _, repeat, ok in run(ReportLog(COOLDOWN), events):
        if not repeat or key not in seen or seen[key] != says:
            assert ok
        if ok:
            seen[key] = says


@FAST
@given(reports)
def test_subjects_are_limited_independently(events: list[Report]) -> None:
    together = run(ReportLog(COOLDOWN), events)
    for key in KEYS:
        # Each key's reports alone, at the times they had: admitted the same.
        mine = [r for r in together if r[0] == key]
        alone = ReportLog(COOLDOWN)
        assert [r[4] for r in mine] == [
            alone.admit(k, says, now, repeat=repeat) for k, says, now, repeat, _ in mine
        ]


@FAST
@given(st.floats(0.1, 30.0), st.integers(1, 60))
def test_a_reminder_is_never_starved(gap: float, count: int) -> None:
    log = ReportLog(COOLDOWN)
    times = [i * gap for i in range(count)]
    out = [t for t in times if log.admit(KEYS[0], "same", t)]
    assert out[0] == 0.0
    # Reported again at the first report a cooldown after the last one: never later.
    for a, b in itertools.pairwise(out):
        assert COOLDOWN <= b - a <= COOLDOWN + gap + 1e-9
    assert times[-1] - out[-1] <= COOLDOWN + gap + 1e-9
