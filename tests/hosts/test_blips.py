"""The blip suite, scenario 1 (issue 26): one host cut off for 30 s, shorter than the
grace, under traffic through HAProxy in a host of its own.

The bed and apps are :mod:`._blips`'. The counts are printed (run with ``-s`` to see
them) and asserted: nothing relocates, restarts or changes port, and the
``replicas all`` app's requests fail over to the other hosts (0 failed).

Measured (2026-12-08), before main's issue 26 fixes (f1ef5c0): 0 relocations, 0
restarts, 0 port changes, 0 failed of about 4,500 requests, but about 1,100 of the
3,000 sent during the cut (h1's share) waited HAProxy's whole 2 s connect timeout
before its redispatch answered them (with a 2 s client timeout they failed); 2 of 8
runs failed, one with the lease moving twice and the healed h1's first table holding
0 domains for 4.4 s (438 requests 404). On f1ef5c0: every count 0 and no request
waited (p99 during the cut 23 ms) in 6 of 8 runs; 2 failed before the cut (in the
one whose logs were kept, ``everywhere`` was not placed by the lease holder within
40 s; the next holder placed it at once). That was the coordinator's digest: the
app was deployed while the holder's pass wrote the solo apps' placements, and the
digest taken after the writes already covered it, so every later pass skipped it
(fixed; tests/actors/coordinator/test_watch.py). With the fix: every count 0 in 5 of 5
runs, each beside the other blip scenarios at load average about 20 (the load
generator then falls behind, so latencies, and the ``redispatched_requests_cut``
count of requests over 1.9 s, mean little there).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import trio

from corral.testing import HostBed, TrafficGenerator

from ._blips import (
    app_processes,
    open_blip_bed,
    record_instances,
    start_apps,
    traffic,
    wait_all_running,
)

pytestmark = pytest.mark.slow

CUT_S = 30.0


@pytest.fixture
def blip_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    with open_blip_bed(request) as bed:
        yield bed


async def drive(bed: HostBed, traffic: TrafficGenerator, seen: set[tuple[str, str]]) -> None:
    """Traffic throughout; h1 cut off for CUT_S; every (app, node) running seen meanwhile
    (asked of h2 once a second) added to ``seen``."""
    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(record_instances, bed, ["h2"], seen)
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


def test_one_host_cut_off_for_30_s_moves_restarts_and_fails_nothing(blip_bed: HostBed) -> None:
    bed = blip_bed
    before = start_apps(bed)
    processes_before = app_processes(bed)
    requests = traffic()
    seen: set[tuple[str, str]] = set()
    with bed.hosts["edge"].inside():
        trio.run(drive, bed, requests, seen)
    after = wait_all_running(bed, "every instance running again")
    processes_after = app_processes(bed)

    report = requests.report()
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
