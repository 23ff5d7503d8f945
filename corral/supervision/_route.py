"""What the kernel does with one frame that arrived from another node: a pure decision.

Theory of operation
-------------------
A frame is untrusted bytes from a peer. :func:`route` reads it in a fixed order
and stops at the first thing wrong:

1. decode the envelope within the codec limits; an unreadable or oversized
   frame is a :class:`Reject` (answered only when its header shows an ask);
2. a ``"reply"`` or ``"error"`` envelope answers one of our own asks: it is a
   :class:`Reply` carrying the outcome (the decoded value, or the error the
   remote side named, as a typed exception where the asker can act on the type);
3. otherwise the body is decoded against its kind's declared schema (an unknown
   kind or a schema violation is a :class:`Reject`), and a kind that names its
   speaker (``@message(kind, speaker=...)``) must name the peer the transport
   authenticated: a peer speaks only as itself, never as another node;
4. the address must name this node and a path in ``targets``, and that target
   must take messages (supervisors do not); then it is a :class:`Deliver`.

No event loop, no clock, no I/O: the caller (the remote bridge) logs, answers,
and puts the message in the mailbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import outcome

from corral.supervision._errors import (
    ActorNotFound,
    ActorStopped,
    MailboxFull,
    RemoteError,
)
from corral.transport import (
    CodecLimits,
    Envelope,
    ErrorCode,
    Frame,
    FrameError,
    FrameTooLarge,
    SchemaError,
    UnknownKind,
    decode_envelope,
    decode_message,
    message_speaker,
    peek_header,
)

__all__ = ["Deliver", "Reject", "Reply", "Target", "reply_outcome", "route"]

# error code -> local exception type, for errors the asker can act on by type
_TYPED_ERRORS: dict[str, type[Exception]] = {
    ErrorCode.ACTOR_NOT_FOUND: ActorNotFound,
    ErrorCode.ACTOR_STOPPED: ActorStopped,
    ErrorCode.MAILBOX_FULL: MailboxFull,
}


class Target(Protocol):
    """Whatever a path resolves to: the router only asks whether it takes messages."""

    @property
    def takes_messages(self) -> bool: ...


T = TypeVar("T", bound=Target)


class Reject(NamedTuple):
    """Refuse the frame: log it, and answer with an error envelope if ``ask_id`` is set."""

    peer: str
    ask_id: int | None
    code: str
    reason: str


class Reply(NamedTuple):
    """The answer to one of our asks (``correlation_id`` None: it names none)."""

    peer: str
    correlation_id: int | None
    result: outcome.Outcome[Any]


class Deliver(NamedTuple, Generic[T]):
    """Put ``message`` in ``target``'s mailbox; ``ask_id`` set: the sender awaits a reply."""

    peer: str
    target: T
    path: str
    kind: str
    message: object
    ask_id: int | None


def route(
    frame: Frame, node_id: str, targets: Mapping[str, T], limits: CodecLimits
) -> Reject | Reply | Deliver[T]:
    """Decide what to do with ``frame``, which arrived at node ``node_id``.

    Args:
        frame: the sender (as the transport authenticated it) and the bytes.
        node_id: this node's id; frames addressed to another node are refused.
        targets: path -> target on this node.
        limits: the codec limits frames are decoded within.

    Returns:
        :class:`Reject`, :class:`Reply` or :class:`Deliver`. Never raises for
        anything a peer can send.
    """
    peer, data = frame
    try:
        envelope = decode_envelope(data, limits)
    except FrameError as exc:
        code = (
            ErrorCode.FRAME_TOO_LARGE
            if isinstance(exc, FrameTooLarge)
            else (ErrorCode.MALFORMED_FRAME)
        )
        header = peek_header(data)
        ask_id = header[0] if header is not None and header[2] else None
        return Reject(peer, ask_id, code, str(exc))
    ident, to, _, kind, body, correlation_id, expects_reply, _ = envelope
    if kind == "reply" or kind == "error":
        return _new_decision(Reply, (peer, correlation_id, reply_outcome(peer, envelope)))
    ask_id = ident if expects_reply else None
    try:
        message = decode_message(kind, body)
    except UnknownKind as exc:
        return Reject(peer, ask_id, ErrorCode.UNKNOWN_KIND, str(exc))
    except SchemaError as exc:
        return Reject(peer, ask_id, ErrorCode.SCHEMA, f"{kind}: {exc}")
    speaker = message_speaker(message)
    if speaker is not None and speaker != peer:
        return Reject(
            peer,
            ask_id,
            ErrorCode.SCHEMA,
            f"{kind}: node {peer!r} sent a message that claims to come from node "
            f"{speaker[:80]!r}; a node may speak only as itself",
        )
    node, _, rest = to.partition("/")  # split_address, inlined: every message's path
    path = ("/" + rest).rstrip("/") if rest else "/"
    target = targets.get(path) if node == node_id else None
    if target is None:
        return Reject(
            peer,
            ask_id,
            ErrorCode.ACTOR_NOT_FOUND,
            f"no actor at {path} on node {node_id!r}"
            if node == node_id
            else f"frame for node {node!r} arrived at {node_id!r}",
        )
    if not target.takes_messages:
        return Reject(
            peer, ask_id, ErrorCode.UNHANDLED, f"{path} is a supervisor; it takes no messages"
        )
    return _new_decision(Deliver, (peer, target, path, kind, message, ask_id))


# Reply(...) and Deliver(...) without their Python-level __new__ (a named tuple's):
# one of them is built for every frame, from fields already checked.
_new_decision = tuple.__new__


def reply_outcome(peer: str, envelope: Envelope) -> outcome.Outcome[Any]:
    """The outcome a ``"reply"`` or ``"error"`` envelope from ``peer`` carries."""
    body = envelope.body
    if envelope.kind == "error":
        code, text = _error_fields(body)
        error_type = _TYPED_ERRORS.get(code)
        error = error_type(f"{text} (from {peer})") if error_type else RemoteError(code, text)
        return outcome.Error(error)
    if type(body) is not list or len(body) != 2 or not (body[0] is None or type(body[0]) is str):
        return outcome.Error(
            RemoteError(ErrorCode.MALFORMED_FRAME, "reply body is not [kind, value]")
        )
    kind, value = body
    if kind is None:
        return outcome.Value(value)
    try:
        return outcome.Value(decode_message(kind, value))
    except (UnknownKind, SchemaError) as exc:
        return outcome.Error(exc)


def _error_fields(body: Any) -> tuple[str, str]:
    """The code and message of an error envelope's body (``{"code", "message"}``)."""
    if type(body) is dict:
        code, text = body.get("code"), body.get("message")
        if type(code) is str and type(text) is str:
            return code, text
    return ErrorCode.MALFORMED_FRAME, f"unreadable error reply: {body!r:.200}"
