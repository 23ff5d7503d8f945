"""What a node writes about itself: fresh, rewritten, refreshed."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

import corral.actors.node_record as node_record
from corral.actors.node_record import NodeIdentity
from corral.actors.node_record._record import capacity_update, fresh_record, rewritten_record
from corral.registry import MeasuredCapacity, NodeRecord, ServingEntry

IDENTITY = NodeIdentity(
    "n1",
    labels={"tier": "fast"},
    rack="r1",
    datacenter="dc1",
    peer_address="127.0.0.1:7000",
    api_address="127.0.0.1:7400",
    advertise_host="127.0.0.1",
)
CAPACITY = MeasuredCapacity(
    memory_mb=4096, memory_free_mb=2048, disk_mb=100_000, disk_free_mb=50_000
)
SERVING = {"shop": ServingEntry(revision="a" * 64, public_port=24001, internal_port=24002)}


def isort_order(name: str) -> tuple[int, str]:
    """ruff's __all__ order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted() -> None:
    assert node_record.__all__ == sorted(node_record.__all__, key=isort_order)
    for name in node_record.__all__:
        assert hasattr(node_record, name)


def test_fresh_record_of_a_first_life() -> None:
    record = fresh_record(IDENTITY, capacity=CAPACITY, started_at=5.0, previous=None)
    assert record == NodeRecord(
        id="n1",
        state="alive",
        labels={"tier": "fast"},
        rack="r1",
        datacenter="dc1",
        peer_address="127.0.0.1:7000",
        api_address="127.0.0.1:7400",
        advertise_host="127.0.0.1",
        capacity=CAPACITY,
        serving={},
        change_token=0,
        started_at=5.0,
    )


def test_fresh_record_forgets_what_a_previous_life_served() -> None:
    previous = NodeRecord(
        id="n1", state="down", down_since=3.0, serving=SERVING, change_token=7, started_at=1.0
    )
    record = fresh_record(IDENTITY, capacity=None, started_at=9.0, previous=previous)
    assert record.serving == {}
    assert record.change_token == 8
    assert record.state == "alive"
    assert record.down_since is None
    assert record.started_at == 9.0


def test_rewrite_after_lease_loss_keeps_serving_and_moves_the_token() -> None:
    last = fresh_record(IDENTITY, capacity=CAPACITY, started_at=5.0, previous=None)
    last = dataclasses.replace(last, serving=SERVING, change_token=3)
    record = rewritten_record(IDENTITY, capacity=CAPACITY, last_seen=last, stored=None)
    assert record.serving == SERVING
    assert record.change_token == 4
    assert record.started_at == 5.0


def test_rewrite_prefers_what_is_stored() -> None:
    last = fresh_record(IDENTITY, capacity=CAPACITY, started_at=5.0, previous=None)
    stored = dataclasses.replace(last, serving=SERVING, change_token=9)
    record = rewritten_record(IDENTITY, capacity=None, last_seen=last, stored=stored)
    assert record.serving == SERVING
    assert record.change_token == 10
    assert record.capacity is None


@settings(max_examples=60, deadline=None)
@given(
    free=st.integers(0, 4096),
    token=st.integers(0, 1000),
    state=st.sampled_from(["alive", "suspect", "down", "cordoned", "left"]),
)
def test_capacity_update_owns_only_identity_and_capacity(free: int, token: int, state: str) -> None:
    stored = NodeRecord(
        id="n1", state=state, serving=SERVING, change_token=token, started_at=2.0  # type: ignore[arg-type]
    )
    capacity = dataclasses.replace(CAPACITY, memory_free_mb=free)
    updated = capacity_update(IDENTITY, capacity=capacity, stored=stored)
    assert updated is not None
    # The reconciler's fields and the membership state are carried over untouched.
    assert (updated.serving, updated.change_token, updated.state, updated.started_at) == (
        SERVING,
        token,
        state,
        2.0,
    )
    assert updated.capacity == capacity
    assert updated.labels == IDENTITY.labels
    # Nothing changed: nothing to write.
    assert capacity_update(IDENTITY, capacity=capacity, stored=updated) is None
