"""Where the WebSocket transport gets its byte streams: real TCP, or an in-process twin.

:class:`TcpNetwork` is what production uses. :class:`MemoryStreamNetwork` wires
transports in one process through in-memory streams, so tests of heartbeats,
reconnects and queue bounds run under Trio's virtual clock with no sockets, and
can make a peer fall silent (:meth:`MemoryStreamNetwork.blackhole`) or vanish
(:meth:`MemoryStreamNetwork.sever`) on demand.
"""

from __future__ import annotations

import errno
import weakref
from abc import ABC, abstractmethod

import trio
import trio.testing

from corral.transport._ws_rules import format_address

Listeners = list[trio.abc.Listener[trio.abc.Stream]]


class StreamNetwork(ABC):
    """Opens listeners and outgoing byte streams."""

    @abstractmethod
    async def listen(self, host: str, port: int) -> tuple[Listeners, str]:
        """Start listening; returns the listeners and the bound ``host:port``."""

    @abstractmethod
    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """Open a byte stream to ``host:port``.

        Raises:
            OSError: the address refuses or cannot be reached.
        """


class TcpNetwork(StreamNetwork):
    """Plain TCP through Trio's socket API."""

    async def listen(self, host: str, port: int) -> tuple[Listeners, str]:
        listeners = await trio.open_tcp_listeners(port, host=host)
        # A name resolving to several interfaces with port 0 gets one port per
        # listener; a peer address names one port, so keep the first only.
        first, extra = listeners[0], listeners[1:]
        for listener in extra:
            await listener.aclose()
        bound = first.socket.getsockname()
        kept: Listeners = [first]
        return kept, format_address(str(bound[0]), int(bound[1]))

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)


#: connections dialed but not yet accepted, per listener (a TCP listen backlog's role)
MEMORY_BACKLOG = 128


class _MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    def __init__(self, network: MemoryStreamNetwork, address: str) -> None:
        self._network = network
        self.address = address
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](MEMORY_BACKLOG)

    def offer(self, stream: trio.abc.Stream) -> None:
        """Queue a dialed connection for ``accept``.

        Raises:
            ConnectionRefusedError: the backlog is full (nobody accepts).
        """
        try:
            self._send.send_nowait(stream)
        except trio.WouldBlock:
            raise ConnectionRefusedError(
                errno.ECONNREFUSED,
                f"{self.address}: {MEMORY_BACKLOG} connections wait to be accepted",
            ) from None

    async def accept(self) -> trio.abc.Stream:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise trio.ClosedResourceError("listener closed") from None

    async def aclose(self) -> None:
        self._network._forget_listener(self)
        self._send.close()
        self._receive.close()
        await trio.lowlevel.checkpoint()


class _Pipe:
    """One direction of an in-memory connection that a blackhole can stall."""

    def __init__(self, network: MemoryStreamNetwork, address: str) -> None:
        self.network = network
        self.address = address
        self.send = trio.testing.MemorySendStream()
        self.receive = trio.testing.MemoryReceiveStream()
        self.closed = False
        self.send.send_all_hook = self._pump_async
        self.send.close_hook = self._on_close

    def pump(self) -> None:
        if self.network.is_blackholed(self.address):
            return
        try:
            trio.testing.memory_stream_pump(self.send, self.receive)
        except trio.BrokenResourceError:
            pass

    async def _pump_async(self) -> None:
        while self.network.is_blackholed(self.address) and not self.closed:
            await self.network._wait_changed()
        if self.closed and self.network.is_blackholed(self.address):
            return
        trio.testing.memory_stream_pump(self.send, self.receive)

    def _on_close(self) -> None:
        self.closed = True
        self.network._poke()
        self.pump()

    def sever(self) -> None:
        self.closed = True
        self.receive.put_eof()
        self.network._poke()


class MemoryStreamNetwork(StreamNetwork):
    """An in-process network of byte streams for tests under a virtual clock.

    Addresses are ``host:port`` strings like TCP's; listening on port 0 picks
    a free one. No sockets are opened and no wall time passes.
    """

    def __init__(self, first_port: int = 40000) -> None:
        self._listeners: dict[str, _MemoryListener] = {}
        self._next_port = first_port
        self._blackholed: set[str] = set()
        self._changed = trio.Event()
        self._pipes: weakref.WeakSet[_Pipe] = weakref.WeakSet()
        self.connections_made = 0

    async def listen(self, host: str, port: int) -> tuple[Listeners, str]:
        await trio.lowlevel.checkpoint()
        if port == 0:
            while format_address(host, self._next_port) in self._listeners:
                self._next_port += 1
            port = self._next_port
            self._next_port += 1
        address = format_address(host, port)
        if address in self._listeners:
            raise OSError(errno.EADDRINUSE, f"address {address} already in use")
        listener = _MemoryListener(self, address)
        self._listeners[address] = listener
        return [listener], address

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        address = format_address(host, port)
        await trio.lowlevel.checkpoint()
        while self.is_blackholed(address):
            await self._wait_changed()  # like a SYN to a silent host: hangs
        listener = self._listeners.get(address)
        if listener is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens on {address}")
        outbound, inbound = _Pipe(self, address), _Pipe(self, address)
        self._pipes.add(outbound)
        self._pipes.add(inbound)
        client = trio.StapledStream(outbound.send, inbound.receive)
        server = trio.StapledStream(inbound.send, outbound.receive)
        listener.offer(server)  # ConnectionRefusedError when its backlog is full
        self.connections_made += 1
        return client

    def is_blackholed(self, address: str) -> bool:
        """Whether traffic to and from ``address`` is currently stalled."""
        return address in self._blackholed

    def blackhole(self, address: str) -> None:
        """Stall all traffic to and from the node listening on ``address`` (it falls silent)."""
        self._blackholed.add(address)
        self._poke()

    def heal(self, address: str) -> None:
        """Undo :meth:`blackhole`; stalled bytes flow again."""
        self._blackholed.discard(address)
        self._poke()
        for pipe in list(self._pipes):
            if pipe.address == address:
                pipe.pump()

    def sever(self, address: str) -> None:
        """Break every connection to ``address`` at once, as if its process died."""
        for pipe in list(self._pipes):
            if pipe.address == address:
                pipe.sever()

    def _forget_listener(self, listener: _MemoryListener) -> None:
        if self._listeners.get(listener.address) is listener:
            del self._listeners[listener.address]

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_changed(self) -> None:
        await self._changed.wait()
