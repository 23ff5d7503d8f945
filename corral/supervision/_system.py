"""ActorSystem: the root of one node's actor tree, its event log, and its link to other nodes.

Local messages never leave Python: a ref holds its actor's cell and ``tell`` is
one memory-channel send. Messages for other nodes go through the remote bridge
(:class:`~corral.supervision._remote.RemoteBridge`), which refs reach through
the small :class:`~corral.supervision._ref.Remote` protocol; the system only
creates the bridge, attaches it to the transport and closes the transport.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from corral.supervision._errors import ActorNotFound, ActorStopped
from corral.supervision._introspect import ActorSnapshot, Event
from corral.supervision._ref import ActorRef, Ask, Directory, Remote
from corral.supervision._remote import RemoteBridge, Unreachable
from corral.supervision._runtime import (
    Cell,
    Signal,
    StartChild,
    StopChild,
    leaf_error,
    run_supervisor,
)
from corral.supervision._spec import ChildSpec, SupervisorSpec
from corral.transport import CodecLimits, LogBudget, Transport, split_address

__all__ = ["ActorSystem", "open_actor_system", "run_actor_system"]

_DEFAULT_LIMITS = CodecLimits()

_CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)


class ActorSystem:
    """One node's actors. Create it with :func:`open_actor_system` or :func:`run_actor_system`.

    Attributes:
        node_id: this node's id.
        limits: codec limits applied to every frame sent and received.
    """

    def __init__(
        self,
        node_id: str,
        transport: Transport | None = None,
        limits: CodecLimits = _DEFAULT_LIMITS,
        *,
        event_log_size: int = 1000,
        remote_delivery_wait: float = 0.5,
    ) -> None:
        if not node_id or "/" in node_id:
            raise ValueError(f"node id {node_id!r} must be non-empty and contain no '/'")
        if transport is not None and transport.node_id != node_id:
            raise ValueError(
                f"the transport belongs to node {transport.node_id!r}, not {node_id!r}"
            )
        self.node_id = node_id
        self.limits = limits
        self.transport = transport
        #: emit "actor.started" events (off for bulk spawns if they would flood the log)
        self.trace_lifecycle = True
        self._events: deque[Event] = deque(maxlen=event_log_size)
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        #: WARNING lines about refused frames: a few per peer per minute, then a count
        self.rejection_log = LogBudget(burst=5, interval=60.0)
        self._directory = Directory()
        self._bridge: RemoteBridge | None = None
        link: Remote
        if transport is None:
            link = Unreachable(node_id)
        else:
            link = self._bridge = RemoteBridge(
                node_id,
                transport,
                limits,
                self._directory,
                self.emit,
                self.rejection_log,
                delivery_wait=remote_delivery_wait,
            )
        self._link = link
        self._root = Cell(self, self._directory, link, None, node_id, "/", "supervisor", 0)
        self._shutdown = trio.Event()
        self._root_done = trio.Event()

    # ------------------------------------------------------------------ public API

    @property
    def root(self) -> ActorRef:
        """The ref of the root supervisor (path ``"/"``)."""
        return self._root.ref

    async def spawn(
        self, spec: ChildSpec | SupervisorSpec, *, parent: ActorRef | None = None
    ) -> ActorRef:
        """Start ``spec`` under the root supervisor (or under ``parent``) and return its ref.

        Returns once the actor's ``started()`` has finished (for a supervisor:
        once all its children have).

        Raises:
            ActorExists: the parent already has a child of that name.
            ActorNotFound: ``parent`` is not a supervisor of this system.
            ActorStopped: the parent is shutting down.
        """
        target = self._root if parent is None else self._directory.get(parent.path)
        if target is None or target.kind != "supervisor" or (parent and parent.is_remote):
            raise ActorNotFound(f"{parent!r} is not a supervisor on node {self.node_id!r}")
        ref: ActorRef = await self._control(target, StartChild(spec))
        return ref

    async def stop(self, ref: ActorRef) -> None:
        """Stop one actor (or supervisor subtree) gracefully and remove it from its parent.

        Raises:
            ActorNotFound: no such local actor.
        """
        cell = self._directory.get(ref.path)
        if cell is None or ref.is_remote or cell.parent is None:
            raise ActorNotFound(f"no actor at {ref.path} on node {self.node_id!r} to stop")
        await self._control(cell.parent.cell, StopChild(cell.name))

    def ref(self, address: str, *, node: str | None = None) -> ActorRef:
        """A ref to the actor at ``address``.

        Args:
            address: ``"node-b/coordinator"`` (node and path), or a path such as
                ``"/coordinator"`` (this node unless ``node`` is given).
            node: the node, when ``address`` is a path.

        The actor need not exist yet: ``tell``/``ask`` resolve the path when used.
        """
        if node is None:
            if address.startswith("/"):
                node, path = self.node_id, address
            else:
                node, path = split_address(address)
        else:
            path = address if address.startswith("/") else "/" + address
        if len(path) > 1:
            path = path.rstrip("/")
        if node == self.node_id:
            cell = self._directory.get(path)
            return ActorRef(self._directory, self._link, node, path, cell, False)
        return ActorRef(self._directory, self._link, node, path, None, True)

    def tree(self) -> ActorSnapshot:
        """A snapshot of the whole actor tree, from the root supervisor down."""
        return self._root.snapshot()

    def events(self) -> list[Event]:
        """The most recent events, oldest first (a bounded ring buffer)."""
        return list(self._events)

    def emit(self, kind: str, path: str = "/", **fields: Any) -> None:
        """Record an event in the log and pass it to live subscribers (dropped if they lag)."""
        event = Event(trio.current_time(), kind, path, fields)
        self._events.append(event)
        for channel in self._subscribers:
            try:
                channel.send_nowait(event)
            except (trio.WouldBlock, *_CLOSED):
                pass

    @asynccontextmanager
    async def subscribe_events(
        self, buffer: int = 256
    ) -> AsyncIterator[trio.MemoryReceiveChannel[Event]]:
        """A live stream of events from now on, as a receive channel.

        Events that arrive while the subscriber's ``buffer`` is full are dropped
        for that subscriber (the log keeps them).
        """
        send, receive = trio.open_memory_channel[Event](buffer)
        self._subscribers.append(send)
        try:
            async with receive:
                yield receive
        finally:
            self._subscribers.remove(send)
            send.close()

    def shutdown(self) -> None:
        """Ask the system to shut down (what leaving ``open_actor_system`` does)."""
        self._shutdown.set()

    # ------------------------------------------------------------------ internals

    async def _control(self, target: Cell, request: object) -> Any:
        run = target.supervisor
        if run is None or target.closed or target.state in ("stopping", "stopped"):
            raise ActorStopped(f"supervisor {target.path} is not running")
        ask = Ask(request)
        try:
            run.control_send.send_nowait(ask)
        except _CLOSED:
            raise ActorStopped(f"supervisor {target.path} is not running") from None
        return await ask.wait()

    async def _run(self, root: SupervisorSpec, task_status: trio.TaskStatus[None]) -> None:
        ready = Signal()
        async with trio.open_nursery() as nursery:

            async def signal_ready() -> None:
                await ready.wait()
                task_status.started()

            nursery.start_soon(signal_ready)
            try:
                exit_ = await run_supervisor(self._root, root, ready, shield=False)
            finally:
                self._root_done.set()
            if exit_.error is not None:
                raise exit_.error


_DEFAULT_ROOT = SupervisorSpec(name="root", max_restarts=10, within=60.0)


@asynccontextmanager
async def open_actor_system(
    node_id: str,
    transport: Transport | None = None,
    limits: CodecLimits = _DEFAULT_LIMITS,
    *,
    children: Sequence[ChildSpec | SupervisorSpec] = (),
    root: SupervisorSpec | None = None,
    event_log_size: int = 1000,
) -> AsyncIterator[ActorSystem]:
    """Run an actor system for the duration of the block.

    Args:
        node_id: this node's id (also the transport's).
        transport: links to other nodes; the system closes it on exit. None: local only.
        limits: codec limits for frames sent and received.
        children: specs started under the root, in order, before the block runs.
        root: the root supervisor's policy (strategy, intensity, backoff); its
            name is ignored (the root's path is ``"/"``).
        event_log_size: how many recent events ``events()`` keeps.

    Leaving the block stops every actor in reverse start order, each with its
    grace period, then ends the transport loops and closes the transport.

    Raises:
        EscalationError: a top-level child exceeded the root's restart intensity.
    """
    system = ActorSystem(node_id, transport, limits, event_log_size=event_log_size)
    root_spec = root or _DEFAULT_ROOT
    if children:
        root_spec = SupervisorSpec(
            name=root_spec.name,
            children=tuple(root_spec.children) + tuple(children),
            strategy=root_spec.strategy,
            max_restarts=root_spec.max_restarts,
            within=root_spec.within,
            backoff=root_spec.backoff,
        )
    forget_losses = None
    try:
        async with trio.open_nursery() as nursery:
            if system._bridge is not None:
                forget_losses = system._bridge.attach(nursery)
            await nursery.start(system._run, root_spec)
            try:
                yield system
            finally:
                system._root.request_stop()
                await system._root_done.wait()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        error = leaf_error(group)
        if isinstance(error, Exception):
            raise error from None
        raise
    finally:
        if forget_losses is not None:
            forget_losses()
        if transport is not None:
            with trio.CancelScope(shield=True):
                await transport.aclose()


async def run_actor_system(
    node_id: str,
    transport: Transport | None = None,
    limits: CodecLimits = _DEFAULT_LIMITS,
    *,
    children: Sequence[ChildSpec | SupervisorSpec] = (),
    root: SupervisorSpec | None = None,
    event_log_size: int = 1000,
    task_status: trio.TaskStatus[ActorSystem] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an actor system as a long-running service.

    Use it as ``system = await nursery.start(run_actor_system, "node-a")``.

    Runs until cancelled or until ``system.shutdown()``; then shuts down as
    :func:`open_actor_system` does.
    """
    async with open_actor_system(
        node_id,
        transport,
        limits,
        children=children,
        root=root,
        event_log_size=event_log_size,
    ) as system:
        task_status.started(system)
        await system._shutdown.wait()
