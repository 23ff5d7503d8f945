"""The kernel over a transport: what actor systems on any transport must do.

The transport itself is checked by the public ``corral.testing.check_transport``;
these checks are about the kernel on top of it. Each ``check_*`` coroutine takes
a factory ``open_transports(count)``: an async context manager yielding ``count``
transports named ``node-0``, ``node-1``, ... that can reach each other. A check
runs actor systems on some of them and, where it needs to hand-craft (bad)
frames and read the answers, keeps one bare transport as a prober: public
behaviour only, and short timeouts, so the checks run the same on virtual time
(memory transport, WebSocket over in-memory streams) and on real sockets.

Use::

    @pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
    async def test_contract(check):
        await check(my_factory)
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import cbor2
import pytest
import trio

from corral.supervision import (
    Actor,
    ActorNotFound,
    ActorSystem,
    AskTimeout,
    ChildSpec,
    RemoteError,
    UnhandledMessage,
    open_actor_system,
)
from corral.transport import (
    CodecLimits,
    Envelope,
    ErrorCode,
    FrameTooLarge,
    PeerUnavailable,
    Transport,
    decode_envelope,
    encode_envelope,
    message,
)

TransportsFactory = Callable[[int], AbstractAsyncContextManager[list[Transport]]]
Check = Callable[[TransportsFactory], Awaitable[None]]

#: small enough that an oversized frame is cheap, large enough for every normal message
CONTRACT_LIMITS = CodecLimits(max_frame_bytes=64 * 1024, max_depth=32)
TIMEOUT = 5.0  # generous: real sockets on a loaded 2-core machine


@message("contract.record")
@dataclass(frozen=True)
class Record:
    sender: str
    seq: int


@message("contract.history")
@dataclass(frozen=True)
class History:
    pass


@message("contract.echo")
@dataclass(frozen=True)
class Echo:
    text: str
    blob: bytes = b""


@message("contract.echoed")
@dataclass(frozen=True)
class Echoed:
    text: str
    node: str


@message("contract.data")
@dataclass(frozen=True)
class Data:
    items: dict[str, int]


@message("contract.stall")
@dataclass(frozen=True)
class Stall:
    seconds: float


@message("contract.fail")
@dataclass(frozen=True)
class Fail:
    reason: str


@message("contract.unhandled")
@dataclass(frozen=True)
class Unhandled:
    pass


class Recorder(Actor):
    """Remembers every Record in arrival order and answers the test messages."""

    mailbox_size = 512

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []

    async def handle(self, msg: object) -> object:
        match msg:
            case Record(sender=sender, seq=seq):
                self.seen.append((sender, seq))
                return None
            case History():
                return [[s, n] for s, n in self.seen]
            case Echo(text=text):
                return Echoed(text=text, node=self.ctx.node_id)
            case Data(items=items):
                return {"sum": sum(items.values()), "keys": sorted(items)}
            case Stall(seconds=seconds):
                await trio.sleep(seconds)
                return "late"
            case Fail(reason=reason):
                raise RuntimeError(reason)
        raise UnhandledMessage(msg)


async def _spawn_recorder(system: ActorSystem, name: str = "recorder") -> None:
    await system.spawn(ChildSpec(name, Recorder, shutdown_grace=1.0))


Build = Callable[[int, str], bytes]  # (id, sender address) -> frame bytes
_probe_ids = itertools.count(1)


@asynccontextmanager
async def systems(
    transports: Sequence[Transport], limits: CodecLimits = CONTRACT_LIMITS
) -> AsyncIterator[list[ActorSystem]]:
    """An actor system on each of ``transports``."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(open_actor_system(t.node_id, t, limits))
            for t in transports
        ]


def _frame(kind: str, body: Any, to: str) -> Build:
    def build(ident: int, sender: str) -> bytes:
        return encode_envelope(Envelope(ident, to, sender, kind, body, None, True))

    return build


async def probe(prober: Transport, peer: str, build: Build) -> Envelope:
    """Send the ask ``build(id, sender)`` from a bare transport; return the answer's envelope."""
    ident = next(_probe_ids)
    await prober.send(peer, build(ident, f"{prober.node_id}/"))
    with trio.fail_after(TIMEOUT):
        while True:
            answer = decode_envelope((await prober.receive()).data)
            if answer.correlation_id == ident:
                return answer


async def probe_error(prober: Transport, peer: str, build: Build) -> tuple[str, str]:
    """The ``(code, message)`` of the error envelope that answers ``build``'s ask."""
    answer = await probe(prober, peer, build)
    assert answer.kind == "error", answer
    assert isinstance(answer.body, dict)
    return answer.body["code"], answer.body["message"]


def _rejections(system: ActorSystem, code: str) -> int:
    return sum(
        1 for e in system.events() if e.kind == "transport.rejected" and e.fields["code"] == code
    )


async def _still_serving(asker: ActorSystem, target: str) -> None:
    reply = await asker.ref(target).ask(Echo("still there?"), timeout=TIMEOUT)
    assert reply == Echoed(text="still there?", node=target.split("/")[0])


async def _prober_sees_it_serving(prober: Transport, target: str) -> None:
    node = target.split("/")[0]
    answer = await probe(prober, node, _frame("contract.echo", {"text": "still there?"}, target))
    assert answer.kind == "reply"
    assert answer.body == ["contract.echoed", {"text": "still there?", "node": node}]


# ---------------------------------------------------------------------------- checks


async def check_tell_and_ask_across_systems(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as transports, systems(transports) as (a, b):
        await _spawn_recorder(b)
        ref = a.ref("node-1/recorder")
        assert ref.is_remote
        reply = await ref.ask(Echo("hi"), timeout=TIMEOUT)
        assert reply == Echoed(text="hi", node="node-1")  # a message dataclass comes back typed
        plain = await ref.ask(Data({"x": 2, "y": 3}), timeout=TIMEOUT)
        assert plain == {"sum": 5, "keys": ["x", "y"]}  # plain data comes back as data
        await ref.tell(Record("a", 1))
        assert await ref.ask(History(), timeout=TIMEOUT) == [["a", 1]]
        # the same call shape works the other way round, and locally
        await _spawn_recorder(a)
        assert await b.ref("/recorder", node="node-0").ask(Echo("back"), timeout=TIMEOUT) == (
            Echoed(text="back", node="node-0")
        )


async def check_order_per_sender_receiver_pair(open_transports: TransportsFactory) -> None:
    count = 300
    async with open_transports(3) as transports, systems(transports) as (a, b, c):
        await _spawn_recorder(b)

        async def send_all(system: ActorSystem, name: str) -> None:
            ref = system.ref("node-1/recorder")
            for seq in range(count):
                await ref.tell(Record(name, seq))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_all, a, "a")
            nursery.start_soon(send_all, c, "c")
        # one more ask from each sender: its reply comes after that sender's tells
        await a.ref("node-1/recorder").ask(Echo("flush"), timeout=TIMEOUT)
        await c.ref("node-1/recorder").ask(Echo("flush"), timeout=TIMEOUT)
        seen = await a.ref("node-1/recorder").ask(History(), timeout=TIMEOUT)
        for name in ("a", "c"):
            assert [seq for s, seq in seen if s == name] == list(range(count))


async def check_ask_unknown_actor_raises_actor_not_found(
    open_transports: TransportsFactory,
) -> None:
    async with open_transports(2) as transports, systems(transports) as (a, b):
        with pytest.raises(ActorNotFound, match="no-such-actor"):
            await a.ref("node-1/no-such-actor").ask(Echo("anyone?"), timeout=TIMEOUT)
        assert _rejections(b, ErrorCode.ACTOR_NOT_FOUND) == 1


async def check_unknown_kind_gets_error_reply(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as (prober, t1), systems([t1]) as (b,):
        await _spawn_recorder(b)
        code, text = await probe_error(
            prober, "node-1", _frame("contract.nobody-declared-this", {}, "node-1/recorder")
        )
        assert code == ErrorCode.UNKNOWN_KIND
        assert "contract.nobody-declared-this" in text
        assert _rejections(b, ErrorCode.UNKNOWN_KIND) == 1
        await _prober_sees_it_serving(prober, "node-1/recorder")


async def check_schema_violation_gets_error_reply(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as (prober, t1), systems([t1]) as (b,):
        await _spawn_recorder(b)
        bad_bodies = [
            {"sender": "a", "seq": "not-an-int"},  # wrong type
            {"sender": "a"},  # missing field
            {"sender": "a", "seq": 1, "extra": True},  # unknown field
            ["not", "a", "map"],
        ]
        for body in bad_bodies:
            code, _ = await probe_error(
                prober, "node-1", _frame("contract.record", body, "node-1/recorder")
            )
            assert code == ErrorCode.SCHEMA
        assert _rejections(b, ErrorCode.SCHEMA) == len(bad_bodies)
        # nothing reached the actor
        answer = await probe(prober, "node-1", _frame("contract.history", {}, "node-1/recorder"))
        assert answer.body == [None, []]


async def check_malformed_frames_are_refused_and_system_keeps_running(
    open_transports: TransportsFactory,
) -> None:
    async with open_transports(2) as (prober, t1), systems([t1]) as (b,):
        await _spawn_recorder(b)
        garbage = [
            b"\xff\xff\xff",
            b"not cbor at all",
            cbor2.dumps({"to": "node-1/recorder"}),  # CBOR, but not an envelope
            cbor2.dumps([1, 2, 3]),
            b"\x9f" * 50,  # unterminated indefinite arrays
        ]
        for data in garbage:
            await prober.send("node-1", data)
        await _prober_sees_it_serving(prober, "node-1/recorder")
        assert _rejections(b, ErrorCode.MALFORMED_FRAME) == len(garbage)

        # A frame whose header is readable but whose body is not gets an error reply.
        def tagged_body(ident: int, sender: str) -> bytes:
            head = cbor2.dumps(
                [1, ident, "node-1/recorder", sender, "contract.echo", None, True, 0]
            )
            return head[:-1] + b"\xc1\x1a\x00\x00\x00\x01"  # body: a datetime tag

        assert (await probe_error(prober, "node-1", tagged_body))[0] == ErrorCode.MALFORMED_FRAME

        def too_deep(ident: int, sender: str) -> bytes:
            head = cbor2.dumps(
                [1, ident, "node-1/recorder", sender, "contract.echo", None, True, 0]
            )
            return head[:-1] + b"\x81" * 200 + b"\x00"

        assert (await probe_error(prober, "node-1", too_deep))[0] == ErrorCode.MALFORMED_FRAME
        await _prober_sees_it_serving(prober, "node-1/recorder")


async def check_oversized_frames(open_transports: TransportsFactory) -> None:
    async with open_transports(3) as (prober, t1, t2), systems([t1, t2]) as (b, a):
        await _spawn_recorder(b)
        big = b"x" * (CONTRACT_LIMITS.max_frame_bytes + 1)
        # The sender refuses to encode it: the error is raised where it asked.
        with pytest.raises(FrameTooLarge):
            await a.ref("node-1/recorder").ask(Echo("big", blob=big), timeout=TIMEOUT)

        # A peer with a larger limit sends one anyway: refused, answered, still running.
        def oversized(ident: int, sender: str) -> bytes:
            env = Envelope(
                ident,
                "node-1/recorder",
                sender,
                "contract.echo",
                {"text": "x", "blob": big},
                None,
                True,
            )
            return encode_envelope(env, CodecLimits(max_frame_bytes=4 * len(big)))

        assert (await probe_error(prober, "node-1", oversized))[0] == ErrorCode.FRAME_TOO_LARGE
        assert _rejections(b, ErrorCode.FRAME_TOO_LARGE) == 1
        await _still_serving(a, "node-1/recorder")


async def check_ask_timeout(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as transports, systems(transports) as (a, b):
        await _spawn_recorder(b)
        t0 = trio.current_time()
        with pytest.raises(AskTimeout):
            await a.ref("node-1/recorder").ask(Stall(30.0), timeout=0.2)
        elapsed = trio.current_time() - t0
        assert 0.2 <= elapsed < 5.0


async def check_remote_crash_and_unhandled_are_error_replies(
    open_transports: TransportsFactory,
) -> None:
    async with open_transports(2) as transports, systems(transports) as (a, b):
        await _spawn_recorder(b)
        ref = a.ref("node-1/recorder")
        with pytest.raises(RemoteError) as info:
            await ref.ask(Fail("on purpose"), timeout=TIMEOUT)
        assert info.value.code == ErrorCode.HANDLER_ERROR
        assert "on purpose" in info.value.message
        with pytest.raises(RemoteError) as info:
            await ref.ask(Unhandled(), timeout=TIMEOUT)
        assert info.value.code == ErrorCode.UNHANDLED
        # The crashed actor was restarted by its supervisor and answers again.
        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    await _still_serving(a, "node-1/recorder")
                    break
                except RemoteError:
                    await trio.sleep(0.05)
        snapshot = b.tree().find("/recorder")
        assert snapshot is not None
        assert snapshot.restarts == 1


async def check_an_ask_fails_fast_when_its_peer_is_lost(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as transports, systems(transports) as (a, b):
        await _spawn_recorder(b)
        await _still_serving(a, "node-1/recorder")  # connected
        peer = b.transport
        assert peer is not None

        async def lose_the_peer_while_it_works_on_the_ask() -> None:
            while (snap := b.tree().find("/recorder")) is None or (
                snap.current_message != "contract.stall"
            ):
                await trio.sleep(0.01)
            await peer.aclose()  # its connections close; for the asker, node-1 is gone

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lose_the_peer_while_it_works_on_the_ask)
            with pytest.raises(PeerUnavailable, match=r"lost node 'node-1' .*node-1/recorder"):
                await a.ref("node-1/recorder").ask(Stall(60.0), timeout=30.0)
        assert trio.current_time() - started < TIMEOUT  # far from the 30 s deadline
        lost = [e for e in a.events() if e.kind == "transport.peer-lost"]
        assert [(e.fields["peer"], e.fields["asks"]) for e in lost] == [("node-1", 1)]


async def check_stats_count_frames_by_peer(open_transports: TransportsFactory) -> None:
    async with open_transports(2) as (a, b):
        assert "node-1" not in a.stats() or a.stats()["node-1"] == (0, 0)
        for index in range(3):
            await a.send("node-1", b"frame %d" % index)
        assert [(await b.receive()).data for _ in range(3)] == [b"frame 0", b"frame 1", b"frame 2"]
        await b.send("node-0", b"back")
        assert (await a.receive()).data == b"back"
        assert a.stats()["node-1"] == (3, 1)
        assert b.stats()["node-0"] == (1, 3)
        assert (a.stats()["node-1"].sent, b.stats()["node-0"].received) == (3, 3)


CONTRACT_CHECKS: list[Check] = [
    check_tell_and_ask_across_systems,
    check_order_per_sender_receiver_pair,
    check_ask_unknown_actor_raises_actor_not_found,
    check_unknown_kind_gets_error_reply,
    check_schema_violation_gets_error_reply,
    check_malformed_frames_are_refused_and_system_keeps_running,
    check_oversized_frames,
    check_ask_timeout,
    check_remote_crash_and_unhandled_are_error_replies,
    check_an_ask_fails_fast_when_its_peer_is_lost,
    check_stats_count_frames_by_peer,
]
