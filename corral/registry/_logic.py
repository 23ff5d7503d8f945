"""Decisions every backend shares: compare evaluation, txn checks, key ranges.

Pure functions: no trio, no clock, no I/O. The memory and SQLite backends use
them to evaluate guards exactly as etcd does; the etcd backend uses the range
helpers to build its requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corral.registry._base import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    Get,
    KeyValue,
    Put,
    TxnOp,
)
from corral.registry._errors import InvalidKey, InvalidTxn

KeyCheck = Callable[[str], object]
"""Called on every key a write names; raises InvalidKey to refuse it."""


def accept_any_key(key: str) -> None:
    """A key check that accepts every non-empty str key."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"registry keys are non-empty str, got {key!r}")


def compare_holds(compare: Compare, kv: KeyValue | None) -> bool:
    """Evaluate one txn guard against the key's current state (``None`` = absent).

    As in etcd, an absent key has version, create and mod revision 0, and a
    VALUE compare on an absent key is always false.
    """
    if compare.target is CompareTarget.VALUE:
        if kv is None:
            return False
        if not isinstance(compare.value, bytes | bytearray):
            raise TypeError(f"a VALUE compare needs bytes, got {type(compare.value).__name__}")
        return _apply_op(compare.op, kv.value, bytes(compare.value))
    if kv is None:
        return stamp_compare_holds(compare, None)
    return stamp_compare_holds(compare, (kv.create_revision, kv.mod_revision, kv.version))


def stamp_compare_holds(compare: Compare, stamps: tuple[int, int, int] | None) -> bool:
    """Evaluate a VERSION, CREATE_REVISION or MOD_REVISION guard from the key's
    ``(create_revision, mod_revision, version)`` (``None`` = absent), as
    :func:`compare_holds` does: a backend can read those three without the value.
    """
    target = compare.target
    if target is CompareTarget.MOD_REVISION:
        stamp = 1
    elif target is CompareTarget.VERSION:
        stamp = 2
    elif target is CompareTarget.CREATE_REVISION:
        stamp = 0
    else:
        raise ValueError(f"a {target.name} compare is not evaluated from stamps")
    value = compare.value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a {target.name} compare needs an int, got {type(value).__name__}")
    actual = 0 if stamps is None else stamps[stamp]
    op = compare.op
    if op is CompareOp.EQUAL:  # the common guard, without a call
        return actual == value
    return _apply_op(op, actual, value)


def _apply_op(op: CompareOp, actual: int | bytes, expected: int | bytes) -> bool:
    if op is CompareOp.EQUAL:
        return actual == expected
    if op is CompareOp.NOT_EQUAL:
        return actual != expected
    if op is CompareOp.LESS:
        return actual < expected  # type: ignore[operator]
    return actual > expected  # type: ignore[operator]


def check_txn_branch(ops: Sequence[TxnOp], key_check: KeyCheck) -> None:
    """Refuse what etcd refuses: one key written twice in a branch, a put inside a
    deleted range; and puts of keys outside the key space.

    Raises:
        InvalidTxn: a key is written twice.
        InvalidKey: from ``key_check``.
    """
    puts: set[str] = set()
    deletes: list[Delete] = []
    for op in ops:
        if isinstance(op, Put):
            key_check(op.key)
            if op.key in puts:
                raise InvalidTxn(f"txn puts {op.key!r} twice; write each key once per txn")
            puts.add(op.key)
        elif isinstance(op, Delete):
            deletes.append(op)
        elif not isinstance(op, Get):
            raise TypeError(f"txn ops are Put, Delete or Get, not {type(op).__name__}")
    for delete in deletes:
        for key in puts:
            if key == delete.key or (delete.prefix and key.startswith(delete.key)):
                raise InvalidTxn(f"txn both puts and deletes {key!r}; write each key once per txn")


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the range of keys starting with ``prefix`` (etcd's
    ``GetPrefixRangeEnd``); ``b"\\0"`` means "to the end of the key space"."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def key_matches(key: str, prefix: str, *, is_prefix: bool) -> bool:
    return key.startswith(prefix) if is_prefix else key == prefix
