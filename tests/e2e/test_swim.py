"""Real node processes with SWIM membership (short probe and grace times set by flags):

* SIGSTOP a node for less than the grace: SWIM finds it dead, it refutes when it wakes, and
  its app never moves;
* SIGKILL a node: it is down within probe + suspicion time (long before its record's TTL),
  and its app moves only after the grace;
* SIGTERM a node: it leaves, and its app moves at once (no grace).

``corral node ls --json`` (``client.nodes()``) carries each node's state and incarnation.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.actors.membership import SwimConfig, suspicion_bounds
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GREETER

pytestmark = pytest.mark.slow

LEASE_TTL_MS = 3000
NODE_TTL_MS = 12_000  # long: SWIM, not the record's lapse, must find the dead node
GRACE_MS = 6000
PROBE_INTERVAL_MS = 200
PROBE_TIMEOUT_MS = 100
SWIM = SwimConfig(probe_interval=PROBE_INTERVAL_MS / 1000, probe_timeout=PROBE_TIMEOUT_MS / 1000)
_, MAX_SUSPICION, _ = suspicion_bounds(SWIM, 3)
#: A kill is noticed within a probe round (three members) plus the suspicion timeout; the
#: rest is the coordinator's pass, node ls polling and a shared, busy machine (Lifeguard
#: itself stretches a busy observer's probes). Still well under NODE_TTL_MS: it is SWIM,
#: not the record's lapse, that finds the node.
DETECT_BOUND = 3 * SWIM.probe_interval + MAX_SUSPICION + 5.0
STEP = 30.0


def serving(observer: LocalNode, app: str) -> list[str]:
    with observer.client() as client:
        rows = client.ps()
    return sorted(r["node"] for r in rows if r["app"] == app and r["state"] == "running")


def placed(observer: LocalNode, app: str) -> list[str]:
    with observer.client() as client:
        rows = client.ps()
    return sorted(r["node"] for r in rows if r["app"] == app and r["node"] != "-")


def node_entry(observer: LocalNode, node: str) -> dict[str, Any] | None:
    with observer.client() as client:
        answer = client.nodes()
    return next((n for n in answer["nodes"] if n["node"] == node), None)


def in_state(observer: LocalNode, node: str, state: str) -> dict[str, Any] | None:
    entry = node_entry(observer, node)
    return entry if entry is not None and entry["state"] == state else None


@pytest.fixture
def swim_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, list[LocalNode]]]:
    env = {
        "CORRAL_GRACE_PERIOD_MS": str(GRACE_MS),
        "CORRAL_PROBE_INTERVAL_MS": str(PROBE_INTERVAL_MS),
        "CORRAL_PROBE_TIMEOUT_MS": str(PROBE_TIMEOUT_MS),
    }
    cluster = LocalCluster(
        tmp_path, lease_ttl_ms=LEASE_TTL_MS, node_ttl_ms=NODE_TTL_MS, extra_env=env
    )
    with cluster:
        nodes = [
            cluster.add_node(f"node-{i}", port_range=(28000 + 200 * i, 28199 + 200 * i))
            for i in range(1, 4)
        ]
        for node in nodes:
            cluster.start(node)
        for node in nodes:
            cluster.wait_ready(node)
        yield cluster, nodes


def deploy_single(nodes: list[LocalNode]) -> str:
    with nodes[0].client() as client:
        client.deploy("single", pack_directory(GREETER), replicas=1)
    (victim,) = wait_for("single to run", lambda: serving(nodes[0], "single") or None, timeout=STEP)
    return str(victim)


def wait_all_alive(observer: LocalNode, nodes: list[LocalNode]) -> None:
    """Until the lease holder's SWIM view has every node alive (an incarnation each)."""

    def ready() -> bool:
        entries = [node_entry(observer, n.node_id) for n in nodes]
        return all(
            e is not None and e["state"] == "alive" and isinstance(e["incarnation"], int)
            for e in entries
        )

    wait_for("every node alive in SWIM", ready, timeout=STEP, interval=0.2)


def test_sigstop_under_the_grace_moves_nothing_and_sigkill_moves_after_it(
    swim_cluster: tuple[LocalCluster, list[LocalNode]],
) -> None:
    cluster, nodes = swim_cluster
    victim_id = deploy_single(nodes)
    victim = cluster.nodes[victim_id]
    observer = next(n for n in nodes if n is not victim)
    wait_all_alive(observer, nodes)
    before = node_entry(observer, victim_id)
    assert before is not None

    # SIGSTOP for less than the grace: SWIM finds it dead (its record is still live) ...
    stopped_at = time.monotonic()
    cluster.signal(victim, signal.SIGSTOP)
    try:
        down = wait_for(
            f"{victim_id} down", lambda: in_state(observer, victim_id, "down"),
            timeout=STEP, interval=0.1,
        )  # fmt: skip
        assert time.monotonic() - stopped_at <= DETECT_BOUND
        assert down["grace_until"] - down["down_since"] == GRACE_MS / 1000
        assert placed(observer, "single") == [victim_id]
        time.sleep(1.0)
    finally:
        cluster.signal(victim, signal.SIGCONT)
    # ... and when it wakes it refutes (a higher incarnation): alive, and nothing moved.
    back = wait_for(
        f"{victim_id} alive again", lambda: in_state(observer, victim_id, "alive"),
        timeout=STEP, interval=0.1,
    )  # fmt: skip
    assert back["incarnation"] > before["incarnation"]
    assert time.time() < down["grace_until"]
    time.sleep(GRACE_MS / 1000)
    assert placed(observer, "single") == [victim_id]
    assert serving(observer, "single") == [victim_id]

    # SIGKILL: down within probe + suspicion time, long before its record would lapse ...
    killed_at, killed_wall = time.monotonic(), time.time()
    cluster.kill(victim)
    down = wait_for(
        f"{victim_id} down after the kill", lambda: in_state(observer, victim_id, "down"),
        timeout=STEP, interval=0.1,
    )  # fmt: skip
    detected = time.monotonic() - killed_at
    assert down["down_since"] >= killed_wall  # this spell's clock, not the SIGSTOP's
    assert detected <= DETECT_BOUND
    assert detected < NODE_TTL_MS / 1000
    # ... and its app moves only after the grace.
    assert placed(observer, "single") == [victim_id]
    moved = wait_for(
        "single to run elsewhere",
        lambda: [n for n in serving(observer, "single") if n != victim_id] or None,
        timeout=STEP + GRACE_MS / 1000,
        interval=0.2,
    )
    assert time.time() >= down["grace_until"]
    assert time.monotonic() - killed_at >= GRACE_MS / 1000
    assert victim_id not in moved


def test_a_clean_stop_leaves_and_its_app_moves_at_once(
    swim_cluster: tuple[LocalCluster, list[LocalNode]],
) -> None:
    cluster, nodes = swim_cluster
    victim_id = deploy_single(nodes)
    victim = cluster.nodes[victim_id]
    observer = next(n for n in nodes if n is not victim)
    wait_all_alive(observer, nodes)

    stopped_at = time.monotonic()
    assert cluster.stop(victim) == 0
    moved = wait_for(
        "single to run elsewhere",
        lambda: [n for n in serving(observer, "single") if n != victim_id] or None,
        timeout=STEP,
        interval=0.1,
    )
    took = time.monotonic() - stopped_at
    assert took < GRACE_MS / 1000 - 1.0  # it left: no grace was waited out
    assert victim_id not in moved
    entry = node_entry(observer, victim_id)
    assert entry is None or entry["state"] == "left"
