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

Run: ``python bench/reconcile.py``. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

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
    PlacementRecord,
    app_key,
    node_key,
    placement_key,
)
from corral.supervision import Actor, ActorRef, ChildSpec, SupervisorSpec, open_actor_system

NODE = "node-a"
REVISION = "1" * 64
IDLE_PASSES = 2000
PROCESSES = 100


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
    await registry.put(node_key(NODE), NodeRecord(NODE).encode())
    deployment = Deployment(REVISION, ["python3", "server.py"])
    for i in range(apps):
        name = f"app-{i:05d}"
        await registry.put(app_key(name), AppRecord(name, deployment=deployment).encode())
        await registry.put(placement_key(name), PlacementRecord([NODE], 0.0, 1).encode())


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


async def measure_passes(data_dir: Path) -> dict[str, float]:
    """Both sizes live side by side in one heap; their idle batches alternate, so
    garbage collection and a busy machine weigh on both alike."""
    async with (
        settled_reconciler(10, data_dir) as (small, _),
        settled_reconciler(10_000, data_dir) as (large, settle),
    ):
        small_idle, large_idle = [], []
        for _ in range(20):
            small_idle.append(await per_pass(small, IDLE_PASSES // 20))
            large_idle.append(await per_pass(large, IDLE_PASSES // 20))
        small_full = await per_pass(small, 3, force=True)
        large_full = await per_pass(large, 3, force=True)
    return {
        "small_idle": statistics.median(small_idle),
        "large_idle": statistics.median(large_idle),
        "small_full": small_full,
        "large_full": large_full,
        "settle": settle,
    }


async def measure_processes(data_dir: Path) -> dict[str, float]:
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
        for i in range(PROCESSES):
            await processes.ask(
                StartProcess(f"app-{i:03d}", REVISION, command, str(data_dir), 30000 + i, 31000 + i)
            )
        while True:
            rows = await processes.ask(ListProcesses())
            if sum(1 for row in rows if row["pid"]) == PROCESSES:
                break
            await trio.sleep(0.01)
        started = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(PROCESSES):
            await processes.ask(StopProcess(f"app-{i:03d}", "benchmark"))
        while True:
            rows = await processes.ask(ListProcesses())
            if all(row["state"] == "stopped" for row in rows):
                break
            await trio.sleep(0.01)
        stopped = time.perf_counter() - t0

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(PROCESSES):
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


async def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        passes = await measure_passes(Path(tmp))
        procs = await measure_processes(Path(tmp) / "procs")
    small = {"idle": passes["small_idle"], "full": passes["small_full"]}
    large = {"idle": passes["large_idle"], "full": passes["large_full"]}
    idle_ratio = large["idle"] / small["idle"]
    ours = procs["start"] + procs["stop"]
    bare = procs["bare_start"] + procs["bare_stop"]
    rows = [
        ("idle pass, 10 apps", f"{small['idle'] * 1e6:9.1f} us", "1.00 (baseline)"),
        ("idle pass, 10,000 apps", f"{large['idle'] * 1e6:9.1f} us", f"{idle_ratio:.2f}"),
        ("full pass, 10 apps", f"{small['full'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        (
            "full pass, 10,000 apps",
            f"{large['full'] * 1e3:9.1f} ms",
            f"{large['full'] / small['full']:.0f}",
        ),
        ("bare trio: start 100", f"{procs['bare_start'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        ("bare trio: stop 100", f"{procs['bare_stop'] * 1e3:9.1f} ms", "1.00 (baseline)"),
        (
            "supervisor: start 100",
            f"{procs['start'] * 1e3:9.1f} ms",
            f"{procs['start'] / procs['bare_start']:.2f}",
        ),
        (
            "supervisor: stop 100",
            f"{procs['stop'] * 1e3:9.1f} ms",
            f"{procs['stop'] / procs['bare_stop']:.2f}",
        ),
        ("supervisor: start+stop 100", f"{ours * 1e3:9.1f} ms", f"{ours / bare:.2f}"),
    ]
    print(f"{'measurement':<28} {'time':>12}  ratio")
    for name, value, ratio in rows:
        print(f"{name:<28} {value:>12}  {ratio}")
    print(f"(settling 10,000 apps took {passes['settle']:.1f} s)")
    return {
        "idle_pass_10_us": round(small["idle"] * 1e6, 1),
        "idle_pass_10000_us": round(large["idle"] * 1e6, 1),
        "idle_pass_ratio": round(idle_ratio, 3),
        "full_pass_10_ms": round(small["full"] * 1e3, 2),
        "full_pass_10000_ms": round(large["full"] * 1e3, 1),
        "start_100_ms": round(procs["start"] * 1e3, 1),
        "stop_100_ms": round(procs["stop"] * 1e3, 1),
        "bare_start_100_ms": round(procs["bare_start"] * 1e3, 1),
        "bare_stop_100_ms": round(procs["bare_stop"] * 1e3, 1),
        "start_stop_ratio": round(ours / bare, 3),
    }


if __name__ == "__main__":
    figures = trio.run(main)
    print(json.dumps(figures))
