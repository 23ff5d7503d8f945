"""ActorSystem: the root of one node's actor tree, its event log, and its link to other nodes.

Local messages never leave Python: a ref holds its actor's cell and ``tell`` is
one memory-channel send. Remote messages are encoded into envelopes and handed
to the :class:`~corral.transport.Transport`. Arriving frames are decoded,
checked against their kind's schema and put in the target's mailbox, or the
asker is answered with an ``"error"`` envelope (the system keeps running). The
transport's own receiving task does this when it can
(:meth:`~corral.transport.Transport.deliver_frames_to`: one task switch less
per frame); otherwise one receive loop per system does.

An ask waiting for a remote reply fails with ``PeerUnavailable`` as soon as the
transport reports that peer lost (:meth:`~corral.transport.Transport.on_peer_lost`),
rather than waiting out its deadline. Refused frames are logged at WARNING within
a budget per peer (:class:`~corral.transport._log_budget.LogBudget`); each is
still recorded as a ``transport.rejected`` event.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import outcome
import trio

from corral.supervision._errors import (
    ActorCrashed,
    ActorNotFound,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    RemoteError,
    UnhandledMessage,
)
from corral.supervision._introspect import ActorSnapshot, Event
from corral.supervision._ref import ActorRef, Ask
from corral.supervision._runtime import (
    Cell,
    RemoteAsk,
    Signal,
    StartChild,
    StopChild,
    describe_error,
    leaf_error,
    run_supervisor,
)
from corral.supervision._spec import ChildSpec, SupervisorSpec
from corral.transport._base import Frame, PeerLost, Transport
from corral.transport._codec import (
    DEFAULT_LIMITS,
    CodecLimits,
    Envelope,
    ErrorCode,
    decode_envelope,
    encode_envelope,
    peek_header,
    split_address,
)
from corral.transport._errors import (
    FrameError,
    FrameTooLarge,
    PeerUnavailable,
    SchemaError,
    TransportError,
    UnknownKind,
)
from corral.transport._log_budget import LogBudget
from corral.transport._schema import (
    decode_message,
    encode_message,
    encode_value,
    message_kind,
)

__all__ = ["ActorSystem", "open_actor_system", "run_actor_system"]

logger = logging.getLogger("corral.supervision")

_CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)

# error code -> local exception type, for errors the asker can act on by type
_TYPED_ERRORS: dict[str, type[Exception]] = {
    ErrorCode.ACTOR_NOT_FOUND: ActorNotFound,
    ErrorCode.ACTOR_STOPPED: ActorStopped,
    ErrorCode.MAILBOX_FULL: MailboxFull,
}


class _PendingAsk(Ask):
    """A remote ask waiting for its reply: the slot, and whom it asked."""

    __slots__ = ("peer", "target")

    def __init__(self, message: object, peer: str, target: str) -> None:
        super().__init__(message)
        self.peer = peer
        self.target = target


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
        limits: CodecLimits = DEFAULT_LIMITS,
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
        self._remote_delivery_wait = remote_delivery_wait
        self._cells: dict[str, Cell] = {}
        self._events: deque[Event] = deque(maxlen=event_log_size)
        self._subscribers: list[trio.MemorySendChannel[Event]] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, _PendingAsk] = {}
        #: WARNING lines about refused frames: a few per peer per minute, then a count
        self.rejection_log = LogBudget(burst=5, interval=60.0)
        # Frames that could not be sent from the caller's task wait here; while any
        # wait for a peer, later frames to that peer queue behind them (per-pair order).
        self._outbox_send, self._outbox_receive = trio.open_memory_channel[tuple[str, bytes]](256)
        self._queued: dict[str, int] = {}
        self._root = Cell(self, None, node_id, "/", "supervisor", 0)
        self._shutdown = trio.Event()
        self._root_done = trio.Event()
        self._address = f"{node_id}/"

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
        target = self._root if parent is None else self._cells.get(parent.path)
        if target is None or target.kind != "supervisor" or (parent and parent.is_remote):
            raise ActorNotFound(f"{parent!r} is not a supervisor on node {self.node_id!r}")
        ref: ActorRef = await self._control(target, StartChild(spec))
        return ref

    async def stop(self, ref: ActorRef) -> None:
        """Stop one actor (or supervisor subtree) gracefully and remove it from its parent.

        Raises:
            ActorNotFound: no such local actor.
        """
        cell = self._cells.get(ref.path)
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
            cell = self._cells.get(path)
            return ActorRef(self, node, path, cell, False)
        return ActorRef(self, node, path, None, True)

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

    def _register(self, cell: Cell) -> None:
        self._cells[cell.path] = cell

    def _unregister(self, cell: Cell) -> None:
        if self._cells.get(cell.path) is cell:
            del self._cells[cell.path]

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

    # ------------------------------------------------------------------ remote: sending

    def _require_transport(self, node: str) -> Transport:
        if self.transport is None:
            raise PeerUnavailable(
                f"actor system {self.node_id!r} has no transport, so node {node!r} "
                "is unreachable; pass transport= to open_actor_system"
            )
        return self.transport

    def _encode_to(self, ref: ActorRef, message: object, ident: int, ask: bool) -> bytes:
        kind, body = encode_message(message)
        return encode_envelope(
            Envelope(ident, ref.address, self._address, kind, body, None, ask), self.limits
        )

    async def _remote_tell(self, ref: ActorRef, message: object) -> None:
        transport = self._require_transport(ref.node_id)
        data = self._encode_to(ref, message, next(self._ids), False)
        await self._send_frame(transport, ref.node_id, data)

    def _remote_tell_nowait(self, ref: ActorRef, message: object) -> None:
        self._require_transport(ref.node_id)
        data = self._encode_to(ref, message, next(self._ids), False)
        if not self._enqueue(ref.node_id, data):
            raise MailboxFull(f"the outbound queue of {self.node_id!r} is full; use `await tell()`")

    async def _remote_ask(self, ref: ActorRef, message: object, timeout: float) -> Any:  # noqa: ASYNC109
        self._require_transport(ref.node_id)

        def build(ident: int, sender: str) -> bytes:
            kind, body = encode_message(message)
            return encode_envelope(
                Envelope(ident, ref.address, sender, kind, body, None, True), self.limits
            )

        return await self._raw_ask(ref.node_id, build, timeout, ref.address, message)

    async def _raw_ask(
        self,
        peer: str,
        build: Callable[[int, str], bytes],
        timeout: float,  # noqa: ASYNC109
        target: str = "",
        message: object = None,
    ) -> Any:
        """Send the frame ``build(id, from_address)`` as an ask to ``peer`` and await its reply.

        The kernel's remote ask, also used by the transport contract tests to send
        hand-made (bad) frames and observe the error reply.
        """
        transport = self._require_transport(peer)
        ident = next(self._ids)
        data = build(ident, self._address)
        slot = _PendingAsk(message, peer, target or f"node {peer!r}")
        self._pending[ident] = slot
        try:
            with trio.move_on_after(timeout if timeout is not None else math.inf):
                await self._send_frame(transport, peer, data)
                return await slot.wait()
        finally:
            self._pending.pop(ident, None)
        raise AskTimeout(
            f"no reply from {target or peer} within {timeout} s to a "
            f"{type(message).__qualname__} message; the node may be slow, partitioned or down"
        )

    def _reply_frame(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> bytes:
        """Encode the reply (or error) envelope for an ask from ``peer``."""
        ident = next(self._ids)
        to = f"{peer}/"
        if isinstance(result, outcome.Value):
            value = result.value
            kind = message_kind(value)
            try:
                if kind is not None:
                    body = [kind, encode_message(value)[1]]
                else:
                    body = [None, encode_value(value)]
                return encode_envelope(
                    Envelope(ident, to, self._address, "reply", body, correlation_id), self.limits
                )
            except FrameTooLarge as exc:
                code, text = ErrorCode.FRAME_TOO_LARGE, f"the reply is too large: {exc}"
            except (FrameError, TypeError, ValueError) as exc:
                code, text = ErrorCode.REPLY_NOT_ENCODABLE, f"the reply cannot be sent: {exc}"
        else:
            assert isinstance(result, outcome.Error)
            code, text = _error_code(result.error)
        return self._error_frame(peer, correlation_id, code, text)

    def _error_frame(self, peer: str, correlation_id: int, code: str, text: str) -> bytes:
        """An ``"error"`` envelope; the message is shortened until the frame fits the limit."""
        for limit in (4000, 200, 0):
            try:
                return encode_envelope(
                    Envelope(
                        next(self._ids),
                        f"{peer}/",
                        self._address,
                        "error",
                        {"code": code, "message": text[:limit]},
                        correlation_id,
                    ),
                    self.limits,
                )
            except FrameTooLarge:
                continue
        raise FrameTooLarge(
            f"even an empty error reply exceeds {self.limits.max_frame_bytes} bytes"
        )

    async def _send_reply(
        self, peer: str, correlation_id: int, result: outcome.Outcome[Any]
    ) -> None:
        try:
            data = self._reply_frame(peer, correlation_id, result)
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)
            return
        if self.transport is None:
            return
        try:
            await self._send_frame(self.transport, peer, data)
        except (TransportError, *_CLOSED) as exc:
            logger.info("%s: reply to %s lost: %s", self.node_id, peer, describe_error(exc))
            self.emit("transport.reply-lost", "/", peer=peer, error=describe_error(exc))

    def _queue_reply(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> None:
        try:
            self._queue_frame(peer, self._reply_frame(peer, correlation_id, result))
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)

    def _queue_frame(self, peer: str, data: bytes) -> None:
        if not self._enqueue(peer, data):
            logger.info("%s: outbound queue full, a frame to %s was dropped", self.node_id, peer)
            self.emit("transport.reply-lost", "/", peer=peer, error="outbound queue full")

    def _enqueue(self, peer: str, data: bytes) -> bool:
        try:
            self._outbox_send.send_nowait((peer, data))
        except (trio.WouldBlock, *_CLOSED):
            return False
        self._queued[peer] = self._queued.get(peer, 0) + 1
        return True

    async def _send_frame(self, transport: Transport, peer: str, data: bytes) -> None:
        """Send now, unless frames to ``peer`` are queued: then queue behind them."""
        if not self._queued.get(peer):
            await transport.send(peer, data)
            return
        self._queued[peer] += 1
        try:
            await self._outbox_send.send((peer, data))
        except BaseException:
            self._sent_one(peer)
            raise

    def _sent_one(self, peer: str) -> None:
        left = self._queued.get(peer, 0) - 1
        if left > 0:
            self._queued[peer] = left
        else:
            self._queued.pop(peer, None)

    async def _outbox_loop(self, transport: Transport) -> None:
        async for peer, data in self._outbox_receive:
            try:
                await transport.send(peer, data)
            except (TransportError, *_CLOSED) as exc:
                logger.info("%s: frame to %s lost: %s", self.node_id, peer, describe_error(exc))
            finally:
                self._sent_one(peer)

    # ------------------------------------------------------------------ remote: receiving

    async def _receive_loop(self, transport: Transport) -> None:
        while True:
            try:
                frame = await transport.receive()
            except (*_CLOSED, trio.EndOfChannel):
                return
            await self._deliver_frame(frame)

    async def _deliver_frame(self, frame: Frame) -> None:
        """Handle one arriving frame; never raises (but for cancellation)."""
        try:
            await self._on_frame(frame)
        except Exception as exc:  # never let one frame stop the loop
            logger.exception("%s: internal error on a frame from %s", self.node_id, frame.sender)
            self._reject(frame.sender, None, ErrorCode.MALFORMED_FRAME, describe_error(exc))

    def _on_peer_lost(self, event: PeerLost) -> None:
        """Fail every ask waiting for a reply from the lost peer (the reply cannot come)."""
        lost = [slot for slot in self._pending.values() if slot.peer == event.peer]
        for slot in lost:
            slot.resolve(
                outcome.Error(
                    PeerUnavailable(
                        f"lost node {event.peer!r} while waiting for the reply from "
                        f"{slot.target} to a {type(slot.message).__qualname__} message "
                        f"({event.reason}); the request may or may not have been handled"
                    )
                )
            )
        logger.info(
            "%s: lost node %r (%s); %d pending asks failed",
            self.node_id,
            event.peer,
            event.reason,
            len(lost),
        )
        self.emit("transport.peer-lost", "/", peer=event.peer, reason=event.reason, asks=len(lost))

    async def _on_frame(self, frame: Frame) -> None:
        try:
            envelope = decode_envelope(frame.data, self.limits)
        except FrameError as exc:
            code = (
                ErrorCode.FRAME_TOO_LARGE
                if isinstance(exc, FrameTooLarge)
                else ErrorCode.MALFORMED_FRAME
            )
            header = peek_header(frame.data)
            ask_id = header[0] if header is not None and header[2] else None
            self._reject(frame.sender, ask_id, code, str(exc))
            return
        kind = envelope.kind
        if kind == "reply" or kind == "error":
            self._on_reply(frame.sender, envelope)
            return
        ask_id = envelope.id if envelope.expects_reply else None
        try:
            message = decode_message(kind, envelope.body)
        except UnknownKind as exc:
            self._reject(frame.sender, ask_id, ErrorCode.UNKNOWN_KIND, str(exc))
            return
        except SchemaError as exc:
            self._reject(frame.sender, ask_id, ErrorCode.SCHEMA, f"{kind}: {exc}")
            return
        node, path = split_address(envelope.to)
        if len(path) > 1:
            path = path.rstrip("/")
        cell = self._cells.get(path) if node == self.node_id else None
        if cell is None:
            self._reject(
                frame.sender,
                ask_id,
                ErrorCode.ACTOR_NOT_FOUND,
                f"no actor at {path} on node {self.node_id!r}"
                if node == self.node_id
                else f"frame for node {node!r} arrived at {self.node_id!r}",
            )
            return
        send = cell.mailbox_send
        if send is None:
            self._reject(
                frame.sender,
                ask_id,
                ErrorCode.UNHANDLED,
                f"{path} is a supervisor; it takes no messages",
            )
            return
        item: object = message
        if ask_id is not None:
            item = RemoteAsk(self, message, frame.sender, ask_id)
        try:
            send.send_nowait(item)
            return
        except trio.WouldBlock:
            pass
        except _CLOSED:
            self._reject(frame.sender, ask_id, ErrorCode.ACTOR_STOPPED, f"actor {path} has stopped")
            return
        # Full mailbox: wait a little (backpressure on the link), then refuse.
        with trio.move_on_after(self._remote_delivery_wait):
            try:
                await send.send(item)
            except _CLOSED:
                self._reject(
                    frame.sender, ask_id, ErrorCode.ACTOR_STOPPED, f"actor {path} has stopped"
                )
            return
        self._reject(
            frame.sender,
            ask_id,
            ErrorCode.MAILBOX_FULL,
            f"the mailbox of {path} on {self.node_id!r} stayed full; a {kind} message was refused",
        )

    def _reject(self, peer: str, ask_id: int | None, code: str, text: str) -> None:
        """Log a refused frame and, if it was an ask, answer it with an error envelope.

        The WARNING line is within :attr:`rejection_log`'s budget per peer; the
        ``transport.rejected`` event is recorded for every frame.
        """
        verdict = self.rejection_log.admit(peer, trio.current_time())
        if verdict.write:
            budget = self.rejection_log
            logger.warning(
                "%s: refused a frame from %s [%s]: %s%s%s",
                self.node_id,
                peer,
                code,
                text,
                f" ({verdict.held_back} more refused from {peer} were not logged)"
                if verdict.held_back
                else "",
                f" (further refusals from {peer} within {budget.interval:g} s are only counted)"
                if verdict.last
                else "",
            )
        self.emit("transport.rejected", "/", peer=peer, code=code, reason=text)
        if ask_id is None:
            return
        try:
            self._queue_frame(peer, self._error_frame(peer, ask_id, code, text))
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)

    def _on_reply(self, peer: str, envelope: Envelope) -> None:
        correlation_id = envelope.correlation_id
        slot = self._pending.pop(correlation_id, None) if correlation_id is not None else None
        if slot is None:
            logger.debug("%s: a reply from %s came too late or unasked", self.node_id, peer)
            return
        body = envelope.body
        if envelope.kind == "error":
            if (
                type(body) is dict
                and type(body.get("code")) is str
                and type(body.get("message")) is str
            ):
                code, text = body["code"], body["message"]
            else:
                code, text = ErrorCode.MALFORMED_FRAME, f"unreadable error reply: {body!r:.200}"
            error_type = _TYPED_ERRORS.get(code)
            error: Exception = (
                error_type(f"{text} (from {peer})") if error_type else RemoteError(code, text)
            )
            slot.resolve(outcome.Error(error))
            return
        if (
            type(body) is not list
            or len(body) != 2
            or not (body[0] is None or type(body[0]) is str)
        ):
            slot.resolve(
                outcome.Error(
                    RemoteError(ErrorCode.MALFORMED_FRAME, "reply body is not [kind, value]")
                )
            )
            return
        kind, value = body
        if kind is None:
            slot.resolve(outcome.Value(value))
            return
        try:
            slot.resolve(outcome.Value(decode_message(kind, value)))
        except (UnknownKind, SchemaError) as exc:
            slot.resolve(outcome.Error(exc))


def _error_code(error: BaseException) -> tuple[str, str]:
    if isinstance(error, ActorCrashed):
        return ErrorCode.HANDLER_ERROR, str(error)
    if isinstance(error, UnhandledMessage):
        return ErrorCode.UNHANDLED, str(error)
    if isinstance(error, ActorStopped):
        return ErrorCode.ACTOR_STOPPED, str(error)
    return ErrorCode.HANDLER_ERROR, describe_error(error)


_DEFAULT_ROOT = SupervisorSpec(name="root", max_restarts=10, within=60.0)


@asynccontextmanager
async def open_actor_system(
    node_id: str,
    transport: Transport | None = None,
    limits: CodecLimits = DEFAULT_LIMITS,
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
            if transport is not None:
                forget_losses = transport.on_peer_lost(system._on_peer_lost)
                if not transport.deliver_frames_to(system._deliver_frame):
                    nursery.start_soon(system._receive_loop, transport)
                nursery.start_soon(system._outbox_loop, transport)
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
    limits: CodecLimits = DEFAULT_LIMITS,
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
