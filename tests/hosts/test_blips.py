"""The blip suite, scenario 1 (issue 26): one host cut off for 30 s, shorter than the
grace, under traffic through HAProxy in a host of its own.

Three corral hosts (each an etcd member and a node labelled ``host=<name>``) and an
``edge`` host running HAProxy on its own loopback, where the load generator runs too.
Three single-replica apps (``solo-hN``, wherever the planner puts them) and one on
every host (``everywhere``, ``replicas all``). The counts are printed (run with
``-s`` to see them) and asserted: nothing relocates, restarts or changes port, and
the ``replicas all`` app's requests fail over to the other hosts (0 failed). The
issue asks for five hosts at 200 req/s; this machine (2 shared cores) runs three at
100 req/s.

Measured (2026-12-08), before main's issue 26 fixes (f1ef5c0): 0 relocations, 0
restarts, 0 port changes, 0 failed of about 4,500 requests, but about 1,100 of the
3,000 sent during the cut (h1's share) waited HAProxy's whole 2 s connect timeout
before its redispatch answered them (with a 2 s client timeout they failed); 2 of 8
runs failed, one with the lease moving twice and the healed h1's first table holding
0 domains for 4.4 s (438 requests 404). On f1ef5c0: every count 0 and no request
waited (p99 during the cut 23 ms) in 6 of 8 runs; 2 failed before the cut (in the
one whose logs were kept, ``everywhere`` was not placed by the lease holder within
40 s; the next holder placed it at once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

from corral.node._errors import ApiError
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed, TrafficGenerator, open_hosts, require_netns

from .conftest import (
    NODE_TTL_MS,
    SWIM_ENV,
    keep_logs_on_failure,
    require_etcd_binary,
    require_haproxy,
)

pytestmark = pytest.mark.slow

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
HOSTS = ["h1", "h2", "h3"]
CUT_S = 30.0
RATE = 100.0
STEP = 40.0
#: Above HAProxy's 2 s connect timeout, so its redispatch to another server can answer.
REQUEST_TIMEOUT = 5.0

#: (app, node) -> public port of every running instance.
Instances = dict[tuple[str, str], int | None]


@pytest.fixture
def blip_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    require_netns()
    require_etcd_binary()
    require_haproxy()
    with open_hosts(
        [*HOSTS, "edge"], etcd_hosts=HOSTS, node_ttl_ms=NODE_TTL_MS, extra_env=SWIM_ENV
    ) as bed:
        bed.start_etcd()
        for name in HOSTS:
            bed.add_node(name, labels={"host": name})
        bed.start_nodes(HOSTS)
        bed.start_proxy("edge", listen_host="127.0.0.1")
        yield bed
        keep_logs_on_failure(request, bed)


def instances(bed: HostBed, observer: str) -> Instances:
    with bed.node(observer).client() as client:
        rows = client.ps()
    return {(r["app"], r["node"]): r["public_port"] for r in rows if r["state"] == "running"}


def app_processes(bed: HostBed) -> set[tuple[int, float]]:
    """(pid, create time) of every app process in the corral hosts."""
    found = set()
    for name in HOSTS:
        for pid in bed.hosts[name].pids():
            try:
                process = psutil.Process(pid)
                if any(part.endswith("greeter.py") for part in process.cmdline()):
                    found.add((pid, process.create_time()))
            except psutil.Error:
                continue
    return found


def all_running(bed: HostBed) -> Instances | None:
    """The running instances, once each solo app runs once and ``everywhere`` everywhere."""
    now = instances(bed, "h2")
    apps = [app for app, _ in now]
    wanted = {f"solo-{name}": 1 for name in HOSTS} | {"everywhere": len(HOSTS)}
    return now if {app: apps.count(app) for app in set(apps)} == wanted else None


async def drive(bed: HostBed, traffic: TrafficGenerator, seen: set[tuple[str, str]]) -> None:
    """Traffic throughout; h1 cut off for CUT_S; every (app, node) running seen meanwhile
    (asked of h2 once a second) added to ``seen``."""

    async def watch() -> None:
        while True:
            try:
                seen.update(await trio.to_thread.run_sync(instances, bed, "h2"))
            except (ApiError, OSError):
                pass  # h2 did not answer this time; the next ask may
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(watch)
        traffic.mark("before")
        await trio.sleep(5)
        traffic.mark("cut")
        await trio.to_thread.run_sync(bed.cut, "h1")
        await trio.sleep(CUT_S)
        await trio.to_thread.run_sync(bed.heal)
        traffic.mark("after")
        await trio.sleep(10)
        traffic.stop()
        nursery.cancel_scope.cancel()


@pytest.mark.xfail(
    strict=False,
    reason=(
        "issue 26: on main f1ef5c0 6 of 8 runs pass with every count 0; 2 failed before "
        "the cut (in the one with logs kept the lease holder never placed the replicas-all "
        "app in 40 s). Before that merge: a 0-domain table after the heal"
    ),
)
def test_one_host_cut_off_for_30_s_moves_restarts_and_fails_nothing(blip_bed: HostBed) -> None:
    bed = blip_bed
    with bed.node("h2").client() as client:
        for name in HOSTS:
            client.deploy(
                f"solo-{name}", pack_directory(GREETER), replicas=1, domains=[f"solo-{name}.test"]
            )
        client.deploy("everywhere", pack_directory(GREETER), replicas="all", domains=["all.test"])
    wait_for("every instance running", lambda: all_running(bed), timeout=STEP)

    def proxy_serves() -> bool:
        probe = TrafficGenerator(("127.0.0.1", 8080), host="all.test", rate=50, max_requests=30)
        with bed.hosts["edge"].inside():
            trio.run(probe.run)
        return probe.report().total().failed == 0

    wait_for("the proxy to serve all.test", proxy_serves, timeout=STEP)

    before, processes_before = instances(bed, "h2"), app_processes(bed)
    traffic = TrafficGenerator(
        ("127.0.0.1", 8080), host="all.test", rate=RATE, timeout=REQUEST_TIMEOUT
    )
    seen: set[tuple[str, str]] = set()
    with bed.hosts["edge"].inside():
        trio.run(drive, bed, traffic, seen)
    after = wait_for("every instance running again", lambda: all_running(bed), timeout=STEP)
    processes_after = app_processes(bed)

    report = traffic.report()
    counts = {
        "relocations_on_blip": len((seen | set(after)) - set(before)),
        "restarts_on_blip": len(processes_before - processes_after),
        "port_changes": sum(1 for key in before if key in after and after[key] != before[key]),
        "failed_requests_replicas_all": report.total().failed,
        # Not asserted (yet): requests that waited out HAProxy's connect timeout on the
        # cut host's instance before a redispatch answered them.
        "redispatched_requests_cut": sum(
            1 for row in report.outcomes if row.phase == "cut" and row.ok and row.latency >= 1.9
        ),
        "by_phase": {phase: report.phase(phase).to_dict() for phase in ("before", "cut", "after")},
    }
    print(json.dumps(counts))
    assert counts["relocations_on_blip"] == 0, (before, after, seen)
    assert counts["restarts_on_blip"] == 0, (processes_before, processes_after)
    assert counts["port_changes"] == 0, (before, after)
    assert counts["failed_requests_replicas_all"] == 0, counts["by_phase"]
