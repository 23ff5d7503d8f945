"""MemoryNetwork: an in-process network of MemoryTransports, with fault injection.

Each connected node has one bounded inbox. ``send`` checks reachability at
once (unknown, killed or partitioned peer: :class:`PeerUnavailable`), rolls the
drop dice, and puts ``(deliver_at, frame)`` in the peer's inbox without waiting
(a full inbox: :class:`PeerBusy`). ``receive`` takes frames in inbox order and,
when a delay is set, sleeps until each frame's delivery time, so frames from one
sender arrive in order however the delay changes. A frame whose link was cut,
or whose receiver was killed, while it was in flight is dropped on delivery.

Two nodes are linked from the first frame either sends the other until a fault
makes them unreachable to each other (a partition cut, a kill, a transport
closing); the next frame links them again. A fault that cuts a link is reported
to both ends' ``on_peer_lost`` handlers at once, as a real transport reports a
closed connection: to the peers a node talked to, not to every node of the
network (a thousand nodes that never talk would otherwise each hear of every other
one's end).

Everything that moves is bytes, exactly as a real wire would carry.
Randomness comes only from the injected ``random.Random``.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import trio

from corral.transport._base import (
    Frame,
    FrameCounts,
    PeerLossListeners,
    PeerLostHandler,
    Transport,
)
from corral.transport._errors import PeerBusy, PeerUnavailable

__all__ = ["MemoryNetwork", "MemoryTransport"]


class MemoryNetwork:
    """Connects several actor systems in one process.

    Args:
        random: the source of randomness for drops (seed it for repeatable tests).
        inbox_size: frames a node may have waiting before senders get PeerBusy.

    Example::

        network = MemoryNetwork()
        a = network.connect("node-a")
        b = network.connect("node-b")
        network.partition({"node-a"}, {"node-b"})
    """

    def __init__(self, random: _random.Random | None = None, inbox_size: int = 1024) -> None:
        self._random = random if random is not None else _random.Random(0)
        self._inbox_size = inbox_size
        self._nodes: dict[str, MemoryTransport] = {}
        self._killed: set[str] = set()
        self._cuts: set[frozenset[str]] = set()
        self._one_way: set[tuple[str, str]] = set()  # (sender, receiver) dropped silently
        # node -> the nodes it is linked to (a frame went between them since the last
        # fault that cut them apart)
        self._links: dict[str, set[str]] = {}
        self._drop_rate = 0.0
        self._delay = 0.0
        #: frames accepted for delivery, dropped by the dice, and dropped in flight
        self.stats = {"sent": 0, "dropped": 0, "lost_in_flight": 0}

    # ------------------------------------------------------------------ topology

    def connect(self, node_id: str) -> MemoryTransport:
        """Attach a node and return its transport.

        Raises:
            ValueError: a live transport already uses ``node_id``.
        """
        existing = self._nodes.get(node_id)
        if existing is not None and not existing._closed:
            raise ValueError(
                f"node {node_id!r} is already connected to this network; close it first"
            )
        transport = MemoryTransport(self, node_id, self._inbox_size)
        self._nodes[node_id] = transport
        return transport

    @property
    def nodes(self) -> list[str]:
        """Ids of connected (open) nodes, sorted."""
        return sorted(n for n, t in self._nodes.items() if not t._closed)

    # ------------------------------------------------------------------ faults

    def set_drop_rate(self, probability: float) -> None:
        """Drop each frame with this probability (0 to 1)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("drop rate must be between 0 and 1")
        self._drop_rate = probability

    def set_delay(self, seconds: float) -> None:
        """Deliver each frame sent from now on this many seconds late."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError("delay must be zero or more seconds")
        self._delay = seconds

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every link between nodes of different groups (cuts add up until :meth:`heal`).

        Nodes named in no group keep their links.
        """
        sets = [frozenset(g) for g in groups]
        cuts: set[frozenset[str]] = set()
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                for a in left:
                    for b in right:
                        if a != b:
                            cuts.add(frozenset((a, b)))
        lost: set[tuple[str, str]] = set()
        for cut in cuts - self._cuts:
            a, b = sorted(cut)
            if b in self._links.get(a, ()) and self._linked(a, b):
                lost.update(((a, b), (b, a)))
                self._unlink(a, b)
        self._cuts |= cuts
        for transport in self._nodes.values():
            transport._discard_unreachable()
        self._report_lost(lost)

    def cut_one_way(self, senders: Iterable[str], receivers: Iterable[str]) -> None:
        """Drop every frame a node of ``senders`` sends to a node of ``receivers``, silently,
        until :meth:`heal` (cuts add up): a firewall dropping one direction. The senders
        still hear the receivers, and neither side is told of a loss (no link is cut);
        frames already in flight arrive.
        """
        receiving = frozenset(receivers)
        self._one_way |= {(a, b) for a in senders for b in receiving if a != b}

    def heal(self) -> None:
        """Remove every partition cut, one-way cuts included."""
        self._cuts.clear()
        self._one_way.clear()

    def kill(self, node_id: str) -> None:
        """Make a node unreachable: it neither sends nor receives; its inbox is lost."""
        peers = self._cut_links(node_id)
        self._killed.add(node_id)
        transport = self._nodes.get(node_id)
        if transport is not None:
            transport._discard_inbox()
        self._report_lost({(node_id, p) for p in peers} | {(p, node_id) for p in peers})

    def revive(self, node_id: str) -> None:
        """Undo :meth:`kill`."""
        self._killed.discard(node_id)

    def reachable(self, sender: str, receiver: str) -> bool:
        """Whether a frame from ``sender`` could reach ``receiver`` right now."""
        target = self._nodes.get(receiver)
        return (
            target is not None
            and not target._closed
            and sender not in self._killed
            and receiver not in self._killed
            and not (self._cuts and frozenset((sender, receiver)) in self._cuts)
        )

    def _linked(self, a: str, b: str) -> bool:
        """Whether open nodes ``a`` and ``b`` can reach each other right now."""
        source = self._nodes.get(a)
        return (
            a != b
            and source is not None
            and not source._closed
            and self.reachable(a, b)
            and self.reachable(b, a)
        )

    def _cut_links(self, node_id: str) -> list[str]:
        """Cut every link of ``node_id``; returns its peers that could reach it, and be
        reached by it, until now (sorted)."""
        peers = sorted(peer for peer in self._links.pop(node_id, ()) if self._linked(peer, node_id))
        for peer in peers:
            self._links.get(peer, set()).discard(node_id)
        return peers

    def _unlink(self, a: str, b: str) -> None:
        self._links.get(a, set()).discard(b)
        self._links.get(b, set()).discard(a)

    def _report_lost(self, lost: set[tuple[str, str]]) -> None:
        """Tell each observer about every peer of ``lost`` ((observer, peer) pairs a
        fault just cut)."""
        for observer, peer in sorted(lost):
            transport = self._nodes.get(observer)
            if transport is not None:
                transport._peer_lost(peer, self._why_unreachable(observer, peer))

    def _closing(self, node_id: str) -> None:
        """A transport is closing: its peers lose it."""
        peers = self._cut_links(node_id)
        transport = self._nodes.get(node_id)
        if transport is not None:
            transport._closed = True
        for observer in peers:
            self._nodes[observer]._peer_lost(node_id, f"node {node_id!r} closed its transport")

    # ------------------------------------------------------------------ delivery

    def _send(self, sender: str, receiver: str, data: bytes) -> None:
        if not self.reachable(sender, receiver):
            raise PeerUnavailable(self._why_unreachable(sender, receiver))
        linked = self._links.get(sender)
        if linked is None or receiver not in linked:
            self._links.setdefault(sender, set()).add(receiver)
            self._links.setdefault(receiver, set()).add(sender)
        if (self._one_way and (sender, receiver) in self._one_way) or (
            self._drop_rate and self._random.random() < self._drop_rate
        ):
            self.stats["dropped"] += 1
            return
        target = self._nodes[receiver]
        deliver_at = trio.current_time() + self._delay if self._delay else 0.0
        try:
            target._inbox_send.send_nowait((deliver_at, Frame(sender, bytes(data))))
        except trio.WouldBlock:
            raise PeerBusy(
                f"the inbox of {receiver!r} holds {self._inbox_size} frames already; retry later"
            ) from None
        self.stats["sent"] += 1

    def _why_unreachable(self, sender: str, receiver: str) -> str:
        if sender in self._killed:
            return f"node {sender!r} is killed; revive it to send"
        target = self._nodes.get(receiver)
        if target is None or target._closed:
            return f"no node {receiver!r} is connected to the network"
        if receiver in self._killed:
            return f"node {receiver!r} is killed"
        return f"nodes {sender!r} and {receiver!r} are partitioned"


class MemoryTransport(Transport):
    """One node's end of a :class:`MemoryNetwork`. Build it with ``network.connect(node_id)``."""

    def __init__(self, network: MemoryNetwork, node_id: str, inbox_size: int) -> None:
        self._network = network
        self._node_id = node_id
        send, receive = trio.open_memory_channel[tuple[float, Frame]](inbox_size)
        self._inbox_send = send
        self._inbox_receive = receive
        self._held: tuple[float, Frame] | None = None
        self._closed = False
        self._loss_listeners = PeerLossListeners()
        self._sent: dict[str, int] = {}
        self._received: dict[str, int] = {}

    @property
    def node_id(self) -> str:
        return self._node_id

    def stats(self) -> Mapping[str, FrameCounts]:
        peers = sorted(self._sent.keys() | self._received.keys())
        return MappingProxyType(
            {p: FrameCounts(self._sent.get(p, 0), self._received.get(p, 0)) for p in peers}
        )

    async def send(self, peer: str, data: bytes) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this MemoryTransport was closed")
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this MemoryTransport was closed")
        self._network._send(self._node_id, peer, data)
        self._sent[peer] = self._sent.get(peer, 0) + 1

    async def receive(self) -> Frame:
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this MemoryTransport was closed")
            if self._held is None:
                try:
                    self._held = await self._inbox_receive.receive()
                except trio.EndOfChannel:
                    raise trio.ClosedResourceError("this MemoryTransport was closed") from None
            held = self._held
            deliver_at, frame = held
            if deliver_at:
                await trio.sleep_until(deliver_at)
                if self._held is not held:
                    continue  # discarded (link cut, node killed) while we waited
            self._held = None
            if self._network.reachable(frame.sender, self._node_id):
                self._received[frame.sender] = self._received.get(frame.sender, 0) + 1
                return frame
            self._network.stats["lost_in_flight"] += 1

    def on_peer_lost(self, handler: PeerLostHandler) -> Callable[[], None]:
        """Call ``handler`` when a partition, a kill or a closing cuts this node off a peer."""
        return self._loss_listeners.add(handler)

    def _peer_lost(self, peer: str, reason: str) -> None:
        self._loss_listeners.notify(peer, reason)

    def _discard_unreachable(self) -> None:
        """Drop queued frames whose link is now cut (they were in flight on it)."""
        held = self._held
        if held is not None and not self._network.reachable(held[1].sender, self._node_id):
            self._held = None
            self._network.stats["lost_in_flight"] += 1
        kept: list[tuple[float, Frame]] = []
        while True:
            try:
                kept.append(self._inbox_receive.receive_nowait())
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                break
        for item in kept:
            if self._network.reachable(item[1].sender, self._node_id):
                self._inbox_send.send_nowait(item)  # fits: it held them a moment ago
            else:
                self._network.stats["lost_in_flight"] += 1

    def _discard_inbox(self) -> None:
        self._held = None
        while True:
            try:
                self._inbox_receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                return

    async def aclose(self) -> None:
        if not self._closed:
            self._network._closing(self._node_id)
            self._closed = True
            self._inbox_receive.close()  # first, so a blocked receive sees ClosedResourceError
            self._inbox_send.close()
        await trio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return f"<MemoryTransport {self._node_id!r}{' closed' if self._closed else ''}>"
