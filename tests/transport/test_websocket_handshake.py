"""The pure peer handshake: mutual HMAC proofs, replay refusal, version and identity checks."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.transport._handshake import (
    NONCE_SIZE,
    ClientHandshake,
    CloseCode,
    Identity,
    NonceLog,
    PeerInfo,
    Refused,
    ServerHandshake,
)

SECRET = b"cluster-secret"
A = Identity("node-a", b"inc-a", 1 << 20)
B = Identity("node-b", b"inc-b", 2048)


def nonce(tag: int) -> bytes:
    return bytes([tag]) * NONCE_SIZE


def run(
    client_secret: bytes = SECRET,
    server_secret: bytes = SECRET,
    *,
    client_nonce: bytes = nonce(1),
    server_nonce: bytes = nonce(2),
    client_log: NonceLog | None = None,
    server_log: NonceLog | None = None,
    expect: str | None = "node-b",
) -> tuple[PeerInfo | Refused, PeerInfo | Refused | None]:
    """Run one handshake in memory; returns (client outcome, server outcome)."""
    client_log = NonceLog() if client_log is None else client_log
    server_log = NonceLog() if server_log is None else server_log
    client = ClientHandshake(A, client_secret, client_nonce, client_log, expect=expect, dial_seq=7)
    server = ServerHandshake(B, server_secret, server_nonce, server_log)
    challenge = server.receive_hello(client.hello())
    if isinstance(challenge, Refused):
        return challenge, challenge
    proof = client.receive_challenge(challenge)
    if isinstance(proof, Refused):
        return proof, None
    accepted = server.receive_proof(proof)
    if isinstance(accepted, Refused):
        return accepted, accepted
    return client.receive_welcome(server.welcome()), accepted


def test_matching_secrets_authenticate_both_sides() -> None:
    client_view, server_view = run()
    assert client_view == PeerInfo("node-b", b"inc-b", 2, 2048, "node-a", 7)
    assert server_view == PeerInfo("node-a", b"inc-a", 2, 1 << 20, "node-a", 7)


def test_no_secret_on_both_sides_is_accepted() -> None:
    client_view, server_view = run(b"", b"")
    assert isinstance(client_view, PeerInfo)
    assert isinstance(server_view, PeerInfo)


@pytest.mark.parametrize(
    ("client_secret", "server_secret"),
    [(b"wrong", SECRET), (b"", SECRET), (SECRET, b"")],
    ids=["wrong-secret", "client-missing-secret", "server-missing-secret"],
)
def test_wrong_or_missing_secret_is_refused(client_secret: bytes, server_secret: bytes) -> None:
    # The server proves itself first, so the client is the one that notices.
    client_view, _ = run(client_secret, server_secret)
    assert isinstance(client_view, Refused)
    assert client_view.code is CloseCode.BAD_PROOF
    assert "secret" in client_view.reason


def test_server_refuses_a_client_that_cannot_prove_the_secret() -> None:
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    client = ClientHandshake(A, b"wrong", nonce(1), NonceLog(), expect="node-b", dial_seq=1)
    server.receive_hello(client.hello())
    forged = cbor2.dumps({"t": "proof", "proof": b"\0" * 32})
    refused = server.receive_proof(forged)
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.BAD_PROOF
    assert "node-a" in refused.reason


def test_a_replayed_hello_nonce_is_refused() -> None:
    seen = NonceLog()
    first, _ = run(server_log=seen, server_nonce=nonce(2))
    assert isinstance(first, PeerInfo)
    replay, _ = run(server_log=seen, server_nonce=nonce(3))
    assert isinstance(replay, Refused)
    assert replay.code is CloseCode.REPLAYED


def test_a_recorded_proof_is_useless_on_a_new_connection() -> None:
    # Record a whole good exchange, then replay the client's proof against a
    # server that drew a fresh nonce: the proof binds the old nonce.
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect="node-b", dial_seq=1)
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    hello = client.hello()
    proof = client.receive_challenge(server.receive_hello(hello))
    assert isinstance(proof, bytes)
    fresh = ServerHandshake(B, SECRET, nonce(9), NonceLog())
    fresh.receive_hello(hello)
    refused = fresh.receive_proof(proof)
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.BAD_PROOF


def test_a_reflected_challenge_is_refused() -> None:
    # A server that echoes the client's own nonce back is replaying it.
    client_view, _ = run(client_nonce=nonce(5), server_nonce=nonce(5))
    assert isinstance(client_view, Refused)
    assert client_view.code is CloseCode.REPLAYED


def test_unsupported_version_is_refused_by_the_server() -> None:
    client = ClientHandshake(
        A, SECRET, nonce(1), NonceLog(), expect=None, dial_seq=1, versions=(99,)
    )
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    refused = server.receive_hello(client.hello())
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.UNSUPPORTED_VERSION
    assert "99" in refused.reason


def test_unsupported_version_is_refused_by_the_client() -> None:
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect=None, dial_seq=1)
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog(), versions=(2, 3))
    challenge = cbor2.loads(server.receive_hello(client.hello()))  # type: ignore[arg-type]
    challenge["version"] = 3
    refused = client.receive_challenge(cbor2.dumps(challenge))
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.UNSUPPORTED_VERSION


def test_a_node_speaking_only_version_1_is_refused() -> None:
    # Version 1 carried one frame per WebSocket message; version 2 carries packets.
    # An older node must be refused at the handshake, never have its frames misread.
    old = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect=None, dial_seq=1, versions=(1,))
    refused = ServerHandshake(B, SECRET, nonce(2), NonceLog()).receive_hello(old.hello())
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.UNSUPPORTED_VERSION


def test_highest_common_version_is_chosen() -> None:
    client = ClientHandshake(A, b"", nonce(1), NonceLog(), expect=None, dial_seq=1, versions=(1, 2))
    server = ServerHandshake(B, b"", nonce(2), NonceLog(), versions=(1, 2, 3))
    challenge = server.receive_hello(client.hello())
    assert isinstance(challenge, bytes)
    assert cbor2.loads(challenge)["version"] == 2


def test_dialing_the_wrong_node_is_refused_on_both_sides() -> None:
    client_view, _ = run(expect="node-c")
    assert isinstance(client_view, Refused)
    assert client_view.code is CloseCode.WRONG_NODE
    # and the client side checks too, should the server not
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect="node-c", dial_seq=1)
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    hello = cbor2.loads(client.hello())
    hello["expect"] = None
    challenge = server.receive_hello(cbor2.dumps(hello))
    refused = client.receive_challenge(challenge)  # type: ignore[arg-type]
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.WRONG_NODE


def test_a_peer_with_our_own_node_id_is_refused() -> None:
    client = ClientHandshake(
        Identity("node-b", b"x", 10), SECRET, nonce(1), NonceLog(), expect=None, dial_seq=1
    )
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    refused = server.receive_hello(client.hello())
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.SAME_NODE_ID


@pytest.mark.parametrize(
    "message",
    [
        "text, not binary",
        b"\xff\xfe not cbor",
        cbor2.dumps([1, 2, 3]),
        cbor2.dumps({"t": "proof"}),
        cbor2.dumps({"t": "hello", "node": "x"}),
        cbor2.dumps({"t": "hello", "versions": [1], "node": "", "incarnation": b"i",
                     "nonce": nonce(1), "max_frame": 10, "dial_seq": 1}),
        cbor2.dumps({"t": "hello", "versions": [1], "node": "x", "incarnation": b"i",
                     "nonce": b"short", "max_frame": 10, "dial_seq": 1}),
        cbor2.dumps({"t": "hello", "versions": [True], "node": "x", "incarnation": b"i",
                     "nonce": nonce(1), "max_frame": 10, "dial_seq": 1}),
        b"\x00" * 5000,
    ],
)  # fmt: skip
def test_malformed_hello_is_refused_not_raised(message: bytes | str) -> None:
    refused = ServerHandshake(B, SECRET, nonce(2), NonceLog()).receive_hello(message)
    assert isinstance(refused, Refused)
    assert refused.code in (CloseCode.PROTOCOL_ERROR, CloseCode.UNSUPPORTED_VERSION)


def test_a_field_of_the_wrong_type_is_refused_naming_it() -> None:
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect="node-b", dial_seq=1)
    hello = cbor2.loads(client.hello())
    hello["max_frame"] = "big"
    refused = ServerHandshake(B, SECRET, nonce(2), NonceLog()).receive_hello(cbor2.dumps(hello))
    assert refused == Refused(CloseCode.PROTOCOL_ERROR, "hello.max_frame: expected int, got str")
    del hello["max_frame"]
    refused = ServerHandshake(B, SECRET, nonce(2), NonceLog()).receive_hello(cbor2.dumps(hello))
    assert isinstance(refused, Refused)
    assert "missing max_frame" in refused.reason


def test_a_hello_from_a_later_version_still_negotiates() -> None:
    # A newer peer offers version 3 too and says more in its hello: this node answers
    # with the version both speak, ignoring the fields it does not know.
    client = ClientHandshake(
        A, SECRET, nonce(1), NonceLog(), expect="node-b", dial_seq=1, versions=(2, 3)
    )
    hello = cbor2.loads(client.hello())
    hello["compression"] = ["zstd"]
    challenge = ServerHandshake(B, SECRET, nonce(2), NonceLog()).receive_hello(
        cbor2.dumps(hello)
    )
    assert isinstance(challenge, bytes)
    assert cbor2.loads(challenge)["version"] == 2


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_authenticate(data: bytes) -> None:
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    assert isinstance(server.receive_hello(data), Refused)
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect="node-b", dial_seq=1)
    client.hello()
    assert isinstance(client.receive_challenge(data), Refused)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=31), st.integers(min_value=1, max_value=255))
def test_any_bit_flip_in_the_client_proof_is_refused(index: int, flip: int) -> None:
    client = ClientHandshake(A, SECRET, nonce(1), NonceLog(), expect="node-b", dial_seq=1)
    server = ServerHandshake(B, SECRET, nonce(2), NonceLog())
    proof_message = client.receive_challenge(server.receive_hello(client.hello()))  # type: ignore[arg-type]
    assert isinstance(proof_message, bytes)
    proof = bytearray(cbor2.loads(proof_message)["proof"])
    proof[index] ^= flip
    refused = server.receive_proof(cbor2.dumps({"t": "proof", "proof": bytes(proof)}))
    assert isinstance(refused, Refused)
    assert refused.code is CloseCode.BAD_PROOF


def test_nonce_log_is_bounded_and_remembers_recent_nonces() -> None:
    log = NonceLog(capacity=3)
    assert all(log.remember(bytes([i])) for i in range(5))
    assert len(log) == 3
    assert not log.remember(bytes([4]))
    assert bytes([0]) not in log
    assert log.remember(bytes([0]))  # forgotten, so accepted again
