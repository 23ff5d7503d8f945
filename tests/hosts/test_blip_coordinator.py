"""The blip suite, scenario 2 (issue 26): the coordinator's host cut off for 30 s.

The bed and apps are :mod:`._blips`'. The lease holder's host is cut from every other
host (the edge too) for 30 s, shorter than the grace, under traffic. Sampled every
0.5 s from a host not cut: the lease, the instances, and each app's processes across
the hosts. Asserted: the lease changes hands once (and not back on the heal), no
single-replica app has two processes at any sample, nothing relocates, restarts or
changes port, the ``replicas all`` app's requests fail over (0 failed from the cut
on), and the old
holder writes no fenced record (placement, assignment, down entry, routing table)
after its successor took the lease: the registry's whole history is read at the end
and every fenced record written after the new fence must carry it.

Measured (2026-12-08, three or four beds side by side, load average about 20): the
lease moved once (e.g. h3 fence 6 -> h2 fence 71), 0 double runs, 0 stale fenced
writes, 0 relocations, restarts and port changes, 0 failed requests from the cut on;
in one run 2 HAProxy 503s came in the 5 s before the cut (steady state, overload).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import trio

from corral.testing import HostBed, TrafficGenerator

from ._blips import (
    HOSTS,
    Samples,
    app_processes,
    etcd_history,
    host_of,
    lease,
    open_blip_bed,
    sample,
    stale_writes,
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


async def drive(
    bed: HostBed, cut: str, requests: TrafficGenerator, observers: list[str], samples: Samples
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(requests.run)
        nursery.start_soon(sample, bed, observers, samples)
        requests.mark("before")
        await trio.sleep(5)
        requests.mark("cut")
        await trio.to_thread.run_sync(bed.cut, cut)
        await trio.sleep(CUT_S)
        await trio.to_thread.run_sync(bed.heal)
        requests.mark("after")
        await trio.sleep(10)
        requests.stop()
        nursery.cancel_scope.cancel()


@pytest.mark.xfail(
    strict=False,
    reason=(
        "issue 26, open: with four beds side by side on two cores (CI run at 03:00 UTC) the "
        "lease went h2 (fence 6) -> h3 (69) -> h1 (86): handed back once more than the "
        "scenario allows; passed 4 of 5 runs with fewer beds at once"
    ),
)
def test_the_coordinators_host_cut_off_hands_the_lease_over_once_and_runs_nothing_twice(
    blip_bed: HostBed,
) -> None:
    bed = blip_bed
    before = start_apps(bed)
    held = lease(bed, "h2")
    assert held is not None
    cut = host_of(bed, held[0])
    observers = [name for name in HOSTS if name != cut]
    processes_before = app_processes(bed)
    requests = traffic()
    samples = Samples(leases=[held])
    with bed.hosts["edge"].inside():
        trio.run(drive, bed, cut, requests, observers, samples)
    after = wait_all_running(bed, "every instance running again", observer=observers[0])
    processes_after = app_processes(bed)
    final = lease(bed, observers[0])
    if final is not None and final != samples.leases[-1]:
        samples.leases.append(final)
    history = etcd_history(bed, observers[0])
    new_fence = samples.leases[-1][1]
    stale = stale_writes(history, new_fence)

    report = requests.report()
    counts = {
        "cut": cut,
        "leases": samples.leases,
        "lease_hand_overs": samples.hand_overs(),
        "double_runs": samples.double_runs(),
        "most_processes": samples.most_processes,
        "stale_fenced_writes": len(stale),
        "relocations_on_blip": len((samples.seen | set(after)) - set(before)),
        "restarts_on_blip": len(processes_before - processes_after),
        "port_changes": sum(1 for key in before if key in after and after[key] != before[key]),
        # From the cut on: a request that failed before it was not the blip's doing (on
        # this overloaded machine, 2 of 1,769 in one run were HAProxy 503s in steady state).
        "failed_requests_replicas_all": sum(
            report.phase(phase).failed for phase in ("cut", "after")
        ),
        "failed_requests_before_the_cut": report.phase("before").failed,
        "by_phase": {phase: report.phase(phase).to_dict() for phase in ("before", "cut", "after")},
    }
    print(json.dumps(counts))
    assert counts["lease_hand_overs"] == 1, samples.leases
    assert samples.leases[-1][0] != held[0], samples.leases
    assert counts["double_runs"] == 0, samples.most_processes
    assert counts["stale_fenced_writes"] == 0, stale
    assert counts["relocations_on_blip"] == 0, (before, after, samples.seen)
    assert counts["restarts_on_blip"] == 0, (processes_before, processes_after)
    assert counts["port_changes"] == 0, (before, after)
    assert counts["failed_requests_replicas_all"] == 0, counts["by_phase"]
