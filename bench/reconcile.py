"""Benchmark: the reconcile loop's idle pass, and starting/stopping real processes.

Two measurements, each against a baseline taken in the same run:

1. **Idle pass** — a pass whose change token has not moved (and no timer is due) at
   10 and at 10,000 assigned apps, on the in-memory registry. The pass runs in the real
   Reconciler actor; its two siblings are small stand-ins (the real ProcessSupervisor
   would need 10,000 processes) that answer what the Reconciler asks. The ratio
   10,000 / 10 should stay flat (target <= 1.5). A forced full pass at both sizes is
   shown beside it: what the token check saves.
2. **Start/stop 100 processes** (``sleep 600``) through the real ProcessSupervisor
   (own process groups, pid files, log pipes, SIGTERM -> reap), beside starting the
   same 100 with bare ``trio.run_process`` and cancelling them.

Run: ``python bench/reconcile.py`` (about half a minute); ``--quick`` (a few seconds) runs
1,000 apps against 10, 200 idle passes and 10 processes, the same code at smaller sizes.

Figures (the last line, one JSON object): ``idle_pass_small_us``, ``idle_pass_large_us``,
``idle_pass_ratio``, ``full_pass_small_ms``, ``full_pass_large_ms``, ``start_ms``,
``stop_ms``, ``bare_start_ms``, ``bare_stop_ms``, ``start_stop_ratio``, and the sizes they
were measured at: ``apps_small``, ``apps_large``, ``processes``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from corral.actors.coordinator import plan_writes
from corral.actors.port_allocator import EnsurePair, ReleasePorts
from corral.actors.process_supervisor import (
    ForgetProcess,
    ListProcesses,
    ProcessGeneration,
    ProcessSupervisor,
    StartProcess,
    StopProcess,
)
from corral.actors.reconciler import Reconciler, RunPass
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    NodeRecord,
    app_key,
    node_key,
)
from corral.supervision import Actor, ActorRef, ChildSpec, SupervisorSpec, open_actor_system

NODE = "node-a"
REVISION = "1" * 64


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does."""

    apps_small: int
    apps_large: int
    idle_passes: int
    processes: int


FULL = Sizes(apps_small=10, apps_large=10_000, idle_passes=2000, processes=100)
QUICK = Sizes(apps_small=10, apps_large=1_000, idle_passes=200, processes=10)


class StandInProcesses(Actor):
    """Answers the Reconciler as a ProcessSupervisor whose processes all run."""

    mailbox_size = 1024

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, Any]] = {}
        self.generation = 0

    async def handle(self, message: object) -> object:
        match message:
            case StartProcess():
                self.rows[message.app] = {
                    "app": message.app,
                    "state": "running",
                    "pid": 1,
                    "revision": message.revision,
                    "public_port": message.public_port,
                    "internal_port": message.internal_port,
                    "restarts": 0,
                    "crash_loop": False,
                }
                self.generation += 1
                return True
            case StopProcess():
                self.rows.pop(message.app, None)
                self.generation += 1
                return True
            case ForgetProcess():
                return True
            case ListProcesses():
                return list(self.rows.values())
            case ProcessGeneration():
                return f"0:{self.generation}"
        return None


class StandInPorts(Actor):
    """Answers the Reconciler as a PortAllocator with an unbounded range."""

    mailbox_size = 1024

    def __init__(self) -> None:
        super().__init__()
        self.pairs: dict[str, tuple[int, int]] = {}

    async def handle(self, message: object) -> object:
        match message:
            case EnsurePair():
                n = self.pairs.setdefault(message.app, (len(self.pairs), 0))[0]
                return {"ok": True, "app": message.app, "public": 2 * n, "internal": 2 * n + 1}
            case ReleasePorts():
                return {"ok": True, "released": None}
        return None


async def seed_registry(registry: MemoryRegistry, apps: int) -> None:
    """The node, ``apps`` apps, and their placements on it written as the coordinator
    writes them: each placement with the app's spec, and the node's assignment index
    (``assign/<node>``, the one key its reconciler reads first) in the same transactions."""
    await registry.put(node_key(NODE), NodeRecord(NODE).encode())
    deployment = Deployment(REVISION, ["python3", "server.py"])
    records = {}
    for i in range(apps):
        name = f"app-{i:05d}"
        records[name] = AppRecord(name, deployment=deployment)
        await registry.put(app_key(name), records[name].encode())
    targets = {name: (NODE,) for name in records}
    plan = plan_writes(targets, {}, fence=1, decided_at=0.0, apps=records)
    for batch in plan.batches:
        await registry.txn([], list(batch.operations))


@asynccontextmanager
async def settled_reconciler(apps: int, data_dir: Path) -> AsyncIterator[tuple[ActorRef, float]]:
    """A Reconciler (with stand-in siblings) serving ``apps`` apps, settled: its next
    pass finds the token unmoved. Yields its ref and how long settling took."""
    registry = MemoryRegistry()
    await seed_registry(registry, apps)

    async def materialize(app: str, deployment: Deployment) -> Path:
        await trio.lowlevel.checkpoint()
        return data_dir

    spec = SupervisorSpec(
        name="agent",
        children=[
            ChildSpec(name="process_supervisor", factory=StandInProcesses),
            ChildSpec(name="port_allocator", factory=StandInPorts),
            ChildSpec(
                name="reconciler",
                factory=lambda: Reconciler(
                    node_id=NODE,
                    data_dir=data_dir,
                    registry=registry,
                    materialize=materialize,
                    interval=3600.0,
                    full_pass_every=3600.0,
                    debounce=0.0,
                    ask_timeout=600.0,
                ),
            ),
        ],
    )
    async with open_actor_system(NODE) as system:
        await system.spawn(spec)
        reconciler = system.ref("/agent/reconciler")
        t0 = time.perf_counter()
        while not (await reconciler.ask(RunPass(), timeout=600))["skipped"]:
            pass
        yield reconciler, time.perf_counter() - t0


async def per_pass(reconciler: ActorRef, passes: int, *, force: bool = False) -> float:
    t0 = time.perf_counter()
    for _ in range(passes):
        summary = await reconciler.ask(RunPass(force=force), timeout=600)
        assert summary["skipped"] != force
        assert summary["actions"] == []
    return (time.perf_counter() - t0) / passes


async def measure_passes(data_dir: Path, sizes: Sizes) -> dict[str, float]:
    """Both sizes live side by side in one heap; their idle batches alternate, so
    garbage collection and a busy machine weigh on both alike."""
    async with (
        settled_reconciler(sizes.apps_small, data_dir) as (small, _),
        settled_reconciler(sizes.apps_large, data_dir) as (large, settle),
    ):
        small_idle, large_idle = [], []
        for _ in range(20):
            small_idle.append(await per_pass(small, sizes.idle_passes // 20))
            large_idle.append(await per_pass(large, sizes.idle_passes // 20))
        small_full = await per_pass(small, 3, force=True)
        large_full = await per_pass(large, 3, force=True)
    return {
        "small_idle": statistics.median(small_idle),
        "large_idle": statistics.median(large_idle),
        "small_full": small_full,
        "large_full": large_full,
        "settle": settle,
    }


async def measure_processes(data_dir: Path, processes_wanted: int) -> dict[str, float]:
    command = ("sleep", "600")
    spec = ChildSpec(
        name="process_supervisor",
        factory=lambda: ProcessSupervisor(
            node_id=NODE, data_dir=data_dir, notify=None, ready_timeout=0.5, grace=5.0
        ),
        shutdown_grace=30.0,
    )
    async with open_actor_system(NODE) as system:
        processes = await system.spawn(spec)
        t0 = time.perf_counter()
        for i in range(processes_wanted):
            await processes.ask(
                StartProcess(f"app-{i:03d}", REVISION, command, str(data_dir), 30000 + i, 31000 + i)
            )
        while True:
            rows = await processes.ask(ListProcesses())
            if sum(1 for row in rows if row["pid"]) == processes_wanted:
                break
            await trio.sleep(0.01)
        started = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(processes_wanted):
            await processes.ask(StopProcess(f"app-{i:03d}", "benchmark"))
        while True:
            rows = await processes.ask(ListProcesses())
            if all(row["state"] == "stopped" for row in rows):
                break
            await trio.sleep(0.01)
        stopped = time.perf_counter() - t0

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(processes_wanted):
            await nursery.start(trio.run_process, list(command))
        bare_started = time.perf_counter() - t0
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    bare_stopped = time.perf_counter() - t1
    return {
        "start": started,
        "stop": stopped,
        "bare_start": bare_started,
        "bare_stop": bare_stopped,
    }


async def main(sizes: Sizes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        passes = await measure_passes(Path(tmp), sizes)
        procs = await measure_processes(Path(tmp) / "procs", sizes.processes)
    small = {"idle": passes["small_idle"], "full": passes["small_full"]}
    large = {"idle": passes["large_idle"], "full": passes["large_full"]}
    idle_ratio = large["idle"] / small["idle"]
    ours = procs["start"] + procs["stop"]
    bare = procs["bare_start"] + procs["bare_stop"]
    few, many, n = f"{sizes.apps_small:,} apps", f"{sizes.apps_large:,} apps", sizes.processes
    rows = [
        (f"idle pass, {few}", f"{small['idle'] * 1e6:9.1f} us", "1.00 (baseline)"),
        (f"idle pass, {many}", f"{large['idle'] * 1e6:9.1f} us", f"{idle_ratio:.2f}"),
        (f"full pass, {few}", f"{small['full'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        (
            f"full pass, {many}",
            f"{large['full'] * 1e3:9.1f} ms",
            f"{large['full'] / small['full']:.0f}",
        ),
        (f"bare trio: start {n}", f"{procs['bare_start'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        (f"bare trio: stop {n}", f"{procs['bare_stop'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        (
            f"supervisor: start {n}",
            f"{procs['start'] * 1e3:9.1f} ms",
            f"{procs['start'] / procs['bare_start']:.2f}",
        ),
        (
            f"supervisor: stop {n}",
            f"{procs['stop'] * 1e3:9.1f} ms",
            f"{procs['stop'] / procs['bare_stop']:.2f}",
        ),
        (f"supervisor: start+stop {n}", f"{ours * 1e3:9.1f} ms", f"{ours / bare:.2f}"),
    ]
    print(f"{'measurement':<28} {'time':>12}  ratio")
    for name, value, ratio in rows:
        print(f"{name:<28} {value:>12}  {ratio}")
    print(f"(settling {many} took {passes['settle']:.1f} s)")
    return {
        "idle_pass_small_us": round(small["idle"] * 1e6, 1),
        "idle_pass_large_us": round(large["idle"] * 1e6, 1),
        "idle_pass_ratio": round(idle_ratio, 3),
        "full_pass_small_ms": round(small["full"] * 1e3, 2),
        "full_pass_large_ms": round(large["full"] * 1e3, 1),
        "start_ms": round(procs["start"] * 1e3, 1),
        "stop_ms": round(procs["stop"] * 1e3, 1),
        "bare_start_ms": round(procs["bare_start"] * 1e3, 1),
        "bare_stop_ms": round(procs["bare_stop"] * 1e3, 1),
        "start_stop_ratio": round(ours / bare, 3),
        "apps_small": sizes.apps_small,
        "apps_large": sizes.apps_large,
        "processes": sizes.processes,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a few seconds")
    args = parser.parse_args()
    figures = trio.run(main, QUICK if args.quick else FULL)
    print(json.dumps(figures))
