"""A registry whose every call answers within a deadline, for the API's handlers.

A registry that stopped answering (etcd frozen, a partition that drops packets)
accepts connections and never replies; the etcd client then waits its request
timeout (10 s) per try and retries reads for four rounds. An operator's command
would wait that long and end on its own HTTP timeout, saying the node cannot be
reached although the node is up. Behind :class:`DeadlineRegistry` each call ends
after ``deadline`` seconds with :class:`RegistryTooSlow` (a 504), which names
the registry and says whether the call that timed out was a write (which may have
been applied) or a read (every operation's one write comes after its reads, so
then nothing was written).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import trio

from corral.registry import (
    Compare,
    KeyValue,
    Lease,
    Registry,
    RegistryUnavailable,
    TxnOp,
    TxnResult,
    WatchEvent,
)

#: Seconds one registry call made by an API handler may take: half the etcd client's
#: request timeout (10 s), so the node's answer naming the registry comes before the
#: client's own timeout, and far before the command line's (30 s, DEFAULT_TIMEOUT in
#: corral.node.cli._client). A healthy registry answers in milliseconds.
REGISTRY_DEADLINE = 5.0

_T = TypeVar("_T")


class RegistryTooSlow(RegistryUnavailable):
    """The registry did not answer one call within the API's deadline (a 504).

    ``may_have_applied``: the call was a write, sent and not answered: it may have
    been applied. A read that timed out wrote nothing (each operation writes once,
    after its reads)."""

    def __init__(self, registry: str, deadline: float, *, may_have_applied: bool) -> None:
        if may_have_applied:
            what = (
                f"did not answer within {deadline:g} s after this node sent it a change: the "
                "change may have been applied; `corral ps` (`corral alias ls` for an alias) "
                "shows whether it was, and repeating the same request is safe (the same "
                "deploy again keeps the revision)"
            )
        else:
            what = f"did not answer a read within {deadline:g} s, so this request changed nothing"
        super().__init__(
            f"the registry {registry} {what}. This node is up; the registry is stopped, "
            "overloaded or unreachable from it: check that it runs and answers, then try again"
        )
        self.registry = registry
        self.deadline = deadline
        self.may_have_applied = may_have_applied


class DeadlineRegistry(Registry):
    """``registry``, each call bounded to ``deadline`` seconds (watches excepted: a
    watch waits for changes by design).

    Args:
        registry: the registry to call.
        name: how messages name it (its URL: ``etcd://10.0.0.5:2379``).
        deadline: seconds per call.

    Every call raises what ``registry`` raises, and :class:`RegistryTooSlow` when it
    does not answer within ``deadline``.
    """

    def __init__(self, registry: Registry, name: str, deadline: float = REGISTRY_DEADLINE) -> None:
        self._registry = registry
        self.name = name
        self.deadline = deadline

    async def _bounded(self, call: Awaitable[_T], *, write: bool) -> _T:
        try:
            with trio.fail_after(self.deadline):
                return await call
        except trio.TooSlowError:
            raise RegistryTooSlow(self.name, self.deadline, may_have_applied=write) from None

    async def get(self, key: str) -> KeyValue | None:
        return await self._bounded(self._registry.get(key), write=False)

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self._bounded(self._registry.range(prefix), write=False)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        return await self._bounded(self._registry.put(key, value, lease), write=True)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        return await self._bounded(self._registry.delete(key, prefix=prefix), write=True)

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        writes = bool(on_success or on_failure)
        return await self._bounded(
            self._registry.txn(compares, on_success, on_failure), write=writes
        )

    async def grant(self, ttl: float) -> Lease:
        return await self._bounded(self._registry.grant(ttl), write=True)

    async def keepalive(self, lease_id: int) -> float:
        return await self._bounded(self._registry.keepalive(lease_id), write=True)

    async def revoke(self, lease_id: int) -> None:
        await self._bounded(self._registry.revoke(lease_id), write=True)

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._registry.watch(prefix, start_revision)

    async def revision(self) -> int:
        return await self._bounded(self._registry.revision(), write=False)

    async def aclose(self) -> None:
        """The wrapped registry belongs to its opener, which closes it."""
        await trio.lowlevel.checkpoint()
