"""Request validation (pure): every error names its field."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.node import RequestInvalid
from corral.node._requests import (
    check_name,
    exec_string_problem,
    json_shape_problem,
    parse_deploy,
    parse_env,
    parse_json_body,
    parse_pairs,
    parse_replicas,
)

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


# --------------------------------------------------------------------------- JSON shape

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\u00e9'),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


def nesting(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    return 0


@settings(max_examples=300)
@given(json_values, st.booleans())
def test_the_shape_scan_measures_the_depth_json_would_build(value: object, ascii: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii).encode()
    depth = nesting(value)
    assert json_shape_problem(raw, max_depth=depth) is None
    if depth:
        assert "deeper than" in str(json_shape_problem(raw, max_depth=depth - 1))


def test_a_json_body_is_parsed_within_its_bounds() -> None:
    assert parse_json_body(b"  ") == {}
    assert parse_json_body(b'{"a": [[1]]}') == {"a": [[1]]}
    inside = b"[" * 63 + b"]" * 63  # with the body's own object: 64 levels
    assert parse_json_body(b'{"a": ' + inside + b"}")["a"] is not None
    for raw, needle in [
        (b'{"a": [' + inside + b"]}", "deeper than the 64 levels"),
        (b"[" * 100_000, "100000 arrays and objects, more than the 1024"),
        (b'["a", ' * 5000, "5000 strings, more than the 4096"),
        (b'{"a": "\xff"}', "is not UTF-8 (byte 7)"),
        (b'{"a": }', "is not JSON: Expecting value"),
        (b"[1]", "must be a JSON object"),
    ]:
        with pytest.raises(RequestInvalid, match=re.escape(needle)) as caught:
            parse_json_body(raw)
        assert caught.value.field == "body"


def test_exec_strings_refuse_nul_and_lone_surrogates() -> None:
    assert exec_string_problem("plain \n\t text é") is None
    assert "NUL byte (at offset 1)" in str(exec_string_problem("a\x00"))
    assert "lone surrogate" in str(exec_string_problem("\udc80"))
