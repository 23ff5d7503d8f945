"""Benchmark: corral on many hosts (issue 26's blip suite, on the namespace test bed).

Builds the bed of ``tests/hosts/test_blips.py`` with :func:`corral.testing.open_hosts`:
three corral hosts (each an etcd member and a node labelled ``host=<name>``, given all
three endpoints) and an ``edge`` host running HAProxy and the load generator. Three
single-replica apps (``solo-hN``) and one ``replicas all`` app (``everywhere``, 100
req/s through HAProxy). Then, one after the other on the same bed:

* **Blip** (scenario 1): h1 cut off from every other host for 30 s (shorter than the
  grace), then 10 s to settle. Counted: instances that ran somewhere new
  (relocations), app processes that ended (restarts), instances whose public port
  changed, failed requests to the ``replicas all`` app, samples (each 0.5 s) at which
  two processes served one single-replica app (double runs), and registry writes the
  API acknowledged (an alias set through h2 or h3 each second) that are not there
  afterwards (writes lost).
* **Lossy** (scenario 4): every host drops 3 % of what it sends and 3 % of what it
  receives (5.9 % on every link) for 60 s; counted: nodes shown down on any node's
  view (polled each second) or told down in any node's events.
* **Detection**: a host other than the lease holder's is killed (SIGKILL of all in
  it); the time until the lease holder's ``node ls`` shows its node down, against
  the virtual-time model of ``bench/membership.py`` for the bed's SWIM settings
  (probe interval 0.2 s; three members): SWIM's expected time to the first
  detection, ``e/(e-1) * T``, plus the minimum suspicion timeout. Three kills, each
  host restarted on its data dir before the next.

Needs root, ``ip``, ``nft``, ``etcd`` and HAProxy (CI runs it so); without them it
exits 2 saying which is missing. The issue asks for five hosts at 200 req/s; this
machine (2 shared cores) runs three at 100 req/s.

Measured (2026-12-08, this machine beside other work): every count 0 (31 writes
acknowledged, 0 lost; 3,011 requests during the cut, 0 failed, p99 504 ms; 6,215
during the loss, 0 failed), detection 1.16-1.19 s against the model's 1.12 s (ratio
1.05); ``--quick``: the same zeros, detection 1.09 s (0.98).

Run: ``python bench/hosts.py`` (about 2.5 minutes); ``--quick`` (under a minute: 50 s
alone here): an 8 s cut, 4 s to settle, 6 s of loss
and one kill.

Figures (the last line, one JSON object): ``relocations_on_blip``,
``restarts_on_blip``, ``port_changes``, ``failed_requests_replicas_all``,
``double_runs``, ``etcd_writes_lost``, ``etcd_writes_acknowledged``,
``lossy_false_downs``, ``swim_detect_s``, ``swim_detect_model_s``,
``swim_detect_ratio``, ``requests_ok_by_phase``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import trio

from corral.actors.membership import SwimConfig, suspicion_timeout
from corral.node._errors import ApiError
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.proxy import DEFAULT_HAPROXY
from corral.testing import HostBed, TrafficGenerator, open_hosts
from corral.testing._hosts_net import netns_missing_reason

GREETER = Path(__file__).resolve().parents[1] / "examples" / "apps" / "greeter"
HOSTS = ["h1", "h2", "h3"]
RATE = 100.0
REQUEST_TIMEOUT = 5.0
STEP = 40.0
LOSS_PERCENT_PER_HOST = 3
#: The bed's SWIM settings (those of tests/hosts/conftest.py): a killed host is found
#: down within seconds; nothing moves for being down a while (the grace is 120 s).
PROBE_INTERVAL_MS = 200
SWIM_ENV = {
    "CORRAL_PROBE_INTERVAL_MS": str(PROBE_INTERVAL_MS),
    "CORRAL_PROBE_TIMEOUT_MS": "100",
    "CORRAL_GRACE_PERIOD_MS": "120000",
}
#: Long: SWIM, not a record's lapse, must find a killed node.
NODE_TTL_MS = 12_000

#: (app, node) -> public port of every running instance.
Instances = dict[tuple[str, str], int | None]


@dataclass(frozen=True)
class Plan:
    cut_s: float
    #: After the heal, before the counts.
    settle_s: float
    lossy_s: float
    kills: int


FULL = Plan(cut_s=30.0, settle_s=10.0, lossy_s=60.0, kills=3)
QUICK = Plan(cut_s=8.0, settle_s=4.0, lossy_s=6.0, kills=1)


def missing_tools() -> str | None:
    reason = netns_missing_reason()
    if reason is not None:
        return reason
    if shutil.which("etcd") is None:
        return "no etcd binary on PATH (Debian: apt-get install etcd-server)"
    if not os.access(DEFAULT_HAPROXY, os.X_OK):
        return f"haproxy is not installed at {DEFAULT_HAPROXY} (apt-get install haproxy)"
    return None


def instances(bed: HostBed, observer: str) -> Instances:
    with bed.node(observer).client(timeout=3.0) as client:
        rows = client.ps()
    return {(r["app"], r["node"]): r["public_port"] for r in rows if r["state"] == "running"}


def all_running(bed: HostBed) -> Instances | None:
    now = instances(bed, "h2")
    wanted = {f"solo-{name}": 1 for name in HOSTS} | {"everywhere": len(HOSTS)}
    return now if dict(Counter(app for app, _ in now)) == wanted else None


def app_processes(bed: HostBed) -> dict[tuple[int, float], str]:
    """(pid, create time) -> app of every greeter process in the corral hosts (the app
    from its working directory, ``<data>/apps/<app>/...``)."""
    found = {}
    for name in HOSTS:
        for pid in bed.hosts[name].pids():
            try:
                process = psutil.Process(pid)
                if not any(part.endswith("greeter.py") for part in process.cmdline()):
                    continue
                parts = Path(process.cwd()).parts
                app = parts[parts.index("apps") + 1] if "apps" in parts else "?"
                found[(pid, process.create_time())] = app
            except psutil.Error:
                continue
    return found


def down_nodes(bed: HostBed, observer: str) -> set[str]:
    with bed.node(observer).client(timeout=3.0) as client:
        entries = client.nodes()["nodes"]
    return {entry["node"] for entry in entries if entry["state"] == "down"}


def proxy_serves(bed: HostBed) -> bool:
    probe = TrafficGenerator(("127.0.0.1", 8080), host="all.test", rate=50, max_requests=30)
    with bed.hosts["edge"].inside():
        trio.run(probe.run)
    return probe.report().total().failed == 0


@dataclass
class Watch:
    """What the samples during a phase showed."""

    seen: set[tuple[str, str]] = field(default_factory=set)
    downs: set[str] = field(default_factory=set)
    double_runs: int = 0
    acknowledged: list[str] = field(default_factory=list)

    def sample_processes(self, bed: HostBed) -> None:
        counts = Counter(app_processes(bed).values())
        self.double_runs += sum(1 for app, n in counts.items() if app.startswith("solo-") and n > 1)

    def write_alias(self, bed: HostBed, index: int) -> None:
        domain = f"w{index}.alias.test"
        with bed.node(HOSTS[1 + index % 2]).client(timeout=5.0) as client:
            client.set_alias(domain, "solo-h2")
        self.acknowledged.append(domain)


async def blip(bed: HostBed, traffic: TrafficGenerator, watch: Watch, plan: Plan) -> None:
    async def observe() -> None:
        while True:
            try:
                watch.seen.update(await trio.to_thread.run_sync(instances, bed, "h2"))
            except (ApiError, OSError):
                pass  # h2 did not answer this time; the next ask may
            await trio.to_thread.run_sync(watch.sample_processes, bed)
            await trio.sleep(0.5)

    async def write() -> None:
        for index in range(10_000):
            try:
                await trio.to_thread.run_sync(watch.write_alias, bed, index)
            except (ApiError, OSError):
                pass  # not acknowledged: not counted
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(observe)
        nursery.start_soon(write)
        traffic.mark("before")
        await trio.sleep(3)
        traffic.mark("cut")
        await trio.to_thread.run_sync(bed.cut, "h1")
        await trio.sleep(plan.cut_s)
        await trio.to_thread.run_sync(bed.heal)
        traffic.mark("after")
        await trio.sleep(plan.settle_s)
        traffic.stop()
        nursery.cancel_scope.cancel()


async def lossy(bed: HostBed, traffic: TrafficGenerator, watch: Watch, lossy_s: float) -> None:
    async def observe() -> None:
        while True:
            for observer in HOSTS:
                try:
                    watch.downs.update(await trio.to_thread.run_sync(down_nodes, bed, observer))
                except (ApiError, OSError):
                    pass  # lost to the loss this time
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        nursery.start_soon(observe)
        traffic.mark("lossy")
        for name in [*HOSTS, "edge"]:
            await trio.to_thread.run_sync(bed.lossy, name, LOSS_PERCENT_PER_HOST)
        await trio.sleep(lossy_s)
        for name in [*HOSTS, "edge"]:
            await trio.to_thread.run_sync(bed.lossy, name, 0)
        await trio.sleep(2)
        traffic.stop()
        nursery.cancel_scope.cancel()


def detection_time(bed: HostBed) -> float:
    """Kill a host other than the lease holder's; seconds until the holder shows its
    node down. The host is started again (same data dir) before returning."""
    by_id = {bed.node(name).node_id: name for name in HOSTS}
    with bed.node("h2").client() as client:
        holder = by_id[str(client.nodes()["coordinator"])]
    victim = next(name for name in HOSTS if name != holder)
    victim_id = bed.node(victim).node_id
    killed = time.monotonic()
    bed.kill(victim)
    wait_for(
        f"{victim_id} down on the lease holder",
        lambda: victim_id in down_nodes(bed, holder),
        timeout=STEP,
        interval=0.05,
    )
    detected = time.monotonic() - killed
    bed.restart(victim)
    wait_for(
        f"{victim_id} alive again",
        lambda: victim_id not in down_nodes(bed, holder) and all_running(bed) is not None,
        timeout=STEP,
    )
    return detected


def model_detection_s(members: int) -> float:
    config = SwimConfig(probe_interval=PROBE_INTERVAL_MS / 1000, probe_timeout=0.1)
    return math.e / (math.e - 1) * config.probe_interval + suspicion_timeout(config, members)


def main(plan: Plan) -> int:
    missing = missing_tools()
    if missing is not None:
        print(f"bench/hosts.py cannot build its bed: {missing}", file=sys.stderr)
        return 2
    wall = time.perf_counter()
    with open_hosts(
        [*HOSTS, "edge"], etcd_hosts=HOSTS, node_ttl_ms=NODE_TTL_MS, extra_env=SWIM_ENV
    ) as bed:
        bed.start_etcd()
        for name in HOSTS:
            bed.add_node(name, labels={"host": name})
        bed.start_nodes(HOSTS)
        bed.start_proxy("edge", listen_host="127.0.0.1")
        with bed.node("h2").client() as client:
            for name in HOSTS:
                client.deploy(
                    f"solo-{name}",
                    pack_directory(GREETER),
                    replicas=1,
                    domains=[f"solo-{name}.test"],
                )
            client.deploy(
                "everywhere", pack_directory(GREETER), replicas="all", domains=["all.test"]
            )
        wait_for("every instance running", lambda: all_running(bed), timeout=STEP)
        wait_for("the proxy to serve all.test", lambda: proxy_serves(bed), timeout=STEP)
        print(f"bed ready after {time.perf_counter() - wall:.1f} s", file=sys.stderr)

        before = instances(bed, "h2")
        processes_before = set(app_processes(bed))
        watch = Watch()
        traffic = TrafficGenerator(
            ("127.0.0.1", 8080), host="all.test", rate=RATE, timeout=REQUEST_TIMEOUT
        )
        with bed.hosts["edge"].inside():
            trio.run(blip, bed, traffic, watch, plan)
        after = wait_for("every instance running again", lambda: all_running(bed), timeout=STEP)
        processes_after = set(app_processes(bed))
        with bed.node("h2").client() as client:
            aliases = {view["domain"] for view in client.aliases()["aliases"]}
        blip_report = traffic.report()
        print(f"blip done after {time.perf_counter() - wall:.1f} s", file=sys.stderr)

        lossy_traffic = TrafficGenerator(
            ("127.0.0.1", 8080), host="all.test", rate=RATE, timeout=REQUEST_TIMEOUT
        )
        lossy_from = time.time()
        with bed.hosts["edge"].inside():
            trio.run(lossy, bed, lossy_traffic, watch, plan.lossy_s)
        down_events = []  # during the loss (the blip's cut rightly put h1 down before)
        for name in HOSTS:
            with bed.node(name).client() as client:
                down_events += [
                    e
                    for e in client.events()
                    if e["kind"] == "node.down" and e["wall_time"] >= lossy_from
                ]
        lossy_report = lossy_traffic.report()
        print(f"lossy done after {time.perf_counter() - wall:.1f} s", file=sys.stderr)

        detections = [detection_time(bed) for _ in range(plan.kills)]
        print(f"detection done after {time.perf_counter() - wall:.1f} s", file=sys.stderr)

    detect_s = sum(detections) / len(detections)
    model_s = model_detection_s(len(HOSTS))
    phases: dict[str, Any] = {
        phase: blip_report.phase(phase).to_dict() for phase in ("before", "cut", "after")
    }
    phases["lossy"] = lossy_report.phase("lossy").to_dict()
    figures = {
        "relocations_on_blip": len((watch.seen | set(after)) - set(before)),
        "restarts_on_blip": len(processes_before - processes_after),
        "port_changes": sum(1 for key in before if key in after and after[key] != before[key]),
        "failed_requests_replicas_all": blip_report.total().failed,
        "double_runs": watch.double_runs,
        "etcd_writes_acknowledged": len(watch.acknowledged),
        "etcd_writes_lost": len(set(watch.acknowledged) - aliases),
        "lossy_false_downs": len(watch.downs | {e["fields"]["node"] for e in down_events}),
        "lossy_failed_requests": lossy_report.total().failed,
        "swim_detect_s": round(detect_s, 3),
        "swim_detect_runs_s": [round(value, 3) for value in detections],
        "swim_detect_model_s": round(model_s, 3),
        "swim_detect_ratio": round(detect_s / model_s, 2),
        "requests_ok_by_phase": {
            phase: summary["sent"] - summary["failed"] for phase, summary in phases.items()
        },
        "requests_by_phase": phases,
        "cut_s": plan.cut_s,
        "lossy_s": plan.lossy_s,
        "wall_s": round(time.perf_counter() - wall, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run, for CI")
    sys.exit(main(QUICK if parser.parse_args().quick else FULL))
