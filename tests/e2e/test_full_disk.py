"""A node whose data dir is on a real 40 MiB tmpfs (needs root; skipped without).

With about 20 MiB free, a 25 MiB deploy is refused with 507 naming the data dir, the
bytes needed and the bytes free (the CLI prints that one line); no partial file is
left, and the apps recorded earlier are still there. With the disk then filled to
the last block by something else, the registry gives up its reserve (one log line),
so the node's writes still go through: it keeps renewing its record and keeps the
coordinator lease (same fence). Partial files a killed node left are swept at start.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.node import ApiRefused
from corral.node.artifacts import pack_directory
from corral.node.artifacts._artifact_store import KEEP_FREE_BYTES
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for
from corral.registry._sqlite import DEFAULT_RESERVE_BYTES, RESERVE_SUFFIX

from ..conftest import SmallDisk
from .conftest import GREETER, started_cluster

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
#: Longer than the node's record TTL and the coordinator lease TTL (3 s each).
OUTLAST_TTLS = 8.0


def cli(node: LocalNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args, "--api", node.api_url, "--token", node.token()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def lease_expiries(db: Path, keys: list[str]) -> dict[str, float]:
    """key -> when its lease expires (host boot-time clock), read without writing."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        found: dict[str, float] = {}
        for key in keys:
            row = conn.execute(
                "SELECT leases.expires FROM kv JOIN leases ON kv.lease = leases.id "
                "WHERE kv.key = ?",
                (key,),
            ).fetchone()
            if row is not None:
                found[key] = float(row[0])
        return found
    finally:
        conn.close()


def boot_clock() -> float:
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


def hidden_files(directory: Path) -> list[str]:
    return (
        sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
        if directory.is_dir()
        else []
    )


def test_a_full_disk_refuses_the_deploy_and_the_node_keeps_its_record_and_lease(
    small_tmpfs: Callable[[int], SmallDisk], tmp_path: Path
) -> None:
    disk = small_tmpfs(40)
    local = LocalCluster(disk.path, lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=5000)
    node_id = f"full-{uuid.uuid4().hex[:6]}"
    node = local.add_node(node_id, port_range=(28600, 28699))
    db = disk.path / "registry.db"
    reserve = Path(f"{db}{RESERVE_SUFFIX}")
    # What a node killed while receiving a copy left behind.
    artifacts = node.data_dir / "artifacts"
    artifacts.mkdir(parents=True)
    leftover = artifacts / f".{'a' * 64}.tar.gz.{'b' * 32}"
    leftover.write_bytes(b"\0" * MIB)

    with started_cluster(local):
        assert not leftover.exists()
        assert "removed 1 partial file(s) of 1048576 bytes" in node.log_path.read_text()
        assert reserve.stat().st_size == DEFAULT_RESERVE_BYTES
        with node.client() as client:
            client.deploy("early", pack_directory(GREETER), replicas=1)
            lease = wait_for("the lease", lambda: client.state().get("lease"), timeout=20)
        assert lease["holder"] == node_id

        # About 20 MiB free; a 25 MiB app (incompressible) does not fit.
        big = tmp_path / "big"
        shutil.copytree(GREETER, big)
        (big / "blob.bin").write_bytes(os.urandom(25 * MIB))
        packed = pack_directory(big)
        disk.fill("filler", leave=20 * MIB)
        free_before = disk.free()
        done = cli(node, "deploy", str(big), "--name", "big")
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        line = lines[0]
        assert f"in the data dir {node.data_dir}:" in line
        assert f"needs {packed.size + KEEP_FREE_BYTES} bytes" in line
        figures = re.search(r"its file system has (\d+) bytes", line)
        assert figures is not None, line
        assert 19 * MIB < int(figures.group(1)) <= free_before
        with node.client() as client, pytest.raises(ApiRefused) as refused:
            client.deploy("big", packed)
        assert refused.value.status == 507
        assert hidden_files(artifacts) == []
        assert free_before - disk.free() < MIB  # nothing of the 25 MiB stayed
        with node.client() as client:
            assert client.request("GET", "/v1/apps/early")["app"]["name"] == "early"
            with pytest.raises(ApiRefused, match="no app named 'big'"):
                client.request("GET", "/v1/apps/big")

        # Something else fills the disk to the last block.
        disk.fill("filler-2")
        assert disk.free() < 4096
        with node.client() as client:
            client.set_replicas("early", 1)  # a registry write, on the full disk
        released = wait_for(
            "the reserve's log line",
            lambda: [
                ln
                for ln in node.log_path.read_text(errors="replace").splitlines()
                if "released the" in ln
            ],
            timeout=10,
        )
        assert len(released) == 1, released
        assert f"{DEFAULT_RESERVE_BYTES}-byte reserve {reserve}" in released[0]
        assert not reserve.exists()
        started = boot_clock()
        time.sleep(OUTLAST_TTLS)
        with node.client() as client:
            state = client.state()
        assert state["node"]["id"] == node_id
        assert state["lease"]["holder"] == node_id
        assert state["lease"]["fence"] == lease["fence"]  # never lost, never taken again
        expiries = lease_expiries(db, [f"nodes/{node_id}", "lease/coordinator"])
        assert set(expiries) == {f"nodes/{node_id}", "lease/coordinator"}
        # Renewed during the last TTL, so renewed on the full disk.
        assert all(at > started + OUTLAST_TTLS for at in expiries.values()), expiries
        with node.client() as client:
            assert client.request("GET", "/v1/apps/early")["app"]["replicas"] == 1
        # Room again: the node can stop cleanly (its record withdrawn, its apps stopped).
        (disk.path / "filler").unlink()
        (disk.path / "filler-2").unlink()
