"""SQLite backend specifics: sharing one file between registries and processes,
persistence, compaction, group commit."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import trio

from corral.registry import (
    Compare,
    EventType,
    LeaseNotFound,
    Put,
    RegistryUnavailable,
    RevisionCompacted,
    SQLiteRegistry,
    default_registry_url,
    open_registry,
)
from corral.testing import ManualClock, take_events


async def test_two_registries_on_one_file_share_state_watches_and_expiry(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    path = tmp_path / "shared.db"
    a = await SQLiteRegistry.open(path, clock=clock, poll_interval=0.01)
    b = await SQLiteRegistry.open(path, clock=clock, poll_interval=0.01)
    try:
        lease = await a.grant(10)
        async with a.watch("nodes/") as events:
            await b.put("nodes/n2", b"from b")
            await a.put("nodes/n1", b"from a", lease=lease.id)
            assert [kv.key for kv in await b.range("nodes/")] == ["nodes/n1", "nodes/n2"]
            assert await a.revision() == await b.revision()
            clock.advance(11)
            assert await b.get("nodes/n1") is None  # b enforces a's lease
            got = await take_events(events, 3, within=5)
        assert [(e.type, e.kv.key) for e in got] == [
            (EventType.PUT, "nodes/n2"),
            (EventType.PUT, "nodes/n1"),
            (EventType.DELETE, "nodes/n1"),
        ]
        with pytest.raises(LeaseNotFound):
            await a.keepalive(lease.id)
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_watcher_sweeps_expired_leases_without_other_access(tmp_path: Path) -> None:
    clock = ManualClock()
    registry = await SQLiteRegistry.open(tmp_path / "sweep.db", clock=clock, poll_interval=0.01)
    try:
        lease = await registry.grant(5)
        await registry.put("nodes/n1", b"x", lease=lease.id)
        async with registry.watch("nodes/") as events:
            clock.advance(6)  # nobody reads: the watcher's poll expires the lease
            (event,) = await take_events(events, 1, within=5)
        assert event.type is EventType.DELETE
    finally:
        await registry.aclose()


_CLAIM = """
import sys, trio
from corral.registry import Compare, Get, Put, open_registry

async def main(url, name):
    async with open_registry(url) as registry:
        result = await registry.txn(
            [Compare.absent("ports/n1/24000")],
            [Put("ports/n1/24000", name.encode())],
            [Get("ports/n1/24000")],
        )
        holder = name if result.succeeded else result.responses[0][0].value.decode()
        print(("won" if result.succeeded else "lost"), holder)

trio.run(main, sys.argv[1], sys.argv[2])
"""


@pytest.mark.slow
async def test_processes_sharing_the_file_get_exactly_one_cas_winner(tmp_path: Path) -> None:
    url = default_registry_url(tmp_path)
    async with open_registry(url) as registry:
        await registry.put("apps/warm", b"creates the file first")
    outputs: list[str] = []

    async def claim(name: str) -> None:
        done = await trio.run_process(
            [sys.executable, "-c", _CLAIM, url, name], capture_stdout=True, check=True
        )
        outputs.append(done.stdout.decode().strip())

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(claim, f"proc-{i}")
    winners = [line.split()[1] for line in outputs if line.startswith("won")]
    assert len(winners) == 1
    assert sorted(line.split()[1] for line in outputs) == [winners[0]] * 4


async def test_state_survives_reopening_and_the_file_is_wal(tmp_path: Path) -> None:
    url = default_registry_url(tmp_path / "data")
    assert url == f"sqlite://{tmp_path}/data/registry.db"
    async with open_registry(url) as registry:
        rev = await registry.put("apps/a", b"1")
    async with open_registry(url) as registry:
        assert await registry.revision() == rev
        kv = await registry.get("apps/a")
        assert kv is not None
        assert kv.value == b"1"
    conn = sqlite3.connect(tmp_path / "data" / "registry.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


async def test_old_history_is_compacted(tmp_path: Path) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "c.db", history=10)
    try:
        for i in range(30):
            await registry.put(f"apps/a{i % 3}", str(i).encode())
        with pytest.raises(RevisionCompacted):
            async with registry.watch("apps/", 2):
                pass
        start = await registry.revision() - 4
        async with registry.watch("apps/", start) as events:
            got = await take_events(events, 5)
        assert [e.kv.mod_revision for e in got] == list(range(start, start + 5))
    finally:
        await registry.aclose()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_group_commit_isolates_a_failing_write(tmp_path: Path, synchronous: str) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "g.db", synchronous=synchronous)
    try:
        lease = await registry.grant(60)
        while registry._ops % 16 != 15:  # the next write gathers a batch (NORMAL)
            await registry.get("apps/none")
        errors: list[BaseException] = []
        revisions: list[int] = []
        claims: list[bool] = []

        async def put(i: int) -> None:
            try:
                revisions.append(
                    await registry.put(f"apps/a{i}", b"x", lease=999 if i == 3 else lease.id)
                )
            except LeaseNotFound as exc:
                errors.append(exc)
            result = await registry.txn([Compare.absent("apps/claim")], [Put("apps/claim", b"")])
            claims.append(result.succeeded)
            if result.succeeded:
                revisions.append(result.revision)

        before = await registry.revision()
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(put, i)
        assert len(errors) == 1
        assert sorted(revisions) == list(range(before + 1, before + 9))  # 7 puts, 1 claim
        assert sorted(claims) == [False] * 7 + [True]
        assert len(await registry.range("apps/")) == 8
        await registry.revoke(lease.id)
        assert [kv.key for kv in await registry.range("apps/")] == ["apps/claim"]
    finally:
        await registry.aclose()


async def test_a_file_that_is_not_a_registry_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RegistryUnavailable, match=r"bogus\.db"):
        await SQLiteRegistry.open(bogus)


async def test_a_short_lease_granted_elsewhere_is_seen_after_a_cached_probe(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    path = tmp_path / "probe.db"
    a = await SQLiteRegistry.open(path, clock=clock)
    b = await SQLiteRegistry.open(path, clock=clock)
    try:
        assert await a.get("nodes/n1") is None  # a probes: no lease at all
        lease = await b.grant(0.001)
        assert lease.ttl == 0.05  # raised to the shortest TTL, as etcd raises to its own
        await b.put("nodes/n1", b"x", lease=lease.id)
        clock.advance(0.049)
        assert await a.get("nodes/n1") is not None
        clock.advance(0.001)
        assert await a.get("nodes/n1") is None
        assert await a.range("nodes/") == []
    finally:
        await a.aclose()
        await b.aclose()


async def test_open_registry_sweeps_leases_nobody_reads(tmp_path: Path) -> None:
    clock = ManualClock()
    url = default_registry_url(tmp_path)
    async with open_registry(url, clock=clock) as registry:
        lease = await registry.grant(5)
        await registry.put("nodes/n1", b"x", lease=lease.id)
        before = await registry.revision()
        clock.advance(6)
        # A second opener (another process) sees the expiry as an extra revision
        # written by the first one's sweeper, without reading through it.
        other = await SQLiteRegistry.open(tmp_path / "registry.db", clock=lambda: 0.0)
        try:
            with trio.fail_after(5):
                while await other.revision() == before:
                    await trio.sleep(0.05)
            assert await other.get("nodes/n1") is None
        finally:
            await other.aclose()


async def test_checkpoints_keep_the_wal_small_under_concurrent_writes(tmp_path: Path) -> None:
    async def wal_size(checkpoint_every: int) -> int:
        path = tmp_path / f"wal-{checkpoint_every}.db"
        registry = await SQLiteRegistry.open(path, checkpoint_every=checkpoint_every)
        try:

            async def writer(t: int) -> None:
                for i in range(25):
                    await registry.put(f"apps/w{t}", b"x" * 2000 + str(i).encode())

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for t in range(16):
                        nursery.start_soon(writer, t)
            assert await registry.revision() == 1 + 16 * 25
            assert len(await registry.range("apps/")) == 16
            return (tmp_path / f"wal-{checkpoint_every}.db-wal").stat().st_size
        finally:
            await registry.aclose()

    # Without checkpoints catching up, the WAL holds every commit; with them it
    # is reset and reused.
    assert await wal_size(5) * 4 < await wal_size(10**9)


async def test_closing_fails_every_write_of_a_gathering_batch(tmp_path: Path) -> None:
    registry = await SQLiteRegistry.open(tmp_path / "close.db")
    while registry._ops % 16 != 15:  # the next write gathers a batch
        await registry.get("apps/none")
    outcomes: list[str] = []

    async def put(i: int) -> None:
        try:
            await registry.put(f"apps/a{i}", b"x")
        except trio.ClosedResourceError:
            outcomes.append("closed")
        else:
            outcomes.append("written")

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(put, i)
        nursery.start_soon(registry.aclose)
    assert outcomes == ["closed"] * 4


async def test_a_write_after_a_cached_probe_still_expires_a_due_lease_first(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    path = tmp_path / "due.db"
    registry = await SQLiteRegistry.open(path, clock=clock)
    try:
        lease = await registry.grant(1)
        await registry.put("nodes/n1", b"x", lease=lease.id)
        assert await registry.get("nodes/n1") is not None  # probes: caches the expiry
        before = await registry.revision()
        clock.advance(1)
        revision = await registry.put("nodes/n2", b"y")
        assert revision == before + 2  # the expiry's DELETE came first, in its own revision
        with sqlite3.connect(path) as raw:
            keys = [key for (key,) in raw.execute("SELECT key FROM kv ORDER BY key")]
        assert keys == ["nodes/n2"]
    finally:
        await registry.aclose()


async def test_get_never_answers_with_a_stale_reused_value(tmp_path: Path) -> None:
    path = tmp_path / "reuse.db"
    a = await SQLiteRegistry.open(path)
    b = await SQLiteRegistry.open(path)
    try:
        await a.put("nodes/n1", b"one")
        first = await a.get("nodes/n1")
        assert first is not None
        assert first.value == b"one"
        await b.put("nodes/n1", b"one")  # the same value again: a new version
        again = await a.get("nodes/n1")
        assert again is not None
        assert again.value == b"one"
        assert (again.version, again.mod_revision) == (first.version + 1, first.mod_revision + 1)
        await b.put("nodes/n1", b"two" * 10_000)  # too big to be remembered
        for _ in range(2):
            big = await a.get("nodes/n1")
            assert big is not None
            assert big.value == b"two" * 10_000
        await b.delete("nodes/n1")
        assert await a.get("nodes/n1") is None
    finally:
        await a.aclose()
        await b.aclose()
