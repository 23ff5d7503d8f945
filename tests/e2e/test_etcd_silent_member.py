"""Two real nodes on a private three-member etcd whose first endpoint goes silent
(SIGSTOP: connections open into its backlog, nothing answers) — issue 26: the
4 s coordinator lease must not lapse and ``corral node ls`` must keep answering."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.node.cli._local_cluster import LocalCluster, wait_for
from corral.testing._etcd import EtcdCluster, run_etcd_cluster

from .conftest import started_cluster

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

LEASE_TTL_MS = 4000


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    (tmp_path / "etcd").mkdir()
    with run_etcd_cluster(tmp_path / "etcd") as running:
        yield running


def coordinator(cluster: LocalCluster) -> tuple[str, int]:
    def probe() -> tuple[str, int] | None:
        with cluster.any_client() as client:
            listed = client.nodes()
        return (listed["coordinator"], listed["fence"]) if listed["coordinator"] else None

    return wait_for("a coordinator", probe, timeout=30, interval=0.1)


@pytest.mark.parametrize(
    ("frozen_role", "bound"),
    [
        ("follower", 2.0),
        # etcd itself answers no linearizable read until the others elected a new
        # leader (election timeout 1 to 2 s, randomized): that comes on top.
        ("leader", 4.0),
    ],
)
def test_a_silent_first_etcd_member_neither_moves_the_lease_nor_stalls_node_ls(
    etcd: EtcdCluster, tmp_path: Path, frozen_role: str, bound: float
) -> None:
    url = f"{etcd.url}/?prefix=corral-e2e/{uuid.uuid4().hex}/"
    local = LocalCluster(
        tmp_path / "nodes", registry_url=url, lease_ttl_ms=LEASE_TTL_MS, node_ttl_ms=LEASE_TTL_MS
    )
    tag = uuid.uuid4().hex[:6]
    for index in range(2):
        local.add_node(f"silent-{tag}-{index + 1}")
    with started_cluster(local, url):
        before = coordinator(local)
        node = next(iter(local.nodes.values()))
        etcd.hand_leadership_to(etcd.members[0 if frozen_role == "leader" else 1])
        etcd.members[0].freeze()
        try:
            slowest = 0.0
            until = time.monotonic() + 3 * LEASE_TTL_MS / 1000
            while time.monotonic() < until:
                started = time.monotonic()
                with node.client(timeout=5.0) as client:
                    listed = client.nodes()
                slowest = max(slowest, time.monotonic() - started)
                assert (listed["coordinator"], listed["fence"]) == before, "the lease moved"
                time.sleep(0.25)
            started = time.monotonic()
            command = ["node", "ls", "--api", node.api_url, "--token", node.token()]
            shown = subprocess.run(
                [sys.executable, "-m", "corral", *command],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            cli_seconds = time.monotonic() - started
        finally:
            etcd.members[0].resume()
        # The CLI's own start-up (a Python import) is most of that on a busy machine:
        # measured in the same run by a command that asks the node nothing.
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "corral", "node", "ls", "--help"],
            capture_output=True,
            timeout=30,
            check=True,
        )
        startup_seconds = time.monotonic() - started
        print(f"frozen {frozen_role}: GET /v1/nodes up to {slowest:.2f} s, ", end="")
        print(f"node ls {cli_seconds:.2f} s (start-up alone {startup_seconds:.2f} s)")
        assert shown.returncode == 0, shown.stderr
        assert slowest < bound, f"GET /v1/nodes took up to {slowest:.2f} s during the freeze"
        assert cli_seconds - startup_seconds < bound, (
            f"corral node ls took {cli_seconds:.2f} s, its start-up {startup_seconds:.2f} s"
        )
        assert coordinator(local) == before
