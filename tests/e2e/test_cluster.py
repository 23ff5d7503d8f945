"""Three real node processes: deploy, failures, clean shutdown, API refusals, bad deploys."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from typing import Any

import httpx
import psutil
import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GREETER

pytestmark = pytest.mark.slow

STEP = 30.0


def running(rows: list[dict[str, Any]], app: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["app"] == app and r["state"] == "running" and r["public_port"]]


def ps(cluster: LocalCluster) -> list[dict[str, Any]]:
    with cluster.any_client() as client:
        return client.ps()


def wait_rows(cluster: LocalCluster, what: str, done: Any) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        rows = ps(cluster)
        return rows if done(rows) else None

    return wait_for(what, probe, timeout=STEP, interval=0.2)


def answer(port: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/", timeout=2.0)
        except httpx.HTTPError:
            return None
        body: dict[str, Any] = response.json()
        return body

    return wait_for(f"an answer on port {port}", probe, timeout=10.0)


def deploy(cluster: LocalCluster, name: str, **options: Any) -> dict[str, Any]:
    with cluster.any_client() as client:
        return client.deploy(name, pack_directory(GREETER), **options)


def coordinator(cluster: LocalCluster) -> tuple[str, int]:
    def probe() -> tuple[str, int] | None:
        with cluster.any_client() as client:
            lease = client.state().get("lease")
        return (lease["holder"], lease["fence"]) if lease else None

    return wait_for("a coordinator", probe, timeout=STEP, interval=0.05)


def cli(node: LocalNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args, "--api", node.api_url, "--token", node.token()],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_deploy_then_kill9_replaces_the_instance(cluster: LocalCluster) -> None:
    deploy(cluster, "everywhere", replicas="all")
    deploy(cluster, "single", replicas=1, selector={"disk": "ssd"})
    rows = wait_rows(
        cluster,
        "everywhere on 3 nodes and single on 1",
        lambda rows: len(running(rows, "everywhere")) == 3 and len(running(rows, "single")) == 1,
    )
    for row in running(rows, "everywhere") + running(rows, "single"):
        body = answer(row["public_port"])
        assert body["node"] == row["node"]

    victim_id = running(rows, "single")[0]["node"]
    assert victim_id in ("node-1", "node-2")
    victim = cluster.nodes[victim_id]
    orphans = victim.note_descendants()
    assert orphans
    killed_at = time.monotonic()
    cluster.kill(victim)
    rows = wait_rows(
        cluster,
        "single to run on the other ssd node",
        lambda rows: [r["node"] for r in running(rows, "single")] not in ([], [victim_id]),
    )
    moved = running(rows, "single")[0]
    assert moved["node"] in {"node-1", "node-2"} - {victim_id}
    assert answer(moved["public_port"])["node"] == moved["node"]
    # Not before the node record's lease (3 s) could lapse.
    assert time.monotonic() - killed_at >= 2.0

    # The killed node's apps are still running; its next life ends them.
    assert any(psutil.pid_exists(pid) for pid in orphans)
    cluster.start(victim)
    cluster.wait_ready(victim)
    wait_for(
        "the restarted node to end its previous life's processes",
        lambda: (
            not any(
                psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                for pid in orphans
            )
        ),
        timeout=STEP,
    )


def test_sigterm_leaves_nothing_and_the_coordinator_moves(cluster: LocalCluster) -> None:
    deploy(cluster, "everywhere", replicas="all")
    wait_rows(cluster, "everywhere on 3 nodes", lambda rows: len(running(rows, "everywhere")) == 3)
    holder, fence = coordinator(cluster)
    node = cluster.nodes[holder]
    children = node.note_descendants()
    assert children
    cluster.signal(node, 15)
    assert node.process is not None
    assert node.process.wait(STEP) == 0
    stopped_at = time.monotonic()
    assert not [pid for pid in children if psutil.pid_exists(pid)]
    new_holder, new_fence = wait_for(
        "another node to coordinate",
        lambda: (lambda c: c if c[0] != holder else None)(coordinator(cluster)),
        timeout=5.0,
        interval=0.05,
    )
    assert time.monotonic() - stopped_at < 1.0
    assert new_holder != holder
    assert new_fence > fence
    rows = wait_rows(
        cluster,
        f"everywhere to be placed only on the nodes left after {holder}",
        lambda rows: (
            {r["node"] for r in rows if r["app"] == "everywhere"}
            == {n for n in cluster.nodes if n != holder}
        ),
    )
    assert len(running(rows, "everywhere")) == 2


def test_api_refuses_missing_and_wrong_tokens(cluster: LocalCluster) -> None:
    node = cluster.nodes["node-1"]
    assert httpx.get(f"{node.api_url}/v1/state").status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.get(f"{node.api_url}/v1/state", headers=wrong).status_code == 403
    assert httpx.post(f"{node.api_url}/v1/apps/x/retire", headers=wrong).status_code == 403
    right = {"Authorization": f"Bearer {node.token()}"}
    assert httpx.get(f"{node.api_url}/v1/state", headers=right).status_code == 200


def test_bad_deploys_exit_2_name_the_field_and_change_nothing(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    node = cluster.nodes["node-1"]
    assert cli(node, "deploy", str(GREETER), "--name", "good").returncode == 0
    with node.client() as client:
        before = client.request("GET", "/v1/apps")
    empty = tmp_path / "no-command"
    empty.mkdir()
    (empty / "server.py").write_text("print('hi')\n")
    cases = [
        (["deploy", str(GREETER), "--name", "good", "--replicas", "0"], "replicas"),
        (["deploy", str(GREETER), "--name", "Bad_Name"], "name"),
        (["deploy", str(empty), "--name", "good"], "command"),
        (["app", "replicas", "--name", "good", "--count", "0"], "count"),
    ]
    for args, field in cases:
        result = cli(node, *args)
        assert result.returncode == 2, result.stderr
        assert f"error: {field}:" in result.stderr
        assert result.stderr.count("\n") == 1
    # The API itself refuses the same with 400 and the field (not only the CLI).
    response = httpx.post(
        f"{node.api_url}/v1/apps/good/replicas",
        json={"replicas": 0},
        headers={"Authorization": f"Bearer {node.token()}"},
    )
    assert (response.status_code, response.json()["field"]) == (400, "replicas")
    with node.client() as client:
        assert client.request("GET", "/v1/apps") == before


STUBBORN = """\
import os, signal, time
from http.server import BaseHTTPRequestHandler, HTTPServer
signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
server = HTTPServer((os.environ["CORRAL_BIND_HOST"], int(os.environ["PORT"])), H)
server.serve_forever()
"""


def test_a_second_signal_forces_the_stop_and_still_leaves_nothing(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    app = tmp_path / "stubborn"
    app.mkdir()
    (app / "corral.toml").write_text('command = ["python3", "app.py"]\n')
    (app / "app.py").write_text(STUBBORN)
    node = cluster.nodes["node-3"]
    with node.client() as client:
        client.deploy("stubborn", pack_directory(app), selector={"disk": "hdd"}, replicas=1)
    wait_rows(cluster, "stubborn to run on node-3", lambda rows: running(rows, "stubborn"))
    children = node.note_descendants()
    assert children
    cluster.signal(node, 15)
    # The app ignores SIGTERM: the clean stop waits out its grace period (5 s) ...
    assert node.process is not None
    with pytest.raises(subprocess.TimeoutExpired):
        node.process.wait(1.0)
    # ... unless a second signal forces it.
    cluster.signal(node, 15)
    assert node.process.wait(5.0) == 128 + 15
    wait_for(
        "the stubborn app to be gone",
        lambda: not [p for p in children if psutil.pid_exists(p) and not _zombie(p)],
        timeout=5.0,
    )


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True


def test_a_large_artifact_is_served_by_the_node_that_received_it(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    app = tmp_path / "large"
    app.mkdir()
    (app / "Procfile").write_text("web: python3 greeter.py\n")
    (app / "greeter.py").write_text((GREETER / "greeter.py").read_text())
    (app / "blob.bin").write_bytes(random.Random(7).randbytes(3 * 1024 * 1024 // 2))
    packed = pack_directory(app)
    assert packed.size > 1024 * 1024
    receiver = cluster.nodes["node-1"]
    with receiver.client() as client:
        answer_ = client.deploy("large", packed, selector={"disk": "hdd"}, replicas=1)
    assert answer_["stored_in_registry"] is False
    rows = wait_rows(cluster, "large to run on node-3", lambda rows: running(rows, "large"))
    assert running(rows, "large")[0]["node"] == "node-3"
    copy = cluster.nodes["node-3"].data_dir / "apps" / "large" / "revisions" / packed.digest
    assert (copy / "blob.bin").stat().st_size == 3 * 1024 * 1024 // 2
