"""What a revision is: the artifact digest plus everything that changes how the
process runs (command, env, resources), as one pure id."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.registry import (
    AppRecord,
    Deployment,
    NodeRollout,
    PlacementRecord,
    RolloutOptions,
    RolloutRecord,
    Undecodable,
    app_key,
    decode_record,
    placement_key,
)
from corral.registry._records import deployment_revision

digests = st.text("0123456789abcdef", min_size=64, max_size=64)
commands = st.lists(st.text(max_size=8), min_size=1, max_size=3)
envs = st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=4)
megabytes = st.integers(min_value=0, max_value=1 << 20)
inputs = st.tuples(digests, commands, envs, megabytes, megabytes)


def _revision(args: tuple[str, list[str], dict[str, str], int, int]) -> str:
    digest, command, env, memory_mb, disk_mb = args
    return deployment_revision(digest, command, env, memory_mb=memory_mb, disk_mb=disk_mb)


@given(inputs, st.randoms(use_true_random=False))
def test_equal_inputs_give_equal_ids_whatever_the_env_order(
    args: tuple[str, list[str], dict[str, str], int, int], rng: random.Random
) -> None:
    digest, command, env, memory_mb, disk_mb = args
    items = list(env.items())
    rng.shuffle(items)
    shuffled = dict(items)
    assert _revision(args) == _revision((digest, list(command), shuffled, memory_mb, disk_mb))
    assert len(_revision(args)) == 64


@given(inputs, inputs)
def test_any_changed_input_gives_another_id(
    a: tuple[str, list[str], dict[str, str], int, int],
    b: tuple[str, list[str], dict[str, str], int, int],
) -> None:
    assert (_revision(a) == _revision(b)) == (a == b)


@given(inputs)
def test_a_deployment_keeps_its_digest_apart_and_round_trips(
    args: tuple[str, list[str], dict[str, str], int, int],
) -> None:
    digest, command, env, memory_mb, disk_mb = args
    deployment = Deployment.of(digest, command, env, memory_mb=memory_mb, disk_mb=disk_mb)
    assert deployment.digest == digest
    assert deployment.revision == _revision(args)
    record = AppRecord("shop", deployment=deployment, memory_mb=memory_mb, disk_mb=disk_mb)
    assert decode_record(app_key("shop"), record.encode()) == record


def test_a_record_from_before_revisions_covered_more_decodes_to_the_revision_it_runs() -> None:
    digest = "ab" * 32
    old = {
        "v": 1,
        "name": "shop",
        "replicas": "all",
        "deployment": {"revision": digest, "command": ["python3", "server.py"], "env": {}},
    }
    record = decode_record(app_key("shop"), json.dumps(old).encode())
    assert isinstance(record, AppRecord)
    assert record.deployment is not None
    # its processes run revision == digest: nothing restarts on upgrade
    assert (record.deployment.revision, record.deployment.digest) == (digest, digest)


def test_a_deployment_with_a_malformed_digest_is_undecodable() -> None:
    bad = {
        "v": 1,
        "name": "shop",
        "replicas": 1,
        "deployment": {"revision": "ab" * 32, "digest": "nope", "command": ["x"]},
    }
    record = decode_record(app_key("shop"), json.dumps(bad).encode())
    assert isinstance(record, Undecodable)
    assert "digest" in record.reason


def test_an_app_record_without_rollout_options_gets_the_defaults() -> None:
    old = {"v": 1, "name": "shop", "replicas": 1}
    record = decode_record(app_key("shop"), json.dumps(old).encode())
    assert isinstance(record, AppRecord)
    assert record.rollout == RolloutOptions(max_parallel=1, drain_ms=2000, ready_timeout_ms=60000)


def test_rollout_options_round_trip_and_out_of_bounds_ones_are_undecodable() -> None:
    record = AppRecord("shop", rollout=RolloutOptions(max_parallel=3, drain_ms=0))
    assert decode_record(app_key("shop"), record.encode()) == record
    bad = {"v": 1, "name": "shop", "replicas": 1, "rollout": {"max_parallel": 0}}
    decoded = decode_record(app_key("shop"), json.dumps(bad).encode())
    assert isinstance(decoded, Undecodable)
    assert "rollout.max_parallel" in decoded.reason


def _placement_with_rollout() -> PlacementRecord:
    rollout = RolloutRecord(
        "1" * 64,
        {
            "n1": NodeRollout("1" * 64, "done", 10.0),
            "n2": NodeRollout("1" * 64, "restarting", 11.0),
            "n3": NodeRollout("0" * 64, "pending", 10.0),
        },
        started_at=10.0,
    )
    return PlacementRecord(["n1", "n2", "n3"], decided_at=1.0, fence=4, rollout=rollout)


def test_a_placement_keeps_its_rollout_and_old_records_have_none() -> None:
    record = _placement_with_rollout()
    assert decode_record(placement_key("shop"), record.encode()) == record
    assert record.out_of_table() == frozenset({"n2"})
    old = {"v": 1, "nodes": ["n1"], "decided_at": 1.0, "fence": 2}
    decoded = decode_record(placement_key("shop"), json.dumps(old).encode())
    assert isinstance(decoded, PlacementRecord)
    assert decoded.rollout is None
    assert decoded.out_of_table() == frozenset()


_DONE = {"revision": "1" * 64, "step": "done"}


@pytest.mark.parametrize(
    ("rollout", "names"),
    [
        ("rolling", "rollout"),
        ({"revision": "nothex", "nodes": {}}, "digest"),
        ({"revision": "1" * 64, "nodes": []}, "rollout.nodes"),
        ({"revision": "1" * 64, "nodes": {"n1": {"revision": "1" * 64, "step": "up"}}}, "step"),
        ({"revision": "1" * 64, "nodes": {"bad name!": _DONE}}, "node"),
        ({"revision": "1" * 64, "nodes": {"n1": {**_DONE, "since": "x"}}}, "since"),
        ({"revision": "1" * 64, "nodes": {}, "halted": 7}, "halted"),
        (
            {"revision": "1" * 64, "nodes": {f"n{i}": {} for i in range(10_001)}},
            "at most",
        ),
    ],
)
def test_a_placement_with_a_hostile_rollout_is_undecodable(rollout: object, names: str) -> None:
    raw = {"v": 1, "nodes": ["n1"], "decided_at": 1.0, "fence": 2, "rollout": rollout}
    decoded = decode_record(placement_key("shop"), json.dumps(raw).encode())
    assert isinstance(decoded, Undecodable)
    assert names in decoded.reason


def test_a_long_halt_reason_is_cut_to_the_bound() -> None:
    rollout = RolloutRecord("1" * 64, {}, halted="x" * 5000)
    assert len(rollout.halted) == 400  # the bound of every published reason
