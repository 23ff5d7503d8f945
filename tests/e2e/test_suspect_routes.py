"""Real node processes: a node SWIM holds suspect leaves the routing table at once, keeps
its work, and is listed again when it wakes (issue 25 item 9).

The stopped node's record outlives the stop (a long node TTL) and the grace is long, so
only SWIM, through the lease holder's routing renderer, can take its instance out.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from corral.actors.membership import SwimConfig, suspicion_bounds
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GREETER

pytestmark = pytest.mark.slow

PROBE_INTERVAL_MS = 200
PROBE_TIMEOUT_MS = 100
NODE_TTL_MS = 30_000  # the stopped node's record stays: the table must not wait for its lapse
SWIM = SwimConfig(probe_interval=PROBE_INTERVAL_MS / 1000, probe_timeout=PROBE_TIMEOUT_MS / 1000)
_, MAX_SUSPICION, _ = suspicion_bounds(SWIM, 3)
#: Suspected within a probe round or two; the rest is a render, a write and API polling on a
#: shared, busy machine.
LEAVE_BOUND = 3 * SWIM.probe_interval + 3.0
STEP = 40.0


def backends(observer: LocalNode) -> list[str]:
    with observer.client() as client:
        return list(client.routes()["routes"].get("shop.test", []))


def instances(observer: LocalNode) -> dict[str, str]:
    """node -> backend URL of each running shop instance."""
    with observer.client() as client:
        rows = client.ps()
    return {
        r["node"]: f"http://127.0.0.1:{r['public_port']}"
        for r in rows
        if r["app"] == "shop" and r["state"] == "running" and r.get("public_port")
    }


def placed(observer: LocalNode) -> list[str]:
    with observer.client() as client:
        rows = client.ps()
    return sorted(r["node"] for r in rows if r["app"] == "shop" and r["node"] != "-")


def test_a_stopped_node_leaves_the_table_keeps_its_work_and_comes_back(tmp_path: Path) -> None:
    env = {
        "CORRAL_GRACE_PERIOD_MS": "600000",
        "CORRAL_PROBE_INTERVAL_MS": str(PROBE_INTERVAL_MS),
        "CORRAL_PROBE_TIMEOUT_MS": str(PROBE_TIMEOUT_MS),
    }
    cluster = LocalCluster(tmp_path, lease_ttl_ms=3000, node_ttl_ms=NODE_TTL_MS, extra_env=env)
    tag = uuid.uuid4().hex[:6]  # a node ends processes of its id from another life
    with cluster:
        nodes = [
            cluster.add_node(f"sr{tag}-{i}", port_range=(29000 + 200 * i, 29199 + 200 * i))
            for i in range(3)
        ]
        for node in nodes:
            cluster.start(node)
        for node in nodes:
            cluster.wait_ready(node)
        with nodes[0].client() as client:
            client.deploy("shop", pack_directory(GREETER), replicas=3, domains=["shop.test"])
        urls = wait_for(
            "shop on three nodes, all in the table",
            lambda: (
                found
                if len(found := instances(nodes[0])) == 3
                and sorted(backends(nodes[0])) == sorted(found.values())
                else None
            ),
            timeout=STEP,
            interval=0.2,
        )
        with nodes[0].client() as client:
            holder = client.nodes()["coordinator"]
        victim = next(n for n in nodes if n.node_id != holder)
        observer = next(n for n in nodes if n.node_id == holder)
        lost = urls[victim.node_id]

        stopped_at = time.monotonic()
        cluster.signal(victim, signal.SIGSTOP)
        try:
            left = wait_for(
                f"{victim.node_id}'s instance out of the table",
                lambda: found if lost not in (found := backends(observer)) else None,
                timeout=STEP,
                interval=0.1,
            )
            took = time.monotonic() - stopped_at
            print(f"out of the table {took:.2f} s after the stop")
            assert took <= LEAVE_BOUND, took
            assert sorted(left) == sorted(u for n, u in urls.items() if n != victim.node_id)
            with observer.client() as client:
                held = client.routes()["held_back"]
            assert any(
                h["node"] == victim.node_id and "SWIM holds the node" in h["why"] for h in held
            ), held
            # It keeps its work: nothing is placed elsewhere.
            assert placed(observer) == sorted(urls)
        finally:
            cluster.signal(victim, signal.SIGCONT)
        wait_for(
            f"{victim.node_id}'s instance back in the table",
            lambda: lost in backends(observer) or None,
            timeout=STEP,
            interval=0.1,
        )
        assert placed(observer) == sorted(urls)
        assert instances(observer) == urls  # the same processes on the same ports
