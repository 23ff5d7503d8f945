"""Artifact copies between real node processes, against raw httpx downloads.

Run: ``.venv/bin/python bench/artifacts.py`` (well under a minute; ``--quick`` for less).

Two ``corral node run`` processes share a SQLite registry on loopback.

* **fetch_ratio**: a 64 MiB artifact sits in node-1's artifact directory. It is
  fetched with the node's own copy path (:meth:`ArtifactStore.fetch_copy`: a streamed
  download in a worker thread, sha256 checked, renamed into place) from node-1's
  ``GET /v1/artifacts/<digest>``, and, as the baseline, downloaded from the same
  server with a bare ``httpx`` streaming GET written to a file (no hashing, no
  checks). Rounds alternate; the best of each is kept. Target: ratio >= 0.8.
* **join_catchup_s**: 100 live revisions (small real artifacts, one retired app
  each, so nothing is started) are held by node-1; node-2 joins with
  ``--artifact-copies 2``, so it is assigned a copy of every one. Measured: from
  node-2 answering on its API until all 100 are on its disk; printed beside a bare
  sequential httpx download of the same 100 artifacts from node-1.

Figures (the last line, one JSON object): ``fetch_mib``, ``fetch_s``, ``raw_fetch_s``,
``fetch_mib_per_s``, ``raw_mib_per_s``, ``fetch_ratio``, ``join_revisions``, ``join_mib``,
``join_catchup_s``, ``raw_join_download_s``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from corral.node.artifacts._artifact_store import ArtifactStore, Peer, artifact_capability
from corral.node.artifacts._artifacts import pack_directory
from corral.node.artifacts._copy_plan import Site
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for
from corral.registry import AppRecord, Deployment, MemoryRegistry, app_key
from corral.registry._sqlite import SQLiteRegistry

SECRET = "bench-artifacts-secret"
CHUNK = 1024 * 1024


def raw_download(url: str, capability: str, path: Path) -> int:
    """The baseline: a bare httpx streaming GET into a file."""
    written = 0
    with (
        httpx.Client(timeout=60.0) as client,
        client.stream("GET", url, headers={"Authorization": f"Bearer {capability}"}) as response,
    ):
        response.raise_for_status()
        with open(path, "wb") as out:
            for chunk in response.iter_raw(CHUNK):
                out.write(chunk)
                written += len(chunk)
    return written


def place_artifact(node: LocalNode, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    directory = node.data_dir / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{digest}.tar.gz").write_bytes(data)
    return digest


async def corral_fetch(node: LocalNode, digest: str, into: Path, size: int) -> float:
    store = ArtifactStore(
        MemoryRegistry(),
        into,
        node_id="bench",
        secret=SECRET,
        max_artifact_bytes=size + 1,
    )
    peer = Peer(node.node_id, f"127.0.0.1:{node.api_port}", Site())
    started = time.perf_counter()
    path = await store.fetch_copy(digest, [peer])
    elapsed = time.perf_counter() - started
    assert path.stat().st_size == size
    path.unlink()
    return elapsed


def measure_fetch(node: LocalNode, work: Path, size_mb: int, rounds: int) -> dict[str, Any]:
    data = os.urandom(size_mb * 1024 * 1024)
    digest = place_artifact(node, data)
    url = f"http://127.0.0.1:{node.api_port}/v1/artifacts/{digest}"
    capability = artifact_capability(SECRET, digest)
    corral_times, raw_times = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        assert raw_download(url, capability, work / "raw.bin") == len(data)
        raw_times.append(time.perf_counter() - started)
        corral_times.append(trio.run(corral_fetch, node, digest, work / "copies", len(data)))
    corral_s, raw_s = min(corral_times), min(raw_times)
    mib = len(data) / (1024 * 1024)
    return {
        "fetch_mib": round(mib),
        "fetch_s": round(corral_s, 3),
        "raw_fetch_s": round(raw_s, 3),
        "fetch_mib_per_s": round(mib / corral_s, 1),
        "raw_mib_per_s": round(mib / raw_s, 1),
        "fetch_ratio": round(raw_s / corral_s, 3),
    }


async def seed_revisions(db: Path, node: LocalNode, work: Path, count: int) -> list[str]:
    """``count`` retired apps, each with its own small real artifact held by ``node``."""
    digests = []
    registry = await SQLiteRegistry.open(str(db))
    try:
        for i in range(count):
            app = work / f"rev-{i}"
            app.mkdir(parents=True)
            (app / "corral.toml").write_text('command = ["python3", "-c", "pass"]\n')
            (app / "blob.bin").write_bytes(os.urandom(256 * 1024))
            packed = pack_directory(app)
            digest = place_artifact(node, packed.data)
            record = AppRecord(
                f"rev-{i:03d}", retired=True, deployment=Deployment(digest, ["python3"])
            )
            await registry.put(app_key(record.name), record.encode())
            digests.append(digest)
    finally:
        await registry.aclose()
    return digests


def measure_join(cluster: LocalCluster, first: LocalNode, work: Path, count: int) -> dict[str, Any]:
    digests = trio.run(
        seed_revisions, Path(cluster.registry_url.removeprefix("sqlite://")), first, work, count
    )
    sizes = sum((first.data_dir / "artifacts" / f"{d}.tar.gz").stat().st_size for d in digests)
    started = time.perf_counter()
    for digest in digests:
        raw_download(
            f"http://127.0.0.1:{first.api_port}/v1/artifacts/{digest}",
            artifact_capability(SECRET, digest),
            work / "raw.bin",
        )
    raw_s = time.perf_counter() - started
    second = cluster.add_node(
        "node-2", extra_args=["--artifact-copies", "2", "--artifact-interval-ms", "500"]
    )
    cluster.start(second)
    cluster.wait_ready(second)
    started = time.perf_counter()
    wanted = {f"{d}.tar.gz" for d in digests}

    def caught_up() -> bool:
        directory = second.data_dir / "artifacts"
        return directory.is_dir() and wanted <= {p.name for p in directory.iterdir()}

    wait_for(f"node-2 holding all {count} revisions", caught_up, timeout=120.0, interval=0.05)
    join_s = time.perf_counter() - started
    return {
        "join_revisions": count,
        "join_mib": round(sizes / (1024 * 1024), 1),
        "join_catchup_s": round(join_s, 3),
        "raw_join_download_s": round(raw_s, 3),
    }


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, fewer revisions")
    args = parser.parse_args()
    rounds, revisions = (2, 30) if args.quick else (6, 100)
    with tempfile.TemporaryDirectory(prefix="corral-bench-artifacts-") as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        with LocalCluster(root / "cluster", secret=SECRET) as cluster:
            # The default interval: its release grace (a minute) keeps the unreferenced
            # 64 MiB file on node-1 through the fetch rounds.
            first = cluster.add_node("node-1")
            cluster.start_all()
            figures = measure_fetch(first, work, 64, rounds)
            figures |= measure_join(cluster, first, work, revisions)
    print(f"{'figure':<22} {'corral':>10} {'raw httpx':>10}")
    print(f"{'64 MiB fetch (s)':<22} {figures['fetch_s']:>10} {figures['raw_fetch_s']:>10}")
    print(f"{'  MiB/s':<22} {figures['fetch_mib_per_s']:>10} {figures['raw_mib_per_s']:>10}")
    print(f"{'fetch_ratio':<22} {figures['fetch_ratio']:>10} {'(>= 0.8)':>10}")
    print(
        f"{'join catch-up (s)':<22} {figures['join_catchup_s']:>10} "
        f"{figures['raw_join_download_s']:>10}   "
        f"({figures['join_revisions']} revisions, {figures['join_mib']} MiB)"
    )
    return figures


if __name__ == "__main__":
    result = main()
    sys.stdout.flush()
    print(json.dumps(result))
