"""Two real nodes with different ``--max-artifact-mb``: the artifact one node accepts
is refused at unpack by the other, which shows its instance failed with the reason
(and backs off) while the first serves; a deploy through the strict node is a 400."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.node import ApiRefused
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, wait_for

from .conftest import GREETER, started_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path, lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=5000)
    local.add_node("node-1", port_range=(26000, 26099))
    local.add_node("node-2", port_range=(26100, 26199), extra_args=["--max-artifact-mb", "1"])
    with started_cluster(local):
        yield local


def test_a_node_refusing_an_artifact_shows_it_failed_while_another_serves(
    pair: LocalCluster, tmp_path: Path
) -> None:
    app = tmp_path / "heavy"
    shutil.copytree(GREETER, app)
    (app / "zeros.bin").write_bytes(bytes(4 * 1024 * 1024))  # 4 MiB: over node-2's 1 MiB
    packed = pack_directory(app)
    strict, lenient = pair.nodes["node-2"], pair.nodes["node-1"]

    with strict.client() as client, pytest.raises(ApiRefused) as refused:
        client.deploy("heavy", packed, replicas="all")
    assert refused.value.status == 400
    assert refused.value.field == "artifact"
    assert "too large" in refused.value.message
    assert "--max-artifact-mb" in refused.value.message

    with lenient.client() as client:
        client.deploy("heavy", packed, replicas="all")

    def rows_settled() -> dict[str, dict[str, Any]] | None:
        with lenient.client() as client:  # the other node's failure is seen from here
            rows = {r["node"]: r for r in client.ps() if r["app"] == "heavy"}
        states = {node: row["state"] for node, row in rows.items()}
        return rows if states == {"node-1": "running", "node-2": "failed"} else None

    rows = wait_for("node-1 running heavy, node-2 failed", rows_settled, timeout=40.0, interval=0.3)
    assert "too large" in rows["node-2"]["reason"]
    with strict.client() as client:
        failed = client.state()["reconcile"]["failed"]
    (entry,) = failed
    assert entry["app"] == "heavy"
    # the revision node-1 runs (the artifact plus its command and env), not just the digest
    assert entry["revision"] == rows["node-1"]["revision"]
    assert entry["retry_in"] > 0
    # nothing of the refused revision is left half-unpacked on the strict node
    revisions = strict.data_dir / "apps" / "heavy" / "revisions"
    assert not revisions.exists() or list(revisions.iterdir()) == []
