"""A forced drain through real nodes: pinned work is stopped, shown stopped with the
reason, not started elsewhere, and starts on its node again once the drain ends; RELOC
takes the cooldown from the lease holder's coordinator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .test_cluster import STEP, cli, coordinator, deploy, running

pytestmark = pytest.mark.slow

STOPPED = "forced drain of node-3; pinned, not started elsewhere"


def ps(node: LocalNode) -> list[dict[str, Any]]:
    with node.client() as client:
        return client.ps()


def wait_ps(
    node: LocalNode, what: str, done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        rows = ps(node)
        return rows if done(rows) else None

    return wait_for(what, probe, timeout=STEP, interval=0.2)


def test_forced_drain_stops_pinned_work_until_the_drain_ends(cluster: LocalCluster) -> None:
    deploy(cluster, "keeper", replicas=1, selector={"disk": "hdd"}, pinned=True)
    deploy(cluster, "single", replicas=1, selector={"disk": "ssd"})
    holder, _ = coordinator(cluster)
    # Ask a node that does not hold the lease: it asks the holder for the cooldown.
    asked = next(n for n in cluster.nodes.values() if n.node_id != holder)
    rows = wait_ps(
        asked,
        "keeper on node-3 and single on an ssd node",
        lambda rows: bool(running(rows, "keeper") and running(rows, "single")),
    )
    assert [r["node"] for r in running(rows, "keeper")] == ["node-3"]
    (single,) = running(rows, "single")
    assert single["reloc"].startswith("yes (only if its node is lost: cooldown, ")

    node3 = cluster.nodes["node-3"]
    refused = cli(asked, "node", "drain", "node-3")
    assert refused.returncode == 1
    assert "it runs pinned app(s) keeper" in refused.stderr
    forced = cli(asked, "node", "drain", "node-3", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "pinned app(s) keeper are stopped there and not started elsewhere" in forced.stdout

    rows = wait_ps(
        asked,
        "keeper stopped on node-3",
        lambda rows: any(r["state"] == "stopped" for r in rows),
    )
    keeper = [r for r in rows if r["app"] == "keeper"]
    assert [(r["node"], r["state"], r["reason"]) for r in keeper] == [
        ("node-3", "stopped", STOPPED)
    ]
    state = cli(asked, "state")
    assert state.returncode == 0, state.stderr
    assert "stranded    keeper on node-3: the forced drain of node-3 stopped it" in state.stdout
    assert "node-3 (stopped by a forced drain)" in state.stdout

    assert cli(node3, "node", "uncordon", "node-3").returncode == 0
    wait_ps(
        asked,
        "keeper running on node-3 again",
        lambda rows: [r["node"] for r in running(rows, "keeper")] == ["node-3"],
    )
