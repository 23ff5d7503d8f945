"""SQLite backend against a careless host: the registry file deleted or replaced
under a running process, and a wall clock stepped in one process."""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import trio

from corral.registry import RegistryReplaced, SQLiteRegistry, default_registry_url, open_registry
from corral.registry._sqlite import PROBE_WINDOW, host_clock, lease_epoch
from corral.testing import ManualClock


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_a_deleted_file_fails_the_next_write_and_every_call_after(
    tmp_path: Path, synchronous: str
) -> None:
    clock = ManualClock()
    path = tmp_path / "registry.db"
    registry = await SQLiteRegistry.open(path, clock=clock, synchronous=synchronous)
    try:
        await registry.put("apps/a", b"1")
        assert await registry.get("apps/a") is not None
        _remove_database(path)
        with pytest.raises(RegistryReplaced, match="was deleted") as caught:
            await registry.put("apps/b", b"2")
        assert caught.value.path == str(path)
        assert caught.value.deleted
        assert "stop every node using it" in str(caught.value)
        for call in (registry.revision(), registry.get("apps/a"), registry.grant(5)):
            with pytest.raises(RegistryReplaced):
                await call
        assert not path.exists()  # nothing recreated an empty file on the path
    finally:
        await registry.aclose()


async def test_a_read_notices_a_replaced_file_within_the_probe_window(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "registry.db"
    other = tmp_path / "other.db"
    registry = await SQLiteRegistry.open(path, clock=clock)
    stranger = await SQLiteRegistry.open(other, clock=clock)
    await stranger.put("apps/stranger", b"another cluster")
    await stranger.aclose()
    try:
        await registry.put("apps/a", b"1")
        assert await registry.get("apps/a") is not None
        _remove_database(path)
        os.replace(other, path)  # another registry put on the path
        clock.advance(PROBE_WINDOW)
        with pytest.raises(RegistryReplaced, match="was replaced by another file"):
            await registry.get("apps/a")
        with pytest.raises(RegistryReplaced):
            await registry.range("apps/")
    finally:
        await registry.aclose()
    # The other cluster's file was not touched by the process that lost its own.
    async with open_registry(default_registry_url(tmp_path)) as reopened:
        kv = await reopened.get("apps/stranger")
        assert kv is not None
        assert await reopened.get("apps/a") is None


async def test_a_copy_of_the_same_database_is_still_another_file(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    registry = await SQLiteRegistry.open(path, clock=ManualClock())
    try:
        await registry.put("apps/a", b"1")
        copy = tmp_path / "copy.db"
        shutil.copyfile(path, copy)
        os.replace(copy, path)
        with pytest.raises(RegistryReplaced, match="replaced"):
            await registry.put("apps/a", b"2")
    finally:
        await registry.aclose()


async def test_guard_file_raises_when_the_file_goes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "registry.db"
    registry = await SQLiteRegistry.open(path, clock=ManualClock())
    try:
        with trio.move_on_after(10):  # nothing happens to the file: the guard waits
            await registry.guard_file()
        _remove_database(path)
        started = trio.current_time()
        with pytest.raises(RegistryReplaced, match="was deleted"):
            await registry.guard_file(interval=1.0)
        assert trio.current_time() - started == 0  # the first check already sees it
    finally:
        await registry.aclose()


async def test_the_sweeper_of_open_registry_stops_on_a_lost_file(tmp_path: Path) -> None:
    url = default_registry_url(tmp_path)
    async with open_registry(url) as registry:
        assert isinstance(registry, SQLiteRegistry)
        await registry.put("apps/a", b"1")
        _remove_database(tmp_path / "registry.db")
        with pytest.raises(RegistryReplaced):
            await registry.sweep()
        with pytest.raises(RegistryReplaced):
            await registry.guard_file()


# ---------------------------------------------------------------- the lease clock


def test_the_default_lease_clock_is_the_hosts_and_ignores_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = host_clock()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    after = host_clock()
    assert 0 <= after - before < 5


async def test_a_wall_clock_step_in_one_handle_expires_no_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "registry.db"
    a = await SQLiteRegistry.open(path)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60)  # this "process" jumps ahead
    b = await SQLiteRegistry.open(path)
    try:
        lease = await a.grant(10)
        await a.put("nodes/n1", b"a", lease=lease.id)
        await b.put("nodes/n2", b"b")  # every write expires due leases first
        await b.sweep()
        assert await b.get("nodes/n1") is not None
        assert await a.keepalive(lease.id) == 10
    finally:
        await a.aclose()
        await b.aclose()


async def test_an_injected_clock_still_decides_expiry(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    clock = ManualClock()
    a = await SQLiteRegistry.open(path, clock=clock)
    skewed = await SQLiteRegistry.open(path, clock=lambda: clock() + 60)
    try:
        lease = await a.grant(10)
        await a.put("nodes/n1", b"a", lease=lease.id)
        await skewed.put("nodes/n2", b"b")  # a clock 60 s ahead expires it: injection works
        assert await a.get("nodes/n1") is None
    finally:
        await a.aclose()
        await skewed.aclose()


_STEPPED_WRITER = """
import sys, time, trio
from corral.registry import open_registry

real = time.time
time.time = lambda: real() + 60  # this process's wall clock jumped a minute ahead

async def main(url):
    async with open_registry(url) as registry:
        await registry.put("apps/from-stepped", b"x")  # expires every due lease first
        await registry.sweep()
        print("present" if await registry.get("nodes/n1") else "absent")

trio.run(main, sys.argv[1])
"""


@pytest.mark.slow
async def test_a_process_with_a_stepped_wall_clock_expires_no_other_process_lease(
    tmp_path: Path,
) -> None:
    url = default_registry_url(tmp_path)
    async with open_registry(url) as registry:
        lease = await registry.grant(15)
        await registry.put("nodes/n1", b"mine", lease=lease.id)
        with trio.fail_after(60):
            done = await trio.run_process(
                [sys.executable, "-c", _STEPPED_WRITER, url], capture_stdout=True, check=True
            )
        assert done.stdout.decode().strip() == "present"
        assert await registry.get("nodes/n1") is not None
        assert await registry.get("apps/from-stepped") is not None


# ---------------------------------------------------------------- boots and upgrades


def _set_epoch(path: Path, epoch: str | None) -> None:
    with sqlite3.connect(path) as conn:
        if epoch is None:
            conn.execute("DELETE FROM info WHERE name = 'lease_epoch'")
        else:
            conn.execute("UPDATE info SET value = ? WHERE name = 'lease_epoch'", (epoch,))
    conn.close()


@pytest.mark.parametrize("stored", [None, "boottime:another-boot"])
async def test_leases_from_another_boot_or_wall_clock_times_are_renewed_on_open(
    tmp_path: Path, stored: str | None
) -> None:
    path = tmp_path / "registry.db"
    old_clock = ManualClock(1_700_000_000.0)  # e.g. wall-clock expiry times of an old file
    registry = await SQLiteRegistry.open(path, clock=old_clock)
    lease = await registry.grant(10)
    await registry.put("nodes/n1", b"x", lease=lease.id)
    await registry.aclose()
    _set_epoch(path, stored)

    clock = ManualClock(500.0)  # the new boot's clock reads far less
    registry = await SQLiteRegistry.open(path, clock=clock)
    try:
        clock.advance(9)
        assert await registry.get("nodes/n1") is not None  # renewed for its TTL
        clock.advance(2)
        assert await registry.get("nodes/n1") is None  # ... and no longer
    finally:
        await registry.aclose()
    with sqlite3.connect(path) as conn:
        (epoch,) = conn.execute("SELECT value FROM info WHERE name = 'lease_epoch'").fetchone()
    conn.close()
    assert epoch == lease_epoch()


async def test_reopening_on_the_same_boot_keeps_expiry_times(tmp_path: Path) -> None:
    path = tmp_path / "registry.db"
    clock = ManualClock()
    registry = await SQLiteRegistry.open(path, clock=clock)
    lease = await registry.grant(10)
    await registry.put("nodes/n1", b"x", lease=lease.id)
    await registry.aclose()
    clock.advance(8)
    registry = await SQLiteRegistry.open(path, clock=clock)
    try:
        clock.advance(3)
        assert await registry.get("nodes/n1") is None  # not renewed by the reopening
    finally:
        await registry.aclose()


# ---------------------------------------------------------------- the node stops


@pytest.mark.slow
async def test_a_node_whose_registry_file_is_deleted_stops_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from corral.node._config import resolve_node_config
    from corral.node.cli._local_cluster import free_port
    from corral.node.server._node import run_node, single_error

    config = resolve_node_config(
        {
            "data-dir": "data",
            "node-id": "n1",
            "api": f"127.0.0.1:{free_port()}",
            "listen": f"127.0.0.1:{free_port()}",
        },
        {},
        cwd=tmp_path,
    )
    stop = trio.Event()

    async def run_and_delete() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_node, config, stop=stop))
            _remove_database(tmp_path / "data" / "registry.db")

    with trio.fail_after(30), pytest.raises(BaseExceptionGroup) as caught:
        await run_and_delete()
    error = single_error(caught.value)
    assert isinstance(error, RegistryReplaced)
    assert error.deleted
    assert any("node n1 stopping" in r.getMessage() for r in caplog.records)
