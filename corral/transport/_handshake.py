"""The peer handshake of the WebSocket transport: mutual proof of the cluster secret.

Theory of operation
-------------------
Right after the WebSocket upgrade, before any envelope may flow, the two nodes
run a four-message exchange over binary WebSocket messages (each a small CBOR
map tagged ``"t"``). The side that dialed is the *client*::

    client                                  server
      | hello: versions, node, incarnation,    |
      |        nonce_c, expect, max_frame  --> |  version chosen, nonce_c not seen before
      | <-- challenge: version, node,          |
      |     incarnation, nonce_s, max_frame,   |
      |     proof_s = HMAC(k, "server", T)     |
      | proof: proof_c = HMAC(k, "client", T) -->|
      | <-- welcome                             |

``T`` binds everything both sides said: the chosen version, both node ids, both
incarnations, both nonces, both frame limits and the dialer's sequence number.
Each nonce is fresh randomness drawn by its owner, so a proof recorded on one
connection is worthless on the next (the other side's nonce differs), and the
role label stops a proof from being reflected back at its author. A nonce seen
before (a replayed ``hello`` or ``challenge``) is refused outright. Proofs are
compared in constant time. No configured secret means the empty key: two nodes
without a secret accept each other (they only listen on loopback), and a node
with a secret refuses one without.

Each message is a frozen dataclass (:class:`Hello`, :class:`Challenge`,
:class:`Proof`, :class:`Welcome`) checked against its type hints by the transport's
schema (:func:`~corral.transport._schema.check_fields`) before anything reads it;
fields a later protocol version adds are ignored, so a newer peer's ``hello`` still
negotiates down. A refusal is a :class:`Refused` value carrying the WebSocket
close code the shell closes the connection with and a reason it logs. Nothing in this module
does I/O, reads a clock or draws randomness: nonces and incarnations are
passed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, TypeVar

import cbor2

from corral.transport._errors import SchemaError
from corral.transport._schema import check_fields, encode_value

# Version 2: after the handshake, every binary message is a packet of frames
# (corral.transport._ws_wire); version 1 carried one frame per message.
PROTOCOL_VERSION = 2
SUPPORTED_VERSIONS: tuple[int, ...] = (2,)
NONCE_SIZE = 32
MAX_HANDSHAKE_MESSAGE = 4096
MAX_NODE_ID_LENGTH = 256
MAX_INCARNATION_LENGTH = 64


class CloseCode(IntEnum):
    """WebSocket close codes the transport uses (4000-4999 is the application range)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    BAD_PROOF = 4001
    UNSUPPORTED_VERSION = 4002
    REPLAYED = 4003
    PROTOCOL_ERROR = 4004
    HANDSHAKE_TIMEOUT = 4005
    SUPERSEDED = 4006
    WRONG_NODE = 4007
    SAME_NODE_ID = 4008
    HEARTBEAT_TIMEOUT = 4009


@dataclass(frozen=True, slots=True)
class Refused:
    """The handshake failed: close the connection with ``code`` and log ``reason``."""

    code: CloseCode
    reason: str


@dataclass(frozen=True, slots=True)
class Identity:
    """What one side states about itself."""

    node_id: str
    incarnation: bytes
    max_frame: int


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What a completed handshake established about the other side."""

    node_id: str
    incarnation: bytes
    version: int
    max_frame: int
    initiator: str
    dial_seq: int


class NonceLog:
    """The most recent nonces seen, bounded; used to refuse replays."""

    def __init__(self, capacity: int = 16384) -> None:
        if capacity < 1:
            raise ValueError(f"NonceLog capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._order: deque[bytes] = deque()
        self._seen: set[bytes] = set()

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, nonce: bytes) -> bool:
        """Record ``nonce``. Returns False (and records nothing) if it was seen before."""
        if nonce in self._seen:
            return False
        self._seen.add(nonce)
        self._order.append(nonce)
        if len(self._order) > self._capacity:
            self._seen.discard(self._order.popleft())
        return True


def _transcript(
    role: str,
    version: int,
    client: Identity,
    server: Identity,
    client_nonce: bytes,
    server_nonce: bytes,
    dial_seq: int,
) -> bytes:
    return cbor2.dumps(
        [
            "corral-ws-handshake",
            role,
            version,
            client.node_id,
            server.node_id,
            client.incarnation,
            server.incarnation,
            client_nonce,
            server_nonce,
            client.max_frame,
            server.max_frame,
            dial_seq,
        ],
        canonical=True,
    )


def compute_proof(
    secret: bytes,
    role: str,
    version: int,
    client: Identity,
    server: Identity,
    client_nonce: bytes,
    server_nonce: bytes,
    dial_seq: int,
) -> bytes:
    """HMAC-SHA256 of the handshake transcript under ``secret``, labelled by ``role``."""
    message = _transcript(role, version, client, server, client_nonce, server_nonce, dial_seq)
    return hmac.new(secret, message, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Hello:
    """Client -> server: who dials, what it speaks, its nonce, whom it expects."""

    TAG: ClassVar[str] = "hello"
    #: offered protocol versions (entries that are not whole numbers are ignored).
    versions: list[Any]
    node: str
    incarnation: bytes
    nonce: bytes
    max_frame: int
    dial_seq: int
    expect: str | None = None


@dataclass(frozen=True, slots=True)
class Challenge:
    """Server -> client: the chosen version, who answers, its nonce and its proof."""

    TAG: ClassVar[str] = "challenge"
    version: int
    node: str
    incarnation: bytes
    nonce: bytes
    max_frame: int
    proof: bytes


@dataclass(frozen=True, slots=True)
class Proof:
    """Client -> server: the client's proof."""

    TAG: ClassVar[str] = "proof"
    proof: bytes


@dataclass(frozen=True, slots=True)
class Welcome:
    """Server -> client: the handshake is complete."""

    TAG: ClassVar[str] = "welcome"


_M = TypeVar("_M", Hello, Challenge, Proof, Welcome)


def _encode(msg: Hello | Challenge | Proof | Welcome) -> bytes:
    return cbor2.dumps({"t": msg.TAG, **encode_value(msg)})


def _decode(data: bytes | str, cls: type[_M]) -> _M | Refused:
    expected = cls.TAG
    if not isinstance(data, bytes):
        return Refused(CloseCode.PROTOCOL_ERROR, f"expected a binary {expected!r} message")
    if len(data) > MAX_HANDSHAKE_MESSAGE:
        return Refused(
            CloseCode.PROTOCOL_ERROR,
            f"{expected!r} message of {len(data)} bytes exceeds {MAX_HANDSHAKE_MESSAGE}",
        )
    try:
        value = cbor2.loads(data)
    except Exception:  # cbor2 raises several types on hostile input
        return Refused(CloseCode.PROTOCOL_ERROR, f"{expected!r} message is not valid CBOR")
    if not isinstance(value, dict) or value.get("t") != expected:
        return Refused(CloseCode.PROTOCOL_ERROR, f"expected a {expected!r} handshake message")
    known = {f.name for f in dataclasses.fields(cls)}
    try:
        return check_fields(cls, {k: v for k, v in value.items() if k in known}, expected)
    except SchemaError as exc:
        return Refused(CloseCode.PROTOCOL_ERROR, str(exc))


def _identity_problem(msg: Hello | Challenge) -> Refused | None:
    what = msg.TAG
    if not 0 < len(msg.node) <= MAX_NODE_ID_LENGTH:
        problem = f"{what}: node id must be 1..{MAX_NODE_ID_LENGTH} characters"
    elif not 0 < len(msg.incarnation) <= MAX_INCARNATION_LENGTH:
        problem = f"{what}: incarnation must be 1..{MAX_INCARNATION_LENGTH} bytes"
    elif msg.max_frame < 1:
        problem = f"{what}: max_frame must be positive"
    else:
        return None
    return Refused(CloseCode.PROTOCOL_ERROR, problem)


class ClientHandshake:
    """The dialing side of one handshake (one instance per connection attempt)."""

    def __init__(
        self,
        me: Identity,
        secret: bytes,
        nonce: bytes,
        seen: NonceLog,
        *,
        expect: str | None,
        dial_seq: int,
        versions: tuple[int, ...] = SUPPORTED_VERSIONS,
    ) -> None:
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
        self._me = me
        self._secret = secret
        self._nonce = nonce
        self._seen = seen
        self._expect = expect
        self._dial_seq = dial_seq
        self._versions = versions
        self._server: Identity | None = None
        self._server_nonce = b""
        self._version = 0

    def hello(self) -> bytes:
        """The first message, sent right after the WebSocket upgrade."""
        return _encode(
            Hello(
                versions=list(self._versions),
                node=self._me.node_id,
                incarnation=self._me.incarnation,
                nonce=self._nonce,
                max_frame=self._me.max_frame,
                dial_seq=self._dial_seq,
                expect=self._expect,
            )
        )

    def receive_challenge(self, data: bytes | str) -> bytes | Refused:
        """Check the server's challenge and proof; return our proof message or a refusal."""
        msg = _decode(data, Challenge)
        if isinstance(msg, Refused):
            return msg
        problem = _identity_problem(msg)
        if problem is not None:
            return problem
        node_id, incarnation, max_frame = msg.node, msg.incarnation, msg.max_frame
        version, nonce, proof = msg.version, msg.nonce, msg.proof
        if version not in self._versions:
            return Refused(
                CloseCode.UNSUPPORTED_VERSION,
                f"peer chose protocol version {version}; this node speaks {list(self._versions)}",
            )
        if self._expect is not None and node_id != self._expect:
            return Refused(
                CloseCode.WRONG_NODE,
                f"dialed node {self._expect!r} but the peer is {node_id!r}; "
                "check the peer address configured for it",
            )
        if node_id == self._me.node_id:
            return Refused(
                CloseCode.SAME_NODE_ID,
                f"the peer uses this node's own id {node_id!r}; node ids must be unique",
            )
        if len(nonce) != NONCE_SIZE:
            return Refused(CloseCode.PROTOCOL_ERROR, f"challenge nonce must be {NONCE_SIZE} bytes")
        if nonce == self._nonce or not self._seen.remember(nonce):
            return Refused(CloseCode.REPLAYED, "the peer's challenge nonce was seen before")
        server = Identity(node_id, incarnation, max_frame)
        expected = compute_proof(
            self._secret, "server", version, self._me, server, self._nonce, nonce, self._dial_seq
        )
        if not hmac.compare_digest(expected, proof):
            return Refused(
                CloseCode.BAD_PROOF,
                f"peer {node_id!r} could not prove the cluster secret; "
                "both nodes need the same secret",
            )
        self._server, self._server_nonce, self._version = server, nonce, version
        ours = compute_proof(
            self._secret, "client", version, self._me, server, self._nonce, nonce, self._dial_seq
        )
        return _encode(Proof(ours))

    def receive_welcome(self, data: bytes | str) -> PeerInfo | Refused:
        """The server accepted our proof: the handshake is complete."""
        if self._server is None:
            raise RuntimeError("receive_welcome before a successful receive_challenge")
        msg = _decode(data, Welcome)
        if isinstance(msg, Refused):
            return msg
        server = self._server
        return PeerInfo(
            node_id=server.node_id,
            incarnation=server.incarnation,
            version=self._version,
            max_frame=server.max_frame,
            initiator=self._me.node_id,
            dial_seq=self._dial_seq,
        )


class ServerHandshake:
    """The accepting side of one handshake (one instance per inbound connection)."""

    def __init__(
        self,
        me: Identity,
        secret: bytes,
        nonce: bytes,
        seen: NonceLog,
        *,
        versions: tuple[int, ...] = SUPPORTED_VERSIONS,
    ) -> None:
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
        self._me = me
        self._secret = secret
        self._nonce = nonce
        self._seen = seen
        self._versions = versions
        self._client: Identity | None = None
        self._client_nonce = b""
        self._version = 0
        self._dial_seq = 0

    def receive_hello(self, data: bytes | str) -> bytes | Refused:
        """Check the client's hello; return our challenge message or a refusal."""
        msg = _decode(data, Hello)
        if isinstance(msg, Refused):
            return msg
        problem = _identity_problem(msg)
        if problem is not None:
            return problem
        node_id, incarnation, max_frame = msg.node, msg.incarnation, msg.max_frame
        versions, nonce, dial_seq, expect = msg.versions, msg.nonce, msg.dial_seq, msg.expect
        offered = {v for v in versions if isinstance(v, int) and not isinstance(v, bool)}
        common = [v for v in self._versions if v in offered]
        if not common:
            return Refused(
                CloseCode.UNSUPPORTED_VERSION,
                f"peer {node_id!r} speaks protocol versions {versions!r}; this node speaks "
                f"{list(self._versions)}",
            )
        if expect is not None and expect != self._me.node_id:
            return Refused(
                CloseCode.WRONG_NODE,
                f"peer {node_id!r} dialed node {expect!r} but this is {self._me.node_id!r}; "
                "check its peer address table",
            )
        if node_id == self._me.node_id:
            return Refused(
                CloseCode.SAME_NODE_ID,
                f"the peer uses this node's own id {node_id!r}; node ids must be unique",
            )
        if len(nonce) != NONCE_SIZE:
            return Refused(CloseCode.PROTOCOL_ERROR, f"hello nonce must be {NONCE_SIZE} bytes")
        if nonce == self._nonce or not self._seen.remember(nonce):
            return Refused(
                CloseCode.REPLAYED, f"peer {node_id!r} replayed a challenge nonce seen before"
            )
        version = max(common)
        client = Identity(node_id, incarnation, max_frame)
        self._client, self._client_nonce = client, nonce
        self._version, self._dial_seq = version, dial_seq
        proof = compute_proof(
            self._secret, "server", version, client, self._me, nonce, self._nonce, dial_seq
        )
        return _encode(
            Challenge(
                version=version,
                node=self._me.node_id,
                incarnation=self._me.incarnation,
                nonce=self._nonce,
                max_frame=self._me.max_frame,
                proof=proof,
            )
        )

    def receive_proof(self, data: bytes | str) -> PeerInfo | Refused:
        """Check the client's proof; on success the peer is authenticated."""
        client = self._client
        if client is None:
            raise RuntimeError("receive_proof before a successful receive_hello")
        msg = _decode(data, Proof)
        if isinstance(msg, Refused):
            return msg
        proof = msg.proof
        expected = compute_proof(
            self._secret,
            "client",
            self._version,
            client,
            self._me,
            self._client_nonce,
            self._nonce,
            self._dial_seq,
        )
        if not hmac.compare_digest(expected, proof):
            return Refused(
                CloseCode.BAD_PROOF,
                f"peer {client.node_id!r} could not prove the cluster secret "
                "(wrong or missing secret)",
            )
        return PeerInfo(
            node_id=client.node_id,
            incarnation=client.incarnation,
            version=self._version,
            max_frame=client.max_frame,
            initiator=client.node_id,
            dial_seq=self._dial_seq,
        )

    def welcome(self) -> bytes:
        """The last message: the client may start sending frames."""
        return _encode(Welcome())
