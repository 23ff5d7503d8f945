"""The registry interface: the subset of etcd v3 that corral needs.

Every backend (memory, SQLite, etcd) implements :class:`Registry` with the same
semantics, and one contract suite (``tests/registry``) holds them to it.

Semantics, as in etcd v3:

* The store has one **revision** counter. Every write (put, delete that removed
  something, a successful txn with writes, a lease expiry or revoke that removed
  keys) bumps it by exactly one; all keys changed by that write carry it as their
  ``mod_revision``. ``revision()`` is the cluster's change token.
* Per key: ``create_revision`` (revision of the put that created it),
  ``mod_revision`` (last write), ``version`` (number of puts since creation,
  1 after the first). An absent key compares as version 0, create/mod revision 0.
* A lease is granted with a TTL in seconds; keys put with it vanish when it
  expires or is revoked, and that removal is a revision with DELETE watch events.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as stored, with etcd's bookkeeping."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None = None

    def __init__(
        self,
        key: str,
        value: bytes,
        create_revision: int,
        mod_revision: int,
        version: int,
        lease: int | None = None,
    ) -> None:
        _kv_key(self, key)
        _kv_value(self, value)
        _kv_create(self, create_revision)
        _kv_mod(self, mod_revision)
        _kv_version(self, version)
        _kv_lease(self, lease)


class CompareTarget(enum.Enum):
    VERSION = "version"
    VALUE = "value"
    CREATE_REVISION = "create"
    MOD_REVISION = "mod"


class CompareOp(enum.Enum):
    EQUAL = "="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclass(frozen=True, slots=True)
class Compare:
    """A txn guard: ``<target of key> <op> <value>``.

    ``Compare.version_is("k", 0)`` is "k is absent".
    """

    key: str
    target: CompareTarget
    op: CompareOp
    value: int | bytes

    def __init__(self, key: str, target: CompareTarget, op: CompareOp, value: int | bytes) -> None:
        _compare_key(self, key)
        _compare_target(self, target)
        _compare_op(self, op)
        _compare_value(self, value)

    @classmethod
    def version_is(cls, key: str, version: int) -> Compare:
        return cls(key, CompareTarget.VERSION, CompareOp.EQUAL, version)

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls.version_is(key, 0)

    @classmethod
    def value_is(cls, key: str, value: bytes) -> Compare:
        return cls(key, CompareTarget.VALUE, CompareOp.EQUAL, value)

    @classmethod
    def mod_revision_is(cls, key: str, revision: int) -> Compare:
        return cls(key, CompareTarget.MOD_REVISION, CompareOp.EQUAL, revision)

    @classmethod
    def create_revision_is(cls, key: str, revision: int) -> Compare:
        return cls(key, CompareTarget.CREATE_REVISION, CompareOp.EQUAL, revision)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int | None = None

    def __init__(self, key: str, value: bytes, lease: int | None = None) -> None:
        _put_key(self, key)
        _put_value(self, value)
        _put_lease(self, lease)


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """A read inside a txn; its response is the list of matching KeyValues."""

    key: str
    prefix: bool = False


TxnOp = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``responses[i]`` answers the i-th op of the branch that ran:
    ``list[KeyValue]`` for a Get, the number of deleted keys for a Delete,
    ``None`` for a Put."""

    succeeded: bool
    revision: int
    responses: tuple[list[KeyValue] | int | None, ...]

    def __init__(
        self, succeeded: bool, revision: int, responses: tuple[list[KeyValue] | int | None, ...]
    ) -> None:
        _result_succeeded(self, succeeded)
        _result_revision(self, revision)
        _result_responses(self, responses)


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: float


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change. For DELETE, ``kv.value`` is empty and ``kv.mod_revision`` is the
    revision of the deletion."""

    type: EventType
    kv: KeyValue


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    """Each named slot's own store (its descriptor's ``__set__``), for quick ``__init__``s.

    The ``__init__`` a frozen dataclass generates stores every field through
    ``object.__setattr__`` (plain assignment is refused), which finds the slot by
    name each time. The values a read or txn builds by the thousand store through
    the slot descriptors instead: half the cost, the same frozen class (eq, hash,
    repr, ``replace`` and the refusal to assign are the dataclass's own).
    """
    return tuple(getattr(cls, name).__set__ for name in names)


_kv_key, _kv_value, _kv_create, _kv_mod, _kv_version, _kv_lease = _slot_setters(
    KeyValue, "key", "value", "create_revision", "mod_revision", "version", "lease"
)
_compare_key, _compare_target, _compare_op, _compare_value = _slot_setters(
    Compare, "key", "target", "op", "value"
)
_put_key, _put_value, _put_lease = _slot_setters(Put, "key", "value", "lease")
_result_succeeded, _result_revision, _result_responses = _slot_setters(
    TxnResult, "succeeded", "revision", "responses"
)


class Registry(ABC):
    """A consistent key-value store with revisions, txns, leases and watches."""

    @abstractmethod
    async def get(self, key: str) -> KeyValue | None:
        """Return the key, or None when absent."""

    @abstractmethod
    async def range(self, prefix: str) -> list[KeyValue]:
        """Every key starting with ``prefix``, sorted by key."""

    @abstractmethod
    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write ``key``; return the new revision. Raises LeaseNotFound for a
        lease that does not exist (or expired)."""

    @abstractmethod
    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); return how many went."""

    @abstractmethod
    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        """Atomically: if every compare holds run ``on_success`` else ``on_failure``."""

    @abstractmethod
    async def grant(self, ttl: float) -> Lease:
        """Create a lease that expires ``ttl`` seconds from now unless kept alive."""

    @abstractmethod
    async def keepalive(self, lease_id: int) -> float:
        """Reset the lease's TTL; return it. Raises LeaseNotFound once expired."""

    @abstractmethod
    async def revoke(self, lease_id: int) -> None:
        """End the lease now; its keys are deleted in one revision. Idempotent."""

    @abstractmethod
    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Events for keys under ``prefix`` from ``start_revision`` (inclusive;
        None = from now on), in revision order::

            async with registry.watch("placement/", rev + 1) as events:
                async for event in events: ...
        """

    @abstractmethod
    async def revision(self) -> int:
        """The current revision: the change token."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections and files. Idempotent."""
