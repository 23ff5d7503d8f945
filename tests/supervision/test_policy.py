"""Pure restart decisions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.supervision import Backoff, Restart, Strategy
from corral.supervision._policy import (
    backoff_delay,
    next_attempt,
    record_restart,
    restart_set,
    should_restart,
)


@pytest.mark.parametrize(
    ("restart", "crashed", "expected"),
    [
        (Restart.PERMANENT, True, True),
        (Restart.PERMANENT, False, True),
        (Restart.TRANSIENT, True, True),
        (Restart.TRANSIENT, False, False),
        (Restart.TEMPORARY, True, False),
        (Restart.TEMPORARY, False, False),
    ],
)
def test_should_restart_table(restart: Restart, crashed: bool, expected: bool) -> None:
    assert should_restart(restart, crashed) is expected


def test_restart_set_per_strategy() -> None:
    assert restart_set(Strategy.ONE_FOR_ONE, 4, 1) == [1]
    assert restart_set(Strategy.ONE_FOR_ALL, 4, 1) == [0, 1, 2, 3]
    assert restart_set(Strategy.REST_FOR_ONE, 4, 1) == [1, 2, 3]
    with pytest.raises(IndexError):
        restart_set(Strategy.ONE_FOR_ONE, 2, 2)


@settings(max_examples=50)
@given(st.sampled_from(list(Strategy)), st.integers(1, 20), st.data())
def test_restart_set_always_includes_the_failed_child_in_order(
    strategy: Strategy, count: int, data: st.DataObject
) -> None:
    failed = data.draw(st.integers(0, count - 1))
    chosen = restart_set(strategy, count, failed)
    assert failed in chosen
    assert chosen == sorted(set(chosen))
    assert all(0 <= i < count for i in chosen)


def test_intensity_counts_restarts_inside_the_window_only() -> None:
    history: tuple[float, ...] = ()
    history, exceeded = record_restart(history, 0.0, max_restarts=2, within=10.0)
    assert not exceeded
    history, exceeded = record_restart(history, 5.0, max_restarts=2, within=10.0)
    assert not exceeded
    _, exceeded = record_restart(history, 9.9, max_restarts=2, within=10.0)
    assert exceeded
    history, exceeded = record_restart(history, 10.0, max_restarts=2, within=10.0)
    assert not exceeded  # the restart at 0.0 has left the window
    assert history == (5.0, 10.0)


def test_zero_max_restarts_fails_on_the_first_restart() -> None:
    assert record_restart((), 0.0, max_restarts=0, within=1.0)[1]


@settings(max_examples=50)
@given(
    st.lists(st.floats(0, 1000, allow_nan=False), max_size=30),
    st.integers(0, 10),
    st.floats(0.1, 100),
)
def test_intensity_is_exceeded_iff_more_than_max_in_window(
    times: list[float], max_restarts: int, within: float
) -> None:
    times = sorted(times)
    history: tuple[float, ...] = ()
    for i, now in enumerate(times):
        history, exceeded = record_restart(history, now, max_restarts, within)
        in_window = [t for t in times[: i + 1] if now - t < within]
        assert exceeded == (len(in_window) > max_restarts)
        assert len(history) == len(in_window)


def test_backoff_delays() -> None:
    backoff = Backoff(initial=0.1, factor=2.0, maximum=1.0)
    assert [backoff_delay(backoff, n) for n in range(0, 7)] == pytest.approx(
        [0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )


@settings(max_examples=50)
@given(
    st.floats(0, 10),
    st.floats(1, 5),
    st.floats(0, 60),
    st.integers(1, 200),
)
def test_backoff_is_monotonic_and_capped(
    initial: float, factor: float, maximum: float, attempt: int
) -> None:
    backoff = Backoff(initial=initial, factor=factor, maximum=maximum)
    delay = backoff_delay(backoff, attempt)
    assert 0 <= delay <= maximum
    assert backoff_delay(backoff, attempt + 1) >= delay


def test_next_attempt_resets_after_a_stable_run() -> None:
    assert next_attempt(3, ran_for=1.0, reset_after=30.0) == 4
    assert next_attempt(3, ran_for=30.0, reset_after=30.0) == 1
