"""The ``domain/<domain>`` claim key and its record."""

from __future__ import annotations

import pytest

from corral.registry import (
    AliasRecord,
    DomainClaim,
    InvalidKey,
    InvalidName,
    KeyKind,
    Undecodable,
    decode_record,
    domain_key,
    parse_key,
)


def test_a_claim_key_names_one_domain() -> None:
    assert domain_key("shop.example") == "domain/shop.example"
    assert parse_key("domain/shop.example") == (KeyKind.DOMAIN, ("shop.example",))
    for bad in ("domain/Shop.Example", "domain/a..b", "domain/a/b", "domain/"):
        with pytest.raises(InvalidKey, match="domain/<domain>"):
            parse_key(bad)
    with pytest.raises(InvalidName, match="invalid domain"):
        domain_key("-x.example")


def test_a_claim_round_trips_and_is_not_an_alias() -> None:
    claim = DomainClaim("shop")
    assert decode_record("domain/shop.example", claim.encode()) == claim
    assert decode_record("alias/shop.example", claim.encode()) == AliasRecord("shop")
    assert claim != AliasRecord("shop")  # one shape, two meanings
    bad = decode_record("domain/shop.example", b'{"v": 1, "app": "Not An App"}')
    assert isinstance(bad, Undecodable)
    assert "invalid app name" in bad.reason
    with pytest.raises(InvalidName):
        DomainClaim("")
