"""Domain checks at the request boundary (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.actors.routing import normalize_domain
from corral.node import RequestInvalid
from corral.node._requests import MAX_APP_DOMAINS, DeployRequest, check_domain, parse_domains
from corral.node.server._operations import apply_deploy
from corral.registry import AppRecord, Deployment

LABEL = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?", fullmatch=True)
# A last label that starts with a letter is never a number (an IP literal).
LAST_LABEL = st.from_regex(r"[a-zA-Z]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?", fullmatch=True).filter(
    lambda label: label.lower() != "localhost"
)
DOMAIN = st.builds(
    lambda labels, last: ".".join([*labels, last]), st.lists(LABEL, max_size=3), LAST_LABEL
)


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


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.0.0.1.",
        "10.1.2.3",
        "2130706433",  # 127.0.0.1 as one number
        "0x7f.1",  # 127.0.0.1 as a URL parser reads it
        "0x7f000001",
        "0x",
        "shop.8",
        "localhost",
        "LOCALHOST.",
        "shop.localhost",
        "[::1]",
        "::1",
        "[2001:db8::1]",
    ],
)
def test_addresses_and_localhost_are_refused_naming_the_rule(address: str) -> None:
    with pytest.raises(RequestInvalid) as caught:
        check_domain(address, "add")
    assert caught.value.field == "add"
    assert "invalid domain" in caught.value.message
    if ":" not in address:
        assert "would receive every request made to the proxy" in caught.value.message


@pytest.mark.parametrize(
    "name", ["shop.example", "127-0-0-1.example", "1.example", "0xdead.example", "x.0a", "8x"]
)
def test_names_with_digits_that_are_not_addresses_are_accepted(name: str) -> None:
    assert check_domain(name) == name


@given(st.integers(0, 2**32 - 1))
def test_no_ipv4_address_is_a_domain(number: int) -> None:
    import ipaddress

    address = ipaddress.IPv4Address(number)
    for spelling in (str(address), str(number), hex(number), f"{address}."):
        with pytest.raises(RequestInvalid):
            check_domain(spelling)
