"""The remote bridge: one node's actors talking to other nodes' actors over a Transport.

Refs to remote actors and asks that came from other nodes reach the bridge only
through the small :class:`~corral.supervision._ref.Remote` protocol: ``tell``,
``tell_nowait``, ``ask``, ``reply``, ``reply_error`` and ``queue_reply``. Outgoing
messages are encoded into envelopes and handed to the transport. Arriving frames
are routed by the pure :func:`~corral.supervision._route.route` and the bridge
carries the decision out: a message goes into the target's mailbox, a reply
resolves the ask waiting for it, a refusal is logged (within
:attr:`RemoteBridge.rejection_log`'s budget per peer), recorded as a
``transport.rejected`` event and, for an ask, answered with an ``"error"`` envelope.
The transport's own receiving task does this when it can
(:meth:`~corral.transport.Transport.deliver_frames_to`: one task switch less per
frame); otherwise a receive loop of the bridge does.

An ask waiting for a remote reply fails with ``PeerUnavailable`` as soon as the
transport reports that peer lost (:meth:`~corral.transport.Transport.on_peer_lost`),
rather than waiting out its deadline.

Deadlines: a cancel scope per ask costs more than the rest of the bridge's work
on it, so the bridge keeps every pending ask's deadline in one heap and one
timer task fails the asks whose deadline passed with :class:`AskTimeout` (the
asker sleeps on its reply slot, which the timer resolves). The send is covered
by the deadline too: to a peer the bridge has not heard from since it was last
reported lost (the transport may have to dial it), or behind queued frames, the
send runs in a cancel scope at the ask's deadline. To a peer that sent us a frame
since, the transport sends without waiting for the peer (it is connected), so no
scope is entered; such a send is still bounded by the transport itself, which
never blocks forever (``WebSocketTransport``: a frame written through to a socket
whose buffer is full waits at most until the heartbeat drops the connection), and
the ask raises AskTimeout as soon as it returns if the deadline passed meanwhile.

Frames that cannot be sent from the caller's task (replies queued where the
caller cannot wait, error answers) wait in one bounded outbox; while any wait
for a peer, later frames to that peer queue behind them, so per-pair order holds.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

import outcome
import trio

from corral.supervision._errors import (
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    UnhandledMessage,
)
from corral.supervision._ref import Ask, Directory
from corral.supervision._route import Deliver, Reject, Reply, route
from corral.supervision._runtime import RemoteAsk, describe_error
from corral.transport import (
    PROTOCOL_VERSION,
    CodecLimits,
    Envelope,
    ErrorCode,
    Frame,
    FrameError,
    FrameTooLarge,
    LogBudget,
    PeerLost,
    PeerUnavailable,
    Transport,
    TransportError,
    encode_envelope,
    encode_message,
    encode_value,
    message_kind,
)

__all__ = ["RemoteBridge", "Unreachable"]

logger = logging.getLogger("corral.supervision")

_CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)
# Envelope(...) without its Python-level __new__ (a named tuple's), for the two
# envelopes of every remote ask: all eight fields given, in order.
_new_envelope = tuple.__new__
OUTBOX_SIZE = 256
# The deadline heap drops entries of answered asks lazily; it is rebuilt from the
# pending asks when it holds this many more than twice their number.
_HEAP_SLACK = 64


class _PendingAsk(Ask):
    """A remote ask waiting for its reply: the slot, whom it asked, until when."""

    __slots__ = ("deadline", "peer", "target", "timeout")

    def __init__(self, message: object, peer: str, target: str, timeout: float | None) -> None:
        super().__init__(message)
        self.peer = peer
        self.target = target
        self.timeout = timeout
        self.deadline = math.inf

    def timed_out(self) -> AskTimeout:
        return AskTimeout(
            f"no reply from {self.target} within {self.timeout} s to a "
            f"{type(self.message).__qualname__} message; the node may be slow, "
            "partitioned or down"
        )


class Unreachable:
    """The :class:`~corral.supervision._ref.Remote` of a system without a transport."""

    __slots__ = ("node_id",)

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def _error(self, node: str) -> PeerUnavailable:
        return PeerUnavailable(
            f"actor system {self.node_id!r} has no transport, so node {node!r} "
            "is unreachable; pass transport= to open_actor_system"
        )

    async def tell(self, address: str, node: str, message: object) -> None:
        raise self._error(node)

    def tell_nowait(self, address: str, node: str, message: object) -> None:
        raise self._error(node)

    async def ask(self, address: str, node: str, message: object, timeout: float) -> Any:  # noqa: ASYNC109
        raise self._error(node)

    async def reply(self, peer: str, correlation_id: int, value: object) -> None:
        await trio.lowlevel.checkpoint()

    async def reply_error(self, peer: str, correlation_id: int, error: BaseException) -> None:
        await trio.lowlevel.checkpoint()

    def queue_reply(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> None:
        return None


class RemoteBridge:
    """Sends this node's messages to other nodes and routes theirs in.

    Args:
        node_id: this node's id.
        transport: the link to other nodes (the bridge does not close it).
        limits: codec limits for frames sent and received.
        directory: this node's actors by path, where arriving messages go.
        emit: records an event (``ActorSystem.emit``).
        rejection_log: the budget of WARNING lines about refused frames.
        delivery_wait: how long an arriving message may wait for room in a full
            mailbox (backpressure on the link) before it is refused.
    """

    def __init__(
        self,
        node_id: str,
        transport: Transport,
        limits: CodecLimits,
        directory: Directory,
        emit: Callable[..., None],
        rejection_log: LogBudget,
        *,
        delivery_wait: float = 0.5,
    ) -> None:
        self.node_id = node_id
        self.transport = transport
        self.limits = limits
        self.rejection_log = rejection_log
        self._directory = directory
        self._emit = emit
        self._delivery_wait = delivery_wait
        self._address = f"{node_id}/"
        self._ids = itertools.count(1)
        self._pending: dict[int, _PendingAsk] = {}
        # (deadline, ask id) of pending asks; entries of answered asks linger until
        # they reach the top or the heap is rebuilt
        self._deadlines: list[tuple[float, int]] = []
        self._timer: trio.CancelScope | None = None  # the timer task's sleep, while it runs
        self._wake_at = math.inf  # the timer's deadline: no pending ask expires before it
        # peers heard from since they were last reported lost: a send to them
        # does not wait for a dial
        self._heard_from: set[str] = set()
        self._outbox_send, self._outbox_receive = trio.open_memory_channel[tuple[str, bytes]](
            OUTBOX_SIZE
        )
        self._queued: dict[str, int] = {}

    def attach(self, nursery: trio.Nursery) -> Callable[[], None]:
        """Start receiving frames and draining the outbox in ``nursery``.

        Returns:
            A function that stops listening for lost peers (call it on the way out).
        """
        forget_losses = self.transport.on_peer_lost(self.on_peer_lost)
        if not self.transport.deliver_frames_to(self.deliver_frame):
            nursery.start_soon(self._receive_loop)
        nursery.start_soon(self._outbox_loop)
        self._timer = trio.CancelScope(deadline=self._wake_at)
        nursery.start_soon(self._expire_asks, self._timer)
        return forget_losses

    # ------------------------------------------------------------------ sending

    def _encode(self, address: str, message: object, ident: int, ask: bool) -> bytes:
        kind, body = encode_message(message)
        fields = (ident, address, self._address, kind, body, None, ask, PROTOCOL_VERSION)
        return encode_envelope(_new_envelope(Envelope, fields), self.limits)

    async def tell(self, address: str, node: str, message: object) -> None:
        """Send ``message`` to the actor at ``address`` on ``node``."""
        await self._send_frame(node, self._encode(address, message, next(self._ids), False))

    def tell_nowait(self, address: str, node: str, message: object) -> None:
        """Queue ``message`` for the actor at ``address`` on ``node``, or raise MailboxFull."""
        data = self._encode(address, message, next(self._ids), False)
        if not self._enqueue(node, data):
            raise MailboxFull(f"the outbound queue of {self.node_id!r} is full; use `await tell()`")

    async def ask(
        self,
        address: str,
        node: str,
        message: object,
        timeout: float | None,  # noqa: ASYNC109
    ) -> Any:
        """Send ``message`` as an ask to the actor at ``address`` on ``node``; await the reply.

        The deadline covers the send too (a dial in flight, frames queued ahead);
        see the module docstring for how it is kept without a cancel scope per ask.
        """
        if timeout is None:
            timeout = math.inf
        elif not timeout >= 0:
            raise ValueError(f"an ask's timeout must be >= 0 seconds, not {timeout!r}")
        ident = next(self._ids)
        data = self._encode(address, message, ident, True)
        slot = _PendingAsk(message, node, address, timeout)
        timer = self._timer
        if timer is None:  # not attached, or shut down: no timer task to rely on
            with trio.move_on_after(timeout):
                return await self._send_and_wait(node, data, ident, slot)
            raise slot.timed_out()
        pending = self._pending
        pending[ident] = slot
        try:
            if timeout != math.inf:
                deadline = slot.deadline = trio.current_time() + timeout
                heap = self._deadlines
                heappush(heap, (deadline, ident))
                if deadline < self._wake_at:
                    self._wake_at = timer.deadline = deadline
                elif len(heap) > 2 * len(pending) + _HEAP_SLACK:
                    self._rebuild_deadlines()
            if node in self._heard_from and not self._queued.get(node):
                await self.transport.send(node, data)  # connected: does not wait for the peer
            else:
                with trio.CancelScope(deadline=slot.deadline) as scope:
                    await self._send_frame(node, data)
                if scope.cancelled_caught:
                    raise slot.timed_out()
            return await slot.wait()
        finally:
            pending.pop(ident, None)

    async def _send_and_wait(self, node: str, data: bytes, ident: int, slot: _PendingAsk) -> Any:
        self._pending[ident] = slot
        try:
            await self._send_frame(node, data)
            return await slot.wait()
        finally:
            self._pending.pop(ident, None)

    def _rebuild_deadlines(self) -> None:
        """Drop the entries of answered asks (the heap stays within twice the pending asks)."""
        heap = [(slot.deadline, i) for i, slot in self._pending.items() if slot.deadline < math.inf]
        heapify(heap)
        self._deadlines[:] = heap

    async def _expire_asks(self, sleep: trio.CancelScope) -> None:
        """The timer task: fail each pending ask whose deadline passed with AskTimeout."""
        heap, pending = self._deadlines, self._pending
        try:
            while True:
                with sleep:
                    await trio.sleep_forever()
                now = trio.current_time()
                while heap:
                    deadline, ident = heap[0]
                    slot = pending.get(ident)
                    if slot is not None and deadline > now:
                        break
                    heappop(heap)
                    if slot is not None:
                        del pending[ident]
                        slot.resolve(outcome.Error(slot.timed_out()))
                self._wake_at = heap[0][0] if heap else math.inf
                sleep = self._timer = trio.CancelScope(deadline=self._wake_at)
        finally:
            # Nobody is left to time out the asks still waiting: fail them now.
            self._timer = None
            self._wake_at = math.inf
            self._deadlines.clear()
            for slot in list(pending.values()):
                slot.resolve(
                    outcome.Error(
                        PeerUnavailable(
                            f"actor system {self.node_id!r} stopped while an ask to "
                            f"{slot.target} waited for its reply"
                        )
                    )
                )

    def _reply_frame(self, peer: str, correlation_id: int, value: object) -> bytes:
        """Encode the reply envelope answering the ask ``correlation_id`` from ``peer``
        with ``value``, or an error envelope saying why ``value`` cannot be sent."""
        kind = message_kind(value)
        try:
            if kind is not None:
                body = [kind, encode_message(value)[1]]
            else:
                body = [None, encode_value(value)]
            ident, to, sender = next(self._ids), f"{peer}/", self._address
            fields = (ident, to, sender, "reply", body, correlation_id, False, PROTOCOL_VERSION)
            return encode_envelope(_new_envelope(Envelope, fields), self.limits)
        except FrameTooLarge as exc:
            code, text = ErrorCode.FRAME_TOO_LARGE, f"the reply is too large: {exc}"
        except (FrameError, TypeError, ValueError) as exc:
            code, text = ErrorCode.REPLY_NOT_ENCODABLE, f"the reply cannot be sent: {exc}"
        return self._error_frame(peer, correlation_id, code, text)

    def _outcome_frame(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> bytes:
        """The reply or error envelope carrying ``result``."""
        if type(result) is outcome.Value:  # not isinstance: Outcome is an ABC, slow to test
            return self._reply_frame(peer, correlation_id, result.value)
        assert isinstance(result, outcome.Error)
        return self._error_frame(peer, correlation_id, *_error_code(result.error))

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

    async def reply(self, peer: str, correlation_id: int, value: object) -> None:
        """Answer the ask ``correlation_id`` from ``peer`` with ``value``, now, from this task."""
        try:
            data = self._reply_frame(peer, correlation_id, value)
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)
            return
        try:  # _send_reply, inlined: this is every remote ask's reply
            if self._queued.get(peer):
                await self._send_frame(peer, data)
            else:  # _send_frame's common case, inlined
                await self.transport.send(peer, data)
        except (TransportError, *_CLOSED) as exc:
            self._reply_lost(peer, exc)

    async def reply_error(self, peer: str, correlation_id: int, error: BaseException) -> None:
        """Answer the ask ``correlation_id`` from ``peer`` with ``error`` now."""
        try:
            data = self._error_frame(peer, correlation_id, *_error_code(error))
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)
            return
        await self._send_reply(peer, data)

    async def _send_reply(self, peer: str, data: bytes) -> None:
        try:
            await self._send_frame(peer, data)
        except (TransportError, *_CLOSED) as exc:
            self._reply_lost(peer, exc)

    def _reply_lost(self, peer: str, exc: BaseException) -> None:
        logger.info("%s: reply to %s lost: %s", self.node_id, peer, describe_error(exc))
        self._emit("transport.reply-lost", "/", peer=peer, error=describe_error(exc))

    def queue_reply(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> None:
        """Answer the ask ``correlation_id`` from ``peer`` through the outbox (never waits)."""
        try:
            self._queue_frame(peer, self._outcome_frame(peer, correlation_id, result))
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)

    def _queue_frame(self, peer: str, data: bytes) -> None:
        if not self._enqueue(peer, data):
            logger.info("%s: outbound queue full, a frame to %s was dropped", self.node_id, peer)
            self._emit("transport.reply-lost", "/", peer=peer, error="outbound queue full")

    def _enqueue(self, peer: str, data: bytes) -> bool:
        try:
            self._outbox_send.send_nowait((peer, data))
        except (trio.WouldBlock, *_CLOSED):
            return False
        self._queued[peer] = self._queued.get(peer, 0) + 1
        return True

    async def _send_frame(self, peer: str, data: bytes) -> None:
        """Send now, unless frames to ``peer`` are queued: then queue behind them."""
        if not self._queued.get(peer):
            await self.transport.send(peer, data)
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

    async def _outbox_loop(self) -> None:
        async for peer, data in self._outbox_receive:
            try:
                await self.transport.send(peer, data)
            except (TransportError, *_CLOSED) as exc:
                logger.info("%s: frame to %s lost: %s", self.node_id, peer, describe_error(exc))
            finally:
                self._sent_one(peer)

    # ------------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        while True:
            try:
                frame = await self.transport.receive()
            except (*_CLOSED, trio.EndOfChannel):
                return
            await self.deliver_frame(frame)

    async def deliver_frame(self, frame: Frame) -> None:
        """Handle one arriving frame; never raises (but for cancellation)."""
        self._heard_from.add(frame.sender)
        try:
            decision = route(frame, self.node_id, self._directory.cells, self.limits)
            if type(decision) is Deliver:
                peer, target, path, _, message, ask_id = decision
                item = message if ask_id is None else RemoteAsk(self, message, peer, ask_id)
                send = target.mailbox_send
                assert send is not None  # route delivers only to targets that take messages
                try:  # the common case first: room in the mailbox, nothing to wait for
                    send.send_nowait(item)
                except trio.WouldBlock:
                    await self._deliver_when_room(decision, send, item)
                except _CLOSED:
                    self._reject(peer, ask_id, ErrorCode.ACTOR_STOPPED, f"actor {path} has stopped")
            elif type(decision) is Reply:
                self._on_reply(decision)
            else:
                assert type(decision) is Reject
                self._reject(decision.peer, decision.ask_id, decision.code, decision.reason)
        except Exception as exc:  # never let one frame stop the loop
            logger.exception("%s: internal error on a frame from %s", self.node_id, frame.sender)
            self._reject(frame.sender, None, ErrorCode.MALFORMED_FRAME, describe_error(exc))

    def _on_reply(self, reply: Reply) -> None:
        ident = reply.correlation_id
        slot = self._pending.pop(ident, None) if ident is not None else None
        if slot is None:
            logger.debug("%s: a reply from %s came too late or unasked", self.node_id, reply.peer)
            return
        slot.resolve(reply.result)

    async def _deliver_when_room(
        self, decision: Deliver[Any], send: trio.MemorySendChannel[Any], item: object
    ) -> None:
        """Put ``item`` in a full mailbox: wait a little for room, then refuse it."""
        peer, _, path, kind, _, ask_id = decision
        # Backpressure on the link while it waits.
        with trio.move_on_after(self._delivery_wait):
            try:
                await send.send(item)
            except _CLOSED:
                self._reject(peer, ask_id, ErrorCode.ACTOR_STOPPED, f"actor {path} has stopped")
            return
        self._reject(
            peer,
            ask_id,
            ErrorCode.MAILBOX_FULL,
            f"the mailbox of {path} on {self.node_id!r} stayed full; a {kind} message was refused",
        )

    def on_peer_lost(self, event: PeerLost) -> None:
        """Fail every ask waiting for a reply from the lost peer (the reply cannot come)."""
        self._heard_from.discard(event.peer)
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
        self._emit("transport.peer-lost", "/", peer=event.peer, reason=event.reason, asks=len(lost))

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
        self._emit("transport.rejected", "/", peer=peer, code=code, reason=text)
        if ask_id is None:
            return
        try:
            self._queue_frame(peer, self._error_frame(peer, ask_id, code, text))
        except FrameError as exc:
            logger.warning("%s: cannot answer %s: %s", self.node_id, peer, exc)


def _error_code(error: BaseException) -> tuple[str, str]:
    if isinstance(error, ActorCrashed):
        return ErrorCode.HANDLER_ERROR, str(error)
    if isinstance(error, UnhandledMessage):
        return ErrorCode.UNHANDLED, str(error)
    if isinstance(error, ActorStopped):
        return ErrorCode.ACTOR_STOPPED, str(error)
    return ErrorCode.HANDLER_ERROR, describe_error(error)
