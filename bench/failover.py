"""Coordinator failover across processes on one machine, on a shared SQLite registry.

Run: ``.venv/bin/python bench/failover.py`` (about a minute; ``--quick`` for ~10 s).

Three node processes each run NodeRegistration and a Coordinator on one SQLite
registry file, in real time. The bench measures:

* **clean hand-back**: SIGTERM to the coordinating process -> the successor's
  first completed pass (another process's ``coordinator.pass`` event with
  trigger ``acquired``). Several rounds; the stopped node is started again
  between rounds. Target: under 1 % of the TTL.
* **crash takeover**: SIGKILL to the coordinating process -> the successor's
  first completed pass. Nothing is handed back, so the successor waits for the
  lease to lapse: expected between TTL - one tick and TTL after the kill (the
  lease lapses a TTL after the last renewal; the followers' watch sees it go).

Baselines measured in the same run: the TTL itself (each time is also given as
a ratio of it) and the raw registry floor of any hand-back: a put in one process
seen by a watcher in another (the SQLite watch polls every 50 ms).

The default runs both measurements at the default ``leaseTtlMs`` (45 s), so the
crash part takes most of a minute; ``--quick`` uses a 6 s TTL for both and two
clean hand-backs, and the output says which TTL each ratio is against.

Figures (the last line, one JSON object): ``ttl_s``, ``rounds``, ``clean_handoff_s``,
``clean_handoff_max_s``, ``clean_handoff_ratio``, ``crash_takeover_s``,
``crash_takeover_ratio``, ``raw_notify_s``, ``clean_vs_raw_ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from corral.actors.coordinator import coordinator_child_spec
from corral.actors.node_record import NodeIdentity, node_registration_child_spec
from corral.registry import MeasuredCapacity, app_key
from corral.registry._sqlite import SQLiteRegistry
from corral.supervision import SupervisorSpec, open_actor_system

DEFAULT_TTL = 45.0
QUICK_TTL = 6.0
NODES = ("node-1", "node-2", "node-3")
CAPACITY = MeasuredCapacity(
    memory_mb=8192, memory_free_mb=8192, disk_mb=100_000, disk_free_mb=100_000
)


# --------------------------------------------------------------------------- a node process


async def run_node(node_id: str, db: str, ttl: float) -> None:
    """One node: registration + coordinator; prints its coordinator events as JSON lines."""
    registry = await SQLiteRegistry.open(db)
    spec = SupervisorSpec(
        name="node",
        children=(
            node_registration_child_spec(
                NodeIdentity(node_id), registry, capacity_probe=lambda: CAPACITY, lease_ttl=ttl
            ),
            coordinator_child_spec(node_id, registry, lease_ttl=ttl),
        ),
    )

    def say(kind: str, **fields: Any) -> None:
        line = {"node": node_id, "kind": kind, "wall": time.time(), **fields}
        print(json.dumps(line), flush=True)

    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with open_actor_system(node_id) as system:
                async with system.subscribe_events() as events, trio.open_nursery() as nursery:

                    async def relay() -> None:
                        async for event in events:
                            if event.kind.startswith("coordinator."):
                                say(event.kind, **event.fields)

                    nursery.start_soon(relay)
                    await system.spawn(spec)
                    say("ready")
                    async for _ in signals:
                        break
                    nursery.cancel_scope.cancel()
                # Leaving the system stops the actors: the coordinator hands back its lease.
        say("exited")
    finally:
        await registry.aclose()


# --------------------------------------------------------------------------- the parent


class Fleet:
    """The node processes and the lines they print."""

    def __init__(self, db: str, ttl: float) -> None:
        self.db = db
        self.ttl = ttl
        self.procs: dict[str, trio.Process] = {}
        self.lines: list[dict[str, Any]] = []
        self._changed = trio.Event()

    async def start(self, nursery: trio.Nursery, node_id: str) -> None:
        proc = await trio.lowlevel.open_process(
            [sys.executable, __file__, "--node", node_id, "--db", self.db, "--ttl", str(self.ttl)],
            stdout=subprocess.PIPE,
        )
        self.procs[node_id] = proc
        nursery.start_soon(self._read, proc)
        await self.wait_for(lambda line: line["node"] == node_id and line["kind"] == "ready")

    async def _read(self, proc: trio.Process) -> None:
        assert proc.stdout is not None
        buffer = b""
        async for chunk in proc.stdout:
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                if raw.strip():
                    self.lines.append(json.loads(raw))
                    self._changed.set()
                    self._changed = trio.Event()

    async def wait_for(
        self, match: Callable[[dict[str, Any]], bool], *, after: int = 0, limit: float = 120.0
    ) -> dict[str, Any]:
        with trio.fail_after(limit):
            seen = after
            while True:
                for line in self.lines[seen:]:
                    if match(line):
                        return line
                seen = len(self.lines)
                await self._changed.wait()

    def holder(self) -> str | None:
        current: str | None = None
        for line in self.lines:
            if line["kind"] == "coordinator.acquired":
                current = line["node"]
            elif line["kind"] in ("coordinator.lost", "coordinator.handing-back") and (
                line["node"] == current
            ):
                current = None
        return current

    async def takeover(self, sig: int, *, limit: float) -> tuple[str, str, float]:
        """Signal the holder; return (old holder, successor, seconds to its first pass)."""
        old = await self.current_holder()
        mark = len(self.lines)
        sent = time.time()
        self.procs[old].send_signal(sig)
        line = await self.wait_for(
            lambda line: (
                line["kind"] == "coordinator.pass"
                and line["node"] != old
                and line.get("trigger") == "acquired"
            ),
            after=mark,
            limit=limit,
        )
        elapsed = line["wall"] - sent
        await self.procs[old].wait()
        return old, line["node"], elapsed

    async def current_holder(self) -> str:
        await self.wait_for(lambda line: line["kind"] == "coordinator.acquired")
        holder = self.holder()
        while holder is None:
            await trio.sleep(0.01)
            holder = self.holder()
        return holder

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()


async def watch_floor(db: str) -> None:
    """Child side of the raw floor: print the wall time of every ``apps/`` event."""
    registry = await SQLiteRegistry.open(db)
    try:
        async with registry.watch("apps/") as events:
            print(json.dumps({"kind": "watching"}), flush=True)
            async for event in events:
                print(
                    json.dumps({"kind": "event", "key": event.kv.key, "wall": time.time()}),
                    flush=True,
                )
    finally:
        await registry.aclose()


async def raw_notify_floor(db: str, rounds: int = 10) -> float:
    """Median seconds from a put in this process to a watcher in another process
    seeing it: the floor under any cross-process hand-back."""
    writer = await SQLiteRegistry.open(db)
    proc = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--watch-floor", "--db", db], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    lines = _lines(proc.stdout)
    samples: list[float] = []
    try:
        with trio.fail_after(30):
            assert (await lines.__anext__())["kind"] == "watching"
            for i in range(rounds):
                await trio.sleep(0.037)  # vary the phase against the watcher's poll
                sent = time.time()
                await writer.put(app_key(f"floor-{i}"), b"{}")
                seen = await lines.__anext__()
                samples.append(seen["wall"] - sent)
    finally:
        proc.kill()
        await proc.wait()
        await writer.aclose()
    return statistics.median(samples)


async def _lines(stream: trio.abc.ReceiveStream) -> Any:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while b"\n" in buffer:
            raw, buffer = buffer.split(b"\n", 1)
            if raw.strip():
                yield json.loads(raw)


async def bench(ttl: float, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-failover-") as tmp:
        floor = await raw_notify_floor(str(Path(tmp) / "floor.db"))
        fleet = Fleet(str(Path(tmp) / "registry.db"), ttl)
        clean: list[float] = []
        try:
            async with trio.open_nursery() as nursery:
                for node in NODES:
                    await fleet.start(nursery, node)
                await trio.sleep(0.5)  # every node registered
                for _ in range(rounds):
                    old, _new, seconds = await fleet.takeover(signal.SIGTERM, limit=ttl)
                    clean.append(seconds)
                    await fleet.start(nursery, old)
                    await trio.sleep(0.3)
                _, _, crash = await fleet.takeover(signal.SIGKILL, limit=3 * ttl)
                fleet.stop_all()
                nursery.cancel_scope.cancel()
        finally:
            fleet.stop_all()

    clean_s = statistics.median(clean)
    return {
        "ttl_s": ttl,
        "rounds": rounds,
        "clean_handoff_s": round(clean_s, 4),
        "clean_handoff_max_s": round(max(clean), 4),
        "clean_handoff_ratio": round(clean_s / ttl, 5),
        "crash_takeover_s": round(crash, 3),
        "crash_takeover_ratio": round(crash / ttl, 3),
        "raw_notify_s": round(floor, 4),
        "clean_vs_raw_ratio": round(clean_s / floor, 2) if floor > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--watch-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ttl", type=float, default=None, help="lease TTL in seconds")
    parser.add_argument("--quick", action="store_true", help=f"use a {QUICK_TTL:g} s TTL")
    parser.add_argument(
        "--rounds", type=int, default=None, help="clean hand-back rounds (5; --quick: 2)"
    )
    args = parser.parse_args()
    if args.watch_floor:
        trio.run(watch_floor, args.db)
        return
    if args.node:
        trio.run(run_node, args.node, args.db, args.ttl or DEFAULT_TTL)
        return
    ttl = args.ttl or (QUICK_TTL if args.quick else DEFAULT_TTL)
    result = trio.run(bench, ttl, args.rounds or (2 if args.quick else 5))
    print(f"failover on one machine, 3 node processes, SQLite registry, cores={os.cpu_count()}")
    print(f"{'measure':<30}{'seconds':>10}{'ratio':>12}  baseline")
    print(
        f"{'clean hand-back (median)':<30}{result['clean_handoff_s']:>10.4f}"
        f"{result['clean_handoff_ratio']:>12.5f}  TTL {ttl:g} s"
    )
    print(
        f"{'clean hand-back (worst)':<30}{result['clean_handoff_max_s']:>10.4f}"
        f"{result['clean_handoff_max_s'] / ttl:>12.5f}  TTL {ttl:g} s"
    )
    print(
        f"{'clean vs raw notify floor':<30}{result['raw_notify_s']:>10.4f}"
        f"{result['clean_vs_raw_ratio']:>12}  raw put->watch"
    )
    print(
        f"{'crash takeover':<30}{result['crash_takeover_s']:>10.3f}"
        f"{result['crash_takeover_ratio']:>12.3f}  TTL {ttl:g} s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
