"""One heap of timed wake-ups per trio run, served by one system task.

Why: a ``trio.sleep`` is a cancel scope with a deadline; when the deadline passes,
trio delivers ``Cancelled`` through the sleeping task and unwinds it. An actor timer
used to be a task asleep that way. A node holds a handful of timers, a readiness
loop per app and a few debounces; a thousand simulated nodes in one process hold a
thousand times as many, and that machinery was a fifth of their idle time.

Here a wake-up is an entry in a heap. The wheel task sleeps until the earliest
entry, then fires every entry that is due, in deadline order (then in the order they
were made): a callback (:func:`call_at`) runs in the wheel task — an actor's timer
puts its message in the mailbox from there, with no task of its own — and a task in
:func:`sleep_until` is rescheduled. Entries that share a deadline cost one wake-up
of the wheel between them.

Time is trio's: the wheel sleeps with a trio deadline, so ``MockClock`` drives it as
it drives ``trio.sleep``. The wheel task is a trio system task, started the first
time a run asks for it; it never raises (a callback that does is logged).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush

import trio

__all__ = ["TimerEntry", "call_at", "sleep", "sleep_until"]

log = logging.getLogger("corral.supervision")

# Cancelled entries stay in the heap until they come first; the heap is rebuilt without
# them when it holds this many more than twice the live ones.
_SLACK = 64


class TimerEntry:
    """One wake-up of the wheel: a callback to run, or a task to reschedule."""

    __slots__ = ("_wheel", "callback", "done", "task")

    def __init__(
        self,
        wheel: _Wheel,
        callback: Callable[[], object] | None,
        task: trio.lowlevel.Task | None,
    ) -> None:
        self._wheel = wheel
        self.callback = callback
        self.task = task
        self.done = False  # fired or cancelled

    def cancel(self) -> None:
        """Do not fire (idempotent; nothing happens once it fired)."""
        if not self.done:
            self.done = True
            self._wheel.cancelled += 1


class _Wheel:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerEntry]] = []
        self._order = itertools.count()
        self._sleep: trio.CancelScope | None = None
        self.cancelled = 0  # cancelled entries still in the heap

    def add(
        self,
        deadline: float,
        callback: Callable[[], object] | None = None,
        task: trio.lowlevel.Task | None = None,
    ) -> TimerEntry:
        entry = TimerEntry(self, callback, task)
        heappush(self._heap, (deadline, next(self._order), entry))
        if self.cancelled > len(self._heap) // 2 + _SLACK:
            live = [item for item in self._heap if not item[2].done]
            heapify(live)
            self._heap, self.cancelled = live, 0
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = deadline
        return entry

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            # (A callback may add entries, and so rebuild the heap: read it anew.)
            while self._heap and self._heap[0][0] <= now:
                entry = heappop(self._heap)[2]
                if entry.done:
                    self.cancelled -= 1
                    continue
                entry.done = True
                if entry.task is not None:
                    trio.lowlevel.reschedule(entry.task)
                elif entry.callback is not None:
                    try:
                        entry.callback()
                    except Exception:
                        log.exception("a timer callback failed")
            deadline = self._heap[0][0] if self._heap else math.inf
            with trio.CancelScope(deadline=deadline) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None


_WHEEL: trio.lowlevel.RunVar[_Wheel] = trio.lowlevel.RunVar("corral.timer_wheel")


def _wheel() -> _Wheel:
    try:
        return _WHEEL.get()
    except LookupError:
        wheel = _Wheel()
        _WHEEL.set(wheel)
        trio.lowlevel.spawn_system_task(wheel.run, name="corral timer wheel")
        return wheel


def call_at(deadline: float, callback: Callable[[], object]) -> TimerEntry:
    """Run ``callback()`` (synchronous, quick, in the wheel's task) at trio time
    ``deadline`` (at once, at the wheel's next turn, when it has passed).

    Returns:
        The entry: :meth:`TimerEntry.cancel` keeps it from running.
    """
    return _wheel().add(deadline, callback=callback)


async def sleep_until(deadline: float) -> None:
    """Sleep until trio time ``deadline``: ``trio.sleep_until``, served by the wheel.

    A checkpoint, cancellable like ``trio.sleep_until``.
    """
    if deadline <= trio.current_time():
        await trio.lowlevel.checkpoint()
        return
    entry = _wheel().add(deadline, task=trio.lowlevel.current_task())

    def abort(_: object) -> trio.lowlevel.Abort:
        entry.cancel()
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


async def sleep(seconds: float) -> None:
    """Sleep ``seconds``: ``trio.sleep``, served by the wheel.

    Raises:
        ValueError: ``seconds`` is negative or NaN.
    """
    if not seconds >= 0:
        raise ValueError(f"sleep length must be >= 0, got {seconds!r}")
    await sleep_until(trio.current_time() + seconds)
