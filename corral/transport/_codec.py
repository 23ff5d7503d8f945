"""The envelope and its CBOR codec.

Theory of operation: one frame on the wire is one envelope, encoded as a CBOR
array of eight items, body last::

    [version, id, to, from, kind, correlation_id, expects_reply, body]

``to`` and ``from`` are addresses ``"<node>/<actor path>"`` (``"node-b/coordinator"``);
``from`` may be just ``"<node>/"`` when the sender is not an actor. A reply to an
ask carries the ask's id as ``correlation_id`` and kind ``"reply"`` (body
``[message kind or null, value]``) or ``"error"`` (body ``{"code", "message"}``).

Decoding is defensive, in this order: the size limit before anything is
parsed; then cbor2 with a container-depth limit (so deep input is refused while
it is read, not after), no tags at all (no datetimes, no shared or cyclic
values), text or byte keys only, no trailing bytes; then the shape of the
envelope. Every refusal is a :class:`FrameError`. The body is left as plain
data; :func:`corral.transport.decode_message` checks it against its kind's
schema. :func:`peek_header` reads the header items of a refused frame without
cbor2, so the receiver can still address an error reply to the asker.

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import cbor2

from corral.transport._errors import FrameTooLarge, MalformedFrame

__all__ = [
    "PROTOCOL_VERSION",
    "CodecLimits",
    "Envelope",
    "ErrorCode",
    "decode_envelope",
    "encode_envelope",
    "peek_header",
    "split_address",
]

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class CodecLimits:
    """Limits applied to every frame, both ways.

    Attributes:
        max_frame_bytes: the largest encoded frame accepted or sent (default 1 MiB).
        max_depth: the deepest container nesting in a frame, the envelope's own
            array included (default 32).
    """

    max_frame_bytes: int = 1 << 20
    max_depth: int = 32

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 256:
            raise ValueError("max_frame_bytes must be at least 256 bytes")
        if not 2 <= self.max_depth <= 1000:
            raise ValueError("max_depth must be between 2 and 1000")


DEFAULT_LIMITS = CodecLimits()


class ErrorCode:
    """The codes carried by ``"error"`` envelopes."""

    MALFORMED_FRAME = "malformed-frame"
    FRAME_TOO_LARGE = "frame-too-large"
    UNKNOWN_KIND = "unknown-kind"
    SCHEMA = "schema"
    ACTOR_NOT_FOUND = "actor-not-found"
    ACTOR_STOPPED = "actor-stopped"
    MAILBOX_FULL = "mailbox-full"
    HANDLER_ERROR = "handler-error"
    UNHANDLED = "unhandled-message"
    REPLY_NOT_ENCODABLE = "reply-not-encodable"


class Envelope(NamedTuple):
    """One message between actor systems (immutable; a named tuple, cheap to build).

    Attributes:
        id: unique per sending system; asks are answered by it.
        to: ``"<node>/<path>"`` of the receiving actor (or ``"<node>/"`` for replies).
        sender: ``"<node>/<path>"`` of the sender (``from`` on the wire).
        kind: the message kind, or ``"reply"`` / ``"error"``.
        body: plain CBOR-able data (for messages: the schema's map).
        correlation_id: for replies, the id of the ask answered.
        expects_reply: true for an ask.
        version: the protocol version.
    """

    id: int
    to: str
    sender: str
    kind: str
    body: Any = None
    correlation_id: int | None = None
    expects_reply: bool = False
    version: int = PROTOCOL_VERSION

    @property
    def sender_node(self) -> str:
        """The node part of ``sender``."""
        return split_address(self.sender)[0]


def split_address(address: str) -> tuple[str, str]:
    """Split ``"node/path/to/actor"`` into ``("node", "/path/to/actor")``.

    ``"node"`` and ``"node/"`` give ``("node", "/")``.
    """
    node, sep, rest = address.partition("/")
    return node, "/" + rest if sep else "/"


def encode_envelope(envelope: Envelope, limits: CodecLimits = DEFAULT_LIMITS) -> bytes:
    """Encode an envelope to one frame.

    Raises:
        FrameTooLarge: the frame would exceed ``limits.max_frame_bytes``.
        MalformedFrame: the body holds something CBOR cannot carry, or nests too deeply.
    """
    ident, to, sender, kind, body, correlation_id, expects_reply, version = envelope
    if _depth_exceeds(body, limits.max_depth - 1):
        raise MalformedFrame(
            f"the body of a {kind!r} message nests deeper than "
            f"{limits.max_depth - 1} levels; flatten it or raise CodecLimits.max_depth"
        )
    try:
        data: bytes = cbor2.dumps(
            [version, ident, to, sender, kind, correlation_id, expects_reply, body]
        )
    except Exception as exc:
        raise MalformedFrame(
            f"the body of a {kind!r} message cannot be encoded as CBOR: {exc}"
        ) from exc
    if len(data) > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"a {envelope.kind!r} frame is {len(data)} bytes, over the limit of "
            f"{limits.max_frame_bytes}; send less per message or raise CodecLimits.max_frame_bytes"
        )
    return data


def _refuse_tag(*_args: object) -> Any:
    raise ValueError("CBOR tags are not accepted in corral frames")


# Every tag cbor2 knows gets refused; unknown tags go to the tag hook, refused too.
_NO_TAGS = {
    tag: _refuse_tag
    for tag in (
        0, 1, 2, 3, 4, 5, 21, 22, 23, 24, 25, 28, 29, 30, 32, 33, 34, 35, 36, 37,
        100, 256, 258, 260, 261, 262, 263, 270, 1004, 55799,
    )
}  # fmt: skip


def decode_envelope(data: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Envelope:
    """Decode one frame to an envelope; the body stays plain data.

    Raises:
        FrameTooLarge: the frame exceeds ``limits.max_frame_bytes``.
        MalformedFrame: not CBOR, has tags or trailing bytes, nests too deeply,
            or is not an envelope of a supported version.
    """
    if len(data) > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"frame of {len(data)} bytes exceeds the limit of {limits.max_frame_bytes}"
        )
    if not data:
        raise MalformedFrame("empty frame")
    try:
        decoder, stream = _local.decoders[limits.max_depth]
    except (AttributeError, KeyError):
        decoder, stream = _decoder(limits.max_depth)
    stream.seek(0)  # the thread's stream, refilled with this frame alone
    stream.truncate()
    stream.write(data)
    stream.seek(0)
    try:
        decoded = decoder.decode()
    except Exception as exc:
        _forget_decoder(limits.max_depth)  # its state after a failure is not ours to trust
        raise MalformedFrame(f"frame is not valid CBOR within the limits: {exc}") from None
    if stream.tell() != len(data):
        raise MalformedFrame(f"frame has {len(data) - stream.tell()} trailing bytes")
    if type(decoded) is not list or len(decoded) != 8:
        raise MalformedFrame("frame is not an envelope (an array of 8 items)")
    version, ident, to, sender, kind, correlation_id, expects_reply, body = decoded
    # One test for the common envelope; which item is wrong is worked out only when one is.
    if (
        type(ident) is not int
        or ident < 0
        or type(to) is not str
        or type(sender) is not str
        or type(kind) is not str
        or type(expects_reply) is not bool
        or version != PROTOCOL_VERSION
        or type(version) is not int
        or (correlation_id is not None and (type(correlation_id) is not int or correlation_id < 0))
    ):
        raise _malformed_header(decoded)
    fields = (ident, to, sender, kind, body, correlation_id, expects_reply, version)
    return _new_tuple(Envelope, fields)


# Envelope(...) without its Python-level __new__: the fields are checked already.
_new_tuple = tuple.__new__


def _malformed_header(decoded: list[Any]) -> MalformedFrame:
    """The refusal of an envelope whose header items do not check out: the first one wrong."""
    version, ident, to, sender, kind, correlation_id, _, _ = decoded
    if version != PROTOCOL_VERSION or type(version) is not int:
        return MalformedFrame(
            f"envelope version {version!r} is not supported (this node speaks {PROTOCOL_VERSION})"
        )
    if type(ident) is not int or ident < 0:
        return MalformedFrame("envelope id must be a non-negative integer")
    if type(to) is not str or type(sender) is not str or type(kind) is not str:
        return MalformedFrame("envelope to, from and kind must be text")
    if correlation_id is not None and (type(correlation_id) is not int or correlation_id < 0):
        return MalformedFrame("envelope correlation id must be a non-negative integer or null")
    return MalformedFrame("envelope expects_reply must be a bool")


# Building a decoder with these options costs several times the decoding of a small
# frame, and pointing one at a new stream (its fp setter asks the stream three
# questions) a quarter of it; so each thread keeps one decoder per depth limit,
# reading one stream of its own, which each frame refills. A decode that returned
# leaves no unread byte in the decoder (what it read past the item it gives back to
# the stream, which the trailing-bytes check relies on too), so the next frame starts
# clean. Every tag is refused, so no decode leaves shared values or string references
# behind for the next one; a decoder that raised is thrown away with its stream.
_local = threading.local()


def _decoder(max_depth: int) -> tuple[cbor2.CBORDecoder, io.BytesIO]:
    decoders: dict[int, tuple[cbor2.CBORDecoder, io.BytesIO]] | None = getattr(
        _local, "decoders", None
    )
    if decoders is None:
        decoders = _local.decoders = {}
    entry = decoders.get(max_depth)
    if entry is None:
        stream = io.BytesIO()
        decoder = cbor2.CBORDecoder(
            stream,
            max_depth=max_depth,
            semantic_decoders=_NO_TAGS,
            tag_hook=_refuse_tag,
            strict_hashable_types=True,
            allow_duplicate_keys=False,
        )
        entry = decoders[max_depth] = (decoder, stream)
    return entry


def _forget_decoder(max_depth: int) -> None:
    decoders: dict[int, tuple[cbor2.CBORDecoder, io.BytesIO]] | None = getattr(
        _local, "decoders", None
    )
    if decoders is not None:
        decoders.pop(max_depth, None)


_CONTAINERS = (list, tuple, dict)
# Types whose values are never containers: one set lookup rules them out, where
# isinstance against the three container types takes three tests.
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def _depth_exceeds(value: Any, limit: int) -> bool:
    """True when ``value`` nests containers deeper than ``limit`` (iterative, no recursion)."""
    if not isinstance(value, _CONTAINERS):
        return False
    if limit >= 2:
        # The common bodies, a map of scalars or [kind, map of scalars], in one pass
        # without the stack: each container inside may hold no container itself.
        for child in value.values() if isinstance(value, dict) else value:
            if type(child) in _SCALARS:
                continue
            if isinstance(child, _CONTAINERS):
                for grandchild in child.values() if isinstance(child, dict) else child:
                    if type(grandchild) not in _SCALARS and isinstance(grandchild, _CONTAINERS):
                        break
                else:
                    continue
                break
        else:
            return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        seen += 1
        if seen > 1_000_000:
            return True  # a pathological (or cyclic) value: refuse rather than spin
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
    return False


# ---------------------------------------------------------------- header peeking

_MAX_PEEK_TEXT = 4096


def peek_header(data: bytes) -> tuple[int, str, bool] | None:
    """Read ``(id, from, expects_reply)`` from the head of a frame cbor2 refused.

    Only definite-length unsigned integers, text, null and booleans are read, and
    only from the first few kilobytes, so this is cheap and safe on any input.

    Returns:
        The header items, or None when the head does not look like an envelope.
    """
    reader = _HeadReader(data)
    try:
        if reader.byte() != 0x88:  # array of 8
            return None
        reader.uint()  # version
        ident = reader.uint()
        reader.text()  # to
        sender = reader.text()
        reader.text()  # kind
        reader.uint_or_null()  # correlation id
        expects_reply = reader.boolean()
    except _PeekFailed:
        return None
    return ident, sender, expects_reply


class _PeekFailed(Exception):
    pass


class _HeadReader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _PeekFailed
        b = self.data[self.pos]
        self.pos += 1
        return b

    def _argument(self, info: int) -> int:
        if info < 24:
            return info
        sizes = {24: 1, 25: 2, 26: 4, 27: 8}
        size = sizes.get(info)
        if size is None or self.pos + size > len(self.data):
            raise _PeekFailed
        value = int.from_bytes(self.data[self.pos : self.pos + size], "big")
        self.pos += size
        return value

    def uint(self) -> int:
        b = self.byte()
        if b >> 5 != 0:
            raise _PeekFailed
        return self._argument(b & 0x1F)

    def uint_or_null(self) -> int | None:
        if self.pos < len(self.data) and self.data[self.pos] == 0xF6:
            self.pos += 1
            return None
        return self.uint()

    def text(self) -> str:
        b = self.byte()
        if b >> 5 != 3:
            raise _PeekFailed
        length = self._argument(b & 0x1F)
        if length > _MAX_PEEK_TEXT or self.pos + length > len(self.data):
            raise _PeekFailed
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _PeekFailed from None

    def boolean(self) -> bool:
        b = self.byte()
        if b == 0xF5:
            return True
        if b == 0xF4:
            return False
        raise _PeekFailed
