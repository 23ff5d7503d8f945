"""End-to-end tier: real ``corral node`` processes on loopback (marked slow).

Each test gets a fresh three-node cluster sharing one registry: SQLite in a
temporary directory, or (``etcd`` tests) a fresh namespace of the etcd named by
``CORRAL_TEST_ETCD``. Every process a test starts is ended by the fixture, by
pid, and the fixture fails the test if an app process outlived its node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from corral.node.cli._local_cluster import LocalCluster
from corral.registry import open_registry
from corral.testing import etcd_endpoint_from_env

REPO = Path(__file__).resolve().parents[2]
#: How long a down node keeps its work in these tests (300 000 ms by default).
GRACE_PERIOD_MS = 1000
GREETER = REPO / "examples" / "apps" / "greeter"

#: node id -> labels; every node gets its own app port range.
NODES = {
    "node-1": {"disk": "ssd"},
    "node-2": {"disk": "ssd"},
    "node-3": {"disk": "hdd"},
}


def _etcd_url() -> str:
    endpoint = etcd_endpoint_from_env()
    return f"etcd://{endpoint}/?prefix=corral-e2e/{uuid.uuid4().hex}/"


async def _wipe(url: str) -> None:
    async with open_registry(url) as registry:
        await registry.delete("", prefix=True)


@contextmanager
def started_cluster(local: LocalCluster, registry_url: str | None = None) -> Iterator[LocalCluster]:
    """Start every node of ``local``; on exit stop them, wipe the etcd namespace (when
    ``registry_url`` names one) and fail if any app process outlived its node."""
    try:
        local.start_all()
        yield local
    finally:
        local.stop_all()
        leftovers = local.kill_leftovers()
        if registry_url is not None:
            trio.run(_wipe, registry_url)
        assert not leftovers, f"app processes outlived their nodes: {leftovers}"


@contextmanager
def tagged_cluster(
    tmp_path: Path, prefix: str, first_port: int, registry_url: str | None = None
) -> Iterator[LocalCluster]:
    """Three running nodes with ids of their own (``<prefix><tag>-1..3``: a node ends
    processes carrying its id's marker from another life, so parallel runs must not
    share ids), each with 200 app ports from ``first_port`` on; stopped afterwards,
    failing if an app process outlived its node."""
    local = LocalCluster(
        tmp_path,
        registry_url=registry_url,
        lease_ttl_ms=3000,
        node_ttl_ms=3000,
        shutdown_grace_ms=5000,
    )
    tag = uuid.uuid4().hex[:6]
    for index in range(3):
        start = first_port + 200 * index
        local.add_node(f"{prefix}{tag}-{index + 1}", port_range=(start, start + 199))
    with started_cluster(local, registry_url):
        yield local


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    url = _etcd_url() if request.param == "etcd" else None
    local = LocalCluster(
        tmp_path,
        registry_url=url,
        lease_ttl_ms=3000,
        node_ttl_ms=3000,
        shutdown_grace_ms=5000,
        # A lost node keeps its work for the grace period: short, so tests see it move.
        extra_env={"CORRAL_GRACE_PERIOD_MS": str(GRACE_PERIOD_MS)},
    )
    for index, (node_id, labels) in enumerate(NODES.items()):
        start = 25000 + 200 * index
        local.add_node(node_id, labels=labels, port_range=(start, start + 199))
    with started_cluster(local, url):
        yield local
