"""LinkFaults and the switch's ruleset: pure, no namespaces needed."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.testing import LinkFaults
from corral.testing._hosts_faults import Direction, render_ruleset

HOSTS = ["a", "b", "c", "d"]
ADDRESSES = {name: f"10.231.9.{i}" for i, name in enumerate(HOSTS, start=1)}
BY_ADDRESS = {address: name for name, address in ADDRESSES.items()}
directions: st.SearchStrategy[Direction] = st.sampled_from(("both", "out", "in"))


@st.composite
def cuts(draw: st.DrawFn) -> tuple[str, list[str], Direction]:
    host = draw(st.sampled_from(HOSTS))
    others = draw(st.lists(st.sampled_from([h for h in HOSTS if h != host]), unique=True))
    return host, others, draw(directions)


@st.composite
def faults(draw: st.DrawFn) -> LinkFaults:
    value = LinkFaults()
    for host, others, direction in draw(st.lists(cuts(), max_size=5)):
        value = value.cut(host, others, direction)
    for host, percent in draw(
        st.lists(st.tuples(st.sampled_from(HOSTS), st.integers(0, 100)), max_size=4)
    ):
        value = value.lossy(host, percent)
    return value


def rendered_drops(ruleset: str) -> set[tuple[str, str]]:
    """The (sender, receiver) pairs the ruleset drops whole."""
    pairs = re.findall(r"ip saddr (\S+) ip daddr (\S+) drop", ruleset)
    return {(BY_ADDRESS[s], BY_ADDRESS[d]) for s, d in pairs}


def rendered_loss(ruleset: str) -> dict[str, set[tuple[str, int]]]:
    found: dict[str, set[tuple[str, int]]] = {}
    for match, address, percent in re.findall(
        r"^\t\tip (saddr|daddr) (\S+) (?:numgen random mod 100 < (\d+) )?drop$", ruleset, re.M
    ):
        found.setdefault(BY_ADDRESS[address], set()).add((match, int(percent or 100)))
    return found


@given(faults())
def test_the_ruleset_drops_exactly_the_cut_pairs_and_the_lossy_links(value: LinkFaults) -> None:
    ruleset = render_ruleset(value, ADDRESSES)
    assert rendered_drops(ruleset) == set(value.blocked)
    assert rendered_loss(ruleset) == {
        host: {("saddr", percent), ("daddr", percent)} for host, percent in value.loss
    }
    # It replaces the switch's rules whole, in one transaction.
    assert ruleset.startswith("flush ruleset\n")
    for sender in HOSTS:
        for receiver in HOSTS:
            dropped = (sender, receiver) in rendered_drops(ruleset)
            assert value.delivers(sender, receiver) is not dropped


@given(faults(), cuts())
def test_a_cut_blocks_the_directions_asked_and_heal_undoes_only_that_host(
    before: LinkFaults, cut: tuple[str, list[str], Direction]
) -> None:
    host, others, direction = cut
    after = before.cut(host, others, direction)
    for other in others:
        assert after.delivers(host, other) is (direction == "in" and before.delivers(host, other))
        assert after.delivers(other, host) is (direction == "out" and before.delivers(other, host))
    # Cutting never lifts another cut, nor touches loss.
    assert before.blocked <= after.blocked
    assert after.loss == before.loss
    healed = after.heal(host)
    assert not any(host in pair for pair in healed.blocked)
    assert {p for p in healed.blocked} == {p for p in before.blocked if host not in p}
    assert after.heal().blocked == frozenset()
    assert after.heal().loss == before.loss


@given(faults(), cuts())
def test_both_ways_is_out_and_in_together(
    before: LinkFaults, cut: tuple[str, list[str], Direction]
) -> None:
    host, others, _ = cut
    both = before.cut(host, others, "both")
    assert both == before.cut(host, others, "out").cut(host, others, "in")
    assert both.cut(host, others, "both") == both  # idempotent


@given(faults(), st.sampled_from(HOSTS), st.integers(0, 100))
def test_loss_is_set_per_host_and_zero_clears_it(
    before: LinkFaults, host: str, percent: int
) -> None:
    after = before.lossy(host, percent)
    assert after.loss_of(host) == percent
    assert all(after.loss_of(other) == before.loss_of(other) for other in HOSTS if other != host)
    assert (host in dict(after.loss)) is (percent > 0)
    assert after.blocked == before.blocked


@pytest.mark.parametrize("percent", [-1, 101, 2.5, True])
def test_a_loss_outside_0_to_100_percent_is_refused(percent: object) -> None:
    with pytest.raises(ValueError, match="whole percent from 0 to 100"):
        LinkFaults().lossy("a", percent)  # type: ignore[arg-type]


def test_a_host_is_not_cut_from_itself_and_unknown_hosts_are_named() -> None:
    with pytest.raises(ValueError, match="cannot be cut from itself"):
        LinkFaults().cut("a", ["a", "b"])
    with pytest.raises(ValueError, match=r"not one of 'both', 'out', 'in'"):
        LinkFaults().cut("a", ["b"], "sideways")  # type: ignore[arg-type]
    unknown = r"1 host\(s\) in the faults are not on this switch: \['z'\]"
    with pytest.raises(ValueError, match=unknown):
        render_ruleset(LinkFaults().cut("a", ["z"]), {"a": "10.231.9.1"})


def test_no_faults_is_an_empty_chain_that_accepts_everything() -> None:
    ruleset = render_ruleset(LinkFaults(), ADDRESSES)
    assert "policy accept;" in ruleset
    assert "drop" not in ruleset
