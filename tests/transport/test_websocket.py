"""WebSocketTransport on real loopback sockets: frames, auth refusals, limits, queue bounds.

Every server listens on 127.0.0.1 port 0 and every test is bounded by trio.fail_after.
Raw peers speak trio-websocket directly (with the pure handshake where they need to
get past authentication) to show what a misbehaving peer gets.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import cbor2
import pytest
import trio
import trio_websocket

from corral.transport import (
    Frame,
    FrameTooLarge,
    PeerBusy,
    PeerState,
    PeerUnavailable,
    ReconnectPolicy,
    WebSocketConfig,
    WebSocketTransport,
    open_websocket_transport,
)
from corral.transport import _websocket as websocket_module
from corral.transport._handshake import (
    NONCE_SIZE,
    ClientHandshake,
    CloseCode,
    Identity,
    NonceLog,
    Refused,
    ServerHandshake,
)
from corral.transport._websocket import RESOURCE
from corral.transport._ws_rules import frame_refusal_message, parse_peer_address
from corral.transport._ws_wire import pack, pack_one

LOGGER = "corral.transport.websocket"
SECRET = b"test-cluster-secret"
FAST = WebSocketConfig(
    connect_timeout=3.0,
    handshake_timeout=3.0,
    close_timeout=1.0,
    reconnect=ReconnectPolicy(initial=0.02, maximum=0.2),
)
LOOPBACK = ("127.0.0.1", 0)


@asynccontextmanager
async def two_nodes(
    secret_a: bytes | None = SECRET,
    secret_b: bytes | None = SECRET,
    config_a: WebSocketConfig = FAST,
    config_b: WebSocketConfig = FAST,
) -> AsyncIterator[tuple[WebSocketTransport, WebSocketTransport]]:
    async with (
        open_websocket_transport("node-a", LOOPBACK, secret=secret_a, config=config_a) as a,
        open_websocket_transport("node-b", LOOPBACK, secret=secret_b, config=config_b) as b,
    ):
        assert a.address is not None
        assert b.address is not None
        a.add_peer("node-b", b.address)
        b.add_peer("node-a", a.address)
        yield a, b


@asynccontextmanager
async def raw_client(address: str) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    # Not trio_websocket.open_websocket: its client side leaves the socket open
    # when the server closes first, which pytest reports as an unraisable warning.
    host, port = parse_peer_address(address)
    stream = await trio.open_tcp_stream(host, port)
    try:
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(nursery, stream, address, RESOURCE)
            try:
                yield ws
            finally:
                with trio.move_on_after(1):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


async def authenticate(
    ws: trio_websocket.WebSocketConnection,
    node_id: str = "raw",
    secret: bytes = SECRET,
    *,
    max_frame: int = 1 << 20,
    nonce: bytes | None = None,
) -> None:
    """Run the client half of the handshake by hand."""
    handshake = ClientHandshake(
        Identity(node_id, b"raw-incarnation", max_frame),
        secret,
        nonce or trio.lowlevel.current_root_task().name.encode().ljust(NONCE_SIZE, b"\0")[:32],
        NonceLog(),
        expect="node-b",
        dial_seq=1,
    )
    await ws.send_message(handshake.hello())
    proof = handshake.receive_challenge(await ws.get_message())
    assert isinstance(proof, bytes), proof
    await ws.send_message(proof)
    welcome = handshake.receive_welcome(await ws.get_message())
    assert not isinstance(welcome, Refused)


async def close_code_of(ws: trio_websocket.WebSocketConnection) -> int:
    """Wait until the server closes ``ws``; return its close code."""
    try:
        while True:
            await ws.get_message()
    except trio_websocket.ConnectionClosed as closed:
        reason = closed.reason
    assert reason is not None
    return reason.code


async def first_frame_is(node: WebSocketTransport, proof: Frame) -> None:
    """Nothing arrived before ``proof``: anything a refused peer sent was dropped."""
    assert await node.receive() == proof


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_frames_flow_both_ways_over_the_one_connection_dialed_first() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, b):
            await a.send("node-b", b"ping")
            assert await b.receive() == Frame("node-a", b"ping")
            await b.send("node-a", b"pong")
            assert await a.receive() == Frame("node-b", b"pong")
            status_a, status_b = a.peer_status("node-b"), b.peer_status("node-a")
            assert status_a is not None
            assert status_b is not None
            assert status_a.state is status_b.state is PeerState.CONNECTED
            # b answered over a's connection instead of dialing its own
            assert status_a.initiator == status_b.initiator == "node-a"
            assert status_a.failures == status_b.failures == 0


async def test_frames_arrive_in_order_per_sender() -> None:
    config = WebSocketConfig(outbound_queue_size=4096, close_timeout=2.0)
    count = 3000
    with trio.fail_after(30):
        async with two_nodes(config_a=config, config_b=config) as (a, b):
            for i in range(count):
                await a.send("node-b", cbor2.dumps({"seq": i, "pad": "x" * 80}))
            received = [cbor2.loads((await b.receive()).data)["seq"] for _ in range(count)]
            assert received == list(range(count))


async def test_a_peer_with_the_wrong_secret_is_refused_and_nothing_reaches_receive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with trio.fail_after(10):
        async with two_nodes(secret_a=b"not-the-secret") as (a, b):
            with pytest.raises(PeerUnavailable, match="could not prove the cluster secret"):
                await a.send("node-b", b"let me in")
            status = a.peer_status("node-b")
            assert status is not None
            assert status.state is not PeerState.CONNECTED
            assert "close code 4001" in (status.last_error or "")
            # a refused b (b's proof did not match a's secret); b saw the refusal
            refusals = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert any("4001" in r.getMessage() and r.name == LOGGER for r in refusals)
            # b only ever gets frames from authenticated peers
            async with open_websocket_transport(
                "node-c", LOOPBACK, secret=SECRET, config=FAST, peers={"node-b": b.address or ""}
            ) as c:
                await c.send("node-b", b"legit")
                await first_frame_is(b, Frame("node-c", b"legit"))


async def test_a_raw_client_with_a_forged_proof_gets_close_code_4001(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with trio.fail_after(10):
        async with two_nodes() as (a, b):
            assert b.address is not None
            async with raw_client(b.address) as ws:
                handshake = ClientHandshake(
                    Identity("intruder", b"i", 100),
                    b"guess",
                    b"\x01" * NONCE_SIZE,
                    NonceLog(),
                    expect=None,
                    dial_seq=1,
                )
                await ws.send_message(handshake.hello())
                await ws.get_message()  # the challenge; we cannot check its proof
                await ws.send_message(cbor2.dumps({"t": "proof", "proof": b"\0" * 32}))
                await ws.send_message(b"an envelope that must never be delivered")
                assert await close_code_of(ws) == CloseCode.BAD_PROOF
            assert any(
                "'intruder' could not prove the cluster secret" in r.getMessage()
                for r in caplog.records
            )
            await a.send("node-b", b"after")
            await first_frame_is(b, Frame("node-a", b"after"))


async def test_a_node_without_a_secret_is_refused_by_one_with() -> None:
    with trio.fail_after(10):
        async with two_nodes(secret_a=None) as (a, b):
            with pytest.raises(PeerUnavailable, match="4001"):
                await a.send("node-b", b"x")
            with pytest.raises(PeerUnavailable):
                await b.send("node-a", b"x")


async def test_two_nodes_without_a_secret_talk_on_loopback() -> None:
    with trio.fail_after(10):
        async with two_nodes(secret_a=None, secret_b=None) as (a, b):
            await a.send("node-b", b"open")
            assert await b.receive() == Frame("node-a", b"open")


@pytest.mark.parametrize("listen", [("0.0.0.0", 0), "0.0.0.0:0"])
async def test_without_a_secret_a_node_refuses_to_listen_beyond_loopback(
    listen: tuple[str, int] | str,
) -> None:
    with pytest.raises(ValueError, match="without a cluster secret"):
        async with open_websocket_transport("lonely", listen):
            pass  # pragma: no cover


async def test_errors_raised_inside_the_block_come_out_unwrapped() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with open_websocket_transport("x", LOOPBACK, secret=SECRET, config=FAST):
            raise KeyError("mine")


async def test_a_busy_listen_port_and_bad_peer_addresses_are_refused_up_front() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(OSError, match="in use"):
            async with open_websocket_transport("x", ("127.0.0.1", port)):
                pass  # pragma: no cover
    with pytest.raises(ValueError, match="host:port"):
        async with open_websocket_transport("x", LOOPBACK, peers={"y": "no-port"}):
            pass  # pragma: no cover


async def test_listen_takes_a_host_port_string_and_reports_the_real_port() -> None:
    async with open_websocket_transport("x", "127.0.0.1:0", secret=SECRET) as node:
        assert node.address is not None
        host, port = parse_peer_address(node.address)
        assert host == "127.0.0.1"
        assert port > 0


async def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        async with open_websocket_transport("x", LOOPBACK, secret=b""):
            pass  # pragma: no cover


async def test_frames_sent_before_the_handshake_are_refused_with_4004() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, b):
            assert b.address is not None
            async with raw_client(b.address) as ws:
                await ws.send_message(cbor2.dumps({"to": "node-b/victim", "kind": "x"}))
                assert await close_code_of(ws) == CloseCode.PROTOCOL_ERROR
            await a.send("node-b", b"first real frame")
            await first_frame_is(b, Frame("node-a", b"first real frame"))


async def test_a_replayed_hello_is_refused_with_4003() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (_, b):
            assert b.address is not None
            nonce = b"\x07" * NONCE_SIZE
            async with raw_client(b.address) as ws:
                await authenticate(ws, nonce=nonce)
            async with raw_client(b.address) as ws:
                await send_hello(ws, nonce)
                assert await close_code_of(ws) == CloseCode.REPLAYED


async def send_hello(ws: trio_websocket.WebSocketConnection, nonce: bytes) -> None:
    handshake = ClientHandshake(
        Identity("raw", b"raw-incarnation", 1 << 20),
        SECRET,
        nonce,
        NonceLog(),
        expect="node-b",
        dial_seq=1,
    )
    await ws.send_message(handshake.hello())


async def test_an_unsupported_protocol_version_is_refused_with_4002(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with trio.fail_after(10):
        async with two_nodes() as (_, b):
            assert b.address is not None
            async with raw_client(b.address) as ws:
                handshake = ClientHandshake(
                    Identity("future", b"f", 100),
                    SECRET,
                    b"\x09" * NONCE_SIZE,
                    NonceLog(),
                    expect="node-b",
                    dial_seq=1,
                    versions=(7,),
                )
                await ws.send_message(handshake.hello())
                assert await close_code_of(ws) == CloseCode.UNSUPPORTED_VERSION
            assert any("protocol versions [7]" in r.getMessage() for r in caplog.records)


async def test_dialing_an_address_that_holds_another_node_is_refused() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, b):
            assert b.address is not None
            a.add_peer("node-z", b.address)
            with pytest.raises(PeerUnavailable, match="4007"):
                await a.send("node-z", b"x")


async def test_an_oversized_frame_is_refused_with_a_notice_and_the_connection_stays_up() -> None:
    small = WebSocketConfig(max_frame_size=1000, close_timeout=1.0)
    with trio.fail_after(10):
        async with two_nodes(config_b=small) as (a, b):
            assert b.address is not None
            # A conforming sender learns the limit in the handshake and refuses up front.
            await a.send("node-b", b"hello")
            assert await b.receive() == Frame("node-a", b"hello")
            with pytest.raises(FrameTooLarge, match="1000 bytes"):
                await a.send("node-b", b"x" * 1001)
            await a.send("node-b", b"y" * 1000)
            assert await b.receive() == Frame("node-a", b"y" * 1000)
            # A sender that ignores the limit gets an error notice; the connection survives.
            async with raw_client(b.address) as ws:
                await authenticate(ws, "sloppy")
                await ws.send_message(pack([b"z" * 1500]))
                assert await ws.get_message() == frame_refusal_message(1500, 1000)
                # in a packet of several, only the oversized frame is refused
                await ws.send_message(pack([b"before", b"z" * 1200, b"after"]))
                assert await ws.get_message() == frame_refusal_message(1200, 1000)
                assert await b.receive() == Frame("sloppy", b"before")
                assert await b.receive() == Frame("sloppy", b"after")
                # a message that is not a packet is refused whole, and logged
                await ws.send_message(b"\x00\x00\x00\x09short")
                await ws.send_message(pack([b"still here"]))
                assert await b.receive() == Frame("sloppy", b"still here")
            status = b.peer_status("sloppy")
            assert status is not None
            assert status.frames_refused_from_peer == 3


async def test_a_refusal_notice_from_the_peer_is_counted_by_the_sender(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server_identity = Identity("node-r", b"r", 1 << 20)
    done = trio.Event()

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        handshake = ServerHandshake(server_identity, SECRET, b"\x05" * NONCE_SIZE, NonceLog())
        challenge = handshake.receive_hello(await ws.get_message())
        assert isinstance(challenge, bytes)
        await ws.send_message(challenge)
        assert not isinstance(handshake.receive_proof(await ws.get_message()), Refused)
        await ws.send_message(handshake.welcome())
        await ws.get_message()
        await ws.send_message(frame_refusal_message(5, 4))
        await done.wait()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None
            )
            async with open_websocket_transport(
                "node-a",
                LOOPBACK,
                secret=SECRET,
                config=FAST,
                peers={"node-r": f"127.0.0.1:{server.port}"},
            ) as a:
                await a.send("node-r", b"12345")
                while (status := a.peer_status("node-r")) and not status.frames_refused_by_peer:
                    await trio.sleep(0.01)
                done.set()
            nursery.cancel_scope.cancel()
    assert any("peer 'node-r' refused a 5-byte frame" in r.getMessage() for r in caplog.records)


async def test_a_full_outbound_queue_fails_fast_with_peer_busy() -> None:
    stalled = trio.Event()
    release = trio.Event()
    server_identity = Identity("node-s", b"s", 1 << 20)

    async def never_reads(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        handshake = ServerHandshake(server_identity, SECRET, b"\x06" * NONCE_SIZE, NonceLog())
        challenge = handshake.receive_hello(await ws.get_message())
        assert isinstance(challenge, bytes)
        await ws.send_message(challenge)
        assert not isinstance(handshake.receive_proof(await ws.get_message()), Refused)
        await ws.send_message(handshake.welcome())
        stalled.set()
        await release.wait()  # never reads again: TCP buffers fill, then the queue

    config = WebSocketConfig(outbound_queue_size=4, close_timeout=0.5)
    frame = b"f" * 65536
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                lambda task_status: trio_websocket.serve_websocket(
                    never_reads, "127.0.0.1", 0, None, message_queue_size=1, task_status=task_status
                )
            )
            async with open_websocket_transport(
                "node-a",
                LOOPBACK,
                secret=SECRET,
                config=config,
                peers={"node-s": f"127.0.0.1:{server.port}"},
            ) as a:
                await a.send("node-s", frame)
                await stalled.wait()
                sent, busy = 1, None
                while busy is None:
                    started = trio.current_time()
                    try:
                        await a.send("node-s", frame)
                        sent += 1
                    except PeerBusy as exc:
                        busy = exc
                    # neither a queued send nor a refused one waits for the peer
                    assert trio.current_time() - started < 1.0
                    await trio.sleep(0)
                assert "full" in str(busy)
                assert sent > 4  # the socket buffers took some before the queue filled
                release.set()
            nursery.cancel_scope.cancel()


async def test_an_unknown_peer_is_unavailable() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, _):
            with pytest.raises(PeerUnavailable, match="add_peer"):
                await a.send("node-nobody", b"x")
            with pytest.raises(PeerUnavailable, match="this node"):
                await a.send("node-a", b"x")


async def test_an_unreachable_peer_fails_fast_and_stays_unavailable_while_backing_off() -> None:
    config = WebSocketConfig(
        connect_timeout=2.0, reconnect=ReconnectPolicy(initial=5.0, maximum=5.0, jitter=0.0)
    )
    with trio.fail_after(10):
        async with open_websocket_transport(
            "node-a", LOOPBACK, config=config, peers={"node-gone": f"127.0.0.1:{free_port()}"}
        ) as a:
            with pytest.raises(PeerUnavailable, match="node-gone"):
                await a.send("node-gone", b"x")
            started = trio.current_time()
            with pytest.raises(PeerUnavailable, match="redialing with backoff"):
                await a.send("node-gone", b"x")
            assert trio.current_time() - started < 1.0
            status = a.peer_status("node-gone")
            assert status is not None
            assert status.state is PeerState.WAITING
            assert status.failures == 1


async def test_a_closed_transport_refuses_every_call() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, b):
            await a.send("node-b", b"x")
            await b.receive()
            await a.aclose()
            await a.aclose()  # idempotent
            with pytest.raises(trio.ClosedResourceError):
                await a.send("node-b", b"x")
            with pytest.raises(trio.ClosedResourceError):
                await a.receive()
            await trio.sleep(0)  # closing the transport cancelled nothing of ours
            reached_the_end = True
        assert reached_the_end


async def test_closing_wakes_a_pending_receive() -> None:
    with trio.fail_after(10):
        async with two_nodes() as (a, _):
            outcome: list[str] = []

            async def wait_for_frame() -> None:
                try:
                    await a.receive()
                except trio.ClosedResourceError:
                    outcome.append("closed")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_frame)
                await trio.testing.wait_all_tasks_blocked()
                await a.aclose()
            assert outcome == ["closed"]


async def test_closing_flushes_queued_frames() -> None:
    with trio.fail_after(10):
        async with open_websocket_transport("node-b", LOOPBACK, secret=SECRET, config=FAST) as b:
            assert b.address is not None
            async with open_websocket_transport(
                "node-a", LOOPBACK, secret=SECRET, config=FAST, peers={"node-b": b.address}
            ) as a:
                for i in range(50):
                    await a.send("node-b", str(i).encode())
            # a is gone; everything it queued went out before it closed
            assert [(await b.receive()).data for _ in range(50)] == [
                str(i).encode() for i in range(50)
            ]


async def test_a_peer_restarted_on_the_same_port_is_reconnected_to() -> None:
    with trio.fail_after(20):
        async with open_websocket_transport("node-a", LOOPBACK, secret=SECRET, config=FAST) as a:
            async with open_websocket_transport(
                "node-b", LOOPBACK, secret=SECRET, config=FAST
            ) as b:
                assert b.address is not None
                address = b.address
                a.add_peer("node-b", address)
                await a.send("node-b", b"first life")
                assert await b.receive() == Frame("node-a", b"first life")
            with pytest.raises(PeerUnavailable):
                await a.send("node-b", b"nobody home")
            async with open_websocket_transport(
                "node-b", address, secret=SECRET, config=FAST
            ) as b2:
                while True:
                    try:
                        await a.send("node-b", b"second life")
                        break
                    except PeerUnavailable:
                        await trio.sleep(0.05)
                assert await b2.receive() == Frame("node-a", b"second life")


async def test_written_through_and_queued_frames_keep_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # b answers every frame at once, so a's link keeps switching between writing
    # frames through (an answer came since a's last frame) and queueing them
    # (something of a's is still waiting to be written): the order must hold.
    through = {"node-a": 0, "node-b": 0}

    def counting_pack_one(frame: bytes) -> bytes:  # a frame written through: a packet of one
        through[frame[:6].decode()] += 1
        return pack_one(frame)

    monkeypatch.setattr(websocket_module, "pack_one", counting_pack_one)
    count = 2000
    with trio.fail_after(30):
        async with two_nodes() as (a, b):

            async def echo() -> None:
                for _ in range(count):
                    frame = await b.receive()
                    await b.send("node-a", b"node-b" + frame.data[6:])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo)
                for i in range(count):
                    await a.send("node-b", b"node-a%d" % i)
                    if i % 7 == 0:
                        await trio.sleep(0)  # let answers in now and then
                echoed = [int((await a.receive()).data[6:]) for _ in range(count)]
            assert echoed == list(range(count))  # b saw a's order, and a saw b's
            assert through["node-a"] > 0
            assert through["node-b"] > 0
            assert through["node-a"] < count  # most went through the queue, batched
