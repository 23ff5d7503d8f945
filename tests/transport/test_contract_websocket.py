"""WebSocketTransport passes the public transport contract, and the kernel runs on it.

Both over in-memory streams under the virtual clock (trio-websocket's
``wrap_client_stream`` / ``wrap_server_stream`` over trio.testing memory streams)
and over real loopback sockets; plus what only a real network transport has to
show: a peer process killed and restarted is reconnected to, and a node with
the wrong secret is refused before anything reaches an actor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
import trio.testing

from corral.supervision import ActorSystem, open_actor_system
from corral.testing import check_transport
from corral.transport import (
    PeerState,
    PeerUnavailable,
    ReconnectPolicy,
    Transport,
    WebSocketConfig,
    WebSocketTransport,
    open_websocket_transport,
)
from corral.transport._ws_net import MemoryStreamNetwork, StreamNetwork

from ._contract import (
    CONTRACT_CHECKS,
    TIMEOUT,
    Check,
    Echo,
    Echoed,
    History,
    Record,
    Recorder,
    _spawn_recorder,
    systems,
)

SECRET = b"contract-secret"
CONFIG = WebSocketConfig(
    connect_timeout=3.0,
    handshake_timeout=3.0,
    close_timeout=1.0,
    heartbeat_interval=1.0,
    heartbeat_timeout=2.0,
    reconnect=ReconnectPolicy(initial=0.05, maximum=0.5),
)


@asynccontextmanager
async def websocket_transports(
    count: int, secrets: list[bytes] | None = None, network: StreamNetwork | None = None
) -> AsyncIterator[list[WebSocketTransport]]:
    """``count`` WebSocketTransports that know each other's addresses: on 127.0.0.1:0,
    or on ``network`` (in-memory streams)."""
    secrets = secrets or [SECRET] * count
    host = "127.0.0.1" if network is None else "10.0.0.1"
    async with AsyncExitStack() as stack:
        transports: list[WebSocketTransport] = [
            await stack.enter_async_context(
                open_websocket_transport(
                    f"node-{i}", (host, 0), secret=secrets[i], config=CONFIG, network=network
                )
            )
            for i in range(count)
        ]
        for transport in transports:
            for other in transports:
                if other is not transport and other.address is not None:
                    transport.add_peer(other.node_id, other.address)
        yield transports


@asynccontextmanager
async def tcp_transports(count: int) -> AsyncIterator[list[Transport]]:
    async with websocket_transports(count) as transports:
        yield list(transports)


@asynccontextmanager
async def memory_stream_transports(count: int) -> AsyncIterator[list[Transport]]:
    async with websocket_transports(count, network=MemoryStreamNetwork()) as transports:
        yield list(transports)


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[Transport, Transport]]:
    async with websocket_transports(2) as (a, b):
        yield a, b


@asynccontextmanager
async def memory_stream_pair() -> AsyncIterator[tuple[Transport, Transport]]:
    async with websocket_transports(2, network=MemoryStreamNetwork()) as (a, b):
        yield a, b


@asynccontextmanager
async def clogged_memory_stream_pair() -> AsyncIterator[tuple[Transport, Transport]]:
    """Connected, then the link stalls (in-memory streams never fill up by themselves)."""
    network = MemoryStreamNetwork()
    async with websocket_transports(2, network=network) as (a, b):
        await a.send(b.node_id, b"connect")
        assert (await b.receive()).data == b"connect"
        assert b.address is not None
        network.blackhole(b.address)
        yield a, b


async def test_the_transport_contract_over_in_memory_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await check_transport(memory_stream_pair, make_clogged_pair=clogged_memory_stream_pair)


async def test_the_transport_contract_over_real_sockets() -> None:
    with trio.fail_after(120):
        await check_transport(tcp_pair, make_clogged_pair=tcp_pair)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
async def test_kernel_contract_over_in_memory_streams(
    check: Check, autojump_clock: trio.testing.MockClock
) -> None:
    await check(memory_stream_transports)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
async def test_kernel_contract_over_real_sockets(check: Check) -> None:
    with trio.fail_after(30):
        await check(tcp_transports)


async def test_a_node_with_the_wrong_secret_reaches_no_actor() -> None:
    with trio.fail_after(20):
        async with (
            websocket_transports(3, secrets=[b"guessed", SECRET, SECRET]) as transports,
            systems(transports) as (intruder, b, c),
        ):
            await _spawn_recorder(b)
            with pytest.raises(PeerUnavailable, match="4001"):
                await intruder.ref("node-1/recorder").tell(Record("intruder", 1))
            with pytest.raises(PeerUnavailable, match="4001"):
                await intruder.ref("node-1/recorder").ask(Echo("let me in"), timeout=TIMEOUT)
            # a node with the right secret finds the recorder untouched
            seen = await c.ref("node-1/recorder").ask(History(), timeout=TIMEOUT)
            assert seen == []
            assert not [e for e in b.events() if e.kind == "transport.rejected"]


# The peer process: an actor system with a Recorder, on a WebSocketTransport.
PEER_NODE = textwrap.dedent(
    """
    import sys, trio
    sys.path.insert(0, sys.argv[2])
    from corral.supervision import ChildSpec, open_actor_system
    from corral.transport._websocket import open_websocket_transport
    from _contract import Recorder

    async def main():
        listen = ("127.0.0.1", int(sys.argv[1]))
        async with open_websocket_transport("node-1", listen, secret=b"contract-secret") as t:
            async with open_actor_system("node-1", t) as system:
                await system.spawn(ChildSpec("recorder", Recorder))
                print("ready", t.address, flush=True)
                await trio.sleep_forever()

    trio.run(main)
    """
)


async def start_peer(port: int) -> tuple[trio.Process, str]:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", PEER_NODE, str(port), os.path.dirname(__file__)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        chunk = await process.stdout.receive_some(1)
        assert chunk, "the peer process exited before it was ready"
        line += chunk
    word, address = line.decode().split()
    assert word == "ready"
    return process, address


async def kill(process: trio.Process) -> None:
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
    if process.stdout is not None:
        await process.stdout.aclose()


async def ask_until_answered(system: ActorSystem, text: str) -> object:
    """Ask the peer's recorder, retrying while the link redials (bounded by the caller)."""
    while True:
        try:
            return await system.ref("node-1/recorder").ask(Echo(text), timeout=TIMEOUT)
        except PeerUnavailable:
            await trio.sleep(0.05)


@pytest.mark.slow
async def test_a_killed_and_restarted_peer_process_is_reconnected_to() -> None:
    assert Recorder is not None  # the child imports it from the same _contract module
    with trio.fail_after(60):
        first, address = await start_peer(0)
        try:
            async with (
                open_websocket_transport(
                    "node-0", ("127.0.0.1", 0), secret=SECRET, config=CONFIG
                ) as transport,
                open_actor_system("node-0", transport) as a,
            ):
                transport.add_peer("node-1", address)
                assert await ask_until_answered(a, "one") == Echoed("one", "node-1")
                await kill(first)
                while (status := transport.peer_status("node-1")) and status.state is (
                    PeerState.CONNECTED
                ):
                    await trio.sleep(0.01)  # the socket died with the process: noticed at once
                started = trio.current_time()
                with pytest.raises(PeerUnavailable, match="node-1"):
                    await a.ref("node-1/recorder").ask(Echo("gone?"), timeout=TIMEOUT)
                assert trio.current_time() - started < 1.0  # failed fast, did not hang
                second, again = await start_peer(int(address.rpartition(":")[2]))
                try:
                    assert again == address
                    assert await ask_until_answered(a, "two") == Echoed("two", "node-1")
                finally:
                    await kill(second)
        finally:
            await kill(first)
