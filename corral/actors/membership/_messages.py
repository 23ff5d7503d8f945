"""The SWIM wire messages: frozen dataclasses, one kind each, CBOR-friendly.

Every kind is declared with :func:`corral.transport.message`, so its body is
checked field by field against the type hints when it arrives. The schema says
nothing about sizes, so :func:`refusal` adds the bounds the machine relies on:
how many updates ride on one message, how many members one state exchange
lists, how long a node id is and how large an incarnation may grow. A message
that breaks one is refused whole (the reason names the field and the limit).

Who speaks. ``source`` is the sending node, and the kernel refuses a message
whose ``source`` is not the node the transport authenticated (each kind is
registered with ``speaker="source"``), so the machine can trust it: an update
about ``source`` itself is *first-hand*, any other is hearsay. Every message
but :class:`StateSync` (whose own entry says the same) carries ``incarnation``,
the sender's own incarnation as it sends: each message is a first-hand
announcement of it.

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from corral.transport import message

__all__ = [
    "MAX_INCARNATION",
    "MAX_MEMBERS_PER_MESSAGE",
    "MAX_NODE_ID_LENGTH",
    "MAX_UPDATES_PER_MESSAGE",
    "Ack",
    "Gossip",
    "Nack",
    "Ping",
    "PingReq",
    "StateSync",
    "SwimMessage",
    "Update",
    "UpdateState",
    "refusal",
]

#: Updates (gossip) carried by one message, at most; the machine sends fewer.
MAX_UPDATES_PER_MESSAGE: Final = 64
#: Members listed by one state exchange (join, push-pull), at most.
MAX_MEMBERS_PER_MESSAGE: Final = 1024
#: The longest node id accepted (a DNS name's length).
MAX_NODE_ID_LENGTH: Final = 253
#: Incarnations stay exact in every CBOR reader (2**53 - 1).
MAX_INCARNATION: Final = 2**53 - 1

UpdateState: TypeAlias = Literal["alive", "suspect", "dead", "left"]


@message("membership.update")
@dataclass(frozen=True, slots=True)
class Update:
    """What one node believes about ``node``: its state at an incarnation.

    Attributes:
        node: the member the update is about.
        state: alive, suspect, dead (declared failed) or left (said goodbye).
        incarnation: the member's incarnation the claim is about.
        reporter: the node that made the claim (the member itself for alive
            refutations and leaves; the prober for suspect and dead).
    """

    node: str
    state: UpdateState
    incarnation: int
    reporter: str


@message("membership.ping", speaker="source")
@dataclass(frozen=True, slots=True)
class Ping:
    """A probe: ``target`` answers with an :class:`Ack` carrying ``seq``.

    Attributes:
        incarnation: the sender's own incarnation (every kind but :class:`StateSync`
            carries it: the sender's first-hand word that it lives at it).
    """

    seq: int
    source: str
    target: str
    updates: tuple[Update, ...] = ()
    incarnation: int = 0


@message("membership.ack", speaker="source")
@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a :class:`Ping` (or one relayed for a :class:`PingReq`)."""

    seq: int
    source: str
    updates: tuple[Update, ...] = ()
    incarnation: int = 0


@message("membership.ping-req", speaker="source")
@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask the receiver to probe ``target`` for ``source`` (SWIM's indirect probe).

    Attributes:
        nack: answer with a :class:`Nack` when the target stays silent (Lifeguard).
    """

    seq: int
    source: str
    target: str
    nack: bool = False
    updates: tuple[Update, ...] = ()
    incarnation: int = 0


@message("membership.nack", speaker="source")
@dataclass(frozen=True, slots=True)
class Nack:
    """An indirect probe's relay heard nothing from the target in time."""

    seq: int
    source: str
    incarnation: int = 0


@message("membership.gossip", speaker="source")
@dataclass(frozen=True, slots=True)
class Gossip:
    """Updates sent on the gossip tick to a few members, outside any probe."""

    source: str
    updates: tuple[Update, ...]
    incarnation: int = 0


@message("membership.sync", speaker="source")
@dataclass(frozen=True, slots=True)
class StateSync:
    """A full state exchange: join from a seed, periodic push-pull, reconnect.

    Attributes:
        members: the sender's view, one entry per member (itself included).
        reply: the receiver should answer with its own view.
    """

    source: str
    members: tuple[Update, ...]
    reply: bool = False


SwimMessage: TypeAlias = Ping | Ack | PingReq | Nack | Gossip | StateSync


def _bad_node(node: str) -> bool:
    return not node or len(node) > MAX_NODE_ID_LENGTH or "/" in node


def _refuse_update(update: Update, where: str) -> str | None:
    if _bad_node(update.node) or _bad_node(update.reporter):
        return (
            f"{where}: node ids must be 1..{MAX_NODE_ID_LENGTH} characters without '/' "
            f"(got {update.node[:40]!r} reported by {update.reporter[:40]!r})"
        )
    if not 0 <= update.incarnation <= MAX_INCARNATION:
        return f"{where}: incarnation {update.incarnation} is outside 0..{MAX_INCARNATION}"
    return None


def refusal(msg: SwimMessage) -> str | None:
    """Why ``msg`` breaks a bound (None when it keeps them all). Pure.

    The schema has already checked the types; this checks the sizes and ranges.
    """
    if _bad_node(msg.source):
        return f"source {msg.source[:40]!r} is not a node id (1..{MAX_NODE_ID_LENGTH} characters)"
    if isinstance(msg, Ping | PingReq) and _bad_node(msg.target):
        return f"target {msg.target[:40]!r} is not a node id"
    if isinstance(msg, Ping | Ack | PingReq | Nack) and not 0 <= msg.seq <= MAX_INCARNATION:
        return f"sequence number {msg.seq} is outside 0..{MAX_INCARNATION}"
    if not isinstance(msg, StateSync) and not 0 <= msg.incarnation <= MAX_INCARNATION:
        return f"incarnation {msg.incarnation} is outside 0..{MAX_INCARNATION}"
    if isinstance(msg, StateSync):
        entries, limit, name = msg.members, MAX_MEMBERS_PER_MESSAGE, "members"
    elif isinstance(msg, Nack):
        return None
    else:
        entries, limit, name = msg.updates, MAX_UPDATES_PER_MESSAGE, "updates"
    if len(entries) > limit:
        return f"{len(entries)} {name} in one message; at most {limit} are accepted"
    for i, update in enumerate(entries):
        why = _refuse_update(update, f"{name}[{i}]")
        if why is not None:
            return why
    return None
