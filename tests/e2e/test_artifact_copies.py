"""Artifact copies with real processes: three nodes in two racks. A 5 MiB app deployed
through node A gets copies on the others within one interval; with A and its app
processes SIGKILLed, the app starts elsewhere from a copy; after three redeploys only
the current and previous revisions remain on any node's disk."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corral.node.artifacts import PackedArtifact, pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

from .conftest import GRACE_PERIOD_MS, GREETER, _etcd_url, started_cluster

pytestmark = pytest.mark.slow

INTERVAL_MS = 500
RACKS = {"node-a": "r1", "node-b": "r1", "node-c": "r2"}


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def racks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    url = _etcd_url() if request.param == "etcd" else None
    local = LocalCluster(
        tmp_path / "cluster",
        registry_url=url,
        lease_ttl_ms=3000,
        node_ttl_ms=3000,
        shutdown_grace_ms=5000,
        extra_env={"CORRAL_GRACE_PERIOD_MS": str(GRACE_PERIOD_MS)},
    )
    for index, (node_id, rack) in enumerate(RACKS.items()):
        start = 27000 + 100 * index
        local.add_node(
            node_id,
            labels={"first": "yes"} if node_id == "node-a" else {},
            port_range=(start, start + 99),
            extra_args=["--rack", rack, "--artifact-interval-ms", str(INTERVAL_MS)],
        )
    with started_cluster(local, url):
        yield local


def heavy_app(root: Path, version: int) -> PackedArtifact:
    """The greeter with 5 MiB of incompressible bytes (a new revision per version)."""
    app = root / f"heavy-{version}"
    shutil.copytree(GREETER, app)
    (app / "blob.bin").write_bytes(os.urandom(5 * 1024 * 1024))
    return pack_directory(app)


def sigkill_with_apps(cluster: LocalCluster, node: LocalNode) -> None:
    node.note_descendants()
    cluster.kill(node)
    for pid, created in sorted(node.seen_descendants.items()):
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                process.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue


def copies_on(node: LocalNode) -> set[str]:
    directory = node.data_dir / "artifacts"
    if not directory.is_dir():
        return set()
    return {p.name.removesuffix(".tar.gz") for p in directory.glob("*.tar.gz")}


def unpacked_on(node: LocalNode, app: str) -> set[str]:
    directory = node.data_dir / "apps" / app / "revisions"
    if not directory.is_dir():
        return set()
    return {p.name for p in directory.iterdir() if not p.name.startswith(".")}


def running_on(cluster: LocalCluster, app: str, digest: str) -> set[str] | None:
    """The nodes running ``app`` from artifact ``digest`` (a revision also covers the
    command and env, so it is looked up in the app's current and previous deployment)."""
    with cluster.any_client() as client:
        rows = [r for r in client.ps() if r["app"] == app]
        record = client.request("GET", f"/v1/apps/{app}")["app"]
    deployments = [record.get("deployment"), record.get("previous_deployment")]
    revisions = {d["revision"] for d in deployments if d and d.get("digest") == digest}
    nodes = {r["node"] for r in rows if r["state"] == "running" and r.get("revision") in revisions}
    return nodes or None


def test_copies_outlive_the_node_that_received_the_deploy(
    racks: LocalCluster, tmp_path: Path
) -> None:
    a, b, c = (racks.nodes[n] for n in RACKS)
    first = heavy_app(tmp_path, 0)
    assert first.size > 5 * 1024 * 1024
    with a.client(timeout=30.0) as client:
        client.deploy("heavy", first, replicas=1, selector={"first": "yes"})
    wait_for(
        "heavy running on node-a",
        lambda: running_on(racks, "heavy", first.digest) == {"node-a"},
        timeout=40.0,
    )
    # One interval (and a little): the others hold copies, in both racks.
    wait_for(
        "copies on node-b and node-c",
        lambda: first.digest in copies_on(b) and first.digest in copies_on(c),
        timeout=10 * INTERVAL_MS / 1000 + 10,
    )
    sigkill_with_apps(racks, a)
    with b.client() as client:
        client.set_selector("heavy", None)
    started = wait_for(
        "heavy running from a copy on node-b or node-c",
        lambda: (running_on(racks, "heavy", first.digest) or set()) & {"node-b", "node-c"} or None,
        timeout=60.0,
        interval=0.3,
    )
    assert len(started) == 1

    revisions = [first.digest]
    for version in (1, 2, 3):
        packed = heavy_app(tmp_path, version)
        with b.client(timeout=30.0) as client:
            client.deploy("heavy", packed)
        revisions.append(packed.digest)
        wait_for(
            f"revision {version} running",
            lambda packed=packed: running_on(racks, "heavy", packed.digest),  # type: ignore[misc]
            timeout=60.0,
            interval=0.3,
        )
    live = set(revisions[-2:])

    def only_two_revisions() -> bool:
        return all(
            copies_on(node) <= live and unpacked_on(node, "heavy") <= live for node in (b, c)
        )

    wait_for("only two revisions on disk", only_two_revisions, timeout=30.0, interval=0.3)
    assert revisions[-1] in copies_on(b) | copies_on(c)
    with b.client() as client:
        artifacts = client.state()["artifacts"]
    assert artifacts["artifacts"] <= 2
    assert artifacts["artifact_bytes"] > 5 * 1024 * 1024
