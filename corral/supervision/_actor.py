"""The Actor base class and the context an actor sees (``self.ctx``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from corral.supervision._errors import UnhandledMessage
from corral.supervision._timers import call_at

if TYPE_CHECKING:
    from corral.supervision._ref import ActorRef
    from corral.supervision._runtime import Cell
    from corral.supervision._system import ActorSystem

__all__ = ["Actor", "ActorContext", "TimerHandle"]


class Actor:
    """Base class of every actor.

    Subclass it, keep private state on ``self``, and override any of
    :meth:`started`, :meth:`handle` and :meth:`stopping`. The kernel calls
    :meth:`handle` with one message at a time; its return value is the reply to
    an ``ask``. If it raises, the actor crashes and its supervisor decides.

    Attributes:
        mailbox_size: default bounded mailbox capacity for this class (a
            ChildSpec's ``mailbox_size`` overrides it).
    """

    mailbox_size: ClassVar[int] = 64
    _ctx: ActorContext | None = None

    def __init__(self) -> None:
        self._ctx = None

    @property
    def ctx(self) -> ActorContext:
        """This actor's context; available from :meth:`started` on."""
        ctx = self._ctx
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__qualname__}.ctx is only available once the actor is spawned "
                "(from started() on), not in __init__"
            )
        return ctx

    async def started(self) -> None:
        """Called after spawn, before the first message. Start timers and tasks here."""

    async def handle(self, message: object) -> object:
        """Handle one message; the return value answers an ``ask``.

        Raises:
            UnhandledMessage: the default; the asker gets it, the actor keeps running.
        """
        raise UnhandledMessage(message)

    async def stopping(self) -> None:
        """Clean up. Runs shielded from cancellation, bounded by the child's shutdown grace.

        Called whenever this instance ends after it was created: on a stop
        request, on a crash, and when its parent is being cancelled.
        """


class TimerHandle:
    """A timer started with :meth:`ActorContext.every` or :meth:`ActorContext.after`.

    It lives in the run's timer wheel (see :mod:`._timers`), not in a task of its own:
    when it is due, the wheel puts its message in the actor's mailbox. It ends with
    the actor: a timer of an actor that stopped sends nothing more.
    """

    __slots__ = ("_ctx", "_entry", "_interval", "_message", "_next_at", "cancelled")

    def __init__(
        self, ctx: ActorContext, message: object, deadline: float, interval: float | None
    ) -> None:
        self._ctx = ctx
        self._message = message
        self._interval = interval
        self._next_at = deadline
        #: Whether :meth:`cancel` was called.
        self.cancelled = False
        self._entry = call_at(deadline, self._fire)

    def cancel(self) -> None:
        """Stop the timer; no further messages come from it. Idempotent."""
        self.cancelled = True
        self._entry.cancel()

    def _fire(self) -> None:
        ctx = self._ctx
        nursery = ctx._nursery
        send = ctx._cell.mailbox_send
        if self.cancelled or nursery is None or send is None:
            return  # cancelled, or the actor stopped: its timers end with it
        try:
            send.send_nowait(self._message)
        except trio.WouldBlock:
            if self._interval is None:
                # A one-shot waits for room (in the actor's nursery: it ends with it).
                nursery.start_soon(_send_when_room, send, self._message)
            # A tick that finds the mailbox full is skipped: ticks never pile up.
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        interval = self._interval
        if interval is None:
            return
        next_at = self._next_at + interval
        now = trio.current_time()
        while next_at <= now:
            next_at += interval
        self._next_at = next_at
        self._entry = call_at(next_at, self._fire)


async def _send_when_room(send: trio.MemorySendChannel[Any], message: object) -> None:
    try:
        await send.send(message)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        return


class ActorContext:
    """What an actor can reach: its ref, path, system, timers, tasks, log and events."""

    __slots__ = ("_cell", "_log", "_nursery")

    def __init__(self, cell: Cell) -> None:
        self._cell = cell
        self._nursery: trio.Nursery | None = None
        self._log: logging.Logger | None = None

    @property
    def ref(self) -> ActorRef:
        """This actor's own ref."""
        return self._cell.ref

    @property
    def path(self) -> str:
        """This actor's path, e.g. ``"/node/coordinator"``."""
        return self._cell.path

    @property
    def name(self) -> str:
        """The last part of the path (the ChildSpec name)."""
        return self._cell.name

    @property
    def system(self) -> ActorSystem:
        """The actor system this actor lives in."""
        return self._cell.system

    @property
    def node_id(self) -> str:
        """The id of this actor's node."""
        return self._cell.system.node_id

    @property
    def log(self) -> logging.Logger:
        """A logger named for this actor: ``corral.actor.<node>.<path parts>``."""
        if self._log is None:
            dotted = ".".join(p for p in self._cell.path.split("/") if p)
            self._log = logging.getLogger(f"corral.actor.{self.node_id}.{dotted}")
        return self._log

    def emit(self, kind: str, **fields: Any) -> None:
        """Record an event about this actor in the system's event log."""
        self._cell.system.emit(kind, self._cell.path, **fields)

    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("timers and tasks can be started from started() on, not before")
        return self._nursery

    def every(self, interval: float, message: object) -> TimerHandle:
        """Tell this actor ``message`` every ``interval`` seconds until cancelled or the actor ends.

        A tick that finds the mailbox full is skipped (ticks never pile up).
        """
        if interval <= 0:
            raise ValueError("timer interval must be positive")
        self._require_nursery()
        return TimerHandle(self, message, trio.current_time() + interval, interval)

    def after(self, delay: float, message: object) -> TimerHandle:
        """Tell this actor ``message`` once, ``delay`` seconds from now.

        Waits for room if the mailbox is full at that moment.
        """
        self._require_nursery()
        return TimerHandle(self, message, trio.current_time() + max(0.0, delay), None)

    def start_task(self, async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run ``async_fn(*args)`` in this actor's own nursery.

        It is cancelled when the actor stops; if it raises, the actor crashes.
        """
        self._require_nursery().start_soon(async_fn, *args)

    def stop(self) -> None:
        """Ask to stop this actor normally (a TRANSIENT child is then not restarted).

        Called from inside ``handle`` the actor finishes that message first.
        """
        self._cell.request_self_stop()
