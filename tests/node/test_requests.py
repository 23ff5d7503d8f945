"""Request validation (pure): every error names its field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.node._errors import RequestInvalid
from corral.node._requests import check_name, parse_deploy, parse_env, parse_pairs, parse_replicas

from .conftest import b64


@settings(max_examples=80)
@given(st.integers(min_value=-5, max_value=10_000))
def test_replicas_accepts_exactly_whole_numbers_from_one(n: int) -> None:
    if n >= 1:
        assert parse_replicas(n) == n == parse_replicas(str(n))
    else:
        with pytest.raises(RequestInvalid) as caught:
            parse_replicas(n)
        assert caught.value.field == "replicas"


def test_replicas_zero_says_what_to_do_instead() -> None:
    with pytest.raises(RequestInvalid, match="retir"):
        parse_replicas(0)
    assert parse_replicas("all") == "all"
    with pytest.raises(RequestInvalid):
        parse_replicas(True)


def test_names_follow_dns_label_rules() -> None:
    assert check_name("app", "shop-2") == "shop-2"
    for bad in ["", "Shop", "shop_2", "-shop", "shop-", "a" * 64]:
        with pytest.raises(RequestInvalid, match="a-z, 0-9") as caught:
            check_name("app", bad)
        assert caught.value.field == "name"
    with pytest.raises(RequestInvalid, match="must be a string"):
        check_name("app", 7)


def test_pairs_and_env() -> None:
    assert parse_pairs(["a=1", "b = 2"], "selector") == {"a": "1", "b": "2"}
    with pytest.raises(RequestInvalid, match="key=value"):
        parse_pairs(["nope"], "selector")
    with pytest.raises(RequestInvalid):
        parse_pairs({"": "x"}, "selector")
    assert parse_env({"A_1": "x"}) == {"A_1": "x"}
    with pytest.raises(RequestInvalid, match="environment variable"):
        parse_env({"A-1": "x"})


def test_parse_deploy_leaves_unnamed_fields_none() -> None:
    request = parse_deploy("shop", {"artifact": b64(b"x")})
    assert request.artifact == b"x"
    assert (request.replicas, request.selector, request.pinned, request.env) == (
        None,
        None,
        None,
        None,
    )
    with pytest.raises(RequestInvalid) as caught:
        parse_deploy("shop", {})
    assert caught.value.field == "artifact"
