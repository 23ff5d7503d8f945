"""Smoke tests of the bed with corral in it: three hosts, a three-member etcd (one
member per host), a node per host given all three endpoints and advertising its
host's address, an app through HAProxy in another host; then a host's node frozen,
a host killed whole and restarted on the same data directories.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed

from .conftest import require_haproxy

pytestmark = pytest.mark.slow

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
STEP = 30.0


def nodes_seen_from(bed: HostBed, host: str) -> dict[str, dict[str, Any]]:
    with bed.node(host).client(timeout=5.0) as client:
        return {entry["node"]: entry for entry in client.nodes()["nodes"]}


def state_of(bed: HostBed, observer: str, node_id: str, state: str) -> dict[str, Any] | None:
    entry = nodes_seen_from(bed, observer).get(node_id)
    return entry if entry is not None and entry["state"] == state else None


def all_alive(bed: HostBed, observer: str) -> bool:
    seen = nodes_seen_from(bed, observer)
    wanted = {node.node_id for node in bed.nodes.values()}
    return set(seen) == wanted and all(entry["state"] == "alive" for entry in seen.values())


def test_three_hosts_elect_a_coordinator_and_serve_an_app_through_a_proxy_in_another_host(
    cluster_bed: HostBed,
) -> None:
    require_haproxy()
    bed = cluster_bed
    addresses = {name: host.address for name, host in bed.hosts.items()}
    # Every node was given every member's endpoint.
    assert bed.registry_url == "etcd://" + ",".join(f"{a}:2379" for a in addresses.values())
    for node in bed.nodes.values():
        assert node.args[node.args.index("--registry") + 1] == bed.registry_url

    holder = wait_for(
        "a coordinator", lambda: nodes_seen_from(bed, "h1") and _holder(bed), timeout=STEP
    )
    assert holder in {node.node_id for node in bed.nodes.values()}
    wait_for("every node alive", lambda: all_alive(bed, "h1"), timeout=STEP)

    # `corral node ls` run inside h1 lists all three, alive, each at its own address.
    listed = bed.corral("h1", "node", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["node"]: row for row in json.loads(listed.stdout)["nodes"]}
    assert {row["api_address"] for row in rows.values()} == {
        f"{a}:7400" for a in addresses.values()
    }
    assert {row["state"] for row in rows.values()} == {"alive"}
    text = bed.corral("h1", "node", "ls")
    assert all(f"{a}:7400" in text.stdout for a in addresses.values()), text.stdout

    with bed.node("h1").client() as client:
        client.deploy("greet", pack_directory(GREETER), replicas="all", domains=["greet.test"])
    proxy = bed.start_proxy("h3")
    # The routing table carries each host's address, and the proxy in h3 reaches the
    # instances on h1 and h2 through it; the request is sent from h2.
    with httpx.Client(transport=bed.hosts["h2"].http_transport(), timeout=3.0) as web:

        def every_node_answers() -> bool:
            assert proxy.running(), proxy.log_tail()
            seen = set()
            for _ in range(12):
                try:
                    response = web.get(
                        f"http://{addresses['h3']}:8080/", headers={"Host": "greet.test"}
                    )
                except httpx.HTTPError:
                    return False  # the proxy is not up yet
                if response.status_code != 200:
                    return False
                seen.add(response.json()["node"])
            return seen == {node.node_id for node in bed.nodes.values()}

        wait_for("greet.test to answer from all three hosts", every_node_answers, timeout=STEP)
    with bed.node("h2").client() as client:
        urls = client.routes()["routes"]["greet.test"]
    assert sorted(url.rsplit(":", 1)[0] for url in urls) == sorted(
        f"http://{a}" for a in addresses.values()
    )


def _holder(bed: HostBed) -> str | None:
    with bed.node("h1").client(timeout=5.0) as client:
        holder = client.nodes()["coordinator"]
    return str(holder) if holder else None


def test_a_frozen_node_is_found_down_and_comes_back_and_a_killed_host_restarts(
    cluster_bed: HostBed,
) -> None:
    bed = cluster_bed
    wait_for("every node alive", lambda: all_alive(bed, "h1"), timeout=STEP)
    holder = wait_for("a coordinator", lambda: _holder(bed), timeout=STEP)
    # Observe from the lease holder's host; freeze another host's node.
    observer = next(name for name, node in bed.nodes.items() if node.node_id == holder)
    target = next(name for name in bed.nodes if name != observer)
    frozen = bed.node(target)

    # Alive by its record is not enough: the freeze must find it a SWIM member there.
    def a_member() -> dict[str, Any] | None:
        entry = nodes_seen_from(bed, observer)[frozen.node_id]
        return entry if entry["incarnation"] is not None else None

    before = wait_for(f"{target} a member seen from {observer}", a_member, timeout=STEP)

    # Frozen: SWIM finds it down; thawed, it refutes and is alive again.
    bed.freeze(target)
    try:
        wait_for(
            f"{target} down", lambda: state_of(bed, observer, frozen.node_id, "down"), timeout=STEP
        )
        assert frozen.running()  # stopped, not gone
    finally:
        bed.thaw(target)
    back = wait_for(
        f"{target} alive", lambda: state_of(bed, observer, frozen.node_id, "alive"), timeout=STEP
    )
    assert back["incarnation"] > before["incarnation"]

    # Killed: nothing is left in h3, the two other members keep the registry going, and
    # the others see its node down.
    victim = bed.node("h3")
    token = victim.token()
    killed = bed.kill("h3")
    assert victim.pid in killed
    assert bed.etcd["h3"].process is not None
    assert bed.etcd["h3"].process.pid in killed
    assert bed.hosts["h3"].pids() == []
    # A new etcd leader within a few election timeouts when h3's member led.
    wait_for("the two members left to be healthy", bed.etcd["h1"].healthy, timeout=10)
    assert bed.etcd["h2"].healthy()
    wait_for("h3 down", lambda: state_of(bed, "h1", victim.node_id, "down"), timeout=STEP)

    # Restarted on the same data directories: the same node (same token), member healthy.
    started = time.monotonic()
    bed.restart("h3")
    assert bed.etcd["h3"].healthy()
    assert victim.token() == token
    wait_for("h3 alive", lambda: state_of(bed, "h1", victim.node_id, "alive"), timeout=STEP)
    assert time.monotonic() - started < STEP
