"""The running kernel: cells (one per child slot), the actor run loop, supervisors.

A :class:`Cell` is one place in the tree: its path, its bounded mailbox, its
counters. It outlives restarts of its actor (messages queued during a restart
wait for the new instance) and is closed when the actor will not run again
there; a closed cell fails queued asks with :class:`ActorStopped`.

A supervisor run owns its children's cells and the nursery their tasks run in.
Each child runs inside a cancel scope shielded from the supervisor, so a
supervisor being cancelled still stops its children one by one in reverse start
order, each with its stop request and bounded grace; only the child itself (or
its grace deadline) ends it. Restart decisions come from ``_policy``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import outcome
import trio

from corral.supervision._actor import Actor, ActorContext
from corral.supervision._errors import (
    ActorCrashed,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    EscalationError,
    UnhandledMessage,
)
from corral.supervision._introspect import ActorSnapshot
from corral.supervision._policy import (
    backoff_delay,
    next_attempt,
    record_restart,
    restart_set,
    should_restart,
)
from corral.supervision._ref import ActorRef, Ask, Directory, Remote
from corral.supervision._spec import ChildSpec, Restart, SupervisorSpec

if TYPE_CHECKING:
    from corral.supervision._system import ActorSystem

logger = logging.getLogger("corral.supervision")

ExitReason = Literal["crashed", "normal", "shutdown"]


@dataclass(slots=True)
class Exit:
    """How one run of a child ended."""

    reason: ExitReason
    error: BaseException | None = None


def leaf_error(exc: BaseException) -> BaseException:
    """The first meaningful exception inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        useful = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = (useful or list(exc.exceptions))[0]
    return exc


def describe_error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def message_label(item: object) -> str:
    """A short name for a message in a mailbox (its kind or class name)."""
    if type(item) is Ask or type(item) is RemoteAsk:
        item = item.message
    kind = getattr(type(item), "__corral_kind__", None)
    return kind if isinstance(kind, str) else type(item).__qualname__


class Signal:
    """A one-shot flag tasks can wait for (a lighter ``trio.Event``; kernels keep many)."""

    __slots__ = ("_waiters", "is_set_")

    def __init__(self) -> None:
        self.is_set_ = False
        self._waiters: list[trio.lowlevel.Task] | None = None

    def is_set(self) -> bool:
        return self.is_set_

    def set(self) -> None:
        if self.is_set_:
            return
        self.is_set_ = True
        waiters, self._waiters = self._waiters, None
        for task in waiters or ():
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        if self.is_set_:
            await trio.lowlevel.checkpoint()
            return
        task = trio.lowlevel.current_task()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            if self._waiters is not None and task in self._waiters:
                self._waiters.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


class RemoteAsk:
    """An ask that arrived from another node; the reply goes back over the transport."""

    __slots__ = ("correlation_id", "link", "message", "peer")

    def __init__(self, link: Remote, message: object, peer: str, correlation_id: int):
        self.link = link
        self.message = message
        self.peer = peer
        self.correlation_id = correlation_id

    def resolve(self, result: outcome.Outcome[Any]) -> None:
        """Queue the reply (used where the caller cannot wait)."""
        self.link.queue_reply(self.peer, self.correlation_id, result)


class Cell:
    """One place in the actor tree."""

    __slots__ = (
        "closed",
        "current",
        "directory",
        "handled",
        "kind",
        "last_error",
        "link",
        "loop_scope",
        "mailbox_receive",
        "mailbox_send",
        "mailbox_size",
        "name",
        "parent",
        "path",
        "ref",
        "restarts",
        "self_stop",
        "state",
        "stop_requested",
        "supervisor",
        "system",
        "takes_messages",
        "task",
    )

    def __init__(
        self,
        system: ActorSystem,
        directory: Directory,
        link: Remote,
        parent: SupervisorRun | None,
        name: str,
        path: str,
        kind: Literal["actor", "supervisor"],
        mailbox_size: int,
    ) -> None:
        self.system = system
        self.directory = directory
        self.link = link
        self.parent = parent
        self.name = name
        self.path = path
        self.kind = kind
        self.mailbox_size = mailbox_size
        self.mailbox_send: trio.MemorySendChannel[Any] | None
        self.mailbox_receive: trio.MemoryReceiveChannel[Any] | None
        if kind == "actor":
            self.mailbox_send, self.mailbox_receive = trio.open_memory_channel[Any](mailbox_size)
        else:
            self.mailbox_send = self.mailbox_receive = None
        #: whether messages can be put in this cell (an actor's), for the frame router
        self.takes_messages = self.mailbox_send is not None
        self.state = "starting"
        self.handled = 0
        self.restarts = 0
        self.last_error: str | None = None
        self.current: object | None = None
        self.closed = False
        self.loop_scope: trio.CancelScope | None = None
        self.task: trio.lowlevel.Task | None = None
        self.stop_requested = False
        self.self_stop = False
        self.supervisor: SupervisorRun | None = None
        self.ref = ActorRef(directory, link, system.node_id, path, self, False)

    # ------------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """A stop request from outside: end the message loop now (cleanup follows)."""
        self.stop_requested = True
        if self.loop_scope is not None:
            self.loop_scope.cancel()

    def request_self_stop(self) -> None:
        """The actor asked to stop itself: a normal exit."""
        self.self_stop = True
        in_handler = trio.lowlevel.current_task() is self.task and self.current is not None
        if not in_handler and self.loop_scope is not None:
            self.loop_scope.cancel()

    def close(self, *, keep_listed: bool = False) -> None:
        """No actor will run here again: fail what is queued and unregister the path.

        ``keep_listed`` leaves the path registered (it is still in the tree, as
        "stopped"), so messages to it raise ActorStopped rather than ActorNotFound.
        """
        if self.closed:
            if not keep_listed:
                self.directory.remove(self)
            return
        self.closed = True
        self.state = "stopped"
        receive = self.mailbox_receive
        if receive is not None:
            stopped = ActorStopped(f"actor {self.path} on {self.system.node_id!r} has stopped")
            while True:
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                if type(item) is Ask or type(item) is RemoteAsk:
                    item.resolve(outcome.Error(stopped))
            receive.close()
            assert self.mailbox_send is not None
            self.mailbox_send.close()
        if not keep_listed:
            self.directory.remove(self)

    # ------------------------------------------------------------------ introspection

    def snapshot(self) -> ActorSnapshot:
        children: tuple[ActorSnapshot, ...] = ()
        if self.supervisor is not None:
            children = tuple(c.cell.snapshot() for c in self.supervisor.children)
        depth = 0
        if self.mailbox_receive is not None and not self.closed:
            depth = self.mailbox_receive.statistics().current_buffer_used
        elif self.supervisor is not None:
            depth = self.supervisor.control_receive.statistics().current_buffer_used
        current = self.current
        return ActorSnapshot(
            path=self.path,
            name=self.name,
            kind=self.kind,
            state=self.state,  # type: ignore[arg-type]
            mailbox_depth=depth,
            messages_handled=self.handled,
            restarts=self.restarts,
            last_error=self.last_error,
            current_message=None if current is None else message_label(current),
            children=children,
        )


# ---------------------------------------------------------------------- actor runs


async def run_actor(
    cell: Cell, spec: ChildSpec, ready: Signal, prepared: Actor | Exception | None = None
) -> Exit:
    """Run one instance of ``spec`` in ``cell`` until it stops, crashes or is told to stop."""
    system = cell.system
    error: BaseException | None = None
    cell.state = "starting"
    cell.self_stop = False
    cell.task = trio.lowlevel.current_task()
    try:
        if isinstance(prepared, Exception):
            raise prepared
        actor = prepared if prepared is not None else spec.factory()
        if not isinstance(actor, Actor):
            raise TypeError(f"the factory of {cell.path} returned {actor!r}, not an Actor")
    except Exception as exc:
        ready.set()
        _record_crash(cell, exc, "creating")
        cell.state = "crashed"
        return Exit("crashed", exc)
    ctx = ActorContext(cell)
    actor._ctx = ctx
    try:
        with trio.CancelScope(shield=True) as loop_scope:
            cell.loop_scope = loop_scope
            if cell.stop_requested:
                loop_scope.cancel()
            async with trio.open_nursery() as nursery:
                ctx._nursery = nursery
                await actor.started()
                cell.state = "running"
                ready.set()
                if system.trace_lifecycle:
                    system.emit("actor.started", cell.path, restarts=cell.restarts)
                await _message_loop(cell, actor)
                nursery.cancel_scope.cancel()
    except Exception as exc:
        error = leaf_error(exc)
        _record_crash(cell, error, "running")  # before cleanup, so the log reads in order
    finally:
        cell.loop_scope = None
        cell.current = None
        ready.set()
        cell.state = "stopping"
        ctx._nursery = None
        with trio.CancelScope(shield=True) as cleanup:
            cleanup.deadline = trio.current_time() + spec.shutdown_grace
            try:
                await actor.stopping()
            except Exception as exc:
                if error is None:
                    cell.last_error = describe_error(exc)
                system.emit("actor.cleanup-failed", cell.path, error=describe_error(exc))
                logger.warning("%s: stopping() raised %r", cell.path, exc)
        if cleanup.cancelled_caught:
            system.emit("actor.cleanup-timeout", cell.path, grace=spec.shutdown_grace)
            logger.warning("%s: stopping() ran past its %s s grace", cell.path, spec.shutdown_grace)
        cell.task = None
    if error is not None:
        cell.state = "crashed"
        return Exit("crashed", error)
    cell.state = "stopped"
    if cell.stop_requested:
        return Exit("shutdown")
    return Exit("normal")


def _record_crash(cell: Cell, error: BaseException, phase: str) -> None:
    cell.last_error = describe_error(error)
    cell.system.emit("actor.crashed", cell.path, error=cell.last_error, phase=phase)
    logger.warning("%s crashed: %s", cell.path, cell.last_error, exc_info=error)


async def _message_loop(cell: Cell, actor: Actor) -> None:
    assert cell.mailbox_receive is not None
    receive = cell.mailbox_receive.receive
    handle = actor.handle
    while not cell.self_stop:
        item = await receive()
        cell.current = item
        kind = type(item)
        if kind is Ask:
            try:
                result = await handle(item.message)
            except UnhandledMessage as exc:
                item.resolve(outcome.Error(exc))
            except Exception as exc:
                item.resolve(outcome.Error(_crash_error(cell, item.message, exc)))
                raise
            except BaseException:
                item.resolve(outcome.Error(_stopped_error(cell)))
                raise
            else:
                item.resolve(outcome.Value(result))
        elif kind is RemoteAsk:
            try:
                result = await handle(item.message)
            except UnhandledMessage as exc:
                await item.link.reply_error(item.peer, item.correlation_id, exc)
            except Exception as exc:
                item.resolve(outcome.Error(_crash_error(cell, item.message, exc)))
                raise
            except BaseException:
                item.resolve(outcome.Error(_stopped_error(cell)))
                raise
            else:
                # Sent now, from the actor's task, so the reply goes out before any
                # tell the actor sends later; the value as it is, no outcome around it.
                await item.link.reply(item.peer, item.correlation_id, result)
        else:
            try:
                await handle(item)
            except UnhandledMessage:
                cell.system.emit("actor.unhandled", cell.path, message=message_label(item))
                logger.info("%s: unhandled %s", cell.path, message_label(item))
        cell.handled += 1
        cell.current = None


def _crash_error(cell: Cell, message: object, exc: BaseException) -> ActorCrashed:
    err = ActorCrashed(
        f"actor {cell.path} crashed handling {message_label(message)}: {describe_error(exc)}"
    )
    err.__cause__ = exc
    return err


def _stopped_error(cell: Cell) -> ActorStopped:
    return ActorStopped(f"actor {cell.path} was stopped before it replied")


# ---------------------------------------------------------------------- supervisors


@dataclass(slots=True)
class StartChild:
    spec: ChildSpec | SupervisorSpec


@dataclass(slots=True)
class StopChild:
    name: str


@dataclass(slots=True)
class ChildEnded:
    child: Child
    run_id: int


@dataclass(slots=True)
class RestartDue:
    children: list[Child]
    token: int


class Child:
    """A supervisor's record of one child across its restarts."""

    __slots__ = (
        "attempt",
        "cell",
        "done",
        "exit",
        "prepared",
        "ready",
        "run_id",
        "spec",
        "started_at",
        "stopping",
    )

    def __init__(self, spec: ChildSpec | SupervisorSpec, cell: Cell) -> None:
        self.spec = spec
        self.cell = cell
        self.run_id = 0
        self.attempt = 0
        self.started_at = 0.0
        self.done = Signal()
        self.done.set()  # not running yet
        self.ready = Signal()
        self.exit: Exit | None = None
        self.stopping = False
        self.prepared: Actor | Exception | None = None

    @property
    def running(self) -> bool:
        return not self.done.is_set()


async def run_supervisor(
    cell: Cell, spec: SupervisorSpec, ready: Signal, *, shield: bool = True
) -> Exit:
    """Run one life of a supervisor in ``cell``; return how it ended.

    ``shield=False`` (the root) lets an outer cancellation reach the supervisor,
    which then still stops its children in order.
    """
    run = SupervisorRun(cell, spec)
    cell.supervisor = run
    cell.state = "starting"
    try:
        with trio.CancelScope(shield=shield) as loop_scope:
            cell.loop_scope = loop_scope
            if cell.stop_requested:
                loop_scope.cancel()
            await run.run(ready)
    except Exception as exc:
        error = leaf_error(exc)
        cell.loop_scope = None
        ready.set()
        _record_crash(cell, error, "supervising")
        cell.state = "crashed"
        return Exit("crashed", error)
    cell.loop_scope = None
    ready.set()
    cell.state = "stopped"
    return Exit("shutdown" if cell.stop_requested else "normal")


class SupervisorRun:
    """One life of a supervisor: its children, their cells, and its restart history."""

    def __init__(self, cell: Cell, spec: SupervisorSpec) -> None:
        self.cell = cell
        self.spec = spec
        self.system = cell.system
        self.children: list[Child] = []
        self.by_name: dict[str, Child] = {}
        self.history: tuple[float, ...] = ()
        # The control queue holds child exits and spawn/stop requests; it is bounded by
        # the number of children plus callers awaiting a spawn/stop, so no size limit.
        self.control_send, self.control_receive = trio.open_memory_channel[Any](math.inf)
        self._nursery: trio.Nursery | None = None
        self._token = 0

    def child_path(self, name: str) -> str:
        base = self.cell.path
        return f"{base}{name}" if base.endswith("/") else f"{base}/{name}"

    async def run(self, ready: Signal) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                for spec in self.spec.children:
                    child = self._add(spec)
                    await self._start(child)
                self.cell.state = "running"
                ready.set()
                receive = self.control_receive.receive
                while True:
                    await self._on_control(await receive())
            finally:
                self.cell.state = "stopping"
                with trio.CancelScope(shield=True) as scope:
                    if self.spec.shutdown_grace is not None:
                        scope.deadline = trio.current_time() + self.spec.shutdown_grace
                    await self._stop_all()
                self.close_cells()
                self._refuse_pending_requests()
                nursery.cancel_scope.cancel()  # backoff timers

    def _refuse_pending_requests(self) -> None:
        """Answer spawn/stop requests still queued: this supervisor is gone."""
        self.control_send.close()
        while True:
            try:
                item = self.control_receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            if type(item) is Ask:
                item.resolve(outcome.Error(ActorStopped(f"supervisor {self.cell.path} stopped")))

    # ------------------------------------------------------------------ children

    def _add(self, spec: ChildSpec | SupervisorSpec) -> Child:
        if spec.name in self.by_name:
            raise ActorExists(
                f"{self.cell.path} already has a child named {spec.name!r}; pick another name"
            )
        path = self.child_path(spec.name)
        prepared: Actor | Exception | None = None
        if isinstance(spec, SupervisorSpec):
            cell = self._new_cell(spec.name, path, "supervisor", 0)
        else:
            size = spec.mailbox_size
            if size is None:
                # The mailbox exists before the first start, so build the first
                # instance now to learn its class's mailbox_size.
                try:
                    prepared = spec.factory()
                except Exception as exc:
                    prepared = exc  # the first start crashes with it
                size = getattr(prepared, "mailbox_size", Actor.mailbox_size)
                if not isinstance(size, int) or size < 1:
                    size = Actor.mailbox_size
            cell = self._new_cell(spec.name, path, "actor", size)
        self.cell.directory.add(cell)
        child = Child(spec, cell)
        if isinstance(spec, ChildSpec):
            child.prepared = prepared
        self.children.append(child)
        self.by_name[spec.name] = child
        return child

    def _new_cell(
        self, name: str, path: str, kind: Literal["actor", "supervisor"], mailbox_size: int
    ) -> Cell:
        parent = self.cell
        return Cell(
            self.system, parent.directory, parent.link, self, name, path, kind, mailbox_size
        )

    async def _start(self, child: Child) -> None:
        assert self._nursery is not None
        child.run_id += 1
        child.done = Signal()
        child.ready = Signal()
        child.exit = None
        child.stopping = False
        child.cell.stop_requested = False
        child.started_at = trio.current_time()
        self._nursery.start_soon(self._run_child, child, child.run_id, child.ready, child.done)
        await child.ready.wait()

    async def _run_child(self, child: Child, run_id: int, ready: Signal, done: Signal) -> None:
        # The child's own loop scope is shielded: only its stop request (or its
        # grace deadline) ends it, never its supervisor's cancellation.
        spec = child.spec
        if isinstance(spec, SupervisorSpec):
            exit_ = await run_supervisor(child.cell, spec, ready)
        else:
            prepared, child.prepared = child.prepared, None
            exit_ = await run_actor(child.cell, spec, ready, prepared)
        child.exit = exit_
        done.set()
        if not child.stopping and child.run_id == run_id:
            try:
                self.control_send.send_nowait(ChildEnded(child, run_id))
            except trio.ClosedResourceError:
                pass  # the supervisor is already gone

    async def _stop_child(self, child: Child) -> None:
        if child.running:
            child.stopping = True
            child.cell.request_stop()
            await child.done.wait()

    async def _stop_all(self) -> None:
        for child in reversed(self.children):
            was_running = child.running
            await self._stop_child(child)
            child.cell.state = "stopped"
            if was_running:
                self.system.emit("actor.stopped", child.cell.path, reason="shutdown")

    def close_cells(self) -> None:
        """Close every cell of this run's subtree (the run is over for good)."""
        for child in self.children:
            if child.cell.supervisor is not None:
                child.cell.supervisor.close_cells()
            child.cell.close()

    def _remove(self, child: Child) -> None:
        if self.by_name.get(child.spec.name) is child:
            del self.by_name[child.spec.name]
            self.children.remove(child)
        if child.cell.supervisor is not None:
            child.cell.supervisor.close_cells()
        child.cell.close()

    # ------------------------------------------------------------------ control

    async def _on_control(self, item: Any) -> None:
        if type(item) is ChildEnded:
            await self._on_child_ended(item.child, item.run_id)
        elif type(item) is RestartDue:
            await self._on_restart_due(item)
        elif type(item) is Ask:
            request = item.message
            try:
                if type(request) is StartChild:
                    child = self._add(request.spec)
                    await self._start(child)
                    item.resolve(outcome.Value(child.cell.ref))
                elif type(request) is StopChild:
                    found = self.by_name.get(request.name)
                    if found is None:
                        raise ActorNotFound(f"{self.cell.path} has no child named {request.name!r}")
                    await self._stop_child(found)
                    self._remove(found)
                    self.system.emit("actor.stopped", found.cell.path, reason="stop request")
                    item.resolve(outcome.Value(None))
            except Exception as exc:  # a bad request never takes the supervisor down
                item.resolve(outcome.Error(exc))
            except BaseException:
                item.resolve(outcome.Error(ActorStopped(f"supervisor {self.cell.path} stopped")))
                raise

    async def _on_child_ended(self, child: Child, run_id: int) -> None:
        if (
            self.by_name.get(child.spec.name) is not child
            or child.run_id != run_id
            or child.exit is None
        ):
            return
        exit_ = child.exit
        crashed = exit_.reason == "crashed"
        restart = child.spec.restart
        if not should_restart(restart, crashed):
            if restart is Restart.TEMPORARY:
                self._remove(child)
            else:
                child.cell.close(keep_listed=True)
            self.system.emit(
                "actor.stopped", child.cell.path, reason="crashed" if crashed else "normal"
            )
            return
        now = trio.current_time()
        self.history, exceeded = record_restart(
            self.history, now, self.spec.max_restarts, self.spec.within
        )
        if exceeded:
            self.system.emit(
                "supervisor.escalated",
                self.cell.path,
                child=child.cell.path,
                max_restarts=self.spec.max_restarts,
                within=self.spec.within,
            )
            raise EscalationError(
                f"supervisor {self.cell.path} gave up: more than {self.spec.max_restarts} "
                f"restarts within {self.spec.within} s; last: {child.cell.path} "
                f"({child.cell.last_error or exit_.reason})"
            )
        index = self.children.index(child)
        group = [
            self.children[i] for i in restart_set(self.spec.strategy, len(self.children), index)
        ]
        # Siblings go down in reverse start order; temporary ones and those that had
        # already stopped for good do not come back.
        coming_back = [child]
        for sibling in reversed(group):
            if sibling is child:
                continue
            was_live = sibling.running or sibling.cell.state == "restarting"
            await self._stop_child(sibling)
            if sibling.spec.restart is Restart.TEMPORARY:
                self._remove(sibling)
            elif was_live:
                coming_back.append(sibling)
        group = [c for c in self.children if c in coming_back]
        reset_after = self.spec.backoff.reset_after or self.spec.within
        child.attempt = next_attempt(child.attempt, now - child.started_at, reset_after)
        delay = backoff_delay(self.spec.backoff, child.attempt)
        for c in group:
            c.cell.state = "restarting"
        self.system.emit(
            "actor.restarting",
            child.cell.path,
            delay=delay,
            attempt=child.attempt,
            group=[c.cell.path for c in group],
        )
        self._token += 1
        due = RestartDue(group, self._token)
        if delay > 0:
            assert self._nursery is not None
            self._nursery.start_soon(self._restart_later, delay, due)
        else:
            await self._on_restart_due(due)

    async def _restart_later(self, delay: float, due: RestartDue) -> None:
        await trio.sleep(delay)
        try:
            self.control_send.send_nowait(due)
        except trio.ClosedResourceError:
            pass  # the supervisor is already gone

    async def _on_restart_due(self, due: RestartDue) -> None:
        for child in due.children:
            if (
                self.by_name.get(child.spec.name) is not child
                or child.running
                or child.cell.state != "restarting"
            ):
                continue
            child.cell.restarts += 1
            await self._start(child)
