"""One OS process of the SQLite sharing stress test (tests/registry/test_sqlite_busy.py).

Usage: ``python sqlite_stress_worker.py PATH NAME ROLE SECONDS OPENS``. ROLE is
``plain``, ``full`` (synchronous=FULL: writes in a worker thread) or
``checkpoint`` (a checkpoint after every commit, and a raw RESTART checkpoint
from a connection of its own now and then).

The worker imports everything, prints ``ready`` and waits for a line on stdin, so
that every process starts at the same moment. It then opens, writes ``nodes/NAME``
to, and closes the fresh files ``PATH.0`` .. ``PATH.<OPENS-1>`` in turn (racing
the other processes through creating each one), opens the fresh file PATH, and
for SECONDS runs a mix of guarded increments of one shared counter, short leases
left to expire, keepalives, revokes, ranges, gets and a watch. It prints one
JSON line of counts (how many increments succeeded, ...), and exits 1 with the
traceback on any error.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import traceback

import trio

from corral.registry import Compare, Get, LeaseNotFound, Put, SQLiteRegistry

COUNTER = "apps/counter"


async def main(path: str, name: str, role: str, seconds: float, opens: int) -> dict[str, int]:
    print("ready", flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)
    # Every process opens the same fresh files in the same order, so they race
    # each other through creating them and switching them to WAL.
    synchronous = "FULL" if role == "full" else "NORMAL"
    for i in range(opens):
        fresh = await SQLiteRegistry.open(f"{path}.{i}", synchronous=synchronous)
        await fresh.put(f"nodes/{name}", b"opened")
        await fresh.aclose()
    registry = await SQLiteRegistry.open(
        path,
        poll_interval=0.01,
        synchronous=synchronous,
        checkpoint_every=1 if role == "checkpoint" else 50,
    )
    counts = {"increments": 0, "leases": 0, "reads": 0, "events": 0, "checkpoints": 0}
    deadline = trio.current_time() + seconds
    rng = random.Random(name)

    async def increments() -> None:
        while trio.current_time() < deadline:
            kv = await registry.get(COUNTER)
            if kv is None:
                guard, value = Compare.absent(COUNTER), 0
            else:
                guard, value = Compare.mod_revision_is(COUNTER, kv.mod_revision), int(kv.value)
            result = await registry.txn(
                [guard], [Put(COUNTER, str(value + 1).encode())], [Get(COUNTER)]
            )
            counts["increments"] += result.succeeded

    async def leases() -> None:
        i = 0
        while trio.current_time() < deadline:
            lease = await registry.grant(rng.uniform(0.05, 0.2))
            try:
                await registry.put(f"nodes/{name}-{i}", b"alive", lease=lease.id)
            except LeaseNotFound:
                pass  # a busy machine let it expire already: that is allowed
            if rng.random() < 0.5:
                try:
                    await registry.keepalive(lease.id)
                except LeaseNotFound:
                    pass  # it may have expired already: that is allowed
            if rng.random() < 0.2:
                await registry.revoke(lease.id)
            if rng.random() < 0.1:
                await registry.delete(f"nodes/{name}-", prefix=True)
            counts["leases"] += 1
            i += 1
            await trio.sleep(rng.uniform(0, 0.01))

    async def reads() -> None:
        while trio.current_time() < deadline:
            await registry.range("nodes/")
            await registry.get(f"nodes/{name}-0")
            await registry.revision()
            counts["reads"] += 1
            await trio.sleep(rng.uniform(0, 0.005))

    async def watch() -> None:
        with trio.move_on_at(deadline):
            async with registry.watch("nodes/") as events:
                last = 0
                async for event in events:
                    assert event.kv.mod_revision >= last, (event, last)
                    last = event.kv.mod_revision
                    counts["events"] += 1

    async def raw_checkpoints() -> None:
        def restart() -> None:
            conn = sqlite3.connect(path, timeout=10.0, isolation_level=None)
            try:
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                conn.close()

        while trio.current_time() < deadline:
            await trio.sleep(rng.uniform(0.05, 0.2))
            await trio.to_thread.run_sync(restart)
            counts["checkpoints"] += 1

    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(registry.run_sweeper, 0.02)
            # Every task ends by itself at the deadline (none is cancelled in the
            # middle of a write, so the increments counted are the ones made).
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(increments)
                nursery.start_soon(leases)
                nursery.start_soon(reads)
                nursery.start_soon(watch)
                if role == "checkpoint":
                    nursery.start_soon(raw_checkpoints)
            outer.cancel_scope.cancel()
    finally:
        await registry.aclose()
    return counts


if __name__ == "__main__":
    try:
        print(json.dumps(trio.run(main, *sys.argv[1:4], float(sys.argv[4]), int(sys.argv[5]))))
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
