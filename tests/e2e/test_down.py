"""Real node processes and the grace period: a node stopped (SIGSTOP) for less than the
grace keeps its app; a killed one (SIGKILL) is down at once and its app moves only after
the grace. ``corral node ls --json`` shows the down node and when its grace lapses."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from corral.node._artifacts import pack_directory
from corral.node._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GREETER

pytestmark = pytest.mark.slow

TTL_MS = 3000  # node records and the coordinator lease
GRACE_MS = 8000
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


def test_a_stopped_node_keeps_its_app_and_a_killed_one_loses_it_after_the_grace(
    tmp_path: Path,
) -> None:
    env = {"CORRAL_GRACE_PERIOD_MS": str(GRACE_MS)}
    with LocalCluster(tmp_path, lease_ttl_ms=TTL_MS, node_ttl_ms=TTL_MS, extra_env=env) as cluster:
        nodes = [
            cluster.add_node(f"node-{i}", port_range=(27000 + 200 * i, 27199 + 200 * i))
            for i in range(1, 4)
        ]
        for node in nodes:
            cluster.start(node)
        for node in nodes:
            cluster.wait_ready(node)
        with nodes[0].client() as client:
            client.deploy("single", pack_directory(GREETER), replicas=1)
        (victim_id,) = wait_for(
            "single to run", lambda: serving(nodes[0], "single") or None, timeout=STEP
        )
        victim = cluster.nodes[victim_id]
        observer = next(n for n in nodes if n is not victim)

        # SIGSTOP past the node TTL, for less than the grace: down, then back, nothing moved.
        cluster.signal(victim, signal.SIGSTOP)
        try:
            down = wait_for(
                f"{victim_id} to be down",
                lambda: (lambda e: e if e and e["state"] == "down" else None)(
                    node_entry(observer, victim_id)
                ),
                timeout=STEP,
                interval=0.2,
            )
            assert down["grace_until"] - down["down_since"] == GRACE_MS / 1000
            assert down["incarnation"] is None  # no membership view yet
            time.sleep(1.0)
            assert placed(observer, "single") == [victim_id]
        finally:
            cluster.signal(victim, signal.SIGCONT)
        wait_for(
            f"{victim_id} to be alive again",
            lambda: (lambda e: e and e["state"] == "alive")(node_entry(observer, victim_id)),
            timeout=STEP,
            interval=0.2,
        )
        assert time.time() < down["grace_until"]  # back within the grace
        time.sleep(GRACE_MS / 1000)
        assert placed(observer, "single") == [victim_id]  # it never moved
        assert serving(observer, "single") == [victim_id]

        # SIGKILL: down as soon as its record lapses; the app moves only after the grace.
        killed_at = time.monotonic()
        cluster.kill(victim)
        down = wait_for(
            f"{victim_id} to be down after the kill",
            lambda: (lambda e: e if e and e["state"] == "down" else None)(
                node_entry(observer, victim_id)
            ),
            timeout=STEP,
            interval=0.2,
        )
        assert placed(observer, "single") == [victim_id]
        moved = wait_for(
            "single to run elsewhere",
            lambda: [n for n in serving(observer, "single") if n != victim_id] or None,
            timeout=STEP + GRACE_MS / 1000,
            interval=0.2,
        )
        assert time.monotonic() - killed_at >= GRACE_MS / 1000
        assert time.time() >= down["grace_until"]
        assert moved != [victim_id]
