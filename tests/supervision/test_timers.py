"""The run's timer wheel: trio's sleeps, callbacks at a time, and actor timers, on trio's
clock, with one task for all of them."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from corral.supervision import (
    Actor,
    ChildSpec,
    Restart,
    call_at,
    open_actor_system,
    sleep,
    sleep_until,
)


async def test_sleepers_wake_at_their_deadline_in_deadline_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    t0 = trio.current_time()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await sleep(seconds)
        woke.append((name, trio.current_time() - t0))

    async with trio.open_nursery() as nursery:
        for name, seconds in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("a2", 1.0)):
            nursery.start_soon(sleeper, name, seconds)
    assert sorted(woke, key=lambda w: w[1]) == woke
    assert dict(woke) == {"a": 1.0, "a2": 1.0, "b": 2.0, "c": 3.0}


async def test_a_sleep_is_a_checkpoint_and_cancellable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.move_on_after(5) as scope:
        await sleep_until(trio.current_time() + 100)
    assert scope.cancelled_caught
    assert trio.current_time() == 5
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await sleep(0)  # a passed deadline still checkpoints
        pytest.fail("not reached")
    assert cancelled.cancelled_caught
    with pytest.raises(ValueError, match="must be >= 0"):
        await sleep(-1)
    # The cancelled sleep left nothing behind that wakes anyone.
    await sleep(200)
    assert trio.current_time() == 205


async def test_callbacks_run_at_their_time_and_one_that_fails_stops_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[tuple[str, float]] = []

    def failing() -> None:
        raise RuntimeError("boom")

    t0 = trio.current_time()
    call_at(t0 + 2, lambda: ran.append(("two", trio.current_time() - t0)))
    call_at(t0 + 1, failing)
    call_at(t0 + 1, lambda: ran.append(("one", trio.current_time() - t0)))
    never = call_at(t0 + 1.5, lambda: ran.append(("never", 0.0)))
    never.cancel()
    with caplog.at_level(logging.ERROR, logger="corral.supervision"):
        await trio.sleep(3)
    assert ran == [("one", 1.0), ("two", 2.0)]
    assert "a timer callback failed" in caplog.text


async def test_many_cancelled_sleeps_leave_the_wheel_working(
    autojump_clock: trio.testing.MockClock,
) -> None:
    for i in range(2_000):
        with trio.move_on_after(0.001):
            await sleep(1_000 + i)
    t0 = trio.current_time()
    await sleep(3)
    assert trio.current_time() - t0 == 3


async def test_a_full_mailbox_skips_ticks_and_a_one_shot_waits_for_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[str, float]] = []
    gate = trio.Event()

    class Busy(Actor):
        mailbox_size = 1

        async def started(self) -> None:
            self.ctx.every(1.0, "tick")
            self.ctx.after(2.5, "once")

        async def handle(self, message: object) -> object:
            seen.append((str(message), trio.current_time()))
            if len(seen) == 1:
                await gate.wait()  # busy for a while: the mailbox fills
            return None

    async with open_actor_system("n") as system:
        t0 = trio.current_time()
        await system.spawn(ChildSpec("busy", Busy))
        await trio.sleep(10)
        gate.set()
        await trio.sleep(0.5)
    # The first tick blocked the actor; the one after it waited in the mailbox, the
    # ticks after that were skipped; the one-shot waited for room and came.
    assert [(m, t - t0) for m, t in seen[:3]] == [("tick", 1.0), ("tick", 10.0), ("once", 10.0)]


async def test_a_restarted_actor_gets_its_own_timers_and_the_old_ones_die(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ticks: list[tuple[int, float]] = []
    lives = iter(range(10))

    class Crashy(Actor):
        async def started(self) -> None:
            self.life = next(lives)
            self.ctx.every(1.0, "tick")

        async def handle(self, message: object) -> object:
            ticks.append((self.life, trio.current_time()))
            if message == "crash":
                raise RuntimeError("crash")
            return None

    async with open_actor_system("n") as system:
        t0 = trio.current_time()
        ref = await system.spawn(ChildSpec("crashy", Crashy, restart=Restart.PERMANENT))
        await trio.sleep(2.5)
        await ref.tell("crash")
        await trio.sleep(3.0)
    times = [round(t - t0, 3) for _, t in ticks]
    lives_seen = [life for life, _ in ticks]
    # No tick twice at one time (the old life's timer did not outlive it), and every
    # tick after the restart is the new life's.
    assert len(times) == len(set(times))
    after_crash = [life for life, t in ticks if t - t0 > 2.5]
    assert after_crash
    assert set(after_crash[1:]) == {1}
    assert lives_seen[0] == 0


async def test_timers_take_no_task_each(autojump_clock: trio.testing.MockClock) -> None:
    class Many(Actor):
        async def started(self) -> None:
            for i in range(100):
                self.ctx.every(1.0 + i, "tick")
                self.ctx.after(50.0 + i, "once")

    async with open_actor_system("n") as system:
        await system.spawn(ChildSpec("idle", Actor))
        await trio.testing.wait_all_tasks_blocked()
        before = trio.lowlevel.current_statistics().tasks_living
        await system.spawn(ChildSpec("many", Many))
        await trio.testing.wait_all_tasks_blocked()
        after = trio.lowlevel.current_statistics().tasks_living
    # An actor is a task or two; its 200 timers live in the wheel, not in tasks.
    assert after - before < 10
