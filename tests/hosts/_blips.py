"""What the blip scenarios (issue 26) share: the bed, the apps, and the observations.

Three corral hosts (each an etcd member and a node labelled ``host=<name>``) and an
``edge`` host running HAProxy on its own loopback, where the load generator runs too.
Three single-replica apps (``solo-hN``, wherever the planner puts them) and one on
every host (``everywhere``, ``replicas all``). The issue asks for five hosts at
200 req/s; this machine (2 shared cores) runs three at 100 req/s.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import trio

from corral.node._errors import ApiError
from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.registry import Record, Undecodable, decode_record
from corral.testing import HostBed, TrafficGenerator, open_hosts, require_netns

from .conftest import (
    NODE_TTL_MS,
    SWIM_ENV,
    keep_logs_on_failure,
    require_etcd_binary,
    require_haproxy,
)

GREETER = Path(__file__).resolve().parents[2] / "examples" / "apps" / "greeter"
HOSTS = ["h1", "h2", "h3"]
SOLO_APPS = [f"solo-{name}" for name in HOSTS]
RATE = 100.0
STEP = 40.0
#: Above HAProxy's 2 s connect timeout, so its redispatch to another server can answer.
REQUEST_TIMEOUT = 5.0

#: (app, node) -> public port of every running instance.
Instances = dict[tuple[str, str], int | None]


@contextmanager
def open_blip_bed(
    request: pytest.FixtureRequest, *, extra_env: Mapping[str, str] | None = None
) -> Iterator[HostBed]:
    """The bed of the blip scenarios, nodes and proxy running, no app deployed;
    ``extra_env`` is added to :data:`~.conftest.SWIM_ENV` for each node."""
    require_netns()
    require_etcd_binary()
    require_haproxy()
    with open_hosts(
        [*HOSTS, "edge"],
        etcd_hosts=HOSTS,
        node_ttl_ms=NODE_TTL_MS,
        extra_env={**SWIM_ENV, **(extra_env or {})},
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


def app_processes(bed: HostBed, hosts: list[str] | None = None) -> set[tuple[int, float]]:
    """(pid, create time) of every app process in the corral hosts."""
    found = set()
    for name in hosts or HOSTS:
        for pid in bed.hosts[name].pids():
            try:
                process = psutil.Process(pid)
                if any(part.endswith("greeter.py") for part in process.cmdline()):
                    found.add((pid, process.create_time()))
            except psutil.Error:
                continue
    return found


def processes_by_app(bed: HostBed, hosts: list[str] | None = None) -> dict[str, int]:
    """How many processes each app has across the corral hosts (by the CORRAL_APP the
    node gives them)."""
    counts: dict[str, int] = {}
    for name in hosts or HOSTS:
        for pid in bed.hosts[name].pids():
            try:
                app = psutil.Process(pid).environ().get("CORRAL_APP")
            except psutil.Error:
                continue
            if app:
                counts[app] = counts.get(app, 0) + 1
    return counts


def all_running(
    bed: HostBed, observer: str = "h2", hosts: list[str] | None = None
) -> Instances | None:
    """The running instances, once each solo app runs once and ``everywhere`` on each
    of ``hosts`` (every corral host by default)."""
    now = instances(bed, observer)
    apps = [app for app, _ in now]
    wanted = {app: 1 for app in SOLO_APPS} | {"everywhere": len(hosts or HOSTS)}
    return now if {app: apps.count(app) for app in set(apps)} == wanted else None


def deploy_apps(bed: HostBed, via: str = "h2") -> None:
    with bed.node(via).client() as client:
        for app in SOLO_APPS:
            client.deploy(app, pack_directory(GREETER), replicas=1, domains=[f"{app}.test"])
        client.deploy("everywhere", pack_directory(GREETER), replicas="all", domains=["all.test"])


def coordinator_states(bed: HostBed) -> str:
    """Each node's own coordinator state (its last pass, its counts, what it left
    unplaced), as text: what to read when placement did not happen."""
    parts = []
    for name, node in bed.nodes.items():
        try:
            with node.client(timeout=5) as client:
                parts.append(f"{name}: {json.dumps(client.state().get('coordinator'))}")
        except (ApiError, OSError) as exc:
            parts.append(f"{name}: no answer ({exc})")
    return "\n".join(parts)


def wait_all_running(
    bed: HostBed, what: str, observer: str = "h2", hosts: list[str] | None = None
) -> Instances:
    """:func:`all_running` within STEP; on a timeout, each coordinator's state is
    printed before the error."""
    try:
        return wait_for(what, lambda: all_running(bed, observer, hosts), timeout=STEP)
    except Exception:
        print(f"coordinator states:\n{coordinator_states(bed)}")
        raise


def wait_proxy_serves(bed: HostBed, host: str = "all.test") -> None:
    def proxy_serves() -> bool:
        probe = TrafficGenerator(("127.0.0.1", 8080), host=host, rate=50, max_requests=30)
        with bed.hosts["edge"].inside():
            trio.run(probe.run)
        return probe.report().total().failed == 0

    wait_for(f"the proxy to serve {host}", proxy_serves, timeout=STEP)


def start_apps(bed: HostBed) -> Instances:
    """Deploy the scenario's apps and wait until every instance runs and the proxy
    serves the ``replicas all`` app."""
    deploy_apps(bed)
    running = wait_all_running(bed, "every instance running")
    wait_proxy_serves(bed)
    return running


def lease(bed: HostBed, observer: str) -> tuple[str, int] | None:
    """The lease's holder and fence as ``observer`` sees them (None: no holder, or
    no answer)."""
    try:
        with bed.node(observer).client(timeout=5) as client:
            answer = client.nodes()
    except (ApiError, OSError):
        return None
    if not answer.get("coordinator"):
        return None
    return str(answer["coordinator"]), int(answer["fence"])


def host_of(bed: HostBed, node_id: str) -> str:
    """The host a node runs in."""
    return next(name for name, node in bed.nodes.items() if node.node_id == node_id)


def traffic(rate: float = RATE) -> TrafficGenerator:
    """Requests to the ``replicas all`` app through the edge host's HAProxy."""
    return TrafficGenerator(
        ("127.0.0.1", 8080), host="all.test", rate=rate, timeout=REQUEST_TIMEOUT
    )


async def record_instances(
    bed: HostBed, observers: list[str], seen: set[tuple[str, str]], interval: float = 1.0
) -> None:
    """Add every (app, node) running to ``seen``, asked of the first of ``observers``
    that answers, every ``interval`` seconds (runs until cancelled)."""
    while True:
        for observer in observers:
            try:
                seen.update(await trio.to_thread.run_sync(instances, bed, observer))
                break
            except (ApiError, OSError):
                continue  # not answering this time; the next may
        await trio.sleep(interval)


@dataclass
class Samples:
    """What :func:`sample` saw over a scenario."""

    #: Every (app, node) seen running.
    seen: set[tuple[str, str]] = field(default_factory=set)
    #: Per app, the most processes it had at one instant (across the corral hosts).
    most_processes: dict[str, int] = field(default_factory=dict)
    #: (holder, fence) of the lease, each change once, in the order seen.
    leases: list[tuple[str, int]] = field(default_factory=list)
    #: Per node id, its states as the observer listed them, each change once.
    node_states: dict[str, list[str]] = field(default_factory=dict)
    #: (monotonic time, instances) of every answer.
    timeline: list[tuple[float, Instances]] = field(default_factory=list)

    def hand_overs(self) -> int:
        return max(0, len(self.leases) - 1)

    def double_runs(self, apps: list[str] | None = None) -> int:
        """Apps that had two processes at one instant."""
        return sum(1 for app in apps or SOLO_APPS if self.most_processes.get(app, 0) > 1)


def _observe(bed: HostBed, observers: list[str], samples: Samples) -> None:
    for app, count in processes_by_app(bed).items():
        samples.most_processes[app] = max(samples.most_processes.get(app, 0), count)
    for observer in observers:
        try:
            with bed.node(observer).client(timeout=3) as client:
                rows = client.ps()
                answer = client.nodes()
        except (ApiError, OSError):
            continue  # not answering this time; the next may
        now = {(r["app"], r["node"]): r["public_port"] for r in rows if r["state"] == "running"}
        samples.seen.update(now)
        samples.timeline.append((time.monotonic(), now))
        if answer.get("coordinator"):
            holder = (str(answer["coordinator"]), int(answer["fence"]))
            if not samples.leases or samples.leases[-1] != holder:
                samples.leases.append(holder)
        for entry in answer.get("nodes", []):
            states = samples.node_states.setdefault(entry["node"], [])
            if not states or states[-1] != entry["state"]:
                states.append(entry["state"])
        return


async def sample(
    bed: HostBed, observers: list[str], samples: Samples, interval: float = 0.5
) -> None:
    """Fill ``samples`` every ``interval`` seconds, asking the first of ``observers``
    that answers (runs until cancelled)."""
    while True:
        await trio.to_thread.run_sync(_observe, bed, observers, samples)
        await trio.sleep(interval)


def etcd_history(bed: HostBed, host: str) -> list[tuple[str, int, Record | Undecodable | None]]:
    """Every write to the registry since it began, as (key, mod revision, decoded
    record; None for a deletion), from host ``host``'s etcd member (the beds never
    compact, so the whole history is there)."""
    member = bed.etcd[host]
    every_key = {
        "key": base64.b64encode(b"\0").decode(),
        "range_end": base64.b64encode(b"\0").decode(),
    }
    url = f"http://{member.endpoint}/v3"
    with member.host.inside():
        head = urllib.request.Request(
            f"{url}/kv/range", data=json.dumps({**every_key, "count_only": True}).encode()
        )
        with urllib.request.urlopen(head, timeout=5) as response:
            last = int(json.loads(response.read())["header"]["revision"])
        create = {"create_request": {**every_key, "start_revision": "1"}}
        request = urllib.request.Request(f"{url}/watch", data=json.dumps(create).encode())
        history: list[tuple[str, int, Record | Undecodable | None]] = []
        with urllib.request.urlopen(request, timeout=10) as response:
            for line in response:
                for event in json.loads(line).get("result", {}).get("events") or []:
                    kv = event["kv"]
                    key = base64.b64decode(kv["key"]).decode()
                    revision = int(kv["mod_revision"])
                    if event.get("type") == "DELETE":
                        history.append((key, revision, None))
                    else:
                        value = base64.b64decode(kv.get("value", ""))
                        history.append((key, revision, decode_record(key, value)))
                if history and history[-1][1] >= last:
                    break
    return history


def stale_writes(
    history: list[tuple[str, int, Record | Undecodable | None]], fence: int
) -> list[tuple[str, int, int]]:
    """The fenced records written after the lease under ``fence`` was taken (its key
    created at revision ``fence``) under an older fence: (key, revision, their fence)."""
    return [
        (key, revision, record_fence)
        for key, revision, record in history
        if revision > fence
        and isinstance(record_fence := getattr(record, "fence", None), int)
        and record_fence < fence
    ]
