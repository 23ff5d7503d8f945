"""Timed waits on one timer task: each ends exactly when ``trio.sleep`` would."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.process_supervisor._wakeups import Wakeups


@settings(max_examples=60, deadline=None)
@given(
    sleeps=st.lists(
        st.tuples(
            st.integers(0, 50),  # when the task starts sleeping (tenths of a second)
            st.integers(0, 50),  # for how long
            st.one_of(st.none(), st.integers(0, 100)),  # cancelled at (None: never)
        ),
        min_size=1,
        max_size=30,
    )
)
def test_each_sleep_ends_at_its_deadline_or_its_cancellation(
    sleeps: list[tuple[int, int, int | None]],
) -> None:
    ended: dict[int, tuple[float, bool]] = {}

    async def sleeper(
        n: int, wakeups: Wakeups, start: float, length: float, cancel_at: float | None
    ) -> None:
        await trio.sleep_until(start)
        with trio.CancelScope(deadline=cancel_at if cancel_at is not None else float("inf")):
            await wakeups.sleep(length)
            ended[n] = (trio.current_time(), False)
            return
        ended[n] = (trio.current_time(), True)

    async def main() -> None:
        t0 = trio.current_time()
        async with trio.open_nursery() as timer:
            wakeups = Wakeups(timer.start_soon)
            async with trio.open_nursery() as nursery:
                for n, (start, length, cancel_at) in enumerate(sleeps):
                    nursery.start_soon(
                        sleeper,
                        n,
                        wakeups,
                        t0 + start / 10,
                        length / 10,
                        None if cancel_at is None else t0 + cancel_at / 10,
                    )
            assert wakeups.waiting == 0
            wakeups.idle()  # and the timer ends
        for n, (start, length, cancel_at) in enumerate(sleeps):
            due = t0 + start / 10 + length / 10
            # a cancellation due with the wake wins, as it does over a trio.sleep
            cancelled_first = cancel_at is not None and t0 + cancel_at / 10 <= due
            if cancel_at is not None and t0 + cancel_at / 10 <= t0 + start / 10:
                # cancelled before it even slept: at its first checkpoint
                assert ended[n] == (pytest.approx(t0 + start / 10), True)
            elif cancelled_first:
                assert ended[n] == (pytest.approx(t0 + cancel_at / 10), True)  # type: ignore[operator]
            else:
                assert ended[n] == (pytest.approx(due), False)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_an_earlier_deadline_wakes_the_timer_sooner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    woke: list[tuple[str, float]] = []
    t0 = trio.current_time()

    async def sleep(wakeups: Wakeups, name: str, seconds: float) -> None:
        await wakeups.sleep(seconds)
        woke.append((name, trio.current_time() - t0))

    async with trio.open_nursery() as nursery:
        wakeups = Wakeups(nursery.start_soon)
        nursery.start_soon(sleep, wakeups, "late", 60.0)
        await trio.sleep(1.0)
        nursery.start_soon(sleep, wakeups, "early", 2.0)
        await trio.sleep(100.0)
        wakeups.idle()
    assert woke == [("early", 3.0), ("late", 60.0)]


async def test_tasks_due_together_cost_the_timer_one_wake(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The point of it: a hundred checks due at one instant cost the timer one step to
    wake them all, and one more when the first of them sleeps again."""
    steps: dict[str, int] = {}

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps[task.name] = steps.get(task.name, 0) + 1

    async def sleeper(wakeups: Wakeups) -> None:
        for _ in range(4):
            await wakeups.sleep(60.0)

    async with trio.open_nursery() as nursery:
        wakeups = Wakeups(nursery.start_soon)
        async with trio.open_nursery() as sleepers:
            for _ in range(100):
                sleepers.start_soon(sleeper, wakeups)
            await trio.sleep(1.0)
            trio.lowlevel.add_instrument(Steps())
        assert wakeups.timer_running  # it outlives a round: they sleep again at once
        wakeups.idle()
    assert not wakeups.timer_running
    (timer,) = [n for name, n in steps.items() if name.endswith("Wakeups._run")]
    assert timer <= 2 * 4 + 1  # (wake, poked) at 60, 120, 180 and 240 s, then its end


async def test_the_timer_does_not_keep_a_nursery_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """It ends when its last waiter is cancelled, and when told that nobody will sleep."""
    with trio.move_on_after(5.0) as scope:
        async with trio.open_nursery() as nursery:
            wakeups = Wakeups(nursery.start_soon)
            with trio.move_on_after(1.0):
                await wakeups.sleep(3600.0)
    assert not scope.cancelled_caught
    assert wakeups.waiting == 0
    with trio.move_on_after(5.0) as scope:
        async with trio.open_nursery() as nursery:
            wakeups = Wakeups(nursery.start_soon)
            await wakeups.sleep(1.0)
            assert wakeups.timer_running
            wakeups.idle()
    assert not scope.cancelled_caught
    assert not wakeups.timer_running


async def test_a_negative_sleep_is_refused() -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(ValueError, match="non-negative"):
            await Wakeups(nursery.start_soon).sleep(-1.0)
