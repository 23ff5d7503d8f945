"""Refused peer connections are logged a few per remote address per minute, then counted.

A node with the wrong cluster secret (or anyone probing the peer port) redials
without end; each refused handshake must not become its own WARNING line.
Real trio-websocket and the real handshake over the in-memory byte-stream
network, in virtual time.
"""

from __future__ import annotations

import logging
import secrets

import pytest
import trio
import trio.testing
import trio_websocket

from corral.transport import WebSocketConfig, open_websocket_transport
from corral.transport._handshake import (
    NONCE_SIZE,
    ClientHandshake,
    Identity,
    NonceLog,
    Refused,
)
from corral.transport._websocket import RESOURCE
from corral.transport._ws_net import MemoryStreamNetwork, TcpNetwork
from corral.transport._ws_rules import parse_peer_address

CONFIG = WebSocketConfig(handshake_timeout=3.0, close_timeout=1.0)
BURST = 5  # the transport's refusal budget per key per window
WINDOW = 60.0


async def dial_with_wrong_secret(network: MemoryStreamNetwork | TcpNetwork, address: str) -> None:
    """One connection attempt by a node configured with another cluster secret."""
    host, port = parse_peer_address(address)
    stream = await network.connect(host, port)
    handshake = ClientHandshake(
        Identity("intruder", secrets.token_bytes(16), 1 << 20),
        b"not the cluster secret",
        secrets.token_bytes(NONCE_SIZE),
        NonceLog(),
        expect="node-b",
        dial_seq=1,
    )
    async with trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(
            nursery,
            stream,  # type: ignore[arg-type]  # any trio Stream works
            address,
            RESOURCE,
        )
        try:
            await ws.send_message(handshake.hello())
            answer = handshake.receive_challenge(await ws.get_message())
            if isinstance(answer, Refused):  # the server's proof fails under our secret
                await ws.aclose(int(answer.code), answer.reason[:100])
            else:
                await ws.send_message(answer)
                await ws.get_message()
        except trio_websocket.ConnectionClosed:
            pass
        await ws.aclose()


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "inbound connection" in r.getMessage()
    ]


async def test_a_hundred_refused_handshakes_log_the_burst_then_a_count(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = MemoryStreamNetwork()
    async with open_websocket_transport(
        "node-b", ("10.0.0.2", 0), secret=b"cluster secret", config=CONFIG, network=network
    ) as b:
        assert b.address is not None
        for _ in range(100):
            await dial_with_wrong_secret(network, b.address)
        await trio.sleep(1)
        lines = refusal_lines(caplog)
        assert len(lines) == BURST
        assert all("refused the handshake" in line for line in lines)
        assert "counted, not logged" in lines[-1]
        await trio.sleep(WINDOW)  # a new window: its first line carries the count
        await dial_with_wrong_secret(network, b.address)
        await trio.sleep(1)
        lines = refusal_lines(caplog)
    assert len(lines) == BURST + 1
    assert "95 more refused connections with in-memory were not logged" in lines[-1]


async def test_half_open_connections_share_the_budget_of_their_address(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = MemoryStreamNetwork()
    async with open_websocket_transport(
        "node-b", ("10.0.0.2", 0), secret=b"cluster secret", config=CONFIG, network=network
    ) as b:
        assert b.address is not None
        host, port = parse_peer_address(b.address)
        streams = [await network.connect(host, port) for _ in range(30)]
        await trio.sleep(CONFIG.handshake_timeout + 1)  # every one times out
        for stream in streams:
            await stream.aclose()
    lines = refusal_lines(caplog)
    assert len(lines) == BURST
    assert all("handshake not finished within 3.0s" in line for line in lines)


async def test_the_budget_is_kept_per_remote_host_over_real_tcp(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = TcpNetwork()
    async with open_websocket_transport(
        "node-b", ("127.0.0.1", 0), secret=b"cluster secret", config=CONFIG, network=network
    ) as b:
        assert b.address is not None
        with trio.fail_after(20):
            for _ in range(12):  # each from a new source port
                await dial_with_wrong_secret(network, b.address)
            while len(refusal_lines(caplog)) < BURST:
                await trio.sleep(0.01)
            await trio.sleep(0.2)
    lines = refusal_lines(caplog)
    assert len(lines) == BURST
    assert "refused connections with 127.0.0.1" in lines[-1]
