"""The SQLite backend waits out a busy database (another process holding a lock)
for up to busy_timeout, on every path: opening, reads, writes on the loop and in
the worker thread (synchronous=FULL), and closing; and several OS processes
sharing one fresh file never see "database is locked"."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import corral.registry._sqlite as sqlite_backend
from corral.registry import Put, RegistryUnavailable, SQLiteRegistry
from corral.registry._sqlite import _Slot, _Tx
from corral.testing import take_events

WORKER = Path(__file__).with_name("sqlite_stress_worker.py")


def _busy(code: int = sqlite3.SQLITE_BUSY_RECOVERY) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


class BusyCursor:
    """Stands in for the cursor of the loop's connection: its next ``times``
    statements fail the way SQLite fails them while another process holds a lock."""

    def __init__(self, cursor: sqlite3.Cursor, times: int) -> None:
        self.cursor = cursor
        self.times = times
        self.refused = 0

    def execute(self, *args: Any) -> sqlite3.Cursor:
        if self.times > 0:
            self.times -= 1
            self.refused += 1
            raise _busy()
        return self.cursor.execute(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


@pytest.mark.parametrize("operation", ["get", "range", "revision", "put", "txn", "grant"])
async def test_every_operation_waits_out_a_busy_database(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, operation: str
) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "busy.db")
    try:
        await registry.put("apps/a", b"1")
        busy = BusyCursor(registry._cursor, times=6)
        registry._cursor = busy  # type: ignore[assignment]
        calls = {
            "get": lambda: registry.get("apps/a"),
            "range": lambda: registry.range("apps/"),
            "revision": registry.revision,
            "put": lambda: registry.put("apps/b", b"2"),
            "txn": lambda: registry.txn([], [Put("apps/b", b"2")]),
            "grant": lambda: registry.grant(5),
        }
        await calls[operation]()
        assert busy.refused == 6
    finally:
        await registry.aclose()


async def test_a_database_busy_past_busy_timeout_is_reported(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "stuck.db", busy_timeout=3.0)
    try:
        registry._cursor = BusyCursor(registry._cursor, times=10**9)  # type: ignore[assignment]
        for call in (lambda: registry.range("apps/"), lambda: registry.put("apps/a", b"1")):
            start = trio.current_time()
            with pytest.raises(RegistryUnavailable, match="database is locked"):
                await call()
            assert 3.0 <= trio.current_time() - start < 3.2
    finally:
        await registry.aclose()


async def test_opening_retries_when_sqlite_refuses_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Switching a fresh file to WAL while another process does the same fails at
    # once, without SQLite's busy handler: opening starts over.
    real = sqlite_backend._connect
    refusals = [_busy(sqlite3.SQLITE_BUSY), _busy(sqlite3.SQLITE_BUSY_SNAPSHOT)]

    def connect(*args: Any) -> sqlite3.Connection:
        if refusals:
            raise refusals.pop()
        return real(*args)

    monkeypatch.setattr(sqlite_backend, "_connect", connect)
    registry = await SQLiteRegistry.open(tmp_path / "fresh.db")
    try:
        assert refusals == []
        assert await registry.put("apps/a", b"1") == 2
    finally:
        await registry.aclose()


async def test_opening_gives_up_on_a_database_locked_past_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    registry = await SQLiteRegistry.open(path)
    await registry.aclose()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(RegistryUnavailable, match=r"database is locked.*holding it"):
            await SQLiteRegistry.open(path, busy_timeout=0.05)
    finally:
        holder.close()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_open_and_write_wait_for_another_process_to_commit(
    tmp_path: Path, synchronous: str
) -> None:
    path = tmp_path / "shared.db"
    registry = await SQLiteRegistry.open(path, synchronous=synchronous)
    await registry.aclose()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        with trio.fail_after(10):
            holder.execute("BEGIN IMMEDIATE")
            holder.execute("UPDATE meta SET revision = revision + 10")
            async with trio.open_nursery() as nursery:
                opened: list[SQLiteRegistry] = []

                async def open_() -> None:
                    opened.append(await SQLiteRegistry.open(path, synchronous=synchronous))

                nursery.start_soon(open_)
                await trio.testing.wait_all_tasks_blocked()
                holder.execute("COMMIT")
            (registry,) = opened
            holder.execute("BEGIN IMMEDIATE")
            holder.execute("UPDATE meta SET revision = revision + 10")
            revisions: list[int] = []

            async def put() -> None:
                revisions.append(await registry.put("apps/a", b"1"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(put)
                await trio.testing.wait_all_tasks_blocked()
                assert revisions == []  # the put waits for the other process's commit
                holder.execute("COMMIT")
        assert revisions == [22]  # after both of the other process's commits
        await registry.aclose()
    finally:
        holder.close()


class CompactedMidPoll:
    """Stands in for the cursor of the loop's connection: just before a watch poll
    reads the change rows, another process compacts away every one of them."""

    def __init__(self, cursor: sqlite3.Cursor, other: sqlite3.Connection) -> None:
        self.cursor = cursor
        self.other = other
        self.compactions = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.startswith("SELECT revision, deleted") and not self.compactions:
            self.compactions += 1
            self.other.execute("DELETE FROM changes")
            self.other.execute("UPDATE meta SET compacted = revision")
        return self.cursor.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


async def test_a_watch_poll_reads_one_snapshot(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "snapshot.db"
    registry = await SQLiteRegistry.open(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        first = await registry.put("apps/a", b"1")
        await registry.put("apps/a", b"2")
        proxy = CompactedMidPoll(registry._cursor, other)
        registry._cursor = proxy  # type: ignore[assignment]
        async with registry.watch("apps/", first) as events:
            got = await take_events(events, 2)
        assert proxy.compactions == 1
        assert [e.kv.value for e in got] == [b"1", b"2"]
    finally:
        other.close()
        await registry.aclose()


def _put_job(key: str) -> Any:
    def job(tx: _Tx) -> int:
        sqlite_backend._apply(tx, [Put(key, b"x")])
        return tx.revision

    return job


async def test_a_cancelled_thread_commit_never_strands_the_writes_it_carries(
    tmp_path: Path,
) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "full.db", synchronous="FULL")
    try:
        # Another task's write rides in the batch: it is committed even though the
        # committing task is cancelled before the worker thread starts.
        batch: list[_Slot[Any]] = [_Slot(_put_job("apps/a")), _Slot(_put_job("apps/b"))]
        with trio.CancelScope() as scope:
            scope.cancel()
            await registry._commit_in_thread(batch)
        assert [slot.done for slot in batch] == [True, True]
        assert [slot.result() for slot in batch] == [2, 3]
        # A lone write is cancelled before it starts: finished, and nothing written.
        alone: _Slot[Any] = _Slot(_put_job("apps/c"))
        with trio.CancelScope() as scope:
            scope.cancel()
            await registry._commit_in_thread([alone])
        assert scope.cancelled_caught
        assert alone.done
        assert [kv.key for kv in await registry.range("apps/")] == ["apps/a", "apps/b"]
    finally:
        await registry.aclose()


async def test_a_writer_cancelled_while_it_takes_the_lock_never_hangs_the_others(
    tmp_path: Path,
) -> None:
    # synchronous=FULL: A holds the write lock and is cancelled before its worker
    # thread starts; B's write has joined A's batch meanwhile. (Trio runs A or B
    # first at random, so the race is met in about half of the rounds.)
    registry = await SQLiteRegistry.open(tmp_path / "c.db", synchronous="FULL")
    try:
        with trio.fail_after(10):
            for round_ in range(12):
                scope = trio.CancelScope()

                async def a(key: str, scope: trio.CancelScope = scope) -> None:
                    with scope:
                        await registry.put(key, b"a")

                async def b(key: str, scope: trio.CancelScope = scope) -> None:
                    while not registry._write_lock.locked():
                        await trio.lowlevel.checkpoint()
                    scope.cancel()
                    await registry.put(key, b"b")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a, f"apps/a{round_}")
                    nursery.start_soon(b, f"apps/b{round_}")
            assert await registry.get(f"apps/b{round_}") is not None
    finally:
        await registry.aclose()


async def test_a_cancelled_close_still_closes(tmp_path: Path) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "close.db", synchronous="FULL")
    with trio.CancelScope() as scope:
        scope.cancel()
        await registry.aclose()
    with pytest.raises(sqlite3.ProgrammingError):
        registry._conn.execute("SELECT 1")
    assert registry._write_conn is not None
    with pytest.raises(sqlite3.ProgrammingError):
        registry._write_conn.execute("SELECT 1")


@pytest.mark.slow
async def test_processes_sharing_fresh_files_never_see_a_locked_database(
    tmp_path: Path,
) -> None:
    """Six processes open the same fresh files at once, then for two seconds mix
    guarded increments, short leases left to expire, keepalives, ranges and
    watches on one file, while one of them checkpoints after every commit (and
    runs RESTART checkpoints too) and one writes with synchronous=FULL."""
    path = tmp_path / "data" / "registry.db"
    roles = ["checkpoint", "full", "plain", "plain", "plain", "plain"]
    results: list[dict[str, int]] = []
    processes: list[trio.Process] = []
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i, role in enumerate(roles):
                    process = await trio.lowlevel.open_process(
                        [sys.executable, str(WORKER), str(path), f"p{i}", role, "2", "8"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                    )
                    processes.append(process)
                try:
                    for process in processes:
                        assert process.stdout is not None
                        assert await _read_line(process.stdout) == "ready"
                    for process in processes:  # go, all at once
                        assert process.stdin is not None
                        await process.stdin.send_all(b"go\n")

                    async def collect(process: trio.Process) -> None:
                        assert process.stdout is not None
                        assert process.stderr is not None
                        out, err = bytearray(), bytearray()

                        async def drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
                            async for chunk in stream:
                                into += chunk

                        async with trio.open_nursery() as drains:
                            drains.start_soon(drain, process.stdout, out)
                            drains.start_soon(drain, process.stderr, err)
                        code = await process.wait()
                        assert code == 0, err.decode()
                        results.append(json.loads(out.decode().splitlines()[-1]))

                    for process in processes:
                        nursery.start_soon(collect, process)
                except BaseException:
                    for process in processes:
                        process.kill()
                    raise
    finally:
        # However the run ended, no worker outlives the test (a running child
        # collected later would fail an unrelated test with a ResourceWarning).
        with trio.CancelScope(shield=True):
            for process in processes:
                if process.returncode is None:
                    process.kill()
                await process.wait()
                for pipe in (process.stdin, process.stdout, process.stderr):
                    if pipe is not None:
                        await pipe.aclose()

    assert len(results) == len(roles)
    assert all(r["increments"] > 0 and r["leases"] > 0 and r["reads"] > 0 for r in results)
    assert sum(r["events"] for r in results) > 0
    assert sum(r["checkpoints"] for r in results) > 0
    conn = sqlite3.connect(path)
    try:
        (counter,) = conn.execute("SELECT value FROM kv WHERE key = 'apps/counter'").fetchone()
        # Every successful guarded increment counted once: no lost or doubled write.
        assert int(counter) == sum(r["increments"] for r in results)
        for i in range(8):
            fresh = sqlite3.connect(f"{path}.{i}")
            try:
                keys = fresh.execute("SELECT key FROM kv ORDER BY key").fetchall()
            finally:
                fresh.close()
            assert keys == [(f"nodes/p{n}",) for n in range(len(roles))]
    finally:
        conn.close()


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        line += chunk
    return line.decode().strip()
