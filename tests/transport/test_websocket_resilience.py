"""Heartbeats, reconnect backoff, queue bounds and the dial race, in virtual time.

The transports talk through MemoryStreamNetwork (real trio-websocket and the real
handshake over in-memory byte streams), so the MockClock decides every timeout:
the assertions are exact virtual durations and no wall time passes.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
import trio.testing

from corral.transport import (
    Frame,
    PeerBusy,
    PeerLost,
    PeerState,
    PeerUnavailable,
    ReconnectPolicy,
    WebSocketConfig,
    WebSocketTransport,
    open_websocket_transport,
)
from corral.transport._ws_net import MemoryStreamNetwork
from corral.transport._ws_rules import parse_peer_address, reconnect_delay
from corral.transport._ws_wire import pack

SECRET = b"virtual-secret"
POLICY = ReconnectPolicy(initial=0.5, factor=2.0, maximum=4.0, jitter=0.5)
CONFIG = WebSocketConfig(
    heartbeat_interval=1.0,
    heartbeat_timeout=2.0,
    connect_timeout=3.0,
    handshake_timeout=3.0,
    close_timeout=1.0,
    outbound_queue_size=8,
    reconnect=POLICY,
)


class RecordingNetwork(MemoryStreamNetwork):
    """Remembers when each dial was attempted."""

    def __init__(self) -> None:
        super().__init__()
        self.dials: list[tuple[float, str]] = []

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        self.dials.append((trio.current_time(), f"{host}:{port}"))
        return await super().connect(host, port)


@asynccontextmanager
async def cluster(
    network: MemoryStreamNetwork, *node_ids: str, seed: int = 1, config: WebSocketConfig = CONFIG
) -> AsyncIterator[dict[str, WebSocketTransport]]:
    """Nodes on the in-memory network that all know each other's addresses."""
    async with AsyncExitStack() as stack:
        nodes = {
            node_id: await stack.enter_async_context(
                open_websocket_transport(
                    node_id,
                    ("10.0.0.1", 0),
                    secret=SECRET,
                    config=config,
                    random=random.Random(seed),
                    network=network,
                )
            )
            for node_id in node_ids
        }
        for node in nodes.values():
            for other in nodes.values():
                if other is not node and other.address is not None:
                    node.add_peer(other.node_id, other.address)
        yield nodes


def state(node: WebSocketTransport, peer: str) -> PeerState | None:
    status = node.peer_status(peer)
    return None if status is None else status.state


async def wait_for_state(node: WebSocketTransport, peer: str, wanted: PeerState) -> float:
    """Poll in 10 ms virtual steps; returns the virtual time it took."""
    started = trio.current_time()
    while state(node, peer) is not wanted:
        await trio.sleep(0.01)
    return trio.current_time() - started


async def connect(a: WebSocketTransport, b: WebSocketTransport) -> None:
    await a.send(b.node_id, b"hello")
    assert await b.receive() == Frame(a.node_id, b"hello")


async def test_a_silent_peer_is_detected_within_interval_plus_timeout(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a", "node-b") as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        await connect(a, b)
        assert b.address is not None
        network.blackhole(b.address)
        took = await _lost(a)
        assert (
            CONFIG.heartbeat_timeout
            <= took
            <= (CONFIG.heartbeat_interval + CONFIG.heartbeat_timeout + 0.01)
        )
        assert any("missed its heartbeat" in r.getMessage() for r in caplog.records)
        # the peer is known to be gone: an ask's send fails instead of hanging
        with pytest.raises(PeerUnavailable):
            await a.send("node-b", b"are you there?")


async def _lost(node: WebSocketTransport) -> float:
    started = trio.current_time()
    while state(node, "node-b") is PeerState.CONNECTED:
        await trio.sleep(0.01)
    return trio.current_time() - started


async def test_a_healthy_idle_connection_survives_many_heartbeats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a", "node-b") as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        await connect(a, b)
        await trio.sleep(120)
        status = a.peer_status("node-b")
        assert status is not None
        assert status.state is PeerState.CONNECTED
        assert status.failures == 0
        assert network.connections_made == 1


async def test_a_stalled_peer_makes_send_fail_fast_with_peer_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a", "node-b") as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        await connect(a, b)
        assert b.address is not None
        network.blackhole(b.address)
        started = trio.current_time()
        sent = await send_until_busy(a, "node-b")
        assert trio.current_time() == started  # no waiting at all
        # the writer holds one frame in a blocked write; the queue holds the rest
        assert CONFIG.outbound_queue_size <= sent <= CONFIG.outbound_queue_size + 2


async def send_until_busy(node: WebSocketTransport, peer: str) -> int:
    """Send until PeerBusy; returns how many sends were accepted."""
    sent = 0
    while True:
        try:
            await node.send(peer, b"frame %d" % sent)
        except PeerBusy:
            return sent
        sent += 1


async def test_redials_follow_the_backoff_drawn_from_the_injected_random(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = RecordingNetwork()
    later = "10.0.0.9:45000"
    async with cluster(network, "node-a", seed=42) as nodes:
        a = nodes["node-a"]
        a.add_peer("node-b", later)
        with pytest.raises(PeerUnavailable, match="node-b"):
            await a.send("node-b", b"nobody listens yet")
        await trio.sleep(10)
        times = [t for t, address in network.dials if address == later]
        draws = random.Random(42)
        expected = [reconnect_delay(POLICY, n, draws.random()) for n in range(1, len(times))]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(gaps) >= 4
        assert gaps == pytest.approx(expected)
        assert max(gaps) <= POLICY.maximum
        # the peer appears at that address: the next redial connects without any send
        host, port = parse_peer_address(later)
        async with open_websocket_transport(
            "node-b", (host, port), secret=SECRET, config=CONFIG, network=network
        ) as b:
            took = await wait_for_state(a, "node-b", PeerState.CONNECTED)
            assert took <= POLICY.maximum + 0.01
            await a.send("node-b", b"finally")
            assert await b.receive() == Frame("node-a", b"finally")


async def test_a_killed_and_restarted_peer_is_reconnected_to(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a") as nodes:
        a = nodes["node-a"]
        async with open_websocket_transport(
            "node-b", ("10.0.0.2", 0), secret=SECRET, config=CONFIG, network=network
        ) as b:
            assert b.address is not None
            address = b.address
            a.add_peer("node-b", address)
            await connect(a, b)
            network.sever(address)  # the process dies: every connection breaks at once
            await _lost(a)
        with pytest.raises(PeerUnavailable):
            await a.send("node-b", b"gone")
        await trio.sleep(30)  # a keeps redialing, backing off
        host, port = parse_peer_address(address)
        async with open_websocket_transport(
            "node-b", (host, port), secret=SECRET, config=CONFIG, network=network
        ) as b2:
            # no traffic needed: a redials on its own and b2 sees it arrive
            await wait_for_state(b2, "node-a", PeerState.CONNECTED)
            await b2.send("node-a", b"back")
            assert await a.receive() == Frame("node-b", b"back")
            await a.send("node-b", b"welcome back")
            assert await b2.receive() == Frame("node-a", b"welcome back")


@pytest.mark.parametrize("seed", range(4))
async def test_a_simultaneous_dial_settles_on_one_connection_both_agree_on(
    autojump_clock: trio.testing.MockClock, seed: int
) -> None:
    network = MemoryStreamNetwork()
    roomy = WebSocketConfig(outbound_queue_size=64, reconnect=POLICY)
    async with cluster(network, "node-a", "node-b", seed=seed, config=roomy) as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.send, "node-b", b"from a")
            nursery.start_soon(b.send, "node-a", b"from b")
        await trio.sleep(1)
        status_a, status_b = a.peer_status("node-b"), b.peer_status("node-a")
        assert status_a is not None
        assert status_b is not None
        assert status_a.state is status_b.state is PeerState.CONNECTED
        assert status_a.initiator == status_b.initiator == "node-a"  # the lower id's dial
        assert network.connections_made == 2  # both dialed: there was a race to settle
        for i in range(20):
            await a.send("node-b", b"a%d" % i)
            await b.send("node-a", b"b%d" % i)
        got_b = await receive_until(b, b"a19")
        got_a = await receive_until(a, b"b19")
        # the race may have cost the very first frame, never the order
        assert [f for f in got_b if f != b"from a"] == [b"a%d" % i for i in range(20)]
        assert [f for f in got_a if f != b"from b"] == [b"b%d" % i for i in range(20)]


async def receive_until(node: WebSocketTransport, last: bytes) -> list[bytes]:
    got = [(await node.receive()).data]
    while got[-1] != last:
        got.append((await node.receive()).data)
    return got


async def test_a_client_that_never_finishes_the_handshake_is_cut_off(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = MemoryStreamNetwork()
    async with cluster(network, "node-b") as nodes:
        b = nodes["node-b"]
        assert b.address is not None
        stream = await network.connect(*parse_peer_address(b.address))
        started = trio.current_time()
        assert await stream.receive_some() == b""  # closed on us
        assert trio.current_time() - started == pytest.approx(CONFIG.handshake_timeout)
        await stream.aclose()
    assert any("close code 4005" in r.getMessage() for r in caplog.records)


async def test_a_peer_that_only_dialed_in_is_unavailable_once_it_leaves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-b") as nodes:
        b = nodes["node-b"]
        assert b.address is not None
        async with open_websocket_transport(
            "node-a",
            None,
            secret=SECRET,
            config=CONFIG,
            network=network,
            peers={"node-b": b.address},
        ) as a:
            await connect(a, b)
            await b.send("node-a", b"reply over a's connection")
            assert await a.receive() == Frame("node-b", b"reply over a's connection")
        await trio.sleep(1)
        assert state(b, "node-a") is PeerState.UNREACHABLE
        with pytest.raises(PeerUnavailable, match="no address"):
            await b.send("node-a", b"x")


async def test_removing_a_peer_stops_redialing_it(autojump_clock: trio.testing.MockClock) -> None:
    network = RecordingNetwork()
    async with cluster(network, "node-a") as nodes:
        a = nodes["node-a"]
        a.add_peer("node-b", "10.0.0.9:45001")
        with pytest.raises(PeerUnavailable):
            await a.send("node-b", b"x")
        a.remove_peer("node-b")
        await trio.sleep(1)
        dials = len(network.dials)
        await trio.sleep(60)
        assert len(network.dials) == dials
        assert state(a, "node-b") is PeerState.UNREACHABLE


def record_losses(node: WebSocketTransport) -> list[PeerLost]:
    seen: list[PeerLost] = []
    node.on_peer_lost(seen.append)
    return seen


async def test_a_lost_connection_is_reported_once_until_the_peer_is_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with (
        cluster(network, "node-a") as nodes,
        cluster(network, "node-b") as others,  # b does not know a's address: only a dials
    ):
        a, b = nodes["node-a"], others["node-b"]
        assert b.address is not None
        a.add_peer("node-b", b.address)
        seen = record_losses(a)
        await connect(a, b)
        network.blackhole(b.address)
        took = await _lost(a)
        assert took <= CONFIG.heartbeat_interval + CONFIG.heartbeat_timeout + 0.01
        assert [event.peer for event in seen] == ["node-b"]
        assert "no pong within 2.0s" in seen[0].reason
        await trio.sleep(20)  # redials hang and time out: no new reports
        assert state(a, "node-b") is not PeerState.CONNECTED
        assert len(seen) == 1
        network.heal(b.address)
        await wait_for_state(a, "node-b", PeerState.CONNECTED)
        network.sever(b.address)  # connected in between: this loss is reported again
        await _lost(a)
        assert len(seen) == 2
        assert "closed by the peer" in seen[1].reason


async def test_a_failed_dial_is_reported_once(autojump_clock: trio.testing.MockClock) -> None:
    network = RecordingNetwork()
    async with cluster(network, "node-a") as nodes:
        a = nodes["node-a"]
        seen = record_losses(a)
        a.add_peer("node-b", "10.0.0.9:45002")
        with pytest.raises(PeerUnavailable):
            await a.send("node-b", b"nobody there")
        await trio.sleep(30)
        assert len(network.dials) > 3  # it kept redialing...
        assert [event.peer for event in seen] == ["node-b"]  # ...and said so once
        assert "dialing 10.0.0.9:45002 failed" in seen[0].reason


async def test_a_refused_handshake_is_reported(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a") as nodes:
        a = nodes["node-a"]
        seen = record_losses(a)
        async with open_websocket_transport(
            "node-b", ("10.0.0.3", 0), secret=b"another secret", config=CONFIG, network=network
        ) as b:
            assert b.address is not None
            a.add_peer("node-b", b.address)
            with pytest.raises(PeerUnavailable, match="4001"):
                await a.send("node-b", b"let me in")
        assert len(seen) == 1
        assert "4001" in seen[0].reason


async def test_frames_go_to_a_handler_in_order_backlog_first(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a", "node-b") as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        for i in range(5):
            await a.send("node-b", b"early %d" % i)
        await trio.sleep(0.1)  # they wait in b's inbound queue
        got: list[Frame] = []

        async def handler(frame: Frame) -> None:
            if frame.data == b"boom":
                raise RuntimeError("a handler bug")
            await trio.sleep(0.01)  # a handler may wait; the next frame waits for it
            got.append(frame)

        assert b.deliver_frames_to(handler)
        with pytest.raises(RuntimeError, match="already"):
            b.deliver_frames_to(handler)
        for data in (b"late 0", b"boom", b"late 1"):
            await a.send("node-b", data)
        await trio.sleep(1)
        assert [f.data for f in got] == [b"early %d" % i for i in range(5)] + [b"late 0", b"late 1"]
        assert all(f.sender == "node-a" for f in got)
        assert any("frame handler failed" in r.getMessage() for r in caplog.records)
        with trio.move_on_after(1):
            await b.receive()  # nothing is left for receive
            pytest.fail("a frame reached receive() after deliver_frames_to")


async def test_a_flood_of_oversized_frames_logs_a_few_lines_and_a_count(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.transport.websocket")
    network = MemoryStreamNetwork()
    small = WebSocketConfig(max_frame_size=100, close_timeout=1.0)
    async with cluster(network, "node-a") as nodes, cluster(network, "node-b", config=small) as big:
        a, b = nodes["node-a"], big["node-b"]
        assert b.address is not None
        a.add_peer("node-b", b.address)
        await a.send("node-b", b"hello")
        assert (await b.receive()).data == b"hello"
        conn = a._links["node-b"].conn
        assert conn is not None
        for _ in range(40):  # a sender that ignores the limit it was told
            await conn.ws.send_message(pack([b"x" * 200]))
        await trio.sleep(1)
        status = b.peer_status("node-a")
        assert status is not None
        assert status.frames_refused_from_peer == 40
        refused = [
            r.getMessage()
            for r in caplog.records
            if "refused a 200-byte frame from" in r.getMessage()
        ]
        assert len(refused) == 5
        assert "only counted" in refused[-1]
        told = [r.getMessage() for r in caplog.records if "peer 'node-b' refused" in r.getMessage()]
        assert len(told) == 5  # the sender's side of the same flood
        await trio.sleep(60)  # a new window: the next line says how many went unlogged
        await conn.ws.send_message(pack([b"x" * 200]))
        await trio.sleep(1)
        refused = [
            r.getMessage()
            for r in caplog.records
            if "refused a 200-byte frame from" in r.getMessage()
        ]
        assert len(refused) == 6
        assert "35 more refusals of frames from 'node-a' were not logged" in refused[-1]


async def test_a_write_cancelled_part_way_tears_the_connection_down_not_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryStreamNetwork()
    async with cluster(network, "node-a", "node-b") as nodes:
        a, b = nodes["node-a"], nodes["node-b"]
        assert b.address is not None
        await a.send("node-b", b"request")
        assert (await b.receive()).data == b"request"
        await b.send("node-a", b"reply")
        assert (await a.receive()).data == b"reply"  # a's next frame is written through
        network.blackhole(b.address)
        with trio.move_on_after(0.5) as waited:
            await a.send("node-b", b"x" * 1000)  # stuck in the stalled stream
        assert waited.cancelled_caught
        status = a.peer_status("node-b")
        assert status is not None
        assert status.state is not PeerState.CONNECTED  # torn down at once
        assert status.frames_dropped == 1
        network.heal(b.address)
        with trio.fail_after(30):
            while True:
                try:
                    await a.send("node-b", b"after")
                    break
                except PeerUnavailable:
                    await trio.sleep(0.1)
            got = []
            while not got or got[-1] != b"after":
                got.append((await b.receive()).data)
        assert set(got) <= {b"x" * 1000, b"after"}  # whole frames or nothing, never a torn one
