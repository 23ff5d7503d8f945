"""Pure rules of the WebSocket transport: backoff, addresses, connection tie-break, control."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.transport import ReconnectPolicy
from corral.transport._ws_rules import (
    ConnectionKey,
    FrameRefusal,
    check_listen_address,
    format_address,
    frame_refusal_message,
    is_loopback_host,
    new_connection_wins,
    parse_control_message,
    parse_peer_address,
    reconnect_delay,
)

POLICY = ReconnectPolicy(initial=0.1, factor=2.0, maximum=2.0, jitter=0.5)


def test_backoff_doubles_up_to_the_maximum_without_jitter() -> None:
    delays = [reconnect_delay(POLICY, n, 0.0) for n in range(8)]
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_jitter_shortens_by_at_most_its_fraction() -> None:
    assert reconnect_delay(POLICY, 3, 0.5) == pytest.approx(0.4 * 0.75)
    assert reconnect_delay(POLICY, 3, 0.999999) == pytest.approx(0.2, rel=1e-5)


@settings(max_examples=80)
@given(
    failures=st.integers(min_value=1, max_value=10_000),
    u=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    initial=st.floats(min_value=0.001, max_value=5.0),
    factor=st.floats(min_value=1.0, max_value=10.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_backoff_stays_within_its_bounds(
    failures: int, u: float, initial: float, factor: float, jitter: float
) -> None:
    policy = ReconnectPolicy(initial=initial, factor=factor, maximum=initial * 20, jitter=jitter)
    delay = reconnect_delay(policy, failures, u)
    assert 0 <= delay <= policy.maximum
    assert delay >= min(policy.initial, policy.maximum) * (1 - jitter) - 1e-12
    # never shorter than the previous attempt's un-jittered floor allows
    assert reconnect_delay(policy, failures + 1, 0.0) >= reconnect_delay(policy, failures, 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 3.0, "maximum": 1.0}, {"factor": 0.5}, {"jitter": 1.5}],
)
def test_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="ReconnectPolicy"):
        ReconnectPolicy(**kwargs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7401", ("127.0.0.1", 7401)),
        ("node-b.example:9", ("node-b.example", 9)),
        ("[::1]:7401", ("::1", 7401)),
    ],
)
def test_peer_addresses_round_trip(text: str, expected: tuple[str, int]) -> None:
    assert parse_peer_address(text) == expected
    assert format_address(*expected) == text


@pytest.mark.parametrize("text", ["localhost", "127.0.0.1:", ":80", "h:0", "h:70000", "h:x"])
def test_bad_peer_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="address"):
        parse_peer_address(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("10.0.0.5", False),
        ("example.org", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_listening_beyond_loopback_needs_a_secret() -> None:
    check_listen_address("127.0.0.1", has_secret=False)
    check_listen_address("0.0.0.0", has_secret=True)
    with pytest.raises(ValueError, match="without a cluster secret"):
        check_listen_address("0.0.0.0", has_secret=False)


def test_lower_node_ids_dial_wins_the_simultaneous_dial() -> None:
    from_a = ConnectionKey("a", 1, b"inc")
    from_b = ConnectionKey("b", 1, b"inc")
    # at node a (peer b) and at node b (peer a) the same connection survives
    assert new_connection_wins("a", "b", from_a, from_b)
    assert not new_connection_wins("a", "b", from_b, from_a)
    assert new_connection_wins("b", "a", from_a, from_b)
    assert not new_connection_wins("b", "a", from_b, from_a)


def test_a_restarted_peer_replaces_its_stale_connection() -> None:
    old = ConnectionKey("a", 5, b"old-life")
    new = ConnectionKey("b", 1, b"new-life")
    assert new_connection_wins("a", "b", new, old)


keys = st.builds(
    ConnectionKey,
    initiator=st.sampled_from(["a", "b"]),
    dial_seq=st.integers(min_value=1, max_value=5),
    peer_incarnation=st.just(b"same"),
)


@settings(max_examples=80)
@given(keys, keys)
def test_both_ends_agree_on_the_surviving_connection(k1: ConnectionKey, k2: ConnectionKey) -> None:
    if k1 == k2:
        return
    # Exactly one of two distinct connections wins, whichever arrives second,
    # and the answer is the same at both ends of the pair.
    for local, peer in (("a", "b"), ("b", "a")):
        assert new_connection_wins(local, peer, k1, k2) != new_connection_wins(local, peer, k2, k1)
    assert new_connection_wins("a", "b", k1, k2) == new_connection_wins("b", "a", k1, k2)


def test_frame_refusal_round_trips_as_a_control_message() -> None:
    text = frame_refusal_message(2_000_000, 1 << 20)
    assert parse_control_message(text) == FrameRefusal("frame-too-large", 2_000_000, 1 << 20)


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"t": "other"}', '{"t": "refused", "size": "x"}', "x" * 5000]
)
def test_unknown_control_messages_are_ignored(text: str) -> None:
    assert parse_control_message(text) is None
