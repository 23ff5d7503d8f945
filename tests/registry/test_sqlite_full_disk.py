"""The SQLite registry on a full disk, on a real small tmpfs (needs root; skipped
without): its reserve lets its own writes through, with one log line, loses nothing
recorded earlier, and comes back once there is room again."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.registry import RegistryUnavailable, SQLiteRegistry
from corral.registry._sqlite import DEFAULT_RESERVE_BYTES, RESERVE_SUFFIX

from ..conftest import SmallDisk

CHUNK = 64 * 1024


async def test_a_write_on_a_full_disk_goes_through_on_the_reserve(
    small_tmpfs: Callable[[int], SmallDisk], caplog: pytest.LogCaptureFixture
) -> None:
    disk = small_tmpfs(24)
    root = disk.path
    path = root / "registry.db"
    reserve = Path(f"{path}{RESERVE_SUFFIX}")
    registry = await SQLiteRegistry.open(path)
    try:
        assert reserve.stat().st_size == DEFAULT_RESERVE_BYTES
        for n in range(20):
            await registry.put(f"apps/a{n}", f"record {n}".encode())
        filler = disk.fill()
        assert disk.free() < 4096
        lease = await registry.grant(30)
        caplog.set_level(logging.INFO, logger="corral.registry._sqlite")
        # A node's record and its renewals, on a disk something else filled.
        await registry.put("nodes/n1", b"x" * CHUNK, lease=lease.id)
        for _ in range(50):
            await registry.keepalive(lease.id)
            await registry.put("apps/a0", os.urandom(4096))
        released = [r for r in caplog.records if "released the" in r.getMessage()]
        assert len(released) == 1, caplog.text
        message = released[0].getMessage()
        assert str(reserve) in message
        assert f"{DEFAULT_RESERVE_BYTES}-byte reserve" in message
        assert "disk is full" in message
        assert not reserve.exists()
        for n in range(1, 20):
            kv = await registry.get(f"apps/a{n}")
            assert kv is not None
            assert kv.value == f"record {n}".encode()
        # No room yet: the reserve stays away ...
        await registry.keep_reserve()
        assert not reserve.exists()
        # ... until twice its size is free.
        filler.unlink()
        await registry.keep_reserve()
        assert reserve.stat().st_size == DEFAULT_RESERVE_BYTES
        assert "is in place again" in caplog.text
    finally:
        await registry.aclose()


async def test_without_a_reserve_a_full_disk_is_named_and_loses_nothing(
    small_tmpfs: Callable[[int], SmallDisk],
) -> None:
    disk = small_tmpfs(16)
    root = disk.path
    registry = await SQLiteRegistry.open(root / "registry.db", reserve_bytes=0)
    try:
        assert not Path(f"{root / 'registry.db'}{RESERVE_SUFFIX}").exists()
        await registry.put("apps/kept", b"earlier")
        filler = disk.fill()
        with pytest.raises(RegistryUnavailable, match="is full") as raised:
            await registry.put("apps/big", os.urandom(1024 * 1024))
        assert "free space there" in str(raised.value)
        kv = await registry.get("apps/kept")
        assert kv is not None
        assert kv.value == b"earlier"
        filler.unlink()
        await registry.put("apps/after", b"room again")
        assert (await registry.get("apps/after")) is not None
    finally:
        await registry.aclose()
