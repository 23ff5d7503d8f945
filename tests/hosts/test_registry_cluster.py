"""A registry that is a cluster (issue 26), first part: three etcd members, one per
host, and nodes given all three endpoints. Kill one member, deploy, bring it back,
then kill the leader and deploy again: every acknowledged deploy runs, no single
replica app runs twice, the coordinator lease moves at most once, and the nodes
carry on through the survivors with no operator.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed, HostEtcdMember

pytestmark = pytest.mark.slow

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
STEP = 30.0


def status(member: HostEtcdMember) -> dict[str, Any]:
    """etcd's maintenance status of the member (its id and its leader's)."""
    request = urllib.request.Request(
        f"http://{member.endpoint}/v3/maintenance/status", data=b"{}", method="POST"
    )
    with member.host.inside():
        response = urllib.request.urlopen(request, timeout=2)
    with response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def leader_of(bed: HostBed) -> str:
    for name, member in bed.etcd.items():
        if member.running():
            answer = status(member)
            if answer["header"]["member_id"] == answer["leader"]:
                return name
    raise AssertionError("no etcd member says it leads")


def lease(bed: HostBed, observer: str) -> tuple[str, int] | None:
    """The lease's holder and fence (a new fence each time the lease is taken)."""
    with bed.node(observer).client(timeout=15) as client:
        answer = client.nodes()
    if not answer["coordinator"]:
        return None
    return str(answer["coordinator"]), int(answer["fence"])


def running_on(bed: HostBed, observer: str, app: str) -> list[str]:
    with bed.node(observer).client(timeout=15) as client:
        rows = client.ps()
    return sorted(r["node"] for r in rows if r["app"] == app and r["state"] == "running")


def app_process_count(bed: HostBed, app: str) -> int:
    """Processes of ``app`` across every host (by the CORRAL_APP the node gives them)."""
    count = 0
    for host in bed.hosts.values():
        for pid in host.pids():
            try:
                if psutil.Process(pid).environ().get("CORRAL_APP") == app:
                    count += 1
            except psutil.Error:
                continue
    return count


def deploy_and_wait(bed: HostBed, via: str, app: str) -> str:
    with bed.node(via).client(timeout=30) as client:
        client.deploy(app, pack_directory(GREETER), replicas=1)
    (node,) = wait_for(f"{app} running", lambda: running_on(bed, via, app) or None, timeout=STEP)
    return node


def test_kill_a_member_then_the_leader_loses_no_write_and_moves_the_lease_at_most_once(
    cluster_bed: HostBed,
) -> None:
    bed = cluster_bed
    leases = [wait_for("a coordinator", lambda: lease(bed, "h1"), timeout=STEP)]
    deployed = {"before": deploy_and_wait(bed, "h1", "before")}

    # One member (not the leader) killed: the nodes go on through the two others.
    follower = next(name for name in bed.etcd if name != leader_of(bed))
    observer = next(name for name in bed.nodes if name != follower)
    member = bed.etcd[follower]
    assert member.process is not None
    member.process.send_signal(signal.SIGKILL)
    member.process.wait(10)
    deployed["member-down"] = deploy_and_wait(bed, observer, "member-down")
    leases.append(wait_for("a coordinator", lambda: lease(bed, observer), timeout=STEP))
    bed.restart(follower)  # the member alone: its node still runs

    # The leader killed: a new leader among the two others, and the nodes follow it.
    leader = leader_of(bed)
    observer = next(name for name in bed.nodes if name != leader)
    member = bed.etcd[leader]
    assert member.process is not None
    member.process.send_signal(signal.SIGKILL)
    member.process.wait(10)
    deployed["leader-down"] = deploy_and_wait(bed, observer, "leader-down")
    leases.append(wait_for("a coordinator", lambda: lease(bed, observer), timeout=STEP))
    bed.restart(leader)

    # Every acknowledged deploy is there and runs once; the lease moved at most once.
    for app in deployed:
        assert len(running_on(bed, observer, app)) == 1, app
        assert app_process_count(bed, app) == 1, app
    moves = sum(1 for a, b in itertools.pairwise(leases) if a != b)
    print(json.dumps({"leases": leases, "lease_moves": moves, "placed": deployed}))
    assert moves <= 1, leases


def test_a_silent_first_endpoint_costs_the_other_hosts_no_stall(cluster_bed: HostBed) -> None:
    """Issue 26 defect 1 (fixed in main by the endpoint ranking): before it, node ls on
    the other hosts took 10.1 s (3 of 3 runs) and each coordinator in turn stopped on
    'renewal failed'."""
    bed = cluster_bed
    first = next(iter(bed.etcd))  # the first endpoint of every node's --registry
    assert bed.registry_url.startswith(f"etcd://{bed.etcd[first].endpoint},")
    before = wait_for("a coordinator", lambda: lease(bed, "h2"), timeout=STEP)
    if before[0] == bed.node(first).node_id:
        # Measure the registry alone: hand the lease off the host to be cut (a clean
        # stop gives it up at once), or node ls would wait on a silent coordinator too.
        bed.cluster.stop(bed.node(first))
        before = wait_for(
            "another coordinator",
            lambda: (held := lease(bed, "h2")) and held[0] != bed.node(first).node_id and held,
            timeout=STEP,
        )
        bed.start_nodes([first])
    others = [name for name in bed.nodes if name != first]
    bed.cut(first)  # silence, not a refusal: its packets are dropped
    slowest, leases = 0.0, set()
    for _ in range(6):
        for name in others:
            started = time.monotonic()
            leases.add(lease(bed, name))
            slowest = max(slowest, time.monotonic() - started)
        time.sleep(1)
    print(json.dumps({"slowest_node_ls_s": round(slowest, 1), "leases": sorted(map(str, leases))}))
    assert slowest < 3.0
    assert leases == {before}  # the holder was not cut off: it keeps the lease
