"""A real node process: GET /metrics scrapes (with the token, and without one on the
loopback --metrics-listen address), and --log-format json writes JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.node.cli._local_cluster import LocalCluster, free_port

pytestmark = pytest.mark.slow


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_a_real_node_serves_metrics_and_json_logs(tmp_path: Path) -> None:
    metrics_port = free_port()
    with LocalCluster(tmp_path) as cluster:
        node = cluster.add_node(
            "solo",
            port_range=(26200, 26299),
            extra_args=["--metrics-listen", f"127.0.0.1:{metrics_port}", "--log-format", "json"],
        )
        cluster.start(node)
        cluster.wait_ready(node)
        with httpx.Client(timeout=10.0) as client:
            refused = client.get(f"{node.api_url}/metrics")
            with_token = client.get(
                f"{node.api_url}/metrics", headers={"Authorization": f"Bearer {node.token()}"}
            )
            bare = client.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert refused.status_code == 401
        assert with_token.status_code == 200
        assert bare.status_code == 200
        for answer in (with_token, bare):
            got = families(answer.text)
            paths = {labels["path"] for labels, _ in got["corral_actor_mailbox_depth"]}
            assert {"/", "/coordinator", "/agent/reconciler", "/api", "/metrics"} <= paths
            assert got["corral_coordinator_coordinating"] == [({}, 1.0)]
            assert got["corral_ports_free"] == [({}, 100.0)]
            ops = {labels["op"] for labels, _ in got["corral_registry_operation_seconds_count"]}
            assert {"get", "range", "txn", "grant", "revision"} <= ops
            assert {
                labels["backend"] for labels, _ in got["corral_registry_operation_seconds_count"]
            } == {"sqlite"}
            members = {labels["state"]: v for labels, v in got["corral_membership_members"]}
            assert members == {"alive": 1.0, "suspect": 0.0, "dead": 0.0, "left": 0.0}
            states = {labels["state"]: v for labels, v in got["corral_coordinator_node_states"]}
            assert states["alive"] == 1.0
            assert sum(states.values()) == 1.0
        cluster.stop(node)
    lines = [json.loads(line) for line in node.log_path.read_text().splitlines() if line.strip()]
    up = [line for line in lines if line["message"].startswith("node solo up")]
    assert up
    assert up[0]["node"] == "solo"
    assert up[0]["logger"] == "corral.node"
    events = [line for line in lines if line["logger"] == "corral.events"]
    started = [line for line in events if line["event"] == "node.started"]
    assert started
    assert started[0]["api"] == node.api_url.removeprefix("http://")
    assert {line["actor"] for line in events if line["event"] == "actor.started"} >= {
        "/coordinator",
        "/agent/reconciler",
    }
