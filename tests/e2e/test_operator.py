"""What an operator sees with default-like timings: a joining node gets its work at once,
a departed node's work moves at once, and `corral node ls` shows who coordinates and who
is cordoned."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GRACE_PERIOD_MS, GREETER

pytestmark = pytest.mark.slow

#: The coordinator ticks every third of this (10 s): longer than the test waits.
LEASE_TTL_MS = 30_000


def serving_nodes(node: LocalNode, app: str) -> set[str]:
    with node.client() as client:
        return {r["node"] for r in client.ps() if r["app"] == app and r["state"] == "running"}


def cli(node: LocalNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args, "--api", node.api_url, "--token", node.token()],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_nodes_joining_and_leaving_move_work_without_waiting_for_a_tick(tmp_path: Path) -> None:
    grace = {"CORRAL_GRACE_PERIOD_MS": str(GRACE_PERIOD_MS)}
    with LocalCluster(
        tmp_path, lease_ttl_ms=LEASE_TTL_MS, node_ttl_ms=3000, extra_env=grace
    ) as cluster:
        first = cluster.add_node("node-1", port_range=(26000, 26199))
        second = cluster.add_node("node-2", port_range=(26200, 26399), extra_args=["--rack", "r2"])
        cluster.start(first)
        cluster.wait_ready(first)
        with first.client() as client:
            client.deploy("everywhere", pack_directory(GREETER), replicas="all")
        wait_for(
            "everywhere on node-1",
            lambda: serving_nodes(first, "everywhere") == {"node-1"},
            timeout=20,
        )
        cluster.start(second)
        cluster.wait_ready(second)
        ready_at = time.monotonic()
        wait_for(
            "everywhere on node-2 too",
            lambda: serving_nodes(first, "everywhere") == {"node-1", "node-2"},
            timeout=20,
            interval=0.1,
        )
        # Well before the coordinator's next tick (LEASE_TTL_MS / 3).
        assert time.monotonic() - ready_at < LEASE_TTL_MS / 3000 / 2

        # A node that stops cleanly leaves SWIM: its single instance is placed elsewhere at
        # once, without waiting for a tick (or the grace).
        with first.client() as client:
            client.deploy("single", pack_directory(GREETER), replicas=1)
        (victim_id,) = wait_for(
            "single to run", lambda: serving_nodes(first, "single") or None, timeout=20
        )
        victim, survivor = (first, second) if victim_id == "node-1" else (second, first)
        assert cluster.stop(victim) == 0
        stopped_at = time.monotonic()
        wait_for(
            f"single to run on {survivor.node_id}",
            lambda: serving_nodes(survivor, "single") == {survivor.node_id},
            timeout=20,
            interval=0.1,
        )
        assert time.monotonic() - stopped_at < GRACE_PERIOD_MS / 1000 + LEASE_TTL_MS / 3000 / 2

        assert cli(survivor, "node", "cordon", survivor.node_id).returncode == 0
        listed = cli(survivor, "node", "ls")
        assert listed.returncode == 0, listed.stderr
        lines: list[Any] = [line.split() for line in listed.stdout.splitlines()]
        # The coordinator's states: the survivor cordoned (for some seconds, with its SWIM
        # incarnation); the victim, stopped, left (its work moved at once) or is forgotten.
        assert lines[0] == [
            "NODE", "STATE", "FOR", "INC", "APPS", "LABELS", "RACK", "API", "ALLOC", "MEM/DISK"
        ]
        row = next(line for line in lines if line[0] == survivor.node_id)
        assert row[:3] == [survivor.node_id, "*", "cordoned"]
        assert row[-7].isdigit()
        assert row[-6:-2] == [
            "2", "-", "r2" if survivor is second else "-", f"127.0.0.1:{survivor.api_port}"
        ]
        assert row[-1] == "MiB"  # allocatable memory/disk: the node reports its capacity
        assert ["*", "coordinator", "(fence"] == lines[-1][:3]
        assert "states from the node records" not in listed.stdout
