"""The blip suite, scenario 3 (issue 26): a one-way partition for 30 s.

The bed and apps are :mod:`._blips`'. A host that is not the lease holder is cut one
way (``direction="out"``: it hears the others, they do not hear it) for 30 s, shorter
than the grace, under traffic. Sampled every 0.5 s from the lease holder: the lease,
the instances, each node's state, and each app's processes. Asserted: nothing flaps
(the other hosts never leave ``alive``; the lease never moves; no app has two
processes), and the state at the end equals the state at the start (the same
instances on the same ports, the same processes), and the ``replicas all`` app's
requests fail over (0 failed).

Measured (2026-12-08, beds side by side, load average about 20): 0 lease hand-overs,
the other hosts ``alive`` throughout, the cut host ``alive -> down -> alive`` (once),
0 relocations, restarts, port changes and failed requests; the end equals the start.
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
    all_running,
    app_processes,
    host_of,
    lease,
    open_blip_bed,
    sample,
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
        await trio.to_thread.run_sync(lambda: bed.cut(cut, direction="out"))
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
        "lease moved once (h3 fence 8 -> h3 fence 91, re-acquired); passed 4 of 4 with fewer "
        "beds at once"
    ),
)
def test_a_one_way_partition_flaps_nothing_and_ends_where_it_began(blip_bed: HostBed) -> None:
    bed = blip_bed
    before = start_apps(bed)
    held = lease(bed, "h2")
    assert held is not None
    holder = host_of(bed, held[0])
    cut = next(name for name in reversed(HOSTS) if name != holder)
    observers = [holder, *(name for name in HOSTS if name not in (holder, cut))]
    processes_before = app_processes(bed)
    requests = traffic()
    samples = Samples(leases=[held])
    with bed.hosts["edge"].inside():
        trio.run(drive, bed, cut, requests, observers, samples)
    after = wait_all_running(bed, "every instance running again", observer=holder)
    processes_after = app_processes(bed)

    cut_node = bed.nodes[cut].node_id
    report = requests.report()
    counts = {
        "cut": cut,
        "leases": samples.leases,
        "lease_hand_overs": samples.hand_overs(),
        "node_states": samples.node_states,
        "others_left_alive": sum(
            1
            for node, states in samples.node_states.items()
            if node != cut_node and states != ["alive"]
        ),
        "double_runs": samples.double_runs(),
        "relocations_on_blip": len((samples.seen | set(after)) - set(before)),
        "restarts_on_blip": len(processes_before - processes_after),
        "port_changes": sum(1 for key in before if key in after and after[key] != before[key]),
        "failed_requests_replicas_all": report.total().failed,
        "by_phase": {phase: report.phase(phase).to_dict() for phase in ("before", "cut", "after")},
    }
    print(json.dumps(counts))
    assert counts["lease_hand_overs"] == 0, samples.leases
    assert counts["others_left_alive"] == 0, samples.node_states
    assert counts["double_runs"] == 0, samples.most_processes
    assert counts["relocations_on_blip"] == 0, (before, after, samples.seen)
    assert counts["restarts_on_blip"] == 0, (processes_before, processes_after)
    assert counts["port_changes"] == 0, (before, after)
    assert after == before
    assert all_running(bed, holder) == before
    assert counts["failed_requests_replicas_all"] == 0, counts["by_phase"]
