"""Changes under load, end to end: three real nodes, a real HAProxy, no failed request.

The app (``examples/apps/steady``: a ``[health] path``, a graceful SIGTERM) runs
three replicas behind ``corral proxy run --kind haproxy``. An open-loop load
generator sends 50 requests a second through the proxy, each on a new
connection, while the app is redeployed with a new environment (a new
revision), or while a node is stopped. What a user of the proxy must see: every
request answered 2xx; after a redeploy, the new revision answering; a stopped
node's instance out of the table before its process ends. Every process is
stopped by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio

from corral.node.cli._local_cluster import LocalCluster, free_port, wait_for
from corral.proxy import DEFAULT_HAPROXY
from corral.proxy._local import LocalProxy
from corral.testing import TrafficGenerator

from .conftest import REPO, tagged_cluster

pytestmark = pytest.mark.slow

STEADY = REPO / "examples" / "apps" / "steady"
DOMAIN = "roll.test"
STEP = 40.0
RATE = 50.0


@pytest.fixture
def haproxy() -> str:
    if not os.access(DEFAULT_HAPROXY, os.X_OK):
        reason = f"haproxy is not installed at {DEFAULT_HAPROXY} (apt-get install haproxy)"
        if os.environ.get("CORRAL_REQUIRE_PROXIES") == "1":
            pytest.fail(f"CORRAL_REQUIRE_PROXIES=1 but {reason}")
        pytest.skip(reason)
    return DEFAULT_HAPROXY


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with tagged_cluster(tmp_path, "rd", 27600) as local:
        yield local


@pytest.fixture
def proxy(cluster: LocalCluster, haproxy: str) -> Iterator[LocalProxy]:
    # Short: HAProxy's admin socket lives here, and a unix socket path is bounded.
    data_dir = Path(tempfile.mkdtemp(prefix="corral-e2e-rd-", dir="/tmp"))
    run = LocalProxy.start(
        "haproxy",
        listen=free_port(),
        registry_url=cluster.registry_url,
        data_dir=data_dir,
        proxy_id="edge-roll",
    )
    try:
        yield run
    finally:
        leftovers = run.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert not leftovers, f"proxy processes outlived corral proxy run: {leftovers}"


def deploy(cluster: LocalCluster, greeting: str, *extra: str) -> str:
    node = cluster.running_nodes()[0]
    done = subprocess.run(
        [
            sys.executable, "-m", "corral", "deploy", str(STEADY), "--name", "steady",
            "--env", f"GREETING={greeting}", "--json", *extra,
            "--api", node.api_url, "--token", node.token(),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["app"]["deployment"]["revision"])


def instances(cluster: LocalCluster) -> list[dict[str, Any]]:
    with cluster.any_client() as client:
        return [row for row in client.ps() if row["app"] == "steady"]


def backends(cluster: LocalCluster) -> list[str]:
    with cluster.any_client() as client:
        return list(client.routes()["routes"].get(DOMAIN, []))


def rolled_out(cluster: LocalCluster, revision: str) -> bool:
    rows = instances(cluster)
    return (
        len(rows) == 3
        and all(row["revision"] == revision and row["state"] == "running" for row in rows)
        and len(backends(cluster)) == 3
    )


def answers(proxy: LocalProxy, count: int = 12) -> list[dict[str, Any]]:
    """``count`` answers through the proxy; empty on any failure."""
    bodies = []
    for _ in range(count):
        try:
            response = httpx.get(
                f"http://127.0.0.1:{proxy.listen}/", headers={"Host": DOMAIN}, timeout=3.0
            )
        except httpx.HTTPError:
            return []
        if response.status_code != 200:
            return []
        bodies.append(response.json())
    return bodies


def settle(cluster: LocalCluster, proxy: LocalProxy) -> str:
    """Deploy three replicas and wait until the proxy reaches every node; the revision."""
    revision = deploy(cluster, "one", "--replicas", "3", "--domain", DOMAIN)
    wait_for("three instances routed", lambda: rolled_out(cluster, revision), timeout=STEP)
    wait_for(
        "every node to answer through the proxy",
        lambda: (
            {b["node"] for b in answers(proxy)} == set(cluster.nodes)
            and {b["says"] for b in answers(proxy)} == {"one"}
        ),
        timeout=STEP,
    )
    return revision


def test_a_three_replica_redeploy_under_load_fails_no_request(
    cluster: LocalCluster, proxy: LocalProxy
) -> None:
    settle(cluster, proxy)
    traffic = TrafficGenerator(
        ("127.0.0.1", proxy.listen), host=DOMAIN, rate=RATE, timeout=3.0, phase="before"
    )
    second: list[str] = []

    def redeploy() -> None:
        second.append(deploy(cluster, "two"))
        wait_for(
            "the new revision on all three", lambda: rolled_out(cluster, second[0]), timeout=STEP
        )
        wait_for(
            "the proxy to answer with the new revision only",
            lambda: {b["says"] for b in answers(proxy)} == {"two"},
            timeout=STEP,
        )

    async def under_load() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(traffic.run)
            await trio.sleep(1.0)
            traffic.mark("redeploy")
            started = time.monotonic()
            await trio.to_thread.run_sync(redeploy)
            took = time.monotonic() - started
            traffic.mark("after")
            await trio.sleep(1.0)
            traffic.stop()
        return took

    took = trio.run(under_load)
    report = traffic.report()
    before, during, after = (report.phase(p) for p in ("before", "redeploy", "after"))
    assert before.failed == 0, f"failures before the redeploy: {before.failures}"
    # The load really ran through the redeploy: about RATE a second, not a trickle.
    assert during.sent >= RATE * took * 0.8, (during.sent, took)
    assert during.failed == 0, (
        f"{during.failed} of {during.sent} requests failed during the {took:.1f} s redeploy "
        f"({during.failures}, over {during.failure_window * 1000:.0f} ms)"
    )
    assert after.failed == 0, f"failures after the redeploy: {after.failures}"
    assert rolled_out(cluster, second[0])


def test_a_stopped_node_leaves_the_table_before_its_app_ends_and_no_request_fails(
    cluster: LocalCluster, proxy: LocalProxy
) -> None:
    settle(cluster, proxy)
    victim = list(cluster.nodes.values())[2]
    with victim.client() as client:
        (row,) = [p for p in client.state()["processes"] if p["app"] == "steady"]
    url = f"http://127.0.0.1:{row['public_port']}"
    assert url in backends(cluster)
    app = psutil.Process(row["pid"])
    traffic = TrafficGenerator(
        ("127.0.0.1", proxy.listen), host=DOMAIN, rate=RATE, timeout=3.0, phase="stop"
    )
    seen: dict[str, bool] = {}

    def stop_node() -> None:
        time.sleep(0.5)
        cluster.signal(victim, signal.SIGTERM)
        # Left the table while its process still ran: drained, not cut off.
        wait_for(
            "the instance to leave the table", lambda: url not in backends(cluster), timeout=STEP
        )
        seen["alive_when_unrouted"] = app.is_running() and app.status() != psutil.STATUS_ZOMBIE
        assert victim.process is not None
        victim.process.wait(30)
        wait_for("two instances routed", lambda: len(backends(cluster)) == 2, timeout=STEP)

    async def under_load() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(traffic.run)
            await trio.to_thread.run_sync(stop_node)
            await trio.sleep(1.0)
            traffic.stop()

    trio.run(under_load)
    assert seen["alive_when_unrouted"], "the app was stopped before it left the routing table"
    assert victim.process is not None
    assert victim.process.returncode == 0, victim.log_tail()
    summary = traffic.report().phase("stop")
    assert summary.sent >= RATE * 2
    assert summary.failed == 0, (
        f"{summary.failed} of {summary.sent} requests failed while a node stopped "
        f"({summary.failures})"
    )
    assert {b["says"] for b in answers(proxy)} == {"one"}
