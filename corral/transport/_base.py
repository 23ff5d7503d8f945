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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame as received: who sent it, and its bytes."""

    sender: str
    data: bytes


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
