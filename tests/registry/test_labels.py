"""The one label syntax (Kubernetes'): node labels, selectors and the records holding them."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.registry import (
    MAX_LABELS,
    AppRecord,
    InvalidName,
    NodeRecord,
    Undecodable,
    app_key,
    decode_record,
    validate_label,
    validate_labels,
)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("zone", "a"),
        ("zone", ""),
        ("Zone.Name_x-9", "EU_west.1-b"),
        ("example.com/zone", "a"),
        ("a.b-c.d/x", "y"),
        ("k" * 63, "v" * 63),
        ("p" * 63 + "." + "q" * 63 + "/k", "v"),
    ],
)
def test_labels_kubernetes_allows_are_allowed(key: str, value: str) -> None:
    validate_label(key, value)  # raises InvalidName when refused
    assert validate_labels({key: value}) == {key: value}


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("", "a", "key '' is invalid"),
        ("zone\x1b[31m", "a", r"key 'zone\x1b[31m' is invalid"),
        ("zone", "a\nb", r"'zone' has an invalid value 'a\nb'"),
        ("zone", "a\x00", r"invalid value 'a\x00'"),
        ("-zone", "a", "is invalid"),
        ("zone-", "a", "is invalid"),
        ("k" * 64, "a", "is invalid"),
        ("zone", "v" * 64, "invalid value"),
        ("zone", "-a", "invalid value"),
        ("a b", "c", "is invalid"),
        ("a=b", "c", "is invalid"),
        ("/zone", "a", "is invalid"),
        ("Example.com/zone", "a", "is invalid"),
        ("a/b/c", "d", "is invalid"),
        ("zóne", "a", "is invalid"),
        ("p" * 254 + "/k", "a", "is invalid"),
    ],
)
def test_labels_outside_the_syntax_are_refused_naming_the_key(
    key: str, value: str, needle: str
) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_label(key, value)
    assert needle in str(caught.value)


@given(st.text(max_size=70), st.text(max_size=70))
def test_an_accepted_label_holds_no_control_character_space_or_equals(key: str, value: str) -> None:
    try:
        validate_label(key, value)
        refused = ""
    except InvalidName as exc:
        refused = str(exc)
    if refused:
        assert repr(key) in refused  # the message names the key, escaped
        return
    for text in (key, value):
        assert text.isascii()
        assert not any(unicodedata.category(c) == "Cc" or c in " =" for c in text)


def test_the_count_is_bounded() -> None:
    validate_labels({f"k{i}": "v" for i in range(MAX_LABELS)})
    with pytest.raises(InvalidName, match=f"{MAX_LABELS + 1} label pairs, more than the 64"):
        validate_labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})


def test_records_refuse_labels_and_selectors_outside_the_syntax() -> None:
    with pytest.raises(InvalidName, match="selector key"):
        AppRecord("web", selector={"bad key": "x"})
    with pytest.raises(InvalidName, match="label"):
        NodeRecord("n1", labels={"zone": "\x1b[2J"})


def test_a_stored_selector_outside_the_syntax_decodes_as_undecodable() -> None:
    value = json.dumps({"v": 1, "name": "web", "replicas": 1, "selector": {"z\n": "a"}})
    decoded = decode_record(app_key("web"), value.encode())
    assert isinstance(decoded, Undecodable)
    assert r"selector key 'z\n' is invalid" in decoded.reason
