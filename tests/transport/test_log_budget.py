"""LogBudget: a few lines per key per window, then a count (pure, no event loop)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.transport import LogBudget
from corral.transport._log_budget import LogVerdict


def test_the_first_burst_is_written_then_counted_then_reported() -> None:
    budget = LogBudget(burst=3, interval=10.0)
    verdicts = [budget.admit("peer-a", 0.5 * i) for i in range(8)]  # t = 0 .. 3.5
    assert verdicts[:3] == [LogVerdict(True), LogVerdict(True), LogVerdict(True, 0, last=True)]
    assert verdicts[3:] == [LogVerdict(False)] * 5
    # the window opened at t=0 closes at t=10: the next line carries the count
    assert budget.admit("peer-a", 9.99) == LogVerdict(False)
    assert budget.admit("peer-a", 10.0) == LogVerdict(True, held_back=6)
    assert budget.admit("peer-a", 10.1) == LogVerdict(True)


def test_keys_have_budgets_of_their_own() -> None:
    budget = LogBudget(burst=1, interval=60.0)
    assert budget.admit("a", 0.0) == LogVerdict(True, 0, last=True)
    assert budget.admit("a", 1.0) == LogVerdict(False)
    assert budget.admit("b", 1.0).write
    assert not budget.admit("b", 2.0).write


def test_memory_is_bounded_and_expired_windows_go_first() -> None:
    budget = LogBudget(burst=1, interval=10.0, max_keys=3)
    for i, key in enumerate("abc"):
        budget.admit(key, float(i))
    assert not budget.admit("c", 3.0).write
    budget.admit("d", 10.5)  # "a" (opened at 0) has expired: it is the one forgotten
    assert budget.admit("a", 10.6) == LogVerdict(True, 0, last=True)  # a fresh window
    assert len(budget._windows) <= 3


@pytest.mark.parametrize(
    "kwargs", [{"burst": 0}, {"interval": 0.0}, {"interval": -1.0}, {"max_keys": 0}]
)
def test_nonsense_budgets_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="burst"):
        LogBudget(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    burst=st.integers(1, 4),
    interval=st.floats(0.5, 20.0),
    events=st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.0, 5.0)), max_size=80),
)
def test_every_event_is_written_or_counted_and_the_rate_is_bounded(
    burst: int, interval: float, events: list[tuple[str, float]]
) -> None:
    budget = LogBudget(burst=burst, interval=interval)
    now = 0.0
    written: dict[str, list[float]] = {}
    reported = Counter[str]()
    for key, step in events:
        now += step
        verdict = budget.admit(key, now)
        if verdict.write:
            written.setdefault(key, []).append(now)
            reported[key] += verdict.held_back
        else:
            assert verdict == LogVerdict(False)
    for key in "abc":
        total = sum(1 for k, _ in events if k == key)
        window = budget._windows.get(key)
        pending = window.held_back if window is not None else 0
        # nothing is lost: each event was written, reported as held back, or still pending
        assert len(written.get(key, [])) + reported[key] + pending == total
        # fixed windows of `burst` lines each: any span of one interval overlaps
        # at most two of them
        times = written.get(key, [])
        for i, t in enumerate(times):
            assert sum(1 for u in times[i:] if u - t < interval) <= 2 * burst
