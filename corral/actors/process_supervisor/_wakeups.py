"""Timed waits for many tasks, woken by one timer task.

A ``trio.sleep`` is a cancel scope with a deadline: when the deadline passes, trio
cancels the scope, delivers ``Cancelled`` into the sleeping task and unwinds it out
of the scope. A node checks the readiness of every instance it runs once per
interval, so on an idle node that machinery, once per check, was a large part of the
CPU. Here a waiting task parks itself (``trio.lowlevel.wait_task_rescheduled``) in a
heap, and one timer task sleeps until the earliest deadline and reschedules, in one
step, every task due by then (instances started together are checked together).

The timer task starts with the first sleep. It ends once nobody waits and either the
last waiter was cancelled or the owner said no sleep is coming (:meth:`Wakeups.idle`):
not merely because it woke every waiter, since those sleep again at once (a readiness
loop), and a timer task started anew for each round would cost what it saves.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import trio

# One waiting task: [task], or [None] once it was woken or cancelled.
_Entry = list[trio.lowlevel.Task | None]


class Wakeups:
    """Sleeps for many tasks on one timer task.

    Args:
        start_soon: starts the timer task in a nursery that outlives the sleeps (the
            nursery of the tasks that sleep, or one enclosing it).
    """

    def __init__(self, start_soon: Callable[..., Any]) -> None:
        self._start_soon = start_soon
        self._heap: list[tuple[float, int, _Entry]] = []
        self._order = itertools.count()
        self._waiting = 0
        self._timer_running = False
        self._poke = trio.Event()
        # Whether the timer may end once nobody waits (see the module's docstring).
        self._may_end = False

    @property
    def waiting(self) -> int:
        """How many tasks are waiting."""
        return self._waiting

    @property
    def timer_running(self) -> bool:
        """Whether the timer task runs."""
        return self._timer_running

    def idle(self) -> None:
        """Say that no sleep is coming for now: the timer task ends as soon as nobody
        waits (a later sleep starts it again)."""
        self._may_end = True
        self._poke.set()

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on trio's clock, as ``trio.sleep`` does
        (a checkpoint; cancellable).

        Raises:
            ValueError: ``seconds`` is negative.
        """
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        await self.sleep_until(trio.current_time() + seconds)

    async def sleep_until(self, deadline: float) -> None:
        """Return once trio's clock reached ``deadline`` (a checkpoint; cancellable)."""
        entry: _Entry = [trio.lowlevel.current_task()]
        heap = self._heap
        earlier = not heap or deadline < heap[0][0]
        heapq.heappush(heap, (deadline, next(self._order), entry))
        self._waiting += 1
        self._may_end = False
        if not self._timer_running:
            self._timer_running = True
            self._poke = trio.Event()
            self._start_soon(self._run)
        elif earlier:
            self._poke.set()  # the timer sleeps until a later deadline

        def abort(_: Any) -> trio.lowlevel.Abort:
            entry[0] = None  # its heap item is dropped when it comes due
            self._waiting -= 1
            if self._waiting == 0:
                self.idle()  # the last one left by cancellation: let the timer end
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _run(self) -> None:
        heap = self._heap
        try:
            while True:
                now = trio.current_time()
                while heap and heap[0][0] <= now:
                    entry = heapq.heappop(heap)[2]
                    task = entry[0]
                    if task is not None:
                        entry[0] = None
                        self._waiting -= 1
                        trio.lowlevel.reschedule(task)
                if not self._waiting:
                    heap.clear()  # only the items of cancelled waiters were left
                    if self._may_end:
                        break
                self._poke = trio.Event()
                if heap:
                    with trio.move_on_at(heap[0][0]):
                        await self._poke.wait()
                else:
                    await self._poke.wait()
        finally:
            self._timer_running = False
            # Only cancelled ones can be left (their tasks are being cancelled too, or
            # they would be stranded): wake them rather than leave them hanging.
            for _, _, entry in heap:
                task = entry[0]
                if task is not None:
                    entry[0] = None
                    self._waiting -= 1
                    trio.lowlevel.reschedule(task)
            heap.clear()
