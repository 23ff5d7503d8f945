"""WebSocketTransport: frames between nodes over authenticated, self-healing WebSockets.

Each node listens on its peer address. A frame for a peer goes into that
peer's bounded outbound queue (full: ``send`` raises PeerBusy at once); one
writer task per peer drains it into the peer's single WebSocket connection,
as many queued frames per WebSocket message (one socket write) as are waiting
(see :mod:`corral.transport._ws_wire`). A small frame sent while the link is in
a request/reply rhythm (the peer sent us a frame since our last one), with
nothing of ours waiting or being written, skips the queue: ``send`` writes it
itself, which spares a request or a reply the writer task's turn. Streams of
frames still go through the queue and batch.

Only trio-websocket's public API is used: ``wrap_client_stream`` /
``wrap_server_stream`` over whatever byte stream the network gives,
``send_message``, ``get_message``, ``ping`` and ``aclose``. One reader task
per connection takes its messages (the library's own queue holds at most a
few), splits them into frames and hands each to ``receive`` through a bounded
queue, or, once someone called ``deliver_frames_to``, to that handler
directly. The connection is dialed on first use, authenticated by the
handshake in :mod:`corral.transport._handshake`, kept alive by ping/pong
heartbeats, and redialed with exponential backoff and jitter when it drops. A
peer that dials us is identified by the node id it proved in the handshake,
and the same connection carries frames both ways. When a peer's connection
closes or misses its heartbeat, or a dial to it fails, ``on_peer_lost``
handlers hear of it once (until it connects again).

Delivery is at most once and in order per sender→receiver pair: frames queued
while a connection dies, or sent on a connection that loses the
simultaneous-dial tie-break, may be lost, never reordered or duplicated.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random as random_module
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

import trio
import trio_websocket

from corral.transport._base import (
    Frame,
    FrameCounts,
    FrameHandler,
    PeerLossListeners,
    PeerLostHandler,
    Transport,
)
from corral.transport._errors import (
    FrameTooLarge,
    HandshakeFailed,
    PeerBusy,
    PeerUnavailable,
)
from corral.transport._handshake import (
    NONCE_SIZE,
    ClientHandshake,
    CloseCode,
    Identity,
    NonceLog,
    PeerInfo,
    Refused,
    ServerHandshake,
)
from corral.transport._log_budget import LogBudget
from corral.transport._ws_net import Listeners, StreamNetwork, TcpNetwork
from corral.transport._ws_rules import (
    ConnectionKey,
    ReconnectPolicy,
    check_listen_address,
    frame_refusal_message,
    new_connection_wins,
    parse_control_message,
    parse_peer_address,
    reconnect_delay,
)
from corral.transport._ws_wire import MalformedPacket, pack_into_messages, pack_one, unpack

log = logging.getLogger("corral.transport.websocket")

DEFAULT_PORT = 7401
RESOURCE = "/corral/v1"
_INCARNATION_SIZE = 16
# One socket write carries at most this many queued frames / bytes.
_BATCH_FRAMES = 256
_BATCH_BYTES = 256 * 1024
# Larger frames always go through the queue: a small one almost never finds the
# socket buffer too full to take it whole, so writing it through never waits.
_WRITE_THROUGH_BYTES = 16 * 1024
# Frame(...) without its Python-level __new__ (a named tuple's): every arriving
# frame is built here, and its two fields are what they must be.
_new_frame = tuple.__new__


@dataclass(frozen=True, slots=True)
class WebSocketConfig:
    """Limits and timings of a :class:`WebSocketTransport` (seconds and bytes).

    Attributes:
        max_frame_size: largest frame accepted from a peer (default 1 MiB); a larger
            one is refused with an error notice and the connection stays up.
            Peers learn each other's limit in the handshake, and ``send`` refuses
            a frame over the peer's limit before it is queued.
        outbound_queue_size: frames queued per peer before ``send`` raises PeerBusy.
        inbound_queue_size: frames received and not yet taken by ``receive``;
            when full, reading from every peer pauses (backpressure). A node that
            takes no frames for longer than the heartbeat timeout also stops
            answering pings, and its peers drop the connection. Unused once
            frames go to a handler (``deliver_frames_to``): then a peer's reading
            pauses while the handler works on its frame.
        heartbeat_interval: seconds between pings on an idle or busy connection.
        heartbeat_timeout: seconds a ping may go unanswered before the peer is
            declared dead; a silent peer is detected within interval + timeout.
        connect_timeout: bound on dialing, the WebSocket upgrade and the handshake.
        handshake_timeout: bound on an inbound connection's upgrade and handshake.
        close_timeout: bound on flushing queues and the closing handshake.
        reconnect: backoff between dial attempts.
        receive_buffer_size: bytes read from the socket at a time.
    """

    max_frame_size: int = 1 << 20
    outbound_queue_size: int = 1024
    inbound_queue_size: int = 1024
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 10.0
    connect_timeout: float = 5.0
    handshake_timeout: float = 5.0
    close_timeout: float = 2.0
    reconnect: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    receive_buffer_size: int = 1 << 16

    def __post_init__(self) -> None:
        for name in ("max_frame_size", "outbound_queue_size", "inbound_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"WebSocketConfig.{name} must be >= 1")
        for name in (
            "heartbeat_interval",
            "heartbeat_timeout",
            "connect_timeout",
            "handshake_timeout",
            "close_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"WebSocketConfig.{name} must be > 0 seconds")

    @property
    def wire_limit(self) -> int:
        """Largest WebSocket message read at all; beyond it the library closes with 1009.

        Frames between ``max_frame_size`` and this are read, refused and answered;
        the margin keeps a misconfigured peer's oversized frame from costing the
        connection while still bounding what an unauthenticated peer can make us buffer.
        """
        return 2 * self.max_frame_size + (1 << 16)


class PeerState(Enum):
    """Where the link to one peer stands."""

    CONNECTED = "connected"
    CONNECTING = "connecting"
    WAITING = "waiting"  # backing off before the next dial, or just lost the connection
    UNREACHABLE = "unreachable"  # no address to dial; waiting for the peer to dial us


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """A snapshot of the link to one peer (for introspection and tests)."""

    peer: str
    address: str | None
    state: PeerState
    initiator: str | None
    failures: int
    last_error: str | None
    queued: int
    frames_dropped: int
    frames_refused_by_peer: int
    frames_refused_from_peer: int


class _Connection:
    """One authenticated WebSocket to a peer."""

    def __init__(
        self, link: _Link, ws: trio_websocket.WebSocketConnection, info: PeerInfo, now: float
    ) -> None:
        self.link = link
        self.ws = ws
        self.info = info
        self.opened_at = now
        self.key = ConnectionKey(info.initiator, info.dial_seq, info.incarnation)
        self.ready = trio.Event()  # the handshake's last message is out; frames may follow
        self.lost = trio.Event()
        self.closed = trio.Event()
        self.close_code = CloseCode.NORMAL
        self.close_reason = ""
        self.send_scopes: set[trio.CancelScope] = set()  # writes in progress, cancelled on loss
        # Held by whoever writes a message: the writer task, or a sender writing through.
        self.write_lock = _WriteLock()
        # A write was cancelled part way: the stream may end in half a message, so
        # no closing handshake may follow; the stream is just closed.
        self.torn = False


class _WriteLock:
    """Who writes a message to one connection now: the writer task, or a sender
    writing a frame through (which only ever takes it when it is free).

    ``trio.Lock`` would do, but it records its owner for deadlock detection on
    every acquire and release, which costs a write-through more than the rest
    of its own bookkeeping; this lock only has to keep two writers from
    interleaving their messages.
    """

    __slots__ = ("_parked", "_waiting", "held")

    def __init__(self) -> None:
        #: a writer holds it (read it to see whether a write-through may take it)
        self.held = False
        self._waiting = trio.lowlevel.ParkingLot()
        self._parked = 0  # writers waiting in _waiting (counted here: no call to ask it)

    def locked(self) -> bool:
        return self.held

    def release(self) -> None:
        self.held = False
        if self._parked:
            self._waiting.unpark()

    async def __aenter__(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self.held:
            self.held = True  # taken before the schedule point, as trio.Lock does
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self._parked += 1
        try:
            while self.locked():  # woken, another writer may have taken it first
                await self._waiting.park()
        finally:
            self._parked -= 1
        self.held = True

    async def __aexit__(self, *_exc: object) -> None:
        self.release()


class _Link:
    """Everything about one peer: address, queue, current connection, dial state."""

    def __init__(self, peer: str, address: str | None, queue_size: int) -> None:
        self.peer = peer
        self.address = address
        self.conn: _Connection | None = None
        self.phase = PeerState.UNREACHABLE if address is None else PeerState.CONNECTING
        self.failures = 0
        self.last_error: str | None = None
        self.changed = trio.Event()
        self.queue_send, self.queue_receive = trio.open_memory_channel[bytes](queue_size)
        self.writer_done = trio.Event()
        # Frames handed to the queue and not yet written or dropped by the writer
        # (a frame can be out of the channel's buffer and still unwritten).
        self.unwritten = 0
        # A frame came from the peer since we last sent it one: the link is in a
        # request/reply rhythm, and the next frame may skip the queue (see send).
        self.answered = True
        self.maintained = False
        self.peer_left = False  # the last connection ended with the peer's "going away"
        self.reported_lost = False  # on_peer_lost handlers heard of it since it last connected
        self.frames_dropped = 0
        self.frames_refused_by_peer = 0
        self.frames_refused_from_peer = 0
        self.frames_sent = 0
        self.frames_received = 0

    def live(self) -> _Connection | None:
        conn = self.conn
        if conn is None or conn.lost.is_set():
            return None
        return conn

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


def _describe(exc: BaseException) -> str:
    """A one-line account of why a dial failed, looking inside exception groups."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        elif not isinstance(e, trio.Cancelled):
            leaves.append(e)

    walk(exc)
    if not leaves:
        return type(exc).__name__
    leaves.sort(key=lambda e: not isinstance(e, HandshakeFailed))
    first = leaves[0]
    if isinstance(first, trio.TooSlowError):
        return "timed out while connecting"
    text = str(first) or repr(first)
    return f"{type(first).__name__}: {text}"


def _dial_failure_level(failures: int, peer_left: bool) -> int:
    """Log level of a failed dial: loud at first, then only at attempts 2, 4, 8, ..."""
    if failures == 1 and peer_left:
        return logging.INFO  # it said goodbye; not finding it is expected
    if failures & (failures - 1) == 0:
        return logging.WARNING
    return logging.DEBUG


def _remote_host(stream: trio.abc.Stream) -> str:
    """The host a stream comes from, without the port (each dial uses a new one): the
    key of the refused-connection log budget. In-memory streams share one key."""
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(inner, trio.SocketStream):
        try:
            return str(inner.socket.getpeername()[0])
        except OSError:
            return "an unknown address"
    return "in-memory"


def _close_text(reason: trio_websocket.CloseReason | None) -> str:
    if reason is None:
        return "connection closed"
    name = "" if reason.code >= 4000 else f" {reason.name}"
    detail = f" ({reason.reason})" if reason.reason else ""
    return f"close code {reason.code}{name}{detail}"


class WebSocketTransport(Transport):
    """Frames between nodes over WebSockets. Create it with :func:`open_websocket_transport`."""

    def __init__(
        self,
        node_id: str,
        *,
        secret: bytes | None,
        config: WebSocketConfig,
        random: random_module.Random,
        network: StreamNetwork,
        peers: Mapping[str, str],
    ) -> None:
        self._node_id = node_id
        self._nursery: trio.Nursery  # the service nursery, set by _run
        self._secret = secret if secret is not None else b""
        self._config = config
        self._random = random
        self._network = network
        self._identity = Identity(
            node_id, secrets.token_bytes(_INCARNATION_SIZE), config.max_frame_size
        )
        self._nonces = NonceLog()
        self._dial_seq = itertools.count(1)
        self._addresses: dict[str, str] = {}
        self._links: dict[str, _Link] = {}
        self._inbound_send, self._inbound_receive = trio.open_memory_channel[Frame](
            config.inbound_queue_size
        )
        self._address: str | None = None
        self._closed = False
        self._loss_listeners = PeerLossListeners()
        self._refusal_log = LogBudget(burst=5, interval=60.0)
        self._handler: FrameHandler | None = None
        self._backlog_delivered = trio.Event()  # frames queued before the handler are out
        for peer, address in peers.items():
            self.add_peer(peer, address)

    # -- public surface -------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def address(self) -> str | None:
        """The ``host:port`` this node listens on (the real port if 0 was asked), or None."""
        return self._address

    @property
    def config(self) -> WebSocketConfig:
        return self._config

    def add_peer(self, node_id: str, address: str) -> None:
        """Tell the transport where ``node_id`` listens (``"host:port"``).

        Raises:
            ValueError: the address is not ``host:port`` or names this node itself.
        """
        parse_peer_address(address)
        if node_id == self._node_id:
            raise ValueError(f"peer id {node_id!r} is this node's own id")
        self._addresses[node_id] = address
        link = self._links.get(node_id)
        if link is not None:
            link.address = address
            self._ensure_maintained(link)
            link.notify()

    def remove_peer(self, node_id: str) -> None:
        """Forget ``node_id``'s address: it is no longer redialed (a live connection stays)."""
        self._addresses.pop(node_id, None)
        link = self._links.get(node_id)
        if link is not None:
            link.address = None
            link.notify()

    def stats(self) -> Mapping[str, FrameCounts]:
        return MappingProxyType(
            {
                peer: FrameCounts(link.frames_sent, link.frames_received)
                for peer, link in sorted(self._links.items())
            }
        )

    def peer_status(self, node_id: str) -> PeerStatus | None:
        """The state of the link to ``node_id``, or None if it was never used."""
        link = self._links.get(node_id)
        if link is None:
            return None
        conn = link.live()
        if conn is not None:
            state = PeerState.CONNECTED
        elif link.phase is PeerState.CONNECTED:
            state = PeerState.WAITING if link.address is not None else PeerState.UNREACHABLE
        else:
            state = link.phase
        return PeerStatus(
            peer=link.peer,
            address=link.address,
            state=state,
            initiator=conn.info.initiator if conn is not None else None,
            failures=link.failures,
            last_error=link.last_error,
            queued=link.queue_send.statistics().current_buffer_used,
            frames_dropped=link.frames_dropped,
            frames_refused_by_peer=link.frames_refused_by_peer,
            frames_refused_from_peer=link.frames_refused_from_peer,
        )

    async def send(self, peer: str, data: bytes) -> None:
        """Queue ``data`` as one frame for ``peer`` (or write it at once); dial first if needed.

        Waits (at most ``connect_timeout`` and a little) only while a dial to the
        peer is in flight; otherwise never blocks on the peer. (A frame written
        straight to the socket that only partly fits, which takes a socket
        buffer filled to within a few KiB, is finished before ``send`` returns.)

        Raises:
            PeerUnavailable: no address is known for the peer, the dial failed,
                or the connection is down and a redial is pending.
            PeerBusy: the peer's outbound queue is full.
            FrameTooLarge: ``data`` exceeds the peer's frame limit; nothing was sent.
            trio.ClosedResourceError: this transport was closed.
        """
        if self._closed:
            raise trio.ClosedResourceError("the WebSocket transport is closed")
        link = self._links.get(peer)
        if link is None:
            link = self._link_for_send(peer)
        conn = link.conn
        if conn is None or conn.lost.is_set():  # link.live(), inlined: every frame's path
            conn = await self._wait_for_connection(link)
        limit = conn.info.max_frame
        if len(data) > limit:
            raise FrameTooLarge(
                f"frame of {len(data)} bytes exceeds peer {peer!r}'s limit of {limit} bytes; "
                "nothing was sent (send smaller messages or raise max_frame_size on both nodes)"
            )
        answered, link.answered = link.answered, False
        if (
            answered
            and not link.unwritten
            and len(data) <= _WRITE_THROUGH_BYTES
            and conn.ready.is_set()
            and not conn.write_lock.held
        ):
            # Nothing is ahead of this frame: write it from this task, now, as a
            # packet of one. Frames that follow without an answer in between go
            # through the queue and are written many per message by the writer task.
            # Not shielded (a cancel scope per frame costs more than the rest of the
            # write): if the caller is cancelled while the message is being written,
            # part of it may be on the wire, so the connection is torn down without a
            # closing handshake (nothing may follow half a message) and redialed; the
            # frame is lost, as a queued one would be when a connection drops.
            await trio.lowlevel.checkpoint_if_cancelled()  # cancelled already: nothing written
            lock = conn.write_lock
            lock.held = True  # free: checked above, nothing yielded since
            try:
                await conn.ws.send_message(pack_one(data))
            except trio_websocket.ConnectionClosed as exc:
                link.frames_dropped += 1
                self._drop(conn, CloseCode.NORMAL, f"closed: {_close_text(exc.reason)}")
            except trio.Cancelled:
                link.frames_dropped += 1
                conn.torn = True
                self._drop(conn, CloseCode.PROTOCOL_ERROR, "a write was cancelled part way")
                raise
            finally:
                lock.release()
            link.frames_sent += 1
            return
        try:
            link.queue_send.send_nowait(data)
        except trio.WouldBlock:
            raise PeerBusy(
                f"outbound queue to peer {peer!r} is full "
                f"({self._config.outbound_queue_size} frames); the peer is slow or stalled"
            ) from None
        link.unwritten += 1
        link.frames_sent += 1
        await trio.lowlevel.cancel_shielded_checkpoint()

    def on_peer_lost(self, handler: PeerLostHandler) -> Callable[[], None]:
        """Call ``handler`` when a peer's connection closes or misses its heartbeat, or a
        dial to it fails (refused, unreachable, handshake refused)."""
        return self._loss_listeners.add(handler)

    def deliver_frames_to(self, handler: FrameHandler) -> bool:
        """Deliver each frame by ``await handler(frame)`` from the connection's reader task.

        Frames already waiting for :meth:`receive` go first, in order. While the
        handler runs, that peer's connection reads nothing more (backpressure on
        the peer), so it must return well within the heartbeat timeout.

        Raises:
            RuntimeError: a handler is already installed.
        """
        if self._handler is not None:
            raise RuntimeError("this transport already delivers frames to a handler")
        self._handler = handler
        if (
            self._inbound_receive.statistics().current_buffer_used
            or self._inbound_send.statistics().tasks_waiting_send
        ):
            self._nursery.start_soon(self._deliver_backlog, handler)
        else:
            self._backlog_delivered.set()
        return True

    async def _deliver_backlog(self, handler: FrameHandler) -> None:
        try:
            while (
                self._inbound_receive.statistics().current_buffer_used
                or self._inbound_send.statistics().tasks_waiting_send
            ):
                await self._deliver(handler, await self._inbound_receive.receive())
        except (trio.EndOfChannel, trio.ClosedResourceError):
            pass
        finally:
            self._backlog_delivered.set()

    async def _deliver(self, handler: FrameHandler, frame: Frame) -> None:
        try:
            await handler(frame)
        except Exception:
            log.exception(
                "%s: the frame handler failed on a frame from %r", self._node_id, frame.sender
            )

    async def receive(self) -> Frame:
        """The next frame any authenticated peer sent this node.

        Raises:
            trio.ClosedResourceError: this transport was closed.
        """
        try:
            return await self._inbound_receive.receive()
        except trio.EndOfChannel:
            raise trio.ClosedResourceError("the WebSocket transport is closed") from None

    async def aclose(self) -> None:
        """Flush queued frames (bounded), close every connection, stop listening."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        links = list(self._links.values())
        for link in links:
            link.notify()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._config.close_timeout):
                for link in links:
                    link.queue_send.close()
                for link in links:
                    await link.writer_done.wait()
            conns = [link.conn for link in links if link.conn is not None]
            for conn in conns:
                self._drop(conn, CloseCode.GOING_AWAY, "node shutting down")
            with trio.move_on_after(self._config.close_timeout):
                for conn in conns:
                    await conn.closed.wait()
        self._inbound_send.close()
        self._inbound_receive.close()
        self._nursery.cancel_scope.cancel()

    # -- links ----------------------------------------------------------------

    def _link_for_send(self, peer: str) -> _Link:
        if peer == self._node_id:
            raise PeerUnavailable(
                f"{peer!r} is this node; deliver local messages without the transport"
            )
        address = self._addresses.get(peer)
        if address is None:
            raise PeerUnavailable(
                f"no address known for peer {peer!r} and it has not connected to this node; "
                "add it with add_peer(node_id, 'host:port')"
            )
        return self._new_link(peer, address)

    def _new_link(self, peer: str, address: str | None) -> _Link:
        link = _Link(peer, address, self._config.outbound_queue_size)
        self._links[peer] = link
        self._nursery.start_soon(self._write_loop, link)
        self._ensure_maintained(link)
        return link

    def _ensure_maintained(self, link: _Link) -> None:
        if link.maintained or link.address is None or self._closed:
            return
        link.maintained = True
        if link.live() is None:
            link.phase = PeerState.CONNECTING
        self._nursery.start_soon(self._maintain, link)

    async def _wait_for_connection(self, link: _Link) -> _Connection:
        with trio.move_on_after(self._config.connect_timeout + self._config.close_timeout):
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the WebSocket transport is closed")
                conn = link.live()
                if conn is not None:
                    return conn
                if link.phase is not PeerState.CONNECTING:
                    break
                await link.changed.wait()
        raise PeerUnavailable(self._unavailable_reason(link))

    def _unavailable_reason(self, link: _Link) -> str:
        if link.address is None:
            return f"peer {link.peer!r} is not connected and no address is known to dial it" + (
                f" (last error: {link.last_error})" if link.last_error else ""
            )
        if link.phase is PeerState.CONNECTING:
            return f"peer {link.peer!r} at {link.address}: still connecting after the timeout"
        return (
            f"peer {link.peer!r} at {link.address} is unreachable"
            + (f": {link.last_error}" if link.last_error else "")
            + "; redialing with backoff"
        )

    async def _maintain(self, link: _Link) -> None:
        """Keep one connection to the peer up while its address is known."""
        policy = self._config.reconnect
        while not self._closed:
            conn = link.live()
            if conn is not None:
                link.phase = PeerState.CONNECTED
                await conn.lost.wait()
                if link.live() is None:
                    lived = trio.current_time() - conn.opened_at
                    link.failures = 0 if lived >= policy.maximum else link.failures + 1
                continue
            if link.address is None:
                link.phase = PeerState.UNREACHABLE
                link.maintained = False
                link.notify()
                return
            if link.failures > 0:
                delay = reconnect_delay(policy, link.failures, self._random.random())
                link.phase = PeerState.WAITING
                link.notify()
                with trio.move_on_after(delay):
                    while link.live() is None and link.address is not None:
                        await link.changed.wait()
                if link.live() is not None or link.address is None or self._closed:
                    continue
            link.phase = PeerState.CONNECTING
            link.notify()
            try:
                await self._nursery.start(self._run_outbound, link)
            except Exception as exc:
                if link.live() is not None:
                    # The peer's own dial won the tie-break; nothing failed.
                    log.debug("%s: dial to %r not needed: %s", self._node_id, link.peer, exc)
                    continue
                link.failures += 1
                link.last_error = _describe(exc)
                link.phase = PeerState.WAITING
                log.log(
                    _dial_failure_level(link.failures, link.peer_left),
                    "%s: dialing peer %r at %s failed (attempt %d): %s",
                    self._node_id,
                    link.peer,
                    link.address,
                    link.failures,
                    link.last_error,
                )
                link.notify()
                self._report_lost(link, f"dialing {link.address} failed: {link.last_error}")
        link.maintained = False

    # -- connections ----------------------------------------------------------

    async def _run_outbound(
        self, link: _Link, *, task_status: trio.TaskStatus[_Connection] = trio.TASK_STATUS_IGNORED
    ) -> None:
        address = link.address
        if address is None:
            raise PeerUnavailable(f"no address for peer {link.peer!r}")
        host, port = parse_peer_address(address)
        stream: trio.abc.Stream | None = None
        started = False
        try:
            async with trio.open_nursery() as conn_nursery:
                with trio.fail_after(self._config.connect_timeout):
                    stream = await self._network.connect(host, port)
                    ws = await trio_websocket.wrap_client_stream(
                        conn_nursery,
                        stream,  # type: ignore[arg-type]  # any trio Stream works
                        address,
                        RESOURCE,
                        message_queue_size=16,
                        max_message_size=self._config.wire_limit,
                        receive_buffer_size=self._config.receive_buffer_size,
                    )
                    info = await self._client_handshake(ws, link.peer, address)
                conn = _Connection(link, ws, info, trio.current_time())
                if not self._install(link, conn):
                    await self._close_ws(ws, CloseCode.SUPERSEDED, "a preferred connection exists")
                    raise HandshakeFailed(
                        f"connection to {link.peer!r} superseded by the one it dialed to us"
                    )
                conn.ready.set()
                task_status.started(conn)
                started = True
                await self._run_connection(conn, conn_nursery)
        except Exception as exc:
            if not started:
                raise
            log.error(
                "%s: connection to %r ended unexpectedly: %s",
                self._node_id,
                link.peer,
                _describe(exc),
            )
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)

    async def _handle_inbound(self, stream: trio.abc.Stream) -> None:
        """serve_listeners handler: upgrade, authenticate, then serve one peer."""
        remote = _remote_host(stream)
        try:
            async with trio.open_nursery() as conn_nursery:
                ws: trio_websocket.WebSocketConnection | None = None
                outcome: tuple[PeerInfo, bytes] | None = None
                with trio.move_on_after(self._config.handshake_timeout) as timeout:
                    request = await trio_websocket.wrap_server_stream(
                        conn_nursery,
                        stream,
                        message_queue_size=16,
                        max_message_size=self._config.wire_limit,
                        receive_buffer_size=self._config.receive_buffer_size,
                    )
                    ws = await request.accept()
                    outcome = await self._server_handshake(ws, remote)
                if timeout.cancelled_caught:
                    self._warn_refused(
                        remote,
                        f"refused an inbound connection from {remote}: handshake not finished "
                        f"within {self._config.handshake_timeout:.1f}s "
                        f"(close code {int(CloseCode.HANDSHAKE_TIMEOUT)})",
                    )
                    if ws is not None:
                        await self._close_ws(ws, CloseCode.HANDSHAKE_TIMEOUT, "handshake timeout")
                conn = None
                if ws is not None and outcome is not None:
                    conn = await self._accept_peer(ws, *outcome)
                if conn is None:
                    conn_nursery.cancel_scope.cancel()
                    return
                await self._run_connection(conn, conn_nursery)
        except Exception as exc:
            log.debug("%s: inbound connection ended: %s", self._node_id, _describe(exc))
        finally:
            await trio.aclose_forcefully(stream)

    async def _accept_peer(
        self, ws: trio_websocket.WebSocketConnection, info: PeerInfo, welcome: bytes
    ) -> _Connection | None:
        """Install an authenticated inbound connection and tell the peer to go ahead."""
        if self._closed:
            await self._close_ws(ws, CloseCode.GOING_AWAY, "node shutting down")
            return None
        link = self._links.get(info.node_id)
        if link is None:
            link = self._new_link(info.node_id, self._addresses.get(info.node_id))
        conn = _Connection(link, ws, info, trio.current_time())
        if not self._install(link, conn):
            await self._close_ws(ws, CloseCode.SUPERSEDED, "a preferred connection exists")
            return None
        try:
            await ws.send_message(welcome)
        except trio_websocket.ConnectionClosed as exc:
            self._drop(conn, CloseCode.NORMAL, f"closed during the handshake: {exc.reason}")
        conn.ready.set()
        return conn

    async def _client_handshake(
        self, ws: trio_websocket.WebSocketConnection, peer: str, address: str
    ) -> PeerInfo:
        handshake = ClientHandshake(
            self._identity,
            self._secret,
            secrets.token_bytes(NONCE_SIZE),
            self._nonces,
            expect=peer,
            dial_seq=next(self._dial_seq),
        )
        try:
            await ws.send_message(handshake.hello())
            proof = handshake.receive_challenge(await ws.get_message())
            if isinstance(proof, Refused):
                await self._refuse(ws, proof, f"peer {peer!r} at {address}", address)
                raise HandshakeFailed(
                    f"refused peer {peer!r} at {address}: {proof.reason} "
                    f"(close code {int(proof.code)})"
                )
            await ws.send_message(proof)
            info = handshake.receive_welcome(await ws.get_message())
        except trio_websocket.ConnectionClosed as exc:
            raise HandshakeFailed(
                f"peer {peer!r} at {address} refused the handshake: {_close_text(exc.reason)}"
            ) from None
        if isinstance(info, Refused):
            await self._refuse(ws, info, f"peer {peer!r} at {address}", address)
            raise HandshakeFailed(f"refused peer {peer!r} at {address}: {info.reason}")
        return info

    async def _server_handshake(
        self, ws: trio_websocket.WebSocketConnection, remote: str
    ) -> tuple[PeerInfo, bytes] | None:
        """Authenticate a dialing peer; None if it was refused (logged and closed)."""
        handshake = ServerHandshake(
            self._identity, self._secret, secrets.token_bytes(NONCE_SIZE), self._nonces
        )
        origin = f"inbound connection from {ws.remote}"
        try:
            challenge = handshake.receive_hello(await ws.get_message())
            if isinstance(challenge, Refused):
                await self._refuse(ws, challenge, origin, remote)
                return None
            await ws.send_message(challenge)
            info = handshake.receive_proof(await ws.get_message())
            if isinstance(info, Refused):
                await self._refuse(ws, info, origin, remote)
                return None
        except trio_websocket.ConnectionClosed as exc:
            if exc.reason is not None and exc.reason.code >= 4000:
                self._warn_refused(
                    remote, f"{origin} refused the handshake: {_close_text(exc.reason)}"
                )
            else:
                self._warn_refused(
                    remote,
                    f"{origin} left during the handshake: {_close_text(exc.reason)}",
                    level=logging.INFO,
                )
            return None
        return info, handshake.welcome()

    async def _refuse(
        self, ws: trio_websocket.WebSocketConnection, refusal: Refused, origin: str, remote: str
    ) -> None:
        self._warn_refused(
            remote, f"refused {origin}: {refusal.reason} (close code {int(refusal.code)})"
        )
        await self._close_ws(ws, refusal.code, refusal.reason)

    def _warn_refused(self, remote: str, text: str, level: int = logging.WARNING) -> None:
        """Log a refused (or abandoned) connection, a few per remote host per minute:
        a peer with the wrong secret, or anyone probing the port, redials without end."""
        self._warn_within_budget(
            f"connect:{remote}",
            text,
            f"refused connections with {remote}",
            counted_in=None,
            level=level,
        )

    async def _close_ws(
        self, ws: trio_websocket.WebSocketConnection, code: int, reason: str
    ) -> None:
        # Close reasons must fit a control frame (125 bytes with the code).
        with trio.move_on_after(self._config.close_timeout) as scope:
            scope.shield = True
            await ws.aclose(int(code), reason.encode()[:120].decode(errors="ignore"))

    def _install(self, link: _Link, conn: _Connection) -> bool:
        """Make ``conn`` the peer's connection unless a preferred one is live."""
        current = link.live()
        if current is not None and not new_connection_wins(
            self._node_id, link.peer, conn.key, current.key
        ):
            log.info(
                "%s: keeping the connection to %r dialed by %r; closing the duplicate",
                self._node_id,
                link.peer,
                current.info.initiator,
            )
            return False
        link.conn = conn
        link.phase = PeerState.CONNECTED
        link.last_error = None
        link.peer_left = False
        link.reported_lost = False
        if current is not None:
            self._drop(current, CloseCode.SUPERSEDED, "replaced by a preferred connection")
        log.info(
            "%s: connected to peer %r (dialed by %r, protocol v%d)",
            self._node_id,
            link.peer,
            conn.info.initiator,
            conn.info.version,
        )
        link.notify()
        return True

    def _drop(self, conn: _Connection, code: CloseCode, reason: str) -> None:
        """Mark ``conn`` dead; its task closes the WebSocket, the link may redial."""
        if conn.lost.is_set():
            return
        conn.close_code, conn.close_reason = code, reason
        conn.lost.set()
        for scope in conn.send_scopes:
            scope.cancel()
        link = conn.link
        if link.conn is conn:
            link.conn = None
            link.last_error = f"connection lost: {reason}"
            if code not in (CloseCode.GOING_AWAY, CloseCode.SUPERSEDED) or not self._closed:
                log.info("%s: lost peer %r: %s", self._node_id, link.peer, reason)
            link.notify()
            self._report_lost(link, f"connection lost: {reason}")

    def _report_lost(self, link: _Link, reason: str) -> None:
        if not link.reported_lost:
            link.reported_lost = True
            self._loss_listeners.notify(link.peer, reason)

    async def _run_connection(self, conn: _Connection, conn_nursery: trio.Nursery) -> None:
        conn_nursery.start_soon(self._read_loop, conn)
        conn_nursery.start_soon(self._heartbeat, conn)
        try:
            await conn.lost.wait()
        finally:
            self._drop(conn, CloseCode.GOING_AWAY, "node shutting down")
            if not conn.torn:
                await self._close_ws(conn.ws, conn.close_code, conn.close_reason)
            conn.closed.set()
            conn_nursery.cancel_scope.cancel()

    async def _read_loop(self, conn: _Connection) -> None:
        """Take a connection's messages until it closes, and deliver their frames.

        A binary message is a packet of frames (:mod:`corral.transport._ws_wire`);
        a text message is a control notice from the peer.
        """
        link = conn.link
        get_message = conn.ws.get_message
        try:
            while True:
                message = await get_message()
                if isinstance(message, str):
                    self._on_control_message(link, message)
                    continue
                try:
                    frames = unpack(message)
                except MalformedPacket as exc:
                    link.frames_refused_from_peer += 1
                    self._warn_within_budget(
                        f"from:{link.peer}",
                        f"refused a malformed message from {link.peer!r}: {exc}",
                        f"refusals of frames from {link.peer!r}",
                    )
                    continue
                for data in frames:
                    await self._on_frame(conn, link, data)
        except trio_websocket.ConnectionClosed as exc:
            self._on_closed(conn, exc.reason)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._drop(conn, CloseCode.GOING_AWAY, "node shutting down")

    def _on_control_message(self, link: _Link, message: str) -> None:
        """A text message from an authenticated peer: it refused a frame of ours."""
        refusal = parse_control_message(message)
        if refusal is None:
            log.debug("%s: ignored a control message from %r", self._node_id, link.peer)
            return
        link.frames_refused_by_peer += 1
        self._warn_within_budget(
            f"by:{link.peer}",
            f"peer {link.peer!r} refused a {refusal.size}-byte frame: {refusal.reason} "
            f"(its limit is {refusal.limit} bytes)",
            f"refusals by {link.peer!r}",
        )

    async def _on_frame(self, conn: _Connection, link: _Link, data: bytes) -> None:
        """One frame from ``link``'s peer: refuse it, or hand it on.

        Raises:
            trio.ClosedResourceError: this transport is closing.
        """
        limit = self._config.max_frame_size
        if len(data) > limit:
            link.frames_refused_from_peer += 1
            self._warn_within_budget(
                f"from:{link.peer}",
                f"refused a {len(data)}-byte frame from {link.peer!r} (limit {limit} bytes)",
                f"refusals of frames from {link.peer!r}",
            )
            try:
                await conn.ws.send_message(frame_refusal_message(len(data), limit))
            except trio_websocket.ConnectionClosed:
                pass  # the reader notices
            return
        if link.conn is not conn:
            return  # superseded; frames on the losing connection are dropped
        link.answered = True
        link.frames_received += 1
        frame = _new_frame(Frame, (link.peer, data))
        handler = self._handler
        if handler is not None and not self._closed:
            if not self._backlog_delivered.is_set():
                await self._backlog_delivered.wait()
            try:  # _deliver, inlined: this is every frame's path
                await handler(frame)
            except Exception:
                log.exception(
                    "%s: the frame handler failed on a frame from %r", self._node_id, frame.sender
                )
            return
        try:
            try:
                self._inbound_send.send_nowait(frame)  # the common case: no yield
            except trio.WouldBlock:
                await self._inbound_send.send(frame)  # the node is behind: backpressure
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._drop(conn, CloseCode.GOING_AWAY, "node shutting down")
            raise trio.ClosedResourceError("the WebSocket transport is closed") from None

    def _warn_within_budget(
        self,
        key: str,
        text: str,
        what: str,
        counted_in: str | None = "peer_status",
        level: int = logging.WARNING,
    ) -> None:
        """Log a refusal (a WARNING by default), a few per key per minute, then a count."""
        verdict = self._refusal_log.admit(key, trio.current_time())
        if not verdict.write:
            return
        if verdict.held_back:
            text += f" ({verdict.held_back} more {what} were not logged)"
        if verdict.last:
            interval = f"{self._refusal_log.interval:g} s"
            text += (
                f" (further {what} within {interval} are only counted in {counted_in})"
                if counted_in is not None
                else f" (further {what} within {interval} are counted, not logged)"
            )
        log.log(level, "%s: %s", self._node_id, text)

    def _on_closed(self, conn: _Connection, reason: trio_websocket.CloseReason | None) -> None:
        if reason is not None and reason.code == CloseCode.GOING_AWAY:
            conn.link.peer_left = True
        self._drop(conn, CloseCode.NORMAL, f"closed by the peer: {_close_text(reason)}")

    async def _heartbeat(self, conn: _Connection) -> None:
        interval, timeout = self._config.heartbeat_interval, self._config.heartbeat_timeout
        for count in itertools.count(1):
            await trio.sleep(interval)
            with trio.move_on_after(timeout) as waiting:
                try:
                    await conn.ws.ping(count.to_bytes(8, "big"))
                except trio_websocket.ConnectionClosed as exc:
                    self._drop(conn, CloseCode.NORMAL, f"closed: {_close_text(exc.reason)}")
                    return
            if waiting.cancelled_caught:
                log.warning(
                    "%s: peer %r missed its heartbeat (no pong within %.1fs); "
                    "dropping the connection",
                    self._node_id,
                    conn.link.peer,
                    timeout,
                )
                self._drop(conn, CloseCode.HEARTBEAT_TIMEOUT, f"no pong within {timeout:.1f}s")
                return

    async def _write_loop(self, link: _Link) -> None:
        """Drain the peer's queue into its current connection, many frames per write."""
        queue = link.queue_receive
        try:
            while True:
                try:
                    batch = [await queue.receive()]
                except trio.EndOfChannel:
                    return
                size = len(batch[0])
                while len(batch) < _BATCH_FRAMES and size < _BATCH_BYTES:
                    try:
                        frame = queue.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    batch.append(frame)
                    size += len(frame)
                try:
                    await self._write_batch(link, batch)
                finally:
                    link.unwritten -= len(batch)
        finally:
            link.writer_done.set()

    async def _write_batch(self, link: _Link, batch: list[bytes]) -> None:
        conn = link.conn
        if conn is None or conn.lost.is_set():
            link.frames_dropped += len(batch)
            return
        if not conn.ready.is_set():
            await conn.ready.wait()
        messages = pack_into_messages(batch, min(_BATCH_BYTES, conn.info.max_frame))
        with trio.CancelScope() as scope:
            conn.send_scopes.add(scope)
            try:
                async with conn.write_lock:
                    for packet in messages:
                        await conn.ws.send_message(packet)
            except trio_websocket.ConnectionClosed as exc:
                link.frames_dropped += len(batch)
                self._drop(conn, CloseCode.NORMAL, f"closed: {_close_text(exc.reason)}")
            finally:
                conn.send_scopes.discard(scope)
        if scope.cancelled_caught:
            link.frames_dropped += len(batch)

    async def _run(
        self,
        listeners: Listeners,
        address: str | None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Host every background task until :meth:`aclose` cancels them.

        A nursery of its own, so that closing the transport cancels only its tasks,
        never the code of whoever opened it.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if address is not None:
                self._address = address
                await nursery.start(
                    functools.partial(
                        trio.serve_listeners,
                        self._handle_inbound,
                        listeners,
                        handler_nursery=nursery,
                    )
                )
                log.info("%s: listening for peers on %s", self._node_id, address)
            task_status.started()
            await trio.sleep_forever()


def _parse_listen(listen: tuple[str, int] | str) -> tuple[str, int]:
    if not isinstance(listen, str):
        return listen
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"listen address {listen!r} must look like 'host:port'")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


@asynccontextmanager
async def open_websocket_transport(
    node_id: str,
    listen: tuple[str, int] | str | None = ("127.0.0.1", DEFAULT_PORT),
    *,
    secret: bytes | str | None = None,
    peers: Mapping[str, str] | None = None,
    config: WebSocketConfig | None = None,
    random: random_module.Random | None = None,
    network: StreamNetwork | None = None,
) -> AsyncIterator[WebSocketTransport]:
    """Run a :class:`WebSocketTransport` for ``node_id`` for the duration of the block.

    Args:
        node_id: this node's id; peers must dial it by this name.
        listen: ``(host, port)`` or ``"host:port"`` to accept peers on (port 0 picks a
            free one, see ``transport.address``); None to only dial out.
        secret: the cluster secret. Without one the node only listens on loopback,
            and only peers without a secret are accepted.
        peers: node id -> ``"host:port"`` of peers this node may dial; more can be
            added with :meth:`WebSocketTransport.add_peer`.
        config: limits and timings (:class:`WebSocketConfig`).
        random: the random source for reconnect jitter (inject one in tests).
        network: where streams come from; TCP unless a test injects
            :class:`~corral.transport._ws_net.MemoryStreamNetwork`.

    Raises:
        ValueError: empty node id or secret, a malformed address, or a non-loopback
            listen address without a secret.
        OSError: the listen address cannot be bound.
    """
    if not node_id:
        raise ValueError("node_id must not be empty")
    if isinstance(secret, str):
        secret = secret.encode()
    if secret is not None and not secret:
        raise ValueError("the cluster secret must not be empty; pass None for no secret")
    listen_at = None if listen is None else _parse_listen(listen)
    if listen_at is not None:
        check_listen_address(listen_at[0], secret is not None)
    for peer, address in (peers or {}).items():
        parse_peer_address(address)
        if peer == node_id:
            raise ValueError(f"peer id {peer!r} is this node's own id")
    network = network or TcpNetwork()
    listeners: Listeners = []
    bound: str | None = None
    if listen_at is not None:
        listeners, bound = await network.listen(*listen_at)  # OSError here, unwrapped
    try:
        async with trio.open_nursery() as nursery:
            transport = WebSocketTransport(
                node_id,
                secret=secret,
                config=config or WebSocketConfig(),
                random=random or random_module.Random(),
                network=network,
                peers=peers or {},
            )
            try:
                await nursery.start(transport._run, listeners, bound)
                yield transport
            finally:
                await transport.aclose()
    except BaseExceptionGroup as group:
        # Background tasks never raise; the only error in here is the caller's own.
        # Give it back as raised rather than wrapped by our nursery.
        errors = group.subgroup(lambda e: not isinstance(e, trio.Cancelled))
        if errors is not None and len(errors.exceptions) == 1:
            error = errors.exceptions[0]
            if isinstance(error, Exception) and not isinstance(error, BaseExceptionGroup):
                raise error from None
        raise
    finally:
        for listener in listeners:
            await trio.aclose_forcefully(listener)
