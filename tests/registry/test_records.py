"""The key space and the records: round trips, refusals, undecodable values."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.registry import (
    COORDINATOR_LEASE_KEY,
    ROUTING_KEY,
    AliasRecord,
    AppRecord,
    CoordinatorLease,
    Deployment,
    InvalidKey,
    InvalidName,
    KeyKind,
    MeasuredCapacity,
    NodeAssignment,
    NodeDown,
    NodeIntent,
    NodeRecord,
    NodeRollout,
    PlacementRecord,
    PortClaim,
    Record,
    RolloutRecord,
    ServingEntry,
    Undecodable,
    alias_key,
    alias_previous_key,
    app_key,
    artifact_key,
    assign_key,
    decode_record,
    down_key,
    intent_key,
    is_valid_key,
    node_key,
    parse_key,
    placement_key,
    port_key,
    validate_name,
)
from corral.registry._records import Artifact, RoutingTable

DIGEST = hashlib.sha256(b"artifact").hexdigest()

EXAMPLES: list[tuple[str, Record]] = [
    (
        app_key("web"),
        AppRecord(
            "web",
            replicas="all",
            selector={"zone": "a"},
            memory_mb=256,
            disk_mb=100,
            pinned=True,
            deployment=Deployment(DIGEST, ["python", "app.py"], {"A": "1"}, 1700000000.5),
            domains=["web.example"],
            labels={"team": "x"},
        ),
    ),
    (app_key("api"), AppRecord("api", replicas=3, retired=True, teardown_pending=True)),
    (
        node_key("n1"),
        NodeRecord(
            "n1",
            state="suspect",
            down_since=12.5,
            labels={"zone": "a"},
            rack="r1",
            datacenter="dc1",
            peer_address="10.0.0.1:7000",
            api_address="127.0.0.1:7001",
            advertise_host="10.0.0.1",
            capacity=MeasuredCapacity(1024, 512, 10_000, 9_000),
            serving={"web": ServingEntry(DIGEST, 24001, 24002, "running", 2)},
            change_token=7,
            started_at=100.0,
        ),
    ),
    (intent_key("n1"), NodeIntent(cordoned=True, draining=True)),
    (
        down_key("n1"),
        NodeDown(
            "n1", 12.5, {"zone": "a"}, "r1", "dc1", MeasuredCapacity(1024, 512, 10_000, 9_000),
            incarnation=7, instance="n1.a1b2",
        ),
    ),
    (down_key("n2"), NodeDown("n2")),
    (placement_key("web"), PlacementRecord(["n2", "n1"], 5.0, 9, {"n1": 4.0})),
    (placement_key("db"), PlacementRecord(["n1"], 5.0, 9, reserved=(512, 1000))),
    (COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 3.0)),
    (port_key("n1", 24001), PortClaim("n1", 24001, "web", 2.0)),
    (alias_key("web.example"), AliasRecord("web")),
    (alias_previous_key("web.example"), AliasRecord("api")),
    (ROUTING_KEY, RoutingTable({"web.example": ["http://10.0.0.1:24001"]})),
    (artifact_key(DIGEST), Artifact.of(b"artifact")),
]


@pytest.mark.parametrize(("key", "record"), EXAMPLES, ids=[k for k, _ in EXAMPLES])
def test_every_record_round_trips(key: str, record: Record) -> None:
    assert decode_record(key, record.encode()) == record


def test_json_records_carry_the_schema_version() -> None:
    assert json.loads(AliasRecord("web").encode()) == {"v": 1, "app": "web"}


def test_placement_nodes_are_kept_sorted() -> None:
    assert PlacementRecord(["c", "a", "b", "a"], 0.0, 1).nodes == ["a", "b", "c"]


def test_keys_parse_into_kinds_and_parts() -> None:
    assert parse_key("apps/web") == (KeyKind.APP, ("web",))
    assert parse_key("ports/n1/24000") == (KeyKind.PORT, ("n1", "24000"))
    assert parse_key("alias/a.example/previous") == (KeyKind.ALIAS_PREVIOUS, ("a.example",))
    assert parse_key("lease/coordinator")[0] is KeyKind.COORDINATOR_LEASE
    assert parse_key("routing") == (KeyKind.ROUTING, ())
    assert parse_key(f"artifacts/{DIGEST}") == (KeyKind.ARTIFACT, (DIGEST,))


@pytest.mark.parametrize(
    "key",
    [
        "",
        "apps",
        "apps/",
        "apps/Web",
        "apps/-web",
        "apps/web/extra",
        "nodes/" + "a" * 64,
        "ports/n1/0",
        "ports/n1/65536",
        "ports/n1/024000",
        "ports/n1",
        "alias/bad..domain",
        "alias/a.example/next",
        "artifacts/abc",
        "lease/other",
        "routing/x",
        "other/thing",
    ],
)
def test_keys_outside_the_key_space_are_refused(key: str) -> None:
    with pytest.raises(InvalidKey, match="accepted: apps/<app>"):
        parse_key(key)
    assert not is_valid_key(key)


def test_bad_names_say_what_is_allowed() -> None:
    with pytest.raises(InvalidName, match="1-63 characters of a-z, 0-9 and '-'"):
        validate_name("app", "Web_1")
    with pytest.raises(InvalidName):
        app_key("")
    with pytest.raises(InvalidName):
        port_key("n1", 0)
    with pytest.raises(InvalidName):
        AppRecord("UPPER")
    with pytest.raises(ValueError, match="replicas"):
        AppRecord("web", replicas=0)


NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


@settings(max_examples=200)
@given(st.text(alphabet="abcz09-_A.", max_size=70))
def test_validate_name_accepts_exactly_dns_labels(name: str) -> None:
    valid = NAME.fullmatch(name) is not None
    try:
        validate_name("node", name)
    except InvalidName:
        assert not valid
    else:
        assert valid
        assert parse_key(node_key(name)) == (KeyKind.NODE, (name,))


@settings(max_examples=200)
@given(st.sampled_from([k for k, _ in EXAMPLES]), st.binary(max_size=200))
def test_decoding_never_raises(key: str, value: bytes) -> None:
    decoded = decode_record(key, value)
    assert isinstance(decoded, Undecodable) or decoded.encode() is not None


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("apps/web", b"\xff\xfe", "not UTF-8 JSON"),
        ("apps/web", b"[1, 2]", "not a JSON object"),
        ("apps/web", b'{"name": "web", "replicas": 1}', "schema version"),
        ("apps/web", b'{"v": 2, "name": "web", "replicas": 1}', "v=2"),
        ("apps/web", b'{"v": true, "name": "web", "replicas": 1}', "schema version"),
        ("apps/web", b'{"v": 1, "name": "web"}', "'replicas' is missing"),
        ("apps/web", b'{"v": 1, "name": "web", "replicas": 0}', "replicas"),
        ("apps/web", b'{"v": 1, "name": "web", "replicas": true}', "integer"),
        ("apps/web", b'{"v": 1, "name": "other", "replicas": 1}', "key names 'web'"),
        ("apps/web", b'{"v": 1, "name": "web", "replicas": 1, "selector": {"a": 1}}', "string"),
        ("nodes/n1", b'{"v": 1, "id": "n1", "state": "sleepy"}', "one of alive"),
        ("nodes/n1", b'{"v": 1, "id": "n1", "state": "alive", "serving": []}', "object"),
        ("down/n1", b'{"v": 1, "node": "n2"}', "key names 'n1'"),
        ("down/n1", b'{"v": 1, "node": "n1", "down_since": "x"}', "number"),
        ("placement/web", b'{"v": 1, "nodes": ["a"], "decided_at": "x", "fence": 1}', "number"),
        (
            "ports/n1/24000",
            b'{"v": 1, "node": "n1", "port": 24001, "app": "web", "claimed_at": 1}',
            "port 24000",
        ),
        (f"artifacts/{DIGEST}", b"other bytes", "hash to"),
        ("bogus", b"{}", "outside the key space"),
    ],
)
def test_bad_values_are_undecodable_with_a_reason(key: str, value: bytes, reason: str) -> None:
    decoded = decode_record(key, value)
    assert isinstance(decoded, Undecodable)
    assert decoded.key == key
    assert reason in decoded.reason


def test_an_assignment_index_keeps_its_stamps_and_reads_one_written_without() -> None:
    index = NodeAssignment("n1", ["b", "a"], {"a": "1" * 16, "b": "2" * 16, "gone": "3" * 16})
    assert index.stamps == {"a": "1" * 16, "b": "2" * 16}  # only apps it lists
    assert decode_record(assign_key("n1"), index.encode()) == index
    old = b'{"v": 1, "node": "n1", "apps": ["a"]}'
    assert decode_record(assign_key("n1"), old) == NodeAssignment("n1", ["a"])
    # A placement's stamp for a node moves with the app's spec and the revision its
    # rollout names for that node, and only then.
    plain = PlacementRecord(["n1", "n2"], 1.0, 1, spec="s1")
    assert decode_record("placement/a", plain.encode()) == plain
    rollout = RolloutRecord(
        "1" * 64, {"n1": NodeRollout("1" * 64, "restarting"), "n2": NodeRollout("0" * 64)}
    )
    rolling = PlacementRecord(["n1", "n2"], 2.0, 2, rollout=rollout, spec="s1")
    assert rolling.stamp_for("n1") != plain.stamp_for("n1")
    assert PlacementRecord(["n1"], 3.0, 3, spec="s1").stamp_for("n1") == plain.stamp_for("n1")
    assert PlacementRecord(["n1"], 1.0, 1, spec="s2").stamp_for("n1") != plain.stamp_for("n1")
