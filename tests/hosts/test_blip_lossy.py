"""The blip suite, scenario 4 (issue 26): packet loss on every link, under traffic.

The bed of scenario 1 (three corral hosts, each an etcd member and a node labelled
``host=<name>``, and an ``edge`` host running HAProxy and the load generator): three
single-replica apps and one ``replicas all`` app, 100 req/s. Every host, ``edge``
included, drops 3 % of what it sends and 3 % of what it receives (the bed's
``lossy(name, percent)`` acts per host, so a packet between two hosts meets two draws:
5.9 % loss on every link, the issue's 5 % or a little more). The loss lasts 40 s, not
the issue's 60 s, so that the whole test (bed, deploys, loss, settling) stays within
90 s on this 2-core machine beside the other beds: 40 s is still 200 probe intervals
of the bed's SWIM settings, far more chances to be wrong than a 60 s run at the
default one-second interval. Asserted, printed (``-s``): 0 nodes declared down (on any
node's view, polled each second, nor in any node's events), 0 relocations, 0 restarts.

Measured (2026-12-08): every count 0 in 4 of 5 runs (0 failed requests of about
4,000 during the loss, p99 about 1 s: TCP retransmits). The fifth ran beside five
other beds (load average 19 on 2 cores, request p50 6 s): 2 ``node.down`` events,
still 0 relocations; starved CPUs, not the loss, which the others show is harmless.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from corral.node._errors import ApiError
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed, TrafficGenerator

from ._blips import all_running, app_processes, instances, open_blip_bed

pytestmark = pytest.mark.slow

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
HOSTS = ["h1", "h2", "h3"]
LOSS_PERCENT_PER_HOST = 3
LOSSY_S = 40.0
RATE = 100.0
STEP = 40.0
REQUEST_TIMEOUT = 5.0


@pytest.fixture
def lossy_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    with open_blip_bed(request) as bed:
        yield bed


def down_nodes(bed: HostBed, observer: str) -> set[str]:
    with bed.node(observer).client(timeout=3.0) as client:
        entries = client.nodes()["nodes"]
    return {entry["node"] for entry in entries if entry["state"] == "down"}


async def drive(
    bed: HostBed, traffic: TrafficGenerator, seen: set[tuple[str, str]], downs: set[str]
) -> None:
    """Traffic throughout; every host lossy for LOSSY_S; each second, every (app, node)
    running and every node shown down on any observer added to ``seen`` / ``downs``."""

    async def watch() -> None:
        while True:
            for observer in HOSTS:
                try:
                    downs.update(await trio.to_thread.run_sync(down_nodes, bed, observer))
                    seen.update(await trio.to_thread.run_sync(instances, bed, observer))
                except (ApiError, OSError):
                    pass  # this observer did not answer this time (loss); the next ask may
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(watch)
        traffic.mark("before")
        await trio.sleep(5)
        traffic.mark("lossy")
        for name in [*HOSTS, "edge"]:
            await trio.to_thread.run_sync(bed.lossy, name, LOSS_PERCENT_PER_HOST)
        await trio.sleep(LOSSY_S)
        for name in [*HOSTS, "edge"]:
            await trio.to_thread.run_sync(bed.lossy, name, 0)
        traffic.mark("after")
        await trio.sleep(5)
        traffic.stop()
        nursery.cancel_scope.cancel()


def test_loss_on_every_link_for_40_s_declares_no_node_down_and_moves_nothing(
    lossy_bed: HostBed,
) -> None:
    bed = lossy_bed
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
    downs: set[str] = set()
    with bed.hosts["edge"].inside():
        trio.run(drive, bed, traffic, seen, downs)
    after = wait_for("every instance running again", lambda: all_running(bed), timeout=STEP)
    processes_after = app_processes(bed)
    down_events = []
    for name in HOSTS:
        with bed.node(name).client() as client:
            down_events += [e for e in client.events() if e["kind"] == "node.down"]

    report = traffic.report()
    counts = {
        "lossy_false_downs": len(downs | {e["fields"]["node"] for e in down_events}),
        "node_down_events": len(down_events),
        "relocations_on_lossy": len((seen | set(after)) - set(before)),
        "restarts_on_lossy": len(processes_before - processes_after),
        "port_changes": sum(1 for key in before if key in after and after[key] != before[key]),
        # Not asserted (the issue asks for none): requests lost to the loss.
        "failed_requests_replicas_all": report.total().failed,
        "by_phase": {
            phase: report.phase(phase).to_dict() for phase in ("before", "lossy", "after")
        },
    }
    print(json.dumps(counts))
    assert counts["lossy_false_downs"] == 0, (downs, down_events)
    assert counts["relocations_on_lossy"] == 0, (before, after, seen)
    assert counts["restarts_on_lossy"] == 0, (processes_before, processes_after)
    assert counts["port_changes"] == 0, (before, after)
