"""The coordinator's answer to GetCoordinatorState: typed, on the wire and as JSON."""

from __future__ import annotations

import json

import cbor2
import pytest

from corral.actors.coordinator import CoordinatorState, GetCoordinatorState, NodeStatus
from corral.actors.coordinator._state import AppRollout, CoordinatorPass, PassCounts
from corral.actors.planner import Deferred, Pause, Policy, Refusal, Stranded, Unplaced
from corral.actors.planner._types import RefusedDrain
from corral.registry import NodeRollout, RolloutRecord
from corral.testing import open_cluster
from corral.transport import SchemaError, decode_message, encode_message

STATE = CoordinatorState(
    node="n1",
    coordinating=True,
    holder="n1",
    fence=7,
    lease_ttl=45.0,
    policy=Policy(cooldown_s=60.0),
    last_pass=CoordinatorPass(
        time=3.0, duration=0.5, wall_time=1000.0, trigger="watch", outcome="applied",
        skipped=False, digest="ab", fence=7, counts={"writes": 2}, error=None,
    ),
    passes=PassCounts(applied=2, skipped=5, acquired=1),
    unplaced=(Unplaced("db", "placement-unavailable", "no node has 4096 MiB free"),),
    deferred=(Deferred("web", "n2", "cooldown: placed 10s ago", 1050.0),),
    stranded=(Stranded("pin", "n3", "n3 is gone; pin is pinned"),),
    refused=Refusal("drain-would-interrupt-pinned", "drain of n3 refused",
                    (RefusedDrain("n3", ("pin",)),)),
    paused=Pause(("apps/x",), "apps/x cannot be decoded"),
    membership=True,
    node_states=(NodeStatus("n1", "alive", 1.0, None, None, 2, record=True, reason="live"),),
    rollouts=(
        AppRollout("web", "rolling 1/2", RolloutRecord(
            "b" * 64,
            {"n1": NodeRollout("b" * 64, "done", 5.0), "n2": NodeRollout("a" * 64, "pending")},
            started_at=4.0,
        )),
    ),
)


def test_the_state_crosses_the_wire_unchanged() -> None:
    kind, body = encode_message(STATE)
    assert kind == "coordinator.state-reply"
    assert decode_message(kind, cbor2.loads(cbor2.dumps(body))) == STATE


def test_a_malformed_state_is_refused_at_the_boundary_naming_the_field() -> None:
    _, body = encode_message(STATE)
    body["policy"]["cooldown_s"] = "soon"
    with pytest.raises(SchemaError, match=r"policy\.cooldown_s"):
        decode_message("coordinator.state-reply", body)


def test_the_json_keeps_the_shape_the_api_always_had() -> None:
    data = STATE.to_json()
    assert json.loads(json.dumps(data)) == data  # plain JSON: lists, maps, scalars
    assert set(data) == {
        "node", "coordinating", "holder", "fence", "lease_ttl", "policy", "last_pass",
        "passes", "unplaced", "deferred", "stranded", "refused", "paused", "membership",
        "node_states", "rollouts",
    }
    assert data["policy"] == {
        "grace_period_s": 300.0, "cooldown_s": 60.0, "disruption_budget": 5,
        "min_usable_fraction": 0.5,
    }
    assert data["passes"] == {"applied": 2, "skipped": 5, "acquired": 1, "lost": 0}
    assert data["deferred"] == [
        {"app": "web", "node": "n2", "reason": "cooldown: placed 10s ago", "until": 1050.0}
    ]
    assert data["refused"] == {
        "reason": "drain-would-interrupt-pinned",
        "message": "drain of n3 refused",
        "drains": [{"node": "n3", "apps": ["pin"]}],
    }
    assert data["paused"] == {"keys": ["apps/x"], "message": "apps/x cannot be decoded"}
    assert data["node_states"] == [STATE.node_states[0].to_json()]
    assert data["last_pass"]["counts"] == {"writes": 2}


async def test_another_node_asks_the_holder_over_the_transport(autojump_clock: object) -> None:
    async with open_cluster(2, lease_ttl=45.0) as cluster:
        holder = await cluster.wait_for_coordinator()
        other = next(n for n in cluster.running if n != holder)
        system = cluster.node(other).system
        assert system is not None
        ref = system.ref(cluster.node(holder).coordinator.path, node=holder)
        answer = await ref.ask(GetCoordinatorState(), timeout=2.0)
        # Typed on arrival: the schema checked it on the way in.
        assert isinstance(answer, CoordinatorState)
        assert (answer.node, answer.coordinating, answer.holder) == (holder, True, holder)
        assert answer == await cluster.coordinator_state(holder)
