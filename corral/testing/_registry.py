"""Registry wrappers for tests: a switchable gate and a write counter.

Both wrap any :class:`~corral.registry.Registry` and forward every call, so a
test can put them in front of the memory twin, SQLite or etcd alike.

* :class:`RegistryGate` cuts one node off from the registry without touching
  anyone else: ``fail()`` makes every call raise ``RegistryUnavailable`` (the
  connection is refused), ``hang()`` makes every call wait until ``restore()``
  and then go through (a paused process, or a request stuck in a partition,
  arriving late). ``kill()`` is ``fail()`` for good: what a crashed process
  can no longer send.
* :class:`CountingRegistry` counts what goes through it, so a test can assert
  that an idle pass wrote nothing.
"""

from __future__ import annotations

import contextlib
import enum
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio

from corral.registry import (
    Compare,
    Delete,
    KeyValue,
    Lease,
    Put,
    Registry,
    RegistryUnavailable,
    TxnOp,
    TxnResult,
    WatchEvent,
)

__all__ = ["CountingRegistry", "GateMode", "RegistryGate"]

#: Every operation name a gate knows, for ``ops=`` filters. A txn that only
#: reads (no Put or Delete in either branch) is ``"txn-read"``; any other is ``"txn"``.
OPERATIONS = frozenset(
    {
        "get",
        "range",
        "put",
        "delete",
        "txn",
        "txn-read",
        "grant",
        "keepalive",
        "revoke",
        "watch",
        "revision",
    }
)


class GateMode(enum.Enum):
    OPEN = "open"
    FAIL = "fail"
    HANG = "hang"


class RegistryGate(Registry):
    """A registry proxy that can be cut off from the registry behind it.

    Args:
        inner: the registry every call is forwarded to.
        name: who holds this gate, for error messages (a node id).

    ``aclose()`` does not close ``inner``: the gate belongs to one node, the
    registry behind it is shared.
    """

    def __init__(self, inner: Registry, *, name: str = "node") -> None:
        self._inner = inner
        self._name = name
        self._mode = GateMode.OPEN
        self._ops: frozenset[str] = OPERATIONS
        self._killed = False
        self._reopened = trio.Event()

    @property
    def inner(self) -> Registry:
        return self._inner

    @property
    def mode(self) -> GateMode:
        return self._mode

    def fail(self, ops: Collection[str] | None = None) -> None:
        """Make calls (all, or only the named operations) raise RegistryUnavailable."""
        self._set(GateMode.FAIL, ops)

    def hang(self, ops: Collection[str] | None = None) -> None:
        """Make calls (all, or only the named operations) wait until :meth:`restore`,
        then go through to the registry as if they had just been sent."""
        self._set(GateMode.HANG, ops)

    def restore(self) -> None:
        """Let every call through again; calls held by :meth:`hang` proceed now."""
        if self._killed:
            return
        self._mode = GateMode.OPEN
        self._ops = OPERATIONS
        self._reopened.set()

    def kill(self) -> None:
        """Cut off for good: a crashed process sends nothing more, ever."""
        self._set(GateMode.FAIL, None)
        self._killed = True
        self._reopened.set()

    def _set(self, mode: GateMode, ops: Collection[str] | None) -> None:
        if self._killed:
            return
        unknown = set(ops or ()) - OPERATIONS
        if unknown:
            raise ValueError(
                f"unknown registry operation(s) {sorted(unknown)}; pick from {sorted(OPERATIONS)}"
            )
        self._mode = mode
        self._ops = frozenset(ops) if ops else OPERATIONS
        if self._reopened.is_set():
            self._reopened = trio.Event()

    async def _pass(self, op: str) -> None:
        while op in self._ops:
            if self._mode is GateMode.FAIL:
                raise RegistryUnavailable(
                    f"registry cut off from {self._name} by the test harness "
                    f"(call restore() to reconnect)"
                )
            if self._mode is GateMode.OPEN:
                return
            await self._reopened.wait()

    async def get(self, key: str) -> KeyValue | None:
        await self._pass("get")
        return await self._inner.get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        await self._pass("range")
        return await self._inner.range(prefix)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        await self._pass("put")
        return await self._inner.put(key, value, lease)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        await self._pass("delete")
        return await self._inner.delete(key, prefix=prefix)

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        writes = any(isinstance(op, Put | Delete) for op in (*on_success, *on_failure))
        await self._pass("txn" if writes else "txn-read")
        return await self._inner.txn(compares, on_success, on_failure)

    async def grant(self, ttl: float) -> Lease:
        await self._pass("grant")
        return await self._inner.grant(ttl)

    async def keepalive(self, lease_id: int) -> float:
        await self._pass("keepalive")
        return await self._inner.keepalive(lease_id)

    async def revoke(self, lease_id: int) -> None:
        await self._pass("revoke")
        await self._inner.revoke(lease_id)

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(prefix, start_revision)

    @asynccontextmanager
    async def _watch(
        self, prefix: str, start_revision: int | None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        await self._pass("watch")
        async with self._inner.watch(prefix, start_revision) as events:
            gated = self._gated(events)
            # Closed with the watch, also when the watcher stops mid-stream.
            async with contextlib.aclosing(gated):
                yield gated

    async def _gated(self, events: AsyncIterator[WatchEvent]) -> AsyncGenerator[WatchEvent, None]:
        async for event in events:
            # An event that arrives while cut off is held (hang) or ends the
            # watch (fail), as a broken connection would.
            await self._pass("watch")
            yield event

    async def revision(self) -> int:
        await self._pass("revision")
        return await self._inner.revision()

    async def aclose(self) -> None:
        """Close nothing: the registry behind the gate is shared."""


class CountingRegistry(Registry):
    """A registry proxy that counts calls and writes.

    ``calls`` counts every call by operation name. ``writes`` counts the
    operations that changed (or tried to change) stored keys: each ``put`` and
    ``delete``, and each Put/Delete in the branch of a ``txn`` that ran.
    ``keys_written`` counts them per key. ``failed_txns`` counts txns whose
    guard did not hold. Lease grants,
    keepalives and revokes are counted in ``calls`` only. ``delivered`` counts the
    events each watch delivered, by the prefix it was opened on (a subclass may hold
    some back: :meth:`delivers`).

    ``aclose()`` closes the registry behind it.
    """

    def __init__(self, inner: Registry) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()
        self.writes = 0
        self.failed_txns = 0
        self.keys_written: Counter[str] = Counter()
        self.delivered: Counter[str] = Counter()

    @property
    def inner(self) -> Registry:
        return self._inner

    def reset(self) -> None:
        """Start counting from zero."""
        self.calls.clear()
        self.writes = 0
        self.failed_txns = 0
        self.keys_written.clear()
        self.delivered.clear()

    def delivers(self, prefix: str, event: WatchEvent) -> bool:
        """Whether a watch on ``prefix`` gets ``event`` (always; for subclasses)."""
        return True

    def writes_under(self, prefix: str) -> int:
        """How many writes touched a key starting with ``prefix``."""
        return sum(n for key, n in self.keys_written.items() if key.startswith(prefix))

    def _count(self, ops: Sequence[TxnOp]) -> None:
        for op in ops:
            if isinstance(op, Put | Delete):
                self.writes += 1
                self.keys_written[op.key] += 1

    async def get(self, key: str) -> KeyValue | None:
        self.calls["get"] += 1
        return await self._inner.get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        self.calls["range"] += 1
        return await self._inner.range(prefix)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        self.calls["put"] += 1
        revision = await self._inner.put(key, value, lease)
        self._count([Put(key, value, lease)])
        return revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self.calls["delete"] += 1
        deleted = await self._inner.delete(key, prefix=prefix)
        self._count([Delete(key, prefix=prefix)])
        return deleted

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        self.calls["txn"] += 1
        result = await self._inner.txn(compares, on_success, on_failure)
        if result.succeeded:
            self._count(on_success)
        else:
            self.failed_txns += 1
            self._count(on_failure)
        return result

    async def grant(self, ttl: float) -> Lease:
        self.calls["grant"] += 1
        return await self._inner.grant(ttl)

    async def keepalive(self, lease_id: int) -> float:
        self.calls["keepalive"] += 1
        return await self._inner.keepalive(lease_id)

    async def revoke(self, lease_id: int) -> None:
        self.calls["revoke"] += 1
        await self._inner.revoke(lease_id)

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        self.calls["watch"] += 1
        return self._counted_watch(prefix, start_revision)

    @asynccontextmanager
    async def _counted_watch(
        self, prefix: str, start_revision: int | None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        async with self._inner.watch(prefix, start_revision) as events:
            counted = self._counted(prefix, events)
            async with contextlib.aclosing(counted):
                yield counted

    async def _counted(
        self, prefix: str, events: AsyncIterator[WatchEvent]
    ) -> AsyncGenerator[WatchEvent, None]:
        async for event in events:
            if self.delivers(prefix, event):
                self.delivered[prefix] += 1
                yield event

    async def revision(self) -> int:
        self.calls["revision"] += 1
        return await self._inner.revision()

    async def aclose(self) -> None:
        await self._inner.aclose()
