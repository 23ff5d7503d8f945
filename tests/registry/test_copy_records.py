"""copies/<digest> and held/<node>: round trips, hostile values, key shapes."""

from __future__ import annotations

import hashlib

import pytest

from corral.registry import (
    CopyAssignment,
    HeldCopies,
    KeyKind,
    Undecodable,
    copies_key,
    decode_record,
    held_key,
    parse_key,
)

D = hashlib.sha256(b"x").hexdigest()
E = hashlib.sha256(b"y").hexdigest()


def test_assignments_and_holdings_round_trip() -> None:
    copy = CopyAssignment(D, ["n1", "n2"], size=10, apps=["web"])
    assert decode_record(copy.key, copy.encode()) == copy
    assert copy.sha256 == D
    held = HeldCopies("n1", {D: 10, E: 3})
    assert decode_record(held.key, held.encode()) == held
    assert parse_key(copies_key(D)) == (KeyKind.COPIES, (D,))
    assert parse_key(held_key("n1")) == (KeyKind.HELD, ("n1",))


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (f"copies/{D}", b'{"v":1,"digest":"%s","holders":["n1"]}' % E.encode(), "names artifact"),
        (f"copies/{D}", b'{"v":1,"digest":"%s","holders":["N 1"]}' % D.encode(), "invalid node"),
        (
            f"copies/{D}",
            b'{"v":1,"digest":"%s","sha256":"%s","holders":[]}' % (D.encode(), E.encode()),
            "sha256",
        ),
        ("held/n1", b'{"v":1,"node":"n2","copies":{}}', "names node"),
        ("held/n1", b'{"v":1,"node":"n1","copies":{"zz":1}}', "digest"),
        ("held/n1", b'{"v":1,"node":"n1","copies":{"%s":-1}}' % D.encode(), "copies"),
    ],
)
def test_bad_values_are_undecodable(key: str, value: bytes, reason: str) -> None:
    decoded = decode_record(key, value)
    assert isinstance(decoded, Undecodable)
    assert reason in decoded.reason


