"""The blip suite, scenario 7 (issue 26): a rolling deploy while one host is cut off.

The bed of scenario 1 (three corral hosts, each an etcd member and a node labelled
``host=<name>``, and an ``edge`` host running HAProxy and the load generator), one
``replicas all`` app at 50 req/s. h1 is cut off from every other host, then a new
revision of the app is deployed with ``--max-parallel 1``; h1 comes back 25 s later.
What the README ("Rolling deploys and rollback") documents: the lease holder takes at
most one instance out at a time, a node it cannot reach does not get restarted by it
(the rollout waits for that node: it is not done while a placed node has not run the
target), and it carries on once the node is back.

Asserted, printed (``-s``): while h1 is cut off, at least 2 instances (3 placed,
``--max-parallel 1``) are in the table at every sample of the reachable hosts' view
(h1 counts as in the table while the view shows it so: it is the h1 in HAProxy's
table the edge cannot reach that the sample cannot see, so the traffic's failures are
counted too, and must be 0); never more than 1 instance out of the table or
restarting; each host's process is replaced exactly once (3 restarts, none twice);
the rollout finishes within 40 s of h1's return with every instance on the new
revision. The issue asks for five hosts at 200 req/s; this machine runs three at 50.

Measured (2026-12-08, 5 runs): the rollout waits (0 restarts while h1 is cut off: the
lowest node id, h1, is admitted first and holds the width), at least 2 in the table
and at most 1 out at every sample, 1 restart per host, done 9.5-15.2 s after h1's
return, 0 failed requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from corral.node._errors import ApiError
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed, TrafficGenerator

from ._blips import open_blip_bed

pytestmark = pytest.mark.slow

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
HOSTS = ["h1", "h2", "h3"]
CUT_S = 25.0
RATE = 50.0
STEP = 40.0
REQUEST_TIMEOUT = 5.0
MAX_PARALLEL = 1
#: Ready instances the rollout must keep: every placed one but max_parallel.
BUDGET = len(HOSTS) - MAX_PARALLEL
OUT_STEPS = ("out-of-table", "draining", "restarting")


@pytest.fixture
def rollout_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    with open_blip_bed(request) as bed:
        yield bed


def rows_of(bed: HostBed, observer: str) -> list[dict[str, Any]]:
    with bed.node(observer).client(timeout=3.0) as client:
        return [row for row in client.ps_answer()["rows"] if row["app"] == "everywhere"]


def app_pids(bed: HostBed) -> dict[str, set[tuple[int, float]]]:
    """Host -> (pid, create time) of its greeter processes."""
    found: dict[str, set[tuple[int, float]]] = {name: set() for name in HOSTS}
    for name in HOSTS:
        for pid in bed.hosts[name].pids():
            try:
                process = psutil.Process(pid)
                if any(part.endswith("greeter.py") for part in process.cmdline()):
                    found[name].add((pid, process.create_time()))
            except psutil.Error:
                continue
    return found


def settled(bed: HostBed, unlike: str | None = None) -> str | None:
    """The revision every host runs with no rollout left, once they all run one
    (other than ``unlike``)."""
    rows = rows_of(bed, "h2")
    revisions = {r["revision"] for r in rows if r["state"] == "running"}
    running = sum(1 for r in rows if r["state"] == "running")
    if running != len(HOSTS) or len(revisions) != 1 or any(r.get("rollout") for r in rows):
        return None
    (revision,) = revisions
    return None if revision == unlike else str(revision)


class Samples:
    """What the reachable hosts' view showed, sampled: the fewest instances in the
    table, the most out of it at once, and every process seen per host."""

    def __init__(self) -> None:
        self.min_in_table = len(HOSTS)
        self.max_out = 0
        self.samples = 0
        self.pids: dict[str, set[tuple[int, float]]] = {name: set() for name in HOSTS}
        #: The processes when h1 came back.
        self.at_return: dict[str, set[tuple[int, float]]] = {}

    def take(self, bed: HostBed) -> None:
        for name, found in app_pids(bed).items():
            self.pids[name] |= found
        rows = rows_of(bed, "h2")
        out = [r for r in rows if r.get("rollout_step") in OUT_STEPS]
        in_table = [r for r in rows if r["state"] == "running" and r not in out]
        self.min_in_table = min(self.min_in_table, len(in_table))
        self.max_out = max(self.max_out, len(out))
        self.samples += 1


async def drive(bed: HostBed, traffic: TrafficGenerator, samples: Samples, old: str) -> float:
    """Traffic throughout; h1 cut, the new revision deployed, h1 back after CUT_S;
    returns the seconds from h1's return to the rollout's end."""

    async def watch() -> None:
        while True:
            try:
                await trio.to_thread.run_sync(samples.take, bed)
            except (ApiError, OSError):
                pass  # h2 did not answer this time; the next ask may
            await trio.sleep(0.25)

    def deploy_new() -> None:
        with bed.node("h2").client() as client:
            client.deploy(
                "everywhere",
                pack_directory(GREETER),
                replicas="all",
                domains=["all.test"],
                env={"GREETING": "hey"},
                max_parallel=MAX_PARALLEL,
                drain_ms=500,
            )

    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(watch)
        traffic.mark("before")
        await trio.sleep(3)
        traffic.mark("cut")
        await trio.to_thread.run_sync(bed.cut, "h1")
        await trio.sleep(3)
        await trio.to_thread.run_sync(deploy_new)
        await trio.sleep(CUT_S - 3)
        samples.at_return = await trio.to_thread.run_sync(app_pids, bed)
        await trio.to_thread.run_sync(bed.heal)
        traffic.mark("after")
        healed = trio.current_time()
        await trio.to_thread.run_sync(
            lambda: wait_for(
                "the rollout to finish", lambda: settled(bed, unlike=old), timeout=STEP
            )
        )
        finished_s = trio.current_time() - healed
        await trio.sleep(1)
        traffic.stop()
        nursery.cancel_scope.cancel()
    return finished_s


def test_a_rollout_with_a_host_cut_off_keeps_its_budget_and_finishes_when_it_returns(
    rollout_bed: HostBed,
) -> None:
    bed = rollout_bed
    with bed.node("h2").client() as client:
        client.deploy("everywhere", pack_directory(GREETER), replicas="all", domains=["all.test"])
    old = wait_for("every instance running", lambda: settled(bed), timeout=STEP)

    def proxy_serves() -> bool:
        probe = TrafficGenerator(("127.0.0.1", 8080), host="all.test", rate=50, max_requests=30)
        with bed.hosts["edge"].inside():
            trio.run(probe.run)
        return probe.report().total().failed == 0

    wait_for("the proxy to serve all.test", proxy_serves, timeout=STEP)
    before = app_pids(bed)
    traffic = TrafficGenerator(
        ("127.0.0.1", 8080), host="all.test", rate=RATE, timeout=REQUEST_TIMEOUT
    )
    samples = Samples()
    with bed.hosts["edge"].inside():
        finished_s = trio.run(drive, bed, traffic, samples, old)
    after = app_pids(bed)
    report = traffic.report()
    counts = {
        "samples": samples.samples,
        "min_in_table": samples.min_in_table,
        "max_out_at_once": samples.max_out,
        "restarts": {name: len(before[name] - after[name]) for name in HOSTS},
        # Not asserted (the README allows either): restarted while h1 was cut off.
        "restarts_while_cut": {
            name: len(before[name] - samples.at_return.get(name, set())) for name in HOSTS
        },
        "processes_seen": {name: len(samples.pids[name] | before[name]) for name in HOSTS},
        "finished_after_return_s": round(finished_s, 1),
        "failed_requests": report.total().failed,
        "by_phase": {phase: report.phase(phase).to_dict() for phase in ("before", "cut", "after")},
    }
    print(json.dumps(counts))
    assert counts["min_in_table"] >= BUDGET, counts
    assert counts["max_out_at_once"] <= MAX_PARALLEL, counts
    assert counts["restarts"] == {name: 1 for name in HOSTS}, counts
    # Each host ran its old process and one new one: no instance restarted twice.
    assert counts["processes_seen"] == {name: 2 for name in HOSTS}, counts
    assert counts["failed_requests"] == 0, counts["by_phase"]
