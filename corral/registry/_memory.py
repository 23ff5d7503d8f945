"""The in-memory twin: etcd's semantics in a dict, with no threads and no I/O.

Everything happens on the Trio loop, so tests under
``MockClock(autojump_threshold=0)`` keep exact virtual time: a lease granted at
t=0 with a 45 s TTL is gone for every reader at t=45, and a watcher blocked on
the prefix wakes at exactly t=45 to report the deletion (it sleeps until the
earliest lease deadline).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from corral.registry._base import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    Put,
    Registry,
    TxnOp,
    TxnResult,
    WatchEvent,
)
from corral.registry._errors import LeaseNotFound, RevisionCompacted
from corral.registry._logic import KeyCheck, check_txn_branch, compare_holds
from corral.registry._records import parse_key

DEFAULT_HISTORY = 10_000
"""How many watch events a backend keeps for watches that start in the past."""


@dataclass(slots=True)
class _LeaseState:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryRegistry(Registry):
    """A :class:`Registry` held in this process's memory.

    Args:
        clock: a zero-argument callable returning seconds, used for lease expiry
            (default :func:`trio.current_time`, so MockClock drives it).
        key_check: called on every key a write names; raises InvalidKey to refuse
            it (default: corral's key space, :func:`parse_key`).
        history: how many watch events to keep for watches from an old revision.
    """

    def __init__(
        self,
        clock: Callable[[], float] | None = None,
        *,
        key_check: KeyCheck | None = None,
        history: int = DEFAULT_HISTORY,
    ) -> None:
        self._clock: Callable[[], float] = clock if clock is not None else trio.current_time
        self._key_check: KeyCheck = key_check if key_check is not None else parse_key
        self._history = max(1, history)
        self._kv: dict[str, KeyValue] = {}
        # The keys of _kv, sorted: a prefix read is a bisect, not a scan of every key.
        self._keys: list[str] = []
        self._revision = 1
        self._leases: dict[int, _LeaseState] = {}
        # (deadline, lease id) of every grant and keepalive; an entry whose lease is
        # gone or whose deadline moved since is stale and dropped when it comes first.
        self._deadlines: list[tuple[float, int]] = []
        self._next_lease_id = 1
        self._events: list[WatchEvent] = []
        self._event_revisions: list[int] = []
        self._compacted = 0  # every event of a revision <= this is gone
        # Watchers park by prefix: a write wakes only those it concerns. One of them
        # (the keeper) also wakes at the earliest lease deadline, to expire it on time.
        self._lots: dict[str, trio.lowlevel.ParkingLot] = {}
        # The lengths of the watched prefixes, sorted: the prefixes a key starts with are
        # found by a dict lookup per length, not by trying every prefix watched (a
        # thousand nodes watch a thousand prefixes).
        self._prefix_lengths: list[int] = []
        # Per watched prefix, its events in the history (and maybe a few older, dropped
        # lazily): a watcher looks through its own events only, not through every
        # event since it last looked (when a key a thousand nodes watch changes after
        # a long while, each of them would look through the whole history).
        self._prefix_events: dict[str, list[WatchEvent]] = {}
        self._keeper: object | None = None
        self._keeper_lot: trio.lowlevel.ParkingLot | None = None
        self._keeper_wake = math.inf
        # Per watched prefix, the newest revision of a matching event history dropped.
        self._dropped: dict[str, int] = {}
        self._closed = False

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        await self._enter()
        return self._kv.get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        await self._enter()
        return [self._kv[k] for k in self._prefixed(prefix)]

    async def revision(self) -> int:
        await self._enter()
        return self._revision

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        await self._enter()
        self._key_check(key)
        self._apply([Put(key, bytes(value), lease)])
        return self._revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        await self._enter()
        (deleted,) = self._apply([Delete(key, prefix)])
        assert isinstance(deleted, int)
        return deleted

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        await self._enter()
        check_txn_branch(on_success, self._key_check)
        check_txn_branch(on_failure, self._key_check)
        succeeded = all(compare_holds(c, self._kv.get(c.key)) for c in compares)
        responses = self._apply(on_success if succeeded else on_failure)
        return TxnResult(succeeded, self._revision, tuple(responses))

    # ------------------------------------------------------------------ leases

    async def grant(self, ttl: float) -> Lease:
        await self._enter()
        if ttl <= 0:
            raise ValueError(f"a lease TTL must be > 0 seconds, got {ttl}")
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        deadline = self._clock() + ttl
        self._leases[lease_id] = _LeaseState(ttl, deadline)
        heapq.heappush(self._deadlines, (deadline, lease_id))
        if deadline < self._keeper_wake and self._keeper_lot is not None:
            self._keeper_lot.unpark_all()  # the keeper sleeps past this one: wake it
        return Lease(lease_id, ttl)

    async def keepalive(self, lease_id: int) -> float:
        await self._enter()
        state = self._leases.get(lease_id)
        if state is None:
            raise LeaseNotFound(lease_id)
        deadline = self._clock() + state.ttl
        if deadline != state.deadline:
            state.deadline = deadline
            heapq.heappush(self._deadlines, (deadline, lease_id))
        return state.ttl

    async def revoke(self, lease_id: int) -> None:
        await self._enter()
        self._end_lease(lease_id)

    # ------------------------------------------------------------------ watch

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        await self._enter()
        start = self._revision + 1 if start_revision is None else max(1, start_revision)
        if start <= self._compacted:
            raise RevisionCompacted(start, self._compacted)
        # Registered now, not when the stream is first read: what history drops of this
        # prefix from here on must be known to it.
        self._lot(prefix)
        stream = self._stream(prefix, start)
        try:
            yield stream
        finally:
            await stream.aclose()

    async def _stream(self, prefix: str, next_revision: int) -> AsyncGenerator[WatchEvent, None]:
        lot = self._lot(prefix)
        token = object()
        try:
            while True:
                self._check_open()
                self._expire_due()
                if next_revision <= self._compacted:
                    # Only a dropped event of this prefix is a loss: others never woke us.
                    if self._dropped.get(prefix, 0) >= next_revision:
                        raise RevisionCompacted(next_revision, self._compacted)
                    next_revision = self._compacted + 1
                own = self._prefix_events[prefix]
                if own and own[-1].kv.mod_revision >= next_revision:
                    batch = own[bisect.bisect_left(own, next_revision, key=_revision_of) :]
                else:
                    batch = []  # woken for the deadlines, or nothing of this prefix since
                next_revision = self._revision + 1
                if batch:
                    for event in batch:
                        yield event
                    continue
                await self._wait_for_change(lot, token)
        finally:
            if self._keeper is token:
                self._keeper = self._keeper_lot = None
                self._keeper_wake = math.inf
                # One waiting watcher takes the deadlines over (waking all of them would
                # have each look through the history: a thousand nodes watch).
                for other in self._lots.values():
                    if other:
                        other.unpark(count=1)
                        break

    def _lot(self, prefix: str) -> trio.lowlevel.ParkingLot:
        """Where the watchers of ``prefix`` wait."""
        lot = self._lots.get(prefix)
        if lot is None:
            lot = self._lots[prefix] = trio.lowlevel.ParkingLot()
            if len(prefix) not in self._prefix_lengths:
                bisect.insort(self._prefix_lengths, len(prefix))
            # (once per prefix ever watched)
            self._prefix_events[prefix] = [e for e in self._events if e.kv.key.startswith(prefix)]
        return lot

    def _watched(self, key: str) -> Iterator[str]:
        """The watched prefixes ``key`` starts with, shortest first."""
        lots = self._lots
        for length in self._prefix_lengths:
            if length > len(key):
                return
            if key[:length] in lots:
                yield key[:length]

    async def _wait_for_change(self, lot: trio.lowlevel.ParkingLot, token: object) -> None:
        if self._keeper is None:
            self._keeper, self._keeper_lot = token, lot
        if self._keeper is not token:
            await lot.park()
            return
        earliest = self._earliest_deadline()
        self._keeper_wake = math.inf if earliest is None else earliest
        if earliest is None:
            await lot.park()
            return
        with trio.move_on_after(max(0.0, earliest - self._clock())):
            await lot.park()

    def _earliest_deadline(self) -> float | None:
        """The deadline of the lease that lapses first (None: no lease)."""
        heap = self._deadlines
        while heap:
            deadline, lease_id = heap[0]
            state = self._leases.get(lease_id)
            if state is not None and state.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        self._closed = True
        for lot in self._lots.values():
            lot.unpark_all()
        await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this MemoryRegistry is closed")

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._expire_due()

    def _expire_due(self) -> None:
        earliest = self._earliest_deadline()
        if earliest is None:
            return
        now = self._clock()
        if earliest > now:
            return
        # Every lease due, earliest first (then by id), as one sweep.
        due: list[int] = []
        while (earliest := self._earliest_deadline()) is not None and earliest <= now:
            _, lease_id = heapq.heappop(self._deadlines)
            due.append(lease_id)
            self._leases[lease_id].deadline = -1.0  # taken: later entries of it are stale
        for lease_id in due:
            self._end_lease(lease_id)

    def _end_lease(self, lease_id: int) -> None:
        state = self._leases.pop(lease_id, None)
        if state is not None and state.keys:
            self._apply([Delete(key) for key in sorted(state.keys)])

    def _apply(self, ops: Iterable[TxnOp]) -> list[list[KeyValue] | int | None]:
        """Run ``ops`` as one revision (bumped only when something changed)."""
        ops = list(ops)
        for op in ops:
            if isinstance(op, Put) and op.lease is not None and op.lease not in self._leases:
                raise LeaseNotFound(op.lease)
        revision = self._revision + 1
        events: list[WatchEvent] = []
        responses: list[list[KeyValue] | int | None] = []
        for op in ops:
            if isinstance(op, Get):
                responses.append(self._matching(op.key, op.prefix))
            elif isinstance(op, Put):
                previous = self._kv.get(op.key)
                self._detach(previous)
                kv = KeyValue(
                    key=op.key,
                    value=bytes(op.value),
                    create_revision=revision if previous is None else previous.create_revision,
                    mod_revision=revision,
                    version=1 if previous is None else previous.version + 1,
                    lease=op.lease,
                )
                self._kv[op.key] = kv
                if previous is None:
                    bisect.insort(self._keys, op.key)
                if op.lease is not None:
                    self._leases[op.lease].keys.add(op.key)
                events.append(WatchEvent(EventType.PUT, kv))
                responses.append(None)
            else:
                gone = self._matching(op.key, op.prefix)
                for kv in gone:
                    del self._kv[kv.key]
                    del self._keys[bisect.bisect_left(self._keys, kv.key)]
                    self._detach(kv)
                    events.append(
                        WatchEvent(EventType.DELETE, KeyValue(kv.key, b"", 0, revision, 0))
                    )
                responses.append(len(gone))
        if events:
            self._revision = revision
            self._record(events)
        return responses

    def _matching(self, key: str, is_prefix: bool) -> list[KeyValue]:
        if not is_prefix:
            kv = self._kv.get(key)
            return [] if kv is None else [kv]
        return [self._kv[k] for k in self._prefixed(key)]

    def _prefixed(self, prefix: str) -> list[str]:
        """The keys starting with ``prefix``, sorted."""
        keys = self._keys
        start = bisect.bisect_left(keys, prefix)
        end = bisect.bisect_left(keys, prefix + "\U0010ffff", start)
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1  # a key whose next character is U+10FFFF itself
        return keys[start:end]

    def _detach(self, kv: KeyValue | None) -> None:
        if kv is not None and kv.lease is not None:
            state = self._leases.get(kv.lease)
            if state is not None:
                state.keys.discard(kv.key)

    def _record(self, events: list[WatchEvent]) -> None:
        self._events.extend(events)
        self._event_revisions.extend(e.kv.mod_revision for e in events)
        excess = len(self._events) - self._history
        if excess > 0:
            # Drop whole revisions only, so a watcher never sees half of one.
            cut = bisect.bisect_right(self._event_revisions, self._event_revisions[excess - 1])
            self._compacted = self._event_revisions[cut - 1]
            for event in self._events[:cut]:  # oldest first: the newest is kept
                for prefix in self._watched(event.kv.key):
                    self._dropped[prefix] = event.kv.mod_revision
            del self._events[:cut]
            del self._event_revisions[:cut]
        woken: set[str] = set()
        for event in events:
            for prefix in self._watched(event.kv.key):
                own = self._prefix_events[prefix]
                own.append(event)
                if len(own) > 2 * self._history:
                    del own[: len(own) - self._history]  # older than the history keeps
                if prefix not in woken:
                    woken.add(prefix)
                    self._lots[prefix].unpark_all()


def _revision_of(event: WatchEvent) -> int:
    return event.kv.mod_revision
