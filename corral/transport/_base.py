"""The Transport interface: moves encoded frames between actor systems.

A transport knows nothing of actors or message kinds. It carries opaque frames
(one CBOR-encoded envelope each) from this node to a peer node, and hands the
frames that arrive for this node to whoever calls :meth:`Transport.receive`.
The actor system above it encodes, decodes, validates and routes.

Guarantees every implementation keeps (the contract suite checks them):

* frames from one sender to one receiver arrive in the order sent, or not at all;
* ``send`` to a peer that cannot be reached raises :class:`PeerUnavailable`
  (it never blocks forever); a full outbound queue raises :class:`PeerBusy`;
* after ``aclose`` every call raises ``trio.ClosedResourceError``.

Three optional abilities, with defaults for transports that lack them:

* :meth:`Transport.stats`: frames sent and received so far, by peer (read by the
  node's ``/metrics``). The default knows none.

* :meth:`Transport.on_peer_lost`: the transport reports a peer it can no longer
  reach (connection closed, heartbeat missed, dial or handshake refused, node
  killed or partitioned), so whoever waits for that peer's answer can stop
  waiting. The default never reports anything.
* :meth:`Transport.deliver_frames_to`: the transport hands each arriving frame to
  a coroutine from its own receiving task instead of queueing it for
  :meth:`Transport.receive`, which saves a task switch per frame. The default
  declines, and the caller keeps calling ``receive``.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

logger = logging.getLogger("corral.transport")


class Frame(NamedTuple):
    """One frame as received: who sent it, and its bytes (immutable)."""

    sender: str
    data: bytes


@dataclass(frozen=True, slots=True)
class PeerLost:
    """A peer became unreachable: frames sent to it may be lost, answers will not come.

    Attributes:
        peer: the node id of the peer.
        reason: what happened, in words (e.g. "closed by the peer: close code 1001").
    """

    peer: str
    reason: str


#: called with each frame when a transport delivers frames itself (see deliver_frames_to)
FrameHandler = Callable[[Frame], Awaitable[None]]
#: called synchronously when a peer is lost; must not block or raise
PeerLostHandler = Callable[[PeerLost], None]


def _nothing_to_remove() -> None:
    return None


class PeerLossListeners:
    """The handlers registered with :meth:`Transport.on_peer_lost`, for implementations.

    ``notify`` calls each handler in registration order; a handler that raises is
    logged and the others still run.
    """

    __slots__ = ("_handlers",)

    def __init__(self) -> None:
        self._handlers: list[PeerLostHandler] = []

    def add(self, handler: PeerLostHandler) -> Callable[[], None]:
        """Register ``handler``; returns a function that removes it (idempotent)."""
        self._handlers.append(handler)

        def remove() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return remove

    def notify(self, peer: str, reason: str) -> None:
        """Tell every handler that ``peer`` was lost, and why."""
        if not self._handlers:
            return
        event = PeerLost(peer, reason)
        for handler in list(self._handlers):
            try:
                handler(event)
            except Exception:
                logger.exception("a peer-lost handler failed on %r", event)


class FrameCounts(NamedTuple):
    """Frames one transport exchanged with one peer since it started."""

    sent: int
    received: int


_NO_STATS: Mapping[str, FrameCounts] = MappingProxyType({})


class Transport(ABC):
    """Point-to-point frame delivery between named nodes."""

    @property
    @abstractmethod
    def node_id(self) -> str:
        """The id of the node this transport belongs to."""

    @abstractmethod
    async def send(self, peer: str, data: bytes) -> None:
        """Queue ``data`` for delivery to ``peer``.

        Raises:
            PeerUnavailable: the peer is unknown, down, or unreachable.
            PeerBusy: the outbound queue to the peer is full.
            trio.ClosedResourceError: this transport was closed.
        """

    @abstractmethod
    async def receive(self) -> Frame:
        """Wait for the next frame addressed to this node.

        Raises:
            trio.ClosedResourceError: this transport was closed.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Stop sending and receiving. Idempotent."""

    def on_peer_lost(self, handler: PeerLostHandler) -> Callable[[], None]:
        """Call ``handler(PeerLost(peer, reason))`` whenever a peer becomes unreachable.

        A peer is reported lost when frames already handed to ``send`` for it may
        never arrive, or its answers may never come back: its connection closed
        or missed its heartbeat, a dial or handshake to it failed, it was killed
        or cut off. The handler runs synchronously in whichever task noticed; it
        must not block, and errors it raises are logged and ignored. A peer is
        reported again only after it was reachable in between.

        Returns:
            A function that unregisters the handler.

        The default implementation (a transport that cannot tell) never calls it.
        """
        return _nothing_to_remove

    def deliver_frames_to(self, handler: FrameHandler) -> bool:
        """Ask the transport to deliver arriving frames by calling ``await handler(frame)``.

        The transport calls it from its own receiving task(s), in arrival order
        per sender, frames queued before the call first; :meth:`receive` then gets
        nothing more. While the handler runs, frames from that sender wait, so it
        should return quickly (waiting briefly applies backpressure to the sender).
        Exceptions it raises are logged, and delivery goes on. Call it at most once.

        Returns:
            True if the transport will deliver this way; False (the default) if it
            does not support it: keep calling :meth:`receive`.
        """
        return False

    def stats(self) -> Mapping[str, FrameCounts]:
        """Frames sent to and received from each peer so far (a read-only snapshot).

        A frame counts as sent once ``send`` accepted it (written or queued) and as
        received once it was handed on; refused frames are not counted. The
        default (a transport that does not count) is an empty mapping.
        """
        return _NO_STATS
