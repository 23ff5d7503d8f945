"""The registry conformance suite: the whole :class:`~corral.registry.Registry` contract.

Modelled on trio's ``check_two_way_stream``: hand :func:`check_registry` a factory
of :class:`RegistryHarness` objects (a fresh, empty registry each, and how lease
time passes on it), and it runs every check through the interface alone: keys,
revisions and versions, guarded transactions, leases and their expiry, watches,
and undecodable records. memory, SQLite and etcd all pass it; so must yours.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import trio

from corral.registry import (
    AppRecord,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    Get,
    InvalidKey,
    InvalidTxn,
    KeyValue,
    LeaseNotFound,
    Put,
    Registry,
    TxnResult,
    Undecodable,
    WatchEvent,
    read_records,
)
from corral.testing._checks import expect_error, run_checks

__all__ = ["ManualClock", "RegistryHarness", "check_registry", "take_events"]


class ManualClock:
    """A clock that moves only when told: ``clock.advance(45)``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds


@dataclass
class RegistryHarness:
    """A registry under test plus how to let lease time pass on it."""

    name: str
    registry: Registry
    clock: ManualClock | None  # None: the server keeps time (etcd)

    def ttl(self, wanted: float) -> float:
        """A TTL the backend honours (etcd's minimum is 2 s)."""
        return wanted if self.clock is not None else max(wanted, 2.0)

    async def elapse(self, seconds: float) -> None:
        """Let ``seconds`` of lease time pass (real time on etcd)."""
        if self.clock is not None:
            self.clock.advance(seconds)
            await self.registry.revision()  # any access enforces expiry
        else:
            await trio.sleep(seconds)

    async def until_gone(self, key: str, *, within: float = 5.0) -> None:
        """Wait (bounded) until ``key`` is absent; immediate on a manual clock."""
        if self.clock is not None:
            assert await self.registry.get(key) is None, f"{key} outlived its lease"
            return
        with trio.fail_after(within):
            for _ in range(int(within / 0.05) + 1):
                if await self.registry.get(key) is None:
                    return
                await trio.sleep(0.05)
        raise AssertionError(f"{key} outlived its lease")


async def take_events(
    events: AsyncIterator[WatchEvent], n: int, *, within: float = 10.0
) -> list[WatchEvent]:
    """The next ``n`` events of a watch; fails after ``within`` seconds."""
    got: list[WatchEvent] = []
    with trio.fail_after(within):
        async for event in events:
            got.append(event)
            if len(got) == n:
                break
    return got


def _summary(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    return [(e.type.value, e.kv.key, e.kv.value) for e in events]


async def _check_put_get_range_carry_revisions_and_versions(backend: RegistryHarness) -> None:
    registry = backend.registry
    first = await registry.put("apps/a", b"1")
    assert await registry.revision() == first
    assert await registry.get("apps/a") == KeyValue("apps/a", b"1", first, first, 1)
    second = await registry.put("apps/a", b"2")
    assert second == first + 1
    assert await registry.get("apps/a") == KeyValue("apps/a", b"2", first, second, 2)
    await registry.put("apps/b", b"x")
    await registry.put("nodes/n1", b"y")
    assert [kv.key for kv in await registry.range("apps/")] == ["apps/a", "apps/b"]
    assert [kv.key for kv in await registry.range("")] == ["apps/a", "apps/b", "nodes/n1"]
    assert await registry.range("placement/") == []
    assert await registry.get("apps/c") is None


async def _check_every_write_bumps_the_revision_by_one(backend: RegistryHarness) -> None:
    registry = backend.registry
    rev = await registry.revision()
    await registry.put("apps/a", b"1")
    await registry.put("apps/b", b"1")
    assert await registry.revision() == rev + 2
    assert await registry.delete("apps/a") == 1
    assert await registry.revision() == rev + 3
    assert await registry.delete("apps/a") == 0  # nothing changed: no revision
    assert await registry.revision() == rev + 3
    result = await registry.txn([], [Put("apps/c", b"1"), Put("apps/d", b"1")])
    assert result.revision == rev + 4 == await registry.revision()
    failed = await registry.txn([Compare.absent("apps/c")], [Put("apps/e", b"1")])
    assert not failed.succeeded
    assert failed.revision == rev + 4
    lease = await registry.grant(backend.ttl(60))
    assert await registry.revision() == rev + 4  # a grant is not a write
    await registry.put("nodes/n1", b"", lease=lease.id)
    await registry.put("nodes/n2", b"", lease=lease.id)
    await registry.revoke(lease.id)
    assert await registry.revision() == rev + 7  # the revoke is one revision
    assert await registry.delete("apps/", prefix=True) == 3
    assert await registry.revision() == rev + 8


async def _check_cas_on_an_absent_key_has_exactly_one_winner(backend: RegistryHarness) -> None:
    registry = backend.registry
    results: dict[str, TxnResult] = {}

    async def claim(name: str) -> None:
        results[name] = await registry.txn(
            [Compare.absent("ports/n1/24000")],
            [Put("ports/n1/24000", name.encode())],
            [Get("ports/n1/24000")],
        )

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(claim, f"writer-{i}")
    winners = [name for name, result in results.items() if result.succeeded]
    assert len(winners) == 1
    (winner,) = winners
    stored = await registry.get("ports/n1/24000")
    assert stored is not None
    assert stored.value == winner.encode()
    assert stored.version == 1
    for name, result in results.items():
        if name != winner:
            (seen,) = result.responses
            assert isinstance(seen, list)
            assert [kv.value for kv in seen] == [winner.encode()]  # the loser learns who won


async def _check_guarded_txn_on_version_revisions_and_value(backend: RegistryHarness) -> None:
    registry = backend.registry
    created = await registry.put("alias/x.example", b"web-a")
    flip = await registry.txn(
        [Compare.version_is("alias/x.example", 1)],
        [Put("alias/x.example", b"web-b"), Put("alias/x.example/previous", b"web-a")],
        [Get("alias/x.example")],
    )
    assert flip.succeeded
    assert flip.responses == (None, None)
    # The same guard again is stale: nothing is written, the failure branch reads.
    stale = await registry.txn(
        [Compare.version_is("alias/x.example", 1)],
        [Put("alias/x.example", b"web-c")],
        [Get("alias/x.example")],
    )
    assert not stale.succeeded
    assert stale.revision == flip.revision
    (current,) = stale.responses
    assert isinstance(current, list)
    assert [(kv.value, kv.version, kv.mod_revision) for kv in current] == [
        (b"web-b", 2, flip.revision)
    ]
    checks = [
        (Compare.create_revision_is("alias/x.example", created), True),
        (Compare.create_revision_is("alias/x.example", created + 1), False),
        (Compare.mod_revision_is("alias/x.example", flip.revision), True),
        (Compare.mod_revision_is("alias/x.example", created), False),
        (Compare.value_is("alias/x.example", b"web-b"), True),
        (Compare.value_is("alias/x.example", b"web-a"), False),
        (Compare("alias/x.example", CompareTarget.VERSION, CompareOp.GREATER, 1), True),
        (Compare("alias/x.example", CompareTarget.VERSION, CompareOp.LESS, 2), False),
        (Compare("alias/x.example", CompareTarget.VERSION, CompareOp.NOT_EQUAL, 0), True),
        (Compare("alias/x.example", CompareTarget.VALUE, CompareOp.GREATER, b"web-a"), True),
        (Compare.absent("alias/y.example"), True),
        (Compare.create_revision_is("alias/y.example", 0), True),
        # A value compare on an absent key is always false, as in etcd.
        (Compare.value_is("alias/y.example", b""), False),
        (Compare("alias/y.example", CompareTarget.VALUE, CompareOp.NOT_EQUAL, b"x"), False),
    ]
    for compare, expected in checks:
        result = await registry.txn([compare], [])
        assert result.succeeded is expected, compare
    both = await registry.txn(
        [Compare.value_is("alias/x.example", b"web-b"), Compare.absent("alias/x.example")], []
    )
    assert not both.succeeded  # every compare must hold


async def _check_txn_responses_follow_the_branch_ops(backend: RegistryHarness) -> None:
    registry = backend.registry
    await registry.put("apps/a", b"1")
    await registry.put("apps/b", b"2")
    result = await registry.txn(
        [],
        [Get("apps/", prefix=True), Delete("apps/a"), Put("nodes/n1", b"3"), Get("nodes/n1")],
    )
    listed, deleted, put, read_back = result.responses
    assert isinstance(listed, list)
    assert [kv.key for kv in listed] == ["apps/a", "apps/b"]
    assert deleted == 1
    assert put is None
    assert isinstance(read_back, list)
    assert [(kv.value, kv.mod_revision) for kv in read_back] == [(b"3", result.revision)]
    assert await registry.get("apps/a") is None


async def _check_keys_outside_the_key_space_are_refused(backend: RegistryHarness) -> None:
    registry = backend.registry
    rev = await registry.revision()
    with expect_error(InvalidKey, match="outside the key space"):
        await registry.put("bogus", b"1")
    with expect_error(InvalidKey, match="accepted: apps/<app>"):
        await registry.txn([], [Put("apps/a", b"1"), Put("apps/Not_A_Name", b"1")])
    with expect_error(InvalidTxn):
        await registry.txn([], [Put("apps/a", b"1"), Put("apps/a", b"2")])
    with expect_error(InvalidTxn):
        await registry.txn([], [Delete("apps/", prefix=True), Put("apps/a", b"1")])
    assert await registry.revision() == rev
    assert await registry.get("apps/a") is None


async def _check_a_put_on_a_missing_lease_fails_and_writes_nothing(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    lease = await registry.grant(backend.ttl(60))
    await registry.revoke(lease.id)
    rev = await registry.revision()
    with expect_error(LeaseNotFound) as caught:
        await registry.put("nodes/n1", b"x", lease=lease.id)
    assert caught.value.lease_id == lease.id
    with expect_error(LeaseNotFound):
        await registry.txn([], [Put("apps/a", b"1"), Put("nodes/n1", b"x", lease=lease.id)])
    assert await registry.revision() == rev
    assert await registry.range("") == []


async def _check_lease_expiry_removes_its_keys_in_one_revision(backend: RegistryHarness) -> None:
    registry = backend.registry
    lease = await registry.grant(backend.ttl(1))
    assert lease.ttl >= 1
    await registry.put("nodes/n1", b"a", lease=lease.id)
    await registry.put("nodes/n2", b"b", lease=lease.id)
    await registry.put("apps/keep", b"c")
    rev = await registry.revision()
    assert (await registry.get("nodes/n1")) is not None
    await backend.elapse(lease.ttl + 0.1)
    await backend.until_gone("nodes/n1")
    assert await registry.get("nodes/n2") is None
    assert [kv.key for kv in await registry.range("")] == ["apps/keep"]
    assert await registry.revision() == rev + 1
    with expect_error(LeaseNotFound):
        await registry.keepalive(lease.id)


async def _check_keepalive_keeps_keys_past_their_ttl(backend: RegistryHarness) -> None:
    registry = backend.registry
    lease = await registry.grant(backend.ttl(1))
    await registry.put("nodes/n1", b"a", lease=lease.id)
    for _ in range(2):
        await backend.elapse(lease.ttl * 0.75)
        assert await registry.keepalive(lease.id) == lease.ttl
    await backend.elapse(lease.ttl * 0.75)  # 2.25 TTLs after the grant
    kv = await registry.get("nodes/n1")
    assert kv is not None
    assert kv.lease == lease.id
    await registry.revoke(lease.id)


async def _check_revoke_removes_keys_at_once_and_is_idempotent(backend: RegistryHarness) -> None:
    registry = backend.registry
    lease = await registry.grant(backend.ttl(60))
    await registry.put("nodes/n1", b"a", lease=lease.id)
    await registry.put("lease/coordinator", b"b", lease=lease.id)
    await registry.put("nodes/n2", b"c", lease=lease.id)
    await registry.put("nodes/n2", b"c")  # re-put without the lease: detached
    await registry.revoke(lease.id)
    assert await registry.get("nodes/n1") is None
    assert await registry.get("lease/coordinator") is None
    assert await registry.get("nodes/n2") is not None
    await registry.revoke(lease.id)
    with expect_error(LeaseNotFound):
        await registry.keepalive(lease.id)


async def _check_watch_replays_puts_deletes_and_expiries_in_order(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    start = await registry.revision() + 1
    lease = await registry.grant(backend.ttl(1))
    await registry.put("nodes/n1", b"alive", lease=lease.id)
    await registry.put("apps/a", b"1")
    await registry.put("apps/a", b"2")
    await registry.txn([], [Delete("apps/a"), Put("apps/b", b"3")])
    await backend.elapse(lease.ttl + 0.1)
    await backend.until_gone("nodes/n1")
    expected = [
        ("put", "nodes/n1", b"alive"),
        ("put", "apps/a", b"1"),
        ("put", "apps/a", b"2"),
        ("delete", "apps/a", b""),
        ("put", "apps/b", b"3"),
        ("delete", "nodes/n1", b""),
    ]
    async with registry.watch("", start) as events:
        got = await take_events(events, len(expected))
    assert _summary(got) == expected
    revisions = [e.kv.mod_revision for e in got]
    assert revisions == sorted(revisions)
    assert revisions[0] == start
    assert revisions[3] == revisions[4]  # one txn, one revision
    assert got[2].kv.version == 2
    assert got[2].kv.create_revision == revisions[1]
    async with registry.watch("apps/", start + 2) as events:
        got = await take_events(events, 3)
    assert _summary(got) == expected[2:5]


async def _check_watch_from_now_sees_later_writes_and_expiries(backend: RegistryHarness) -> None:
    registry = backend.registry
    await registry.put("nodes/old", b"before the watch")
    async with registry.watch("nodes/") as events:
        lease = await registry.grant(backend.ttl(1))
        await registry.put("nodes/n1", b"a", lease=lease.id)
        await registry.put("apps/ignored", b"b")
        await registry.put("nodes/n2", b"c")
        await registry.delete("nodes/n2")
        await backend.elapse(lease.ttl + 0.1)
        got = await take_events(events, 4)
    assert _summary(got) == [
        ("put", "nodes/n1", b"a"),
        ("put", "nodes/n2", b"c"),
        ("delete", "nodes/n2", b""),
        ("delete", "nodes/n1", b""),
    ]
    assert got[0].type is EventType.PUT
    assert got[0].kv.lease == lease.id


async def _check_revision_is_monotonic_under_concurrent_writers(backend: RegistryHarness) -> None:
    registry = backend.registry
    seen: list[int] = []

    async def writer(i: int) -> None:
        for j in range(5):
            seen.append(await registry.put(f"apps/w{i}", str(j).encode()))

    before = await registry.revision()
    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(writer, i)
    assert sorted(seen) == list(range(before + 1, before + 21))  # each write its own revision
    assert await registry.revision() == before + 20


async def _check_undecodable_values_are_reported_not_raised(backend: RegistryHarness) -> None:
    registry = backend.registry
    await registry.put("apps/web", AppRecord("web", replicas=2).encode())
    await registry.put("apps/broken", b"{not json")
    await registry.put("apps/liar", AppRecord("other").encode())
    records, undecodable = await read_records(registry, "apps/")
    assert records == {"apps/web": AppRecord("web", replicas=2)}
    assert [u.key for u in undecodable] == ["apps/broken", "apps/liar"]
    assert all(isinstance(u, Undecodable) and u.reason for u in undecodable)


CHECKS = [
    _check_put_get_range_carry_revisions_and_versions,
    _check_every_write_bumps_the_revision_by_one,
    _check_cas_on_an_absent_key_has_exactly_one_winner,
    _check_guarded_txn_on_version_revisions_and_value,
    _check_txn_responses_follow_the_branch_ops,
    _check_keys_outside_the_key_space_are_refused,
    _check_a_put_on_a_missing_lease_fails_and_writes_nothing,
    _check_lease_expiry_removes_its_keys_in_one_revision,
    _check_keepalive_keeps_keys_past_their_ttl,
    _check_revoke_removes_keys_at_once_and_is_idempotent,
    _check_watch_replays_puts_deletes_and_expiries_in_order,
    _check_watch_from_now_sees_later_writes_and_expiries,
    _check_revision_is_monotonic_under_concurrent_writers,
    _check_undecodable_values_are_reported_not_raised,
]


async def check_registry(
    make_registry: Callable[[], AbstractAsyncContextManager[RegistryHarness]],
) -> None:
    """Check that a :class:`~corral.registry.Registry` implementation keeps the contract.

    Args:
        make_registry: an async context manager factory yielding a
            :class:`RegistryHarness` around a fresh, empty registry; it closes the
            registry on exit. Give the harness a :class:`ManualClock` if the
            backend takes its lease clock from the caller (then no check waits),
            or None if the server keeps time (then lease checks wait a few real
            seconds, with TTLs of at least 2 s, as etcd requires).

    Raises:
        CheckFailed: a check failed; the message names it.

    Example::

        @asynccontextmanager
        async def memory_registry():
            clock = ManualClock()
            registry = MemoryRegistry(clock)
            try:
                yield RegistryHarness("memory", registry, clock)
            finally:
                await registry.aclose()

        async def test_memory_registry():
            await check_registry(memory_registry)
    """
    await run_checks("check_registry", make_registry, CHECKS)
