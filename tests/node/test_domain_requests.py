"""Domain checks at the request boundary (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.actors.routing import normalize_domain
from corral.node import RequestInvalid
from corral.node._operations import apply_deploy
from corral.node._requests import MAX_APP_DOMAINS, DeployRequest, check_domain, parse_domains
from corral.registry import AppRecord, Deployment

LABEL = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?", fullmatch=True)
DOMAIN = st.lists(LABEL, min_size=1, max_size=4).map(".".join)


@given(st.lists(DOMAIN, max_size=MAX_APP_DOMAINS))
def test_parse_domains_is_sorted_unique_and_normalized(domains: list[str]) -> None:
    parsed = parse_domains(domains)
    assert list(parsed) == sorted(set(parsed))
    assert set(parsed) == {d.lower() for d in domains}
    assert all(normalize_domain(d) == d for d in parsed)
    assert parse_domains(list(parsed)) == parsed


@pytest.mark.parametrize(
    ("given_text", "expected"),
    [("Shop.Example", "shop.example"), ("shop.example.", "shop.example"), (" a.b ", "a.b")],
)
def test_check_domain_lowercases(given_text: str, expected: str) -> None:
    assert check_domain(given_text) == expected


@pytest.mark.parametrize("bad", ["", "a_b", "a..b", "-a", "a" * 64, ".", "é.example", None, 3])
def test_check_domain_refuses_naming_the_field(bad: object) -> None:
    with pytest.raises(RequestInvalid) as caught:
        check_domain(bad, "add")
    assert caught.value.field == "add"


@given(st.lists(DOMAIN, max_size=5), st.one_of(st.none(), st.lists(DOMAIN, max_size=5)))
def test_a_deploy_keeps_domains_unless_it_names_some(old: list[str], new: list[str] | None) -> None:
    deployment = Deployment(revision="0" * 64, command=["true"])
    current = AppRecord(name="shop", domains=sorted({d.lower() for d in old}))
    request = DeployRequest(
        name="shop", artifact=b"", domains=None if new is None else parse_domains(new)
    )
    after = apply_deploy(current, request, deployment)
    expected = current.domains if new is None else sorted({d.lower() for d in new})
    assert after.domains == expected
