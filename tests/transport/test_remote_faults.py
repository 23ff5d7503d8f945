"""Actor systems over MemoryNetwork under faults, on virtual time."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

import corral.supervision._remote as remote_module
from corral.supervision import (
    Actor,
    ActorStopped,
    ActorSystem,
    AskTimeout,
    ChildSpec,
    MailboxFull,
    RemoteError,
    Restart,
    open_actor_system,
)
from corral.transport import (
    Envelope,
    ErrorCode,
    MemoryNetwork,
    PeerUnavailable,
    encode_envelope,
    message,
)


@message("test.faults.ping")
@dataclass(frozen=True)
class Ping:
    n: int = 0


@message("test.faults.hold")
@dataclass(frozen=True)
class Hold:
    seconds: float


@message("test.faults.big")
@dataclass(frozen=True)
class Big:
    size: int


@message("test.faults.quit")
@dataclass(frozen=True)
class Quit:
    pass


class Pong(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    async def handle(self, msg: object) -> object:
        match msg:
            case Ping(n=n):
                self.seen.append(n)
                return {"pong": n, "seen": len(self.seen)}
            case Hold(seconds=seconds):
                await trio.sleep(seconds)
                return None
            case Big(size=size):
                return b"x" * size
            case Quit():
                self.ctx.stop()
                return "bye"
        return None


@asynccontextmanager
async def two_nodes(
    network: MemoryNetwork, mailbox_size: int = 64
) -> AsyncIterator[tuple[ActorSystem, ActorSystem]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_actor_system("a", network.connect("a")))
        b = await stack.enter_async_context(open_actor_system("b", network.connect("b")))
        await b.spawn(ChildSpec("pong", Pong, restart=Restart.TRANSIENT, mailbox_size=mailbox_size))
        yield a, b


async def test_partition_fails_fast_and_heal_restores(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        ref = a.ref("b/pong")
        assert (await ref.ask(Ping(1)))["pong"] == 1
        network.partition({"a"}, {"b"})
        with pytest.raises(PeerUnavailable, match="partitioned"):
            await ref.ask(Ping(2))
        with pytest.raises(PeerUnavailable):
            await ref.tell(Ping(3))
        network.heal()
        assert await ref.ask(Ping(4)) == {"pong": 4, "seen": 2}


async def test_partition_while_a_reply_is_in_flight_fails_the_ask_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        network.set_delay(1.0)
        ref = a.ref("b/pong")
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def cut_later() -> None:
                await trio.sleep(1.5)  # the ask has arrived; the reply is on the wire
                network.partition({"a"}, {"b"})

            nursery.start_soon(cut_later)
            with pytest.raises(PeerUnavailable, match=r"lost node 'b' .* b/pong .*partitioned"):
                await ref.ask(Ping(1), timeout=30.0)
        assert trio.current_time() - t0 == pytest.approx(1.5)  # not the 30 s deadline
        await trio.sleep(1.0)
        assert network.stats["lost_in_flight"] == 1
        lost = [e for e in a.events() if e.kind == "transport.peer-lost"]
        assert [(e.fields["peer"], e.fields["asks"]) for e in lost] == [("b", 1)]


async def test_killed_node_is_unreachable_and_revives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, b):
        network.kill("b")
        with pytest.raises(PeerUnavailable, match="killed"):
            await a.ref("b/pong").ask(Ping(1))
        with pytest.raises(PeerUnavailable, match="killed"):
            await b.ref("a/anything").tell(Ping(1))
        network.revive("b")
        assert (await a.ref("b/pong").ask(Ping(2)))["pong"] == 2


async def test_dropped_frames_time_asks_out_at_their_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        network.set_drop_rate(1.0)
        t0 = trio.current_time()
        with pytest.raises(AskTimeout, match="b/pong"):
            await a.ref("b/pong").ask(Ping(1), timeout=2.0)
        assert trio.current_time() - t0 == pytest.approx(2.0)
        network.set_drop_rate(0.0)
        assert (await a.ref("b/pong").ask(Ping(2)))["seen"] == 1


async def test_delay_costs_one_delay_each_way(autojump_clock: trio.testing.MockClock) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        network.set_delay(0.25)
        t0 = trio.current_time()
        await a.ref("b/pong").ask(Ping(1))
        assert trio.current_time() - t0 == pytest.approx(0.5)


async def test_late_reply_after_a_timeout_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        ref = a.ref("b/pong")
        with pytest.raises(AskTimeout):
            await ref.ask(Hold(5.0), timeout=1.0)
        await trio.sleep(10)  # the reply to Hold arrives now, unasked for
        assert (await ref.ask(Ping(1)))["pong"] == 1


async def test_remote_full_mailbox_refuses_after_a_short_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network, mailbox_size=1) as (a, b):
        ref = a.ref("b/pong")
        await ref.tell(Hold(100.0))  # the actor is busy for 100 s
        await trio.sleep(0.1)
        await ref.tell(Ping(1))  # fills the one slot
        with pytest.raises(MailboxFull, match="stayed full"):
            await ref.ask(Ping(2), timeout=5.0)
        rejected = [e for e in b.events() if e.kind == "transport.rejected"]
        assert [e.fields["code"] for e in rejected] == [ErrorCode.MAILBOX_FULL]


async def test_remote_ask_to_a_stopped_actor_raises_actor_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        ref = a.ref("b/pong")
        assert await ref.ask(Quit()) == "bye"
        await trio.sleep(0.1)
        with pytest.raises(ActorStopped):
            await ref.ask(Ping(1))


async def test_reply_too_large_for_the_wire_is_an_error_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        with pytest.raises(RemoteError) as info:
            await a.ref("b/pong").ask(Big(2 << 20))
        assert info.value.code == ErrorCode.FRAME_TOO_LARGE
        assert isinstance(await a.ref("b/pong").ask(Big(10)), bytes)


async def test_remote_tell_nowait_goes_through_the_outbox(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with two_nodes(network) as (a, _):
        ref = a.ref("b/pong")
        for n in range(5):
            ref.tell_nowait(Ping(n))
        assert await ref.ask(Ping(99)) == {"pong": 99, "seen": 6}


async def test_system_without_transport_cannot_reach_other_nodes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("alone") as system:
        with pytest.raises(PeerUnavailable, match="no transport"):
            await system.ref("other/x").ask(Ping(1))


async def test_local_messages_are_never_encoded(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("a local message was encoded")

    network = MemoryNetwork()
    async with two_nodes(network) as (_, b):
        monkeypatch.setattr(remote_module, "encode_envelope", refuse)
        monkeypatch.setattr(remote_module, "encode_message", refuse)
        ref = b.ref("/pong")
        await ref.tell(Ping(1))
        assert await ref.ask(Ping(2)) == {"pong": 2, "seen": 2}
        monkeypatch.undo()


async def test_a_storm_of_bad_frames_leaves_the_system_serving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(1234)
    network = MemoryNetwork()
    async with two_nodes(network) as (a, b):
        assert a.transport is not None
        valid = encode_envelope(
            Envelope(1, "b/pong", "a/", "test.faults.ping", {"n": 1}, None, False)
        )
        frames = [rng.randbytes(rng.randint(1, 300)) for _ in range(150)]
        for _ in range(150):  # valid frames with a few bytes flipped, cut or appended
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            frames.append(
                bytes(data[: rng.randint(1, len(data))]) + rng.randbytes(rng.randint(0, 3))
            )
        for data in frames:
            await a.transport.send("b", data)
        await trio.testing.wait_all_tasks_blocked()
        reply = await a.ref("b/pong").ask(Ping(7))
        assert reply["pong"] == 7
        snapshot = b.tree().find("/pong")
        assert snapshot is not None
        assert snapshot.state == "running"
        assert snapshot.restarts == 0
        rejected = [e for e in b.events() if e.kind == "transport.rejected"]
        assert len(rejected) > 200  # most were refused, each one logged


async def test_a_flood_of_bad_frames_logs_a_few_warnings_per_peer_and_then_a_count(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.supervision")
    network = MemoryNetwork()
    async with two_nodes(network) as (a, b):
        c = network.connect("c")  # a bare transport: another peer sending garbage
        assert a.transport is not None

        def warnings_about(peer: str) -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.levelno == logging.WARNING
                and f"refused a frame from {peer} " in r.getMessage()
            ]

        for _ in range(50):
            await a.transport.send("b", b"\xff garbage")
        await c.send("b", b"\xff from another peer")
        await trio.testing.wait_all_tasks_blocked()
        assert len(warnings_about("a")) == b.rejection_log.burst == 5
        assert "only counted" in warnings_about("a")[-1]
        assert len(warnings_about("c")) == 1  # each peer has a budget of its own
        # every refusal is still an event
        assert len([e for e in b.events() if e.kind == "transport.rejected"]) == 51
        await trio.sleep(b.rejection_log.interval)
        await a.transport.send("b", b"\xff again")
        await trio.testing.wait_all_tasks_blocked()
        assert len(warnings_about("a")) == 6
        assert "45 more refused from a were not logged" in warnings_about("a")[-1]
        await c.aclose()
