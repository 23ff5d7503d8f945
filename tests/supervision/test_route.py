"""The frame router: every decision about an arriving frame, without an event loop."""

from __future__ import annotations

from dataclasses import dataclass

import cbor2
import outcome
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.supervision import ActorNotFound, ActorStopped, MailboxFull, RemoteError
from corral.supervision._route import Deliver, Reject, Reply, route
from corral.transport import (
    CodecLimits,
    Envelope,
    ErrorCode,
    Frame,
    encode_envelope,
    message,
)

LIMITS = CodecLimits(max_frame_bytes=4096, max_depth=16)


@message("route.ping")
@dataclass(frozen=True)
class Ping:
    seq: int


@message("route.said", speaker="source")
@dataclass(frozen=True)
class Said:
    source: str
    text: str


@dataclass(frozen=True)
class Place:
    takes_messages: bool


ACTOR = Place(True)
SUPERVISOR = Place(False)
TARGETS = {"/pinger": ACTOR, "/": SUPERVISOR, "/app": SUPERVISOR}


def frame(envelope: Envelope, limits: CodecLimits = LIMITS) -> Frame:
    return Frame("node-a", encode_envelope(envelope, limits))


def decide(data: Frame) -> Reject | Reply | Deliver[Place]:
    return route(data, "node-b", TARGETS, LIMITS)


def ask(to: str, kind: str = "route.ping", body: object = None, ident: int = 7) -> Frame:
    return frame(
        Envelope(ident, to, "node-a/", kind, {"seq": 1} if body is None else body, None, True)
    )


def test_a_message_naming_another_speaker_than_the_authenticated_peer_is_refused() -> None:
    def said_by(source: str) -> Frame:
        body = {"source": source, "text": "n2 has left"}
        return frame(Envelope(4, "node-b/pinger", "node-a/", "route.said", body, None, True))

    said = Said("node-a", "n2 has left")
    assert decide(said_by("node-a")) == Deliver("node-a", ACTOR, "/pinger", "route.said", said, 4)
    forged = decide(said_by("node-c"))
    assert isinstance(forged, Reject)
    assert (forged.peer, forged.ask_id, forged.code) == ("node-a", 4, ErrorCode.SCHEMA)
    assert "claims to come from node 'node-c'" in forged.reason


def test_a_valid_tell_and_ask_are_delivered_decoded() -> None:
    tell = frame(Envelope(3, "node-b/pinger", "node-a/", "route.ping", {"seq": 5}))
    assert decide(tell) == Deliver("node-a", ACTOR, "/pinger", "route.ping", Ping(5), None)
    assert decide(ask("node-b/pinger/")) == Deliver(
        "node-a", ACTOR, "/pinger", "route.ping", Ping(1), 7
    )


@pytest.mark.parametrize(
    ("to", "code", "reason"),
    [
        ("node-b/nobody", ErrorCode.ACTOR_NOT_FOUND, "no actor at /nobody on node 'node-b'"),
        ("node-c/pinger", ErrorCode.ACTOR_NOT_FOUND, "frame for node 'node-c' arrived at 'node-b'"),
        ("node-b/app", ErrorCode.UNHANDLED, "/app is a supervisor; it takes no messages"),
    ],
)
def test_a_bad_address_is_refused_and_the_ask_answered(to: str, code: str, reason: str) -> None:
    assert decide(ask(to)) == Reject("node-a", 7, code, reason)


def test_unknown_kinds_and_schema_violations_are_refused() -> None:
    unknown = decide(ask("node-b/pinger", kind="route.nobody-declared-this", body={}))
    assert isinstance(unknown, Reject)
    assert (unknown.ask_id, unknown.code) == (7, ErrorCode.UNKNOWN_KIND)
    bad = decide(ask("node-b/pinger", body={"seq": "one"}))
    assert isinstance(bad, Reject)
    assert (bad.ask_id, bad.code) == (7, ErrorCode.SCHEMA)
    assert bad.reason.startswith("route.ping: ")


def test_an_unreadable_frame_is_answered_only_if_its_header_shows_an_ask() -> None:
    garbage = decide(Frame("node-a", b"\xff\xff"))
    assert isinstance(garbage, Reject)
    assert (garbage.ask_id, garbage.code) == (None, ErrorCode.MALFORMED_FRAME)
    head = cbor2.dumps([1, 9, "node-b/pinger", "node-a/", "route.ping", None, True, 0])
    tagged = decide(Frame("node-a", head[:-1] + b"\xc1\x1a\x00\x00\x00\x01"))
    assert isinstance(tagged, Reject)
    assert (tagged.ask_id, tagged.code) == (9, ErrorCode.MALFORMED_FRAME)
    big = frame(
        Envelope(
            4, "node-b/pinger", "node-a/", "route.ping", {"seq": 1, "pad": "x" * 5000}, None, True
        ),
        CodecLimits(max_frame_bytes=1 << 20),
    )
    oversized = decide(big)
    assert isinstance(oversized, Reject)
    assert (oversized.ask_id, oversized.code) == (4, ErrorCode.FRAME_TOO_LARGE)


def reply(kind: str, body: object, correlation: int | None = 7) -> Reply:
    decision = decide(frame(Envelope(1, "node-b/", "node-c/x", kind, body, correlation)))
    assert isinstance(decision, Reply)
    assert decision.peer == "node-a"
    assert decision.correlation_id == correlation
    return decision


def test_replies_carry_the_typed_value_or_plain_data() -> None:
    assert reply("reply", ["route.ping", {"seq": 3}]).result == outcome.Value(Ping(3))
    assert reply("reply", [None, {"any": [1, 2]}]).result == outcome.Value({"any": [1, 2]})
    assert reply("reply", [None, None], correlation=None).correlation_id is None


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        (ErrorCode.ACTOR_NOT_FOUND, ActorNotFound),
        (ErrorCode.ACTOR_STOPPED, ActorStopped),
        (ErrorCode.MAILBOX_FULL, MailboxFull),
    ],
)
def test_errors_the_asker_acts_on_come_back_typed(code: str, error_type: type) -> None:
    result = reply("error", {"code": code, "message": "gone"}).result
    assert isinstance(result, outcome.Error)
    assert type(result.error) is error_type
    assert str(result.error) == "gone (from node-a)"


def test_other_errors_and_malformed_replies_are_remote_errors() -> None:
    for body, code in [
        ({"code": ErrorCode.HANDLER_ERROR, "message": "boom"}, ErrorCode.HANDLER_ERROR),
        ({"code": 1, "message": "boom"}, ErrorCode.MALFORMED_FRAME),
        ("not a map", ErrorCode.MALFORMED_FRAME),
    ]:
        result = reply("error", body).result
        assert isinstance(result, outcome.Error)
        assert isinstance(result.error, RemoteError)
        assert result.error.code == code
    for body in ([1, 2, 3], "x", [5, {}]):
        result = reply("reply", body).result
        assert isinstance(result, outcome.Error)
        assert isinstance(result.error, RemoteError)
        assert result.error.code == ErrorCode.MALFORMED_FRAME


@given(st.binary(max_size=600))
def test_any_bytes_get_a_decision_and_never_an_exception(data: bytes) -> None:
    decision = decide(Frame("node-a", data))
    assert isinstance(decision, Reject | Reply | Deliver)
    if isinstance(decision, Deliver):
        assert decision.target is ACTOR


@given(
    st.lists(
        st.one_of(
            st.integers(),
            st.text(max_size=20),
            st.none(),
            st.booleans(),
            st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        ),
        min_size=0,
        max_size=9,
    )
)
def test_any_cbor_array_gets_a_decision(items: list[object]) -> None:
    decision = decide(Frame("node-a", cbor2.dumps(items)))
    assert isinstance(decision, Reject | Reply | Deliver)
