"""An ask in flight fails with PeerUnavailable as soon as its peer is lost (virtual time).

On both transports: MemoryNetwork faults (kill, partition, the peer closing), and
WebSocketTransport over MemoryStreamNetwork (the peer falling silent, its process
dying, its node shutting down). The asks have long deadlines; every test asserts
they failed long before them, at the virtual moment the transport could tell.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from corral.supervision import Actor, ActorSystem, ChildSpec, open_actor_system
from corral.transport import (
    MemoryNetwork,
    PeerUnavailable,
    ReconnectPolicy,
    WebSocketConfig,
    WebSocketTransport,
    message,
    open_websocket_transport,
)
from corral.transport._ws_net import MemoryStreamNetwork

DEADLINE = 600.0  # what the asks would wait without loss reports
SECRET = b"loss-secret"
CONFIG = WebSocketConfig(
    heartbeat_interval=1.0,
    heartbeat_timeout=2.0,
    connect_timeout=3.0,
    handshake_timeout=3.0,
    close_timeout=1.0,
    reconnect=ReconnectPolicy(initial=0.5, maximum=4.0),
)


@message("test.loss.slow")
@dataclass(frozen=True)
class Slow:
    seconds: float


class Sleeper(Actor):
    async def handle(self, msg: object) -> object:
        if isinstance(msg, Slow):
            await trio.sleep(msg.seconds)
            return "done"
        return None


@asynccontextmanager
async def memory_nodes(
    network: MemoryNetwork, *names: str
) -> AsyncIterator[dict[str, ActorSystem]]:
    async with AsyncExitStack() as stack:
        systems = {
            name: await stack.enter_async_context(open_actor_system(name, network.connect(name)))
            for name in names
        }
        for system in systems.values():
            await system.spawn(ChildSpec("sleeper", Sleeper, shutdown_grace=0.1))
        yield systems


@asynccontextmanager
async def websocket_nodes(
    network: MemoryStreamNetwork, *names: str
) -> AsyncIterator[dict[str, ActorSystem]]:
    async with AsyncExitStack() as stack:
        transports = [
            await stack.enter_async_context(
                open_websocket_transport(
                    name,
                    ("10.0.0.1", 0),
                    secret=SECRET,
                    config=CONFIG,
                    random=random.Random(7),
                    network=network,
                )
            )
            for name in names
        ]
        for transport in transports:
            for other in transports:
                if other is not transport and other.address is not None:
                    transport.add_peer(other.node_id, other.address)
        systems = {
            t.node_id: await stack.enter_async_context(open_actor_system(t.node_id, t))
            for t in transports
        }
        for system in systems.values():
            await system.spawn(ChildSpec("sleeper", Sleeper, shutdown_grace=0.1))
        yield systems


async def ask_and_lose(
    asker: ActorSystem, target: str, lose: Callable[[], Awaitable[None]]
) -> tuple[PeerUnavailable, float]:
    """Ask ``target`` for something slow, run ``lose`` once it is being handled.

    Returns the error the ask raised and how long after ``lose`` it came.
    """
    assert await asker.ref(target).ask(Slow(0.0)) == "done"  # connected, warmed up
    lost_at = 0.0

    async def lose_soon() -> None:
        nonlocal lost_at
        await trio.sleep(0.5)  # the request has arrived and the actor sleeps on it
        lost_at = trio.current_time()
        await lose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lose_soon)
        with pytest.raises(PeerUnavailable) as info:
            await asker.ref(target).ask(Slow(DEADLINE * 2), timeout=DEADLINE)
    return info.value, trio.current_time() - lost_at


async def test_a_killed_peer_fails_the_ask_at_once(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork()
    async with memory_nodes(network, "a", "b") as nodes:

        async def kill() -> None:
            network.kill("b")

        error, took = await ask_and_lose(nodes["a"], "b/sleeper", kill)
        assert took == 0.0
        assert "lost node 'b'" in str(error)
        assert "killed" in str(error)
        assert "b/sleeper" in str(error)
        assert "Slow" in str(error)


async def test_a_killed_asker_stops_waiting_too(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork()
    async with memory_nodes(network, "a", "b") as nodes:

        async def kill_the_asker() -> None:
            network.kill("a")

        error, took = await ask_and_lose(nodes["a"], "b/sleeper", kill_the_asker)
        assert took == 0.0
        assert "node 'a' is killed" in str(error)


async def test_only_asks_to_the_lost_peer_fail(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork()
    async with memory_nodes(network, "a", "b", "c") as nodes:
        a = nodes["a"]
        results: dict[str, object] = {}

        async def ask(target: str) -> None:
            try:
                results[target] = await a.ref(f"{target}/sleeper").ask(Slow(5.0), timeout=60)
            except PeerUnavailable as exc:
                results[target] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "b")
            nursery.start_soon(ask, "c")
            await trio.sleep(1.0)
            network.partition({"a"}, {"b"})
        assert isinstance(results["b"], PeerUnavailable)
        assert results["c"] == "done"
        network.heal()
        assert await a.ref("b/sleeper").ask(Slow(0.0)) == "done"  # and b is back


async def test_a_peer_that_closes_fails_the_ask_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with memory_nodes(network, "a", "b") as nodes:
        peer = nodes["b"].transport
        assert peer is not None
        error, took = await ask_and_lose(nodes["a"], "b/sleeper", peer.aclose)
        assert took == 0.0
        assert "closed its transport" in str(error)


async def test_over_websocket_a_silent_peer_fails_the_ask_within_its_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with websocket_nodes(network, "node-a", "node-b") as nodes:
        peer = nodes["node-b"].transport
        assert isinstance(peer, WebSocketTransport)
        assert peer.address is not None
        address = peer.address

        async def fall_silent() -> None:
            network.blackhole(address)

        error, took = await ask_and_lose(nodes["node-a"], "node-b/sleeper", fall_silent)
        assert took <= CONFIG.heartbeat_interval + CONFIG.heartbeat_timeout + 0.01
        assert "no pong" in str(error)


async def test_over_websocket_a_dead_peer_process_fails_the_ask_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with websocket_nodes(network, "node-a", "node-b") as nodes:
        peer = nodes["node-b"].transport
        assert isinstance(peer, WebSocketTransport)
        assert peer.address is not None
        address = peer.address

        async def die() -> None:
            network.sever(address)

        error, took = await ask_and_lose(nodes["node-a"], "node-b/sleeper", die)
        assert took < 0.1
        assert "connection lost" in str(error)


async def test_over_websocket_a_peer_shutting_down_fails_the_ask_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with websocket_nodes(network, "node-a", "node-b") as nodes:
        peer = nodes["node-b"].transport
        assert peer is not None
        error, took = await ask_and_lose(nodes["node-a"], "node-b/sleeper", peer.aclose)
        assert took < CONFIG.close_timeout
        assert "1001" in str(error)  # the peer said "going away"
