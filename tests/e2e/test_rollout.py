"""Rolling deploys through three real nodes and real app processes (no load): a
redeploy switches the instances one node at a time, each on the same ports; a
revision whose health check fails halts the rollout with the old revision still
serving on the other nodes, and `corral rollback` brings the tried node back."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.node.artifacts._artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, wait_for

from .test_cluster import cli, coordinator

pytestmark = pytest.mark.slow

APP = "roll"
ROLLING = f"rollout {APP}: rolling "  # what `corral ps` says while it rolls
#: A whole three-node rollout: three restarts, each with its drain and readiness.
ROLLOUT = 120.0

SERVER = '''\
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NODE = os.environ.get("CORRAL_NODE", "?")
SAYS = os.environ.get("GREETING", "hello")
HEALTHY = os.environ.get("HEALTHY", "1") == "1"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            code, body = (200, b"ok") if HEALTHY else (503, b"sick")
        else:
            code, body = 200, json.dumps({"node": NODE, "says": SAYS}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(
    (os.environ.get("CORRAL_BIND_HOST", "127.0.0.1"), int(os.environ["PORT"])), Handler
)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
server.serve_forever()
'''

MANIFEST = '''\
command = ["python3", "server.py"]

[health]
path = "/healthz"
interval_ms = 200
timeout_ms = 500
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "roll-app"
    directory.mkdir()
    (directory / "server.py").write_text(SERVER)
    (directory / "corral.toml").write_text(MANIFEST)
    return directory


def deploy(cluster: LocalCluster, app_dir: Path, **options: Any) -> str:
    with cluster.any_client() as client:
        answer = client.deploy(APP, pack_directory(app_dir), **options)
    revision: str = answer["app"]["deployment"]["revision"]
    return revision


def rows(cluster: LocalCluster) -> list[dict[str, Any]]:
    with cluster.any_client() as client:
        return [r for r in client.ps() if r["app"] == APP]


def says(port: int) -> str | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/", timeout=2.0)
    except httpx.HTTPError:
        return None
    said: str = response.json()["says"]
    return said


def on(rows_now: list[dict[str, Any]], revision: str) -> set[str]:
    """The nodes whose instance runs ``revision``."""
    return {r["node"] for r in rows_now if r["revision"] == revision and r["state"] == "running"}


def settled_on(now: list[dict[str, Any]], revision: str) -> bool:
    """Three instances, every one on ``revision``, and no rollout left."""
    settled = len(now) == 3 and all(r["rollout"] is None for r in now)
    return settled and on(now, revision) == {r["node"] for r in now}


def all_on(cluster: LocalCluster, revision: str) -> list[dict[str, Any]] | None:
    now = rows(cluster)
    return now if settled_on(now, revision) else None


def test_a_redeploy_switches_one_node_at_a_time_on_the_same_ports(
    cluster: LocalCluster, app_dir: Path
) -> None:
    first = deploy(
        cluster, app_dir, replicas=3, env={"GREETING": "one"}, max_parallel=1, drain_ms=1000
    )
    before = wait_for("three instances of the first revision", lambda: all_on(cluster, first),
                      timeout=60.0, interval=0.2)
    ports = {r["node"]: (r["public_port"], r["internal_port"]) for r in before}

    second = deploy(cluster, app_dir, env={"GREETING": "two"})
    assert second != first
    switched: dict[str, float] = {}
    busy_seen: list[int] = []
    texts: list[str] = []
    deadline = time.monotonic() + ROLLOUT
    while time.monotonic() < deadline:
        now = rows(cluster)
        for node in on(now, second):
            switched.setdefault(node, time.monotonic())
        busy_seen.append(
            sum(1 for r in now if r["rollout_step"] not in (None, "pending", "done"))
        )
        if any(r["rollout"] for r in now) and not any(ROLLING in t for t in texts):
            # Again while it rolls: on a loaded machine the CLI's own start can take
            # longer than the rollout's next step (once, it outlasted the rollout).
            shown = cli(cluster.nodes["node-1"], "ps")
            assert shown.returncode == 0, shown.stderr
            texts.append(shown.stdout)
        if settled_on(now, second):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the rollout did not finish in {ROLLOUT} s: {rows(cluster)}")

    assert max(busy_seen) <= 1  # never two instances out or restarting at once
    assert set(switched) == set(ports)
    # One node after the other, as the coordinator told them: each only once the one
    # before was ready again, and after its own drain (1 s).
    holder, _ = coordinator(cluster)
    with cluster.nodes[holder].client() as client:
        told = [
            (e["time"], e["fields"]["node"])
            for e in client.events()
            if e["kind"] == "deploy.rolling" and e["fields"].get("node")
        ]
    assert sorted(node for _, node in told) == sorted(ports)
    times = sorted(when for when, _ in told)
    assert all(later - earlier >= 1.0 for earlier, later in itertools.pairwise(times)), told
    assert any(ROLLING in text for text in texts), texts
    after = rows(cluster)
    assert {r["node"]: (r["public_port"], r["internal_port"]) for r in after} == ports
    for row in after:
        assert says(row["public_port"]) == "two"


def test_a_revision_whose_health_check_fails_halts_and_rollback_restores_it(
    cluster: LocalCluster, app_dir: Path
) -> None:
    good = deploy(
        cluster,
        app_dir,
        replicas=3,
        env={"GREETING": "good", "HEALTHY": "1"},
        drain_ms=300,
        ready_timeout_ms=4000,
    )
    wait_for("three healthy instances", lambda: all_on(cluster, good), timeout=60.0, interval=0.2)
    bad = deploy(cluster, app_dir, env={"GREETING": "bad", "HEALTHY": "0"})

    def halted() -> list[dict[str, Any]] | None:
        now = rows(cluster)
        return now if any(str(r["rollout"] or "").startswith("halted: ") for r in now) else None

    now = wait_for("the rollout to halt", halted, timeout=60.0, interval=0.2)
    (tried,) = on(now, bad) or {r["node"] for r in now if r["revision"] == bad}
    untouched = [r for r in now if r["node"] != tried]
    assert len(untouched) == 2
    (status,) = {r["rollout"] for r in now}
    assert f"was not ready on node {tried} within 4000 ms" in status
    time.sleep(3.0)  # nothing more is admitted: the others keep the good revision, serving
    for row in rows(cluster):
        if row["node"] != tried:
            assert row["revision"] == good
            assert says(row["public_port"]) == "good"

    holder, _ = coordinator(cluster)
    with cluster.nodes[holder].client() as client:
        kinds = [e for e in client.events() if e.get("kind") == "deploy.halted"]
    assert kinds
    assert f"on node {tried}" in kinds[-1]["fields"]["reason"]
    state = cli(cluster.nodes["node-1"], "state")
    assert state.returncode == 0, state.stderr
    assert f"rollout     {APP} to {bad[:12]}: halted: " in state.stdout

    back = cli(cluster.nodes["node-1"], "rollback", APP)
    assert back.returncode == 0, back.stderr
    assert f"rolling back to revision {good[:12]}" in back.stdout
    final = wait_for(
        "every node on the good revision again", lambda: all_on(cluster, good),
        timeout=ROLLOUT, interval=0.2,
    )
    for row in final:
        assert says(row["public_port"]) == "good"
