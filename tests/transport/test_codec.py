"""Envelope codec, message schemas and the decoder's defences."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.transport import (
    CodecLimits,
    Envelope,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    SchemaError,
    UnknownKind,
    decode_envelope,
    decode_message,
    encode_envelope,
    encode_message,
    message,
    message_kind,
    peek_header,
    split_address,
)
from corral.transport._schema import message_class


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Port:
    public: int
    internal: int


@message("test.codec.rich")
@dataclass(frozen=True)
class Rich:
    name: str
    count: int
    ratio: float
    on: bool
    raw: bytes
    maybe: str | None
    tags: list[str]
    pair: tuple[int, ...]
    labels: dict[str, str]
    port: Port
    ports: list[Port] = field(default_factory=list)
    color: Color = Color.RED
    mode: Literal["a", "b"] = "a"
    extra: Any = None


@message("test.codec.empty")
@dataclass(frozen=True)
class Empty:
    pass


def rich() -> Rich:
    return Rich(
        name="web",
        count=3,
        ratio=0.5,
        on=True,
        raw=b"\x00\x01",
        maybe=None,
        tags=["x", "y"],
        pair=(1, 2),
        labels={"zone": "a"},
        port=Port(24000, 24001),
        ports=[Port(1, 2)],
        color=Color.BLUE,
        mode="b",
        extra={"free": [1, "two", None]},
    )


DEFAULT = CodecLimits()


def roundtrip(msg: object, limits: CodecLimits = DEFAULT) -> object:
    kind, body = encode_message(msg)
    data = encode_envelope(Envelope(7, "node-b/x", "node-a/", kind, body, None, True), limits)
    envelope = decode_envelope(data, limits)
    assert envelope.id == 7
    assert envelope.to == "node-b/x"
    assert envelope.sender == "node-a/"
    assert envelope.sender_node == "node-a"
    assert envelope.expects_reply is True
    assert envelope.correlation_id is None
    return decode_message(envelope.kind, envelope.body)


def test_rich_message_roundtrips_to_an_equal_instance() -> None:
    assert roundtrip(rich()) == rich()
    assert roundtrip(Empty()) == Empty()


def test_int_is_accepted_where_a_float_is_declared() -> None:
    body = encode_message(rich())[1]
    body["ratio"] = 1
    decoded = decode_message("test.codec.rich", body)
    assert isinstance(decoded, Rich)
    assert decoded.ratio == 1.0
    assert isinstance(decoded.ratio, float)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"count": "3"}, "count"),
        ({"count": True}, "count"),  # a bool is not an int here
        ({"on": 1}, "on"),
        ({"maybe": 5}, "maybe"),
        ({"tags": ["x", 1]}, "tags[1]"),
        ({"labels": {"zone": 1}}, "labels"),
        ({"port": {"public": 1}}, "port"),
        ({"port": {"public": 1, "internal": 2, "x": 3}}, "port"),
        ({"color": "green"}, "color"),
        ({"mode": "c"}, "mode"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_schema_violations_name_the_field(change: dict[str, Any], where: str) -> None:
    body = encode_message(rich())[1]
    body.update(change)
    with pytest.raises(SchemaError, match=where.replace("[", r"\[")):
        decode_message("test.codec.rich", body)


def test_missing_required_field_is_a_schema_error() -> None:
    body = encode_message(rich())[1]
    del body["name"]
    with pytest.raises(SchemaError, match="missing name"):
        decode_message("test.codec.rich", body)


def test_unknown_kind_and_unregistered_message() -> None:
    with pytest.raises(UnknownKind, match=r"test\.codec\.nope"):
        decode_message("test.codec.nope", {})
    with pytest.raises(UnknownKind):
        message_class("test.codec.nope")

    @dataclass(frozen=True)
    class NotAMessage:
        x: int

    with pytest.raises(SchemaError, match="@message"):
        encode_message(NotAMessage(1))
    assert message_kind(NotAMessage(1)) is None
    assert message_kind(Empty) == "test.codec.empty"


def test_message_decorator_refuses_bad_declarations() -> None:
    with pytest.raises(TypeError, match="frozen dataclass"):

        @message("test.codec.mutable")
        @dataclass
        class Mutable:
            x: int

    with pytest.raises(ValueError, match="reserved"):
        message("reply")
    with pytest.raises(ValueError, match="already registered"):

        @message("test.codec.empty")
        @dataclass(frozen=True)
        class Impostor:
            pass

    with pytest.raises(ValueError, match="has no field 'source'"):

        @message("test.codec.speakerless", speaker="source")
        @dataclass(frozen=True)
        class Speakerless:
            sender: str


def test_frame_size_limit_both_ways() -> None:
    limits = CodecLimits(max_frame_bytes=1000)
    big = Envelope(1, "b/x", "a/", "k", "x" * 2000)
    with pytest.raises(FrameTooLarge, match="over the limit of 1000"):
        encode_envelope(big, limits)
    data = encode_envelope(big)
    with pytest.raises(FrameTooLarge):
        decode_envelope(data, limits)


def test_depth_limit_both_ways() -> None:
    limits = CodecLimits(max_depth=8)
    ok: Any = 0
    for _ in range(7):  # 7 levels of body + the envelope array = 8
        ok = [ok]
    decode_envelope(encode_envelope(Envelope(1, "b/x", "a/", "k", ok), limits), limits)
    too_deep = [ok]
    with pytest.raises(MalformedFrame, match="nests deeper"):
        encode_envelope(Envelope(1, "b/x", "a/", "k", too_deep), limits)
    data = encode_envelope(Envelope(1, "b/x", "a/", "k", too_deep))
    with pytest.raises(MalformedFrame, match="depth"):
        decode_envelope(data, limits)


def test_very_deep_input_is_refused_without_recursion_trouble() -> None:
    data = b"\x88\x01\x01\x61b\x61a\x61k\xf6\xf5" + b"\x81" * 200_000 + b"\x00"
    with pytest.raises(MalformedFrame):
        decode_envelope(data, CodecLimits(max_frame_bytes=1 << 20))
    data = b"\x9f" * 100_000  # indefinite-length arrays, never closed
    with pytest.raises(MalformedFrame):
        decode_envelope(data)


@pytest.mark.parametrize(
    "data",
    [
        cbor2.dumps([1, 1, "b/x", "a/", "k", None, False, 0]) + b"\x00",  # trailing byte
        cbor2.dumps([2, 1, "b/x", "a/", "k", None, False, 0]),  # unsupported version
        cbor2.dumps([1, -1, "b/x", "a/", "k", None, False, 0]),  # negative id
        cbor2.dumps([1, 1, 5, "a/", "k", None, False, 0]),  # to is not text
        cbor2.dumps([1, 1, "b/x", "a/", "k", "x", False, 0]),  # bad correlation id
        cbor2.dumps([1, 1, "b/x", "a/", "k", None, 1, 0]),  # expects_reply not a bool
        cbor2.dumps([1, 1, "b/x", "a/", "k", None, False]),  # 7 items
        cbor2.dumps({"v": 1}),
        b"\xc1\x1a\x00\x00\x00\x01",  # a bare datetime tag
        cbor2.dumps([1, 1, "b/x", "a/", "k", None, False, {1: 2}]),  # non-text map key
        b"\x88\x01\x01\x61b\x61a\x61k\xf6\xf4\xa2\x61x\x00\x61x\x01",  # duplicate map key
        b"\x88\x01\x01\x61b\x61a\x61k\xf6\xf4\xd8\x1c\x81\xd8\x1d\x00",  # shared (cyclic) value
        b"\x88\x01\x01\x61b\x61a\x61k\xf6\xf4\xd9\x01\x02\x81\x01",  # a set
    ],
)
def test_malformed_frames_are_refused(data: bytes) -> None:
    with pytest.raises(MalformedFrame):
        decode_envelope(data)


@settings(max_examples=300)
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_raise_frame_errors(data: bytes) -> None:
    try:
        envelope = decode_envelope(data, CodecLimits(max_frame_bytes=256, max_depth=8))
    except FrameError:
        return
    assert isinstance(envelope, Envelope)


_cbor_leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
_cbor_values = st.recursive(
    _cbor_leaves | st.binary(max_size=8) | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200)
@given(_cbor_values, st.binary(max_size=16), st.integers(0, 40))
def test_mutated_envelopes_never_escape_as_other_errors(body: Any, noise: bytes, cut: int) -> None:
    data = encode_envelope(Envelope(3, "b/x", "a/", "test.codec.rich", body, None, True))
    for candidate in (data[:cut] + noise + data[cut:], data[: len(data) - cut], data + noise):
        try:
            envelope = decode_envelope(candidate)
        except FrameError:
            continue
        # Whatever decodes is a well-formed envelope; a body that is not is refused
        # with the boundary's own errors, never anything else.
        assert isinstance(envelope.kind, str)
        try:
            decode_message(envelope.kind, envelope.body)
        except (SchemaError, UnknownKind):
            pass


def decoded(data: bytes) -> object:
    try:
        return decode_envelope(data)
    except FrameError as exc:
        return (type(exc), str(exc))


def decoded_in_a_new_thread(data: bytes) -> object:
    """What decode_envelope makes of ``data`` with a decoder never used before (each
    thread keeps its own)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(decoded(data)))
    thread.start()
    thread.join()
    return result[0]


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(_cbor_values, st.sampled_from(["whole", "trailing", "cut", "large"])),
        min_size=2,
        max_size=6,
    )
)
def test_the_decoder_a_thread_reuses_answers_as_a_fresh_one(
    frames: list[tuple[Any, str]],
) -> None:
    # One thread decodes frame after frame, refused ones among them (trailing bytes,
    # cut short) and ones larger than a read: each answer is what a fresh decoder gives.
    for body, how in frames:
        if how == "large":
            body = ["x" * 5000, body]
        data = encode_envelope(Envelope(3, "b/x", "a/", "test.codec.rich", body, None, True))
        if how == "trailing":
            data += b"\x01"
        elif how == "cut":
            data = data[:-2]
        assert decoded(data) == decoded_in_a_new_thread(data)


@message("test.codec.keywords")
@dataclass(frozen=True)
class Keywords:
    first: int
    rest: list[int] = field(default_factory=list, kw_only=True)
    label: str = field(default="", kw_only=True)


class PlainMap(dict[str, Any]):
    """A message's map the compiled straight path of its validator leaves to the
    general check (a subclass of dict: only a dict itself takes the straight path)."""


def decoded_or_refusal(kind: str, body: Any) -> object:
    try:
        return decode_message(kind, body)
    except Exception as exc:
        return (type(exc), str(exc))


@given(
    kind=st.sampled_from(["test.codec.rich", "test.codec.keywords", "test.codec.empty"]),
    drop=st.sets(st.sampled_from([*Rich.__dataclass_fields__, "first", "rest"]), max_size=3),
    change=st.dictionaries(
        st.sampled_from([*Rich.__dataclass_fields__, "first", "rest", "label", "public", "odd"]),
        _cbor_values,
        max_size=3,
    ),
)
@settings(max_examples=300)
def test_the_compiled_validators_answer_as_the_general_check_does(
    kind: str, drop: set[str], change: dict[str, Any]
) -> None:
    # A map that fits goes the compiled straight path; a map of another type always
    # takes the general check: both must build the same message or refuse alike.
    valid = {
        "test.codec.rich": encode_message(rich())[1],
        "test.codec.keywords": encode_message(Keywords(1, rest=[2], label="x"))[1],
        "test.codec.empty": {},
    }[kind]
    body = {k: v for k, v in valid.items() if k not in drop} | change
    straight = decoded_or_refusal(kind, body)
    assert straight == decoded_or_refusal(kind, PlainMap(body))
    if body == valid:
        assert straight == decode_message(kind, valid)


def test_keyword_only_fields_are_built_by_name() -> None:
    assert decode_message("test.codec.keywords", {"first": 1, "rest": [2], "label": "x"}) == (
        Keywords(1, rest=[2], label="x")
    )
    assert decode_message("test.codec.keywords", {"first": 1}) == Keywords(1)


@settings(max_examples=100)
@given(st.integers(0, 2**63), st.text(max_size=40), st.booleans(), _cbor_values)
def test_peek_header_reads_what_encode_wrote(
    ident: int, sender: str, expects_reply: bool, body: Any
) -> None:
    data = encode_envelope(Envelope(ident, "b/x", sender, "k", body, 9, expects_reply))
    assert peek_header(data) == (ident, sender, expects_reply)


@settings(max_examples=200)
@given(st.binary(max_size=64))
def test_peek_header_never_raises(data: bytes) -> None:
    result = peek_header(data)
    assert result is None or isinstance(result[0], int)


def test_split_address() -> None:
    assert split_address("node-b/coordinator") == ("node-b", "/coordinator")
    assert split_address("node-b/a/b") == ("node-b", "/a/b")
    assert split_address("node-b/") == ("node-b", "/")
    assert split_address("node-b") == ("node-b", "/")


def test_codec_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        CodecLimits(max_frame_bytes=10)
    with pytest.raises(ValueError, match="max_depth"):
        CodecLimits(max_depth=1)
