"""RegistryGate and CountingRegistry."""

from __future__ import annotations

import pytest
import trio

import corral.testing as testing
from corral.registry import (
    Compare,
    Delete,
    Get,
    MemoryRegistry,
    Put,
    RegistryUnavailable,
    app_key,
)
from corral.testing import CountingRegistry, GateMode, RegistryGate

KEY = app_key("a")


def isort_order(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_exported() -> None:
    assert testing.__all__ == sorted(testing.__all__, key=isort_order)
    for name in testing.__all__:
        assert hasattr(testing, name)


async def test_gate_fails_then_restores() -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry, name="n1")
    await gate.put(KEY, b"1")
    gate.fail()
    assert gate.mode is GateMode.FAIL
    with pytest.raises(RegistryUnavailable, match="cut off from n1"):
        await gate.get(KEY)
    with pytest.raises(RegistryUnavailable):
        async with gate.watch("apps/"):
            pass
    assert (await registry.get(KEY)) is not None  # others are not affected
    gate.restore()
    kv = await gate.get(KEY)
    assert kv is not None
    assert kv.value == b"1"


async def test_gate_hang_holds_calls_until_restored(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry)
    gate.hang(ops={"put"})
    assert await gate.get(KEY) is None  # reads still pass
    done: list[float] = []

    async def late_put() -> None:
        await gate.put(KEY, b"late")
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late_put)
        await trio.sleep(30)
        assert done == []
        assert await registry.get(KEY) is None
        gate.restore()
    assert done == [30.0]
    kv = await registry.get(KEY)
    assert kv is not None
    assert kv.value == b"late"


async def test_gate_tells_reading_txns_from_writing_ones() -> None:
    gate = RegistryGate(MemoryRegistry())
    gate.fail(ops={"txn"})
    result = await gate.txn([], [Get("apps/", prefix=True)])
    assert result.succeeded
    with pytest.raises(RegistryUnavailable):
        await gate.txn([Compare.absent(KEY)], [Put(KEY, b"x")])
    gate.restore()
    gate.fail(ops={"txn-read"})
    assert (await gate.txn([Compare.absent(KEY)], [Put(KEY, b"x")])).succeeded


async def test_killed_gate_never_reopens() -> None:
    gate = RegistryGate(MemoryRegistry())
    gate.kill()
    gate.restore()
    gate.hang()
    assert gate.mode is GateMode.FAIL
    with pytest.raises(RegistryUnavailable):
        await gate.revision()


def test_gate_refuses_unknown_operations() -> None:
    gate = RegistryGate(MemoryRegistry())
    with pytest.raises(ValueError, match="unknown registry operation"):
        gate.fail(ops={"pot"})


async def test_gated_watch_holds_events_while_hanging(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry)
    seen: list[str] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            async with gate.watch("apps/") as events:
                async for event in events:
                    seen.append(event.kv.key)

        nursery.start_soon(watch)
        await trio.sleep(1)
        gate.hang(ops={"watch"})
        await registry.put(KEY, b"1")
        await trio.sleep(5)
        assert seen == []
        gate.restore()
        await trio.sleep(1)
        assert seen == [KEY]
        nursery.cancel_scope.cancel()


async def test_counting_registry_counts_writes_by_key() -> None:
    counting = CountingRegistry(MemoryRegistry())
    await counting.put(KEY, b"1")
    await counting.get(KEY)
    await counting.txn([Compare.absent(KEY)], [Put(KEY, b"2")], [Get(KEY)])  # fails, reads
    await counting.txn([], [Put(app_key("b"), b"1"), Delete(KEY)])
    lease = await counting.grant(10)
    await counting.keepalive(lease.id)
    assert counting.writes == 3
    assert counting.failed_txns == 1
    assert counting.keys_written == {KEY: 2, app_key("b"): 1}
    assert counting.writes_under("apps/b") == 1
    assert counting.calls["txn"] == 2
    assert counting.calls["grant"] == counting.calls["keepalive"] == 1
    counting.reset()
    assert (counting.writes, counting.failed_txns, dict(counting.keys_written)) == (0, 0, {})
    await counting.aclose()
