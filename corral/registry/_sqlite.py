"""The SQLite backend: the embedded default, one file shared by the node processes
of one machine.

Theory of operation
-------------------
Four tables: ``meta`` (the revision and how far history is compacted), ``kv``
(each key with its create/mod revision, version and lease), ``leases`` (TTL and
expiry time on the injected clock) and ``changes`` (the watch history: one row
per changed key, ordered by revision). Every write is one ``BEGIN IMMEDIATE``
transaction, so writers in several processes are serialized by SQLite's lock and
each sees the others' revisions.

Leases expire by the injected clock. The default, :func:`host_clock`, is
``CLOCK_BOOTTIME`` (``CLOCK_MONOTONIC`` where there is none): one clock every
process of the host reads alike, which a step of the wall clock (NTP, an
operator, a VM resume) does not move, so no process can expire its peers'
leases early by having its own idea of the time. That clock restarts at boot:
the ``info`` table records which boot (and which clock) the stored expiry times
belong to, and the first process to open the file on a new boot (or after an
upgrade from wall-clock expiries) renews every lease for its full TTL, as etcd
does after electing a leader.

Every process enforces expiry: a read first probes for a lease past its
expiry and, when there is one, runs the expiry write before reading; every write
transaction expires due leases first; every watcher's poll is such a read; and
:func:`open_registry` runs a periodic sweep (:meth:`SQLiteRegistry.run_sweeper`).
An expiry deletes the lease's keys as one revision with DELETE events, as etcd
does. Reads and on-loop commits are cancel points always and schedule points
every 16th call (a full checkpoint costs as much as a read).

The file's identity (device and inode) is taken when it is opened. Every write
first checks it, reads check it whenever they re-probe for due leases (at most
every PROBE_WINDOW of the lease clock), and :meth:`SQLiteRegistry.guard_file`
checks it every second: a file deleted or replaced under a running process
raises :class:`RegistryReplaced` from then on, instead of this process carrying
on alone in an unlinked file while a new process starts a second cluster on the
path.

Watches poll ``meta.revision`` (every 50 ms by default; a write in this process
wakes its own watchers at once) and read new rows from ``changes``.

A full disk. Beside the file, ``<file>.reserve`` holds ``reserve_bytes`` (8 MiB by
default) of the file system back: made at open when twice that is free, and again
by the sweeper once twice that is free after it was used. A write that fails with
SQLITE_FULL deletes it (saying so in one log line), checkpoints the WAL (so the next
writes reuse the WAL's space instead of growing it) and is tried once more, so the
registry's own small writes — a node's record, lease renewals — go through on a
disk something else filled.

Durability and the Trio loop. With ``synchronous=NORMAL`` (the default) SQLite
does not sync on commit in WAL mode; it syncs when checkpointing the WAL into
the database. Automatic checkpoints are off, and this backend runs checkpoints
in a worker thread every ``checkpoint_every`` commits, so commits run on the loop
without waiting for the disk. With ``synchronous=FULL`` (or EXTRA) each commit
syncs, so writes run in a worker thread on their own connection, and
concurrent writes are group-committed: the writes queued while one commit is in
flight go together in the next transaction, each in its own savepoint and its
own revision.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sqlite3
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Generic, NoReturn, TypeVar

import trio

from corral.registry._base import (
    Compare,
    CompareTarget,
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
from corral.registry._errors import (
    LeaseNotFound,
    RegistryError,
    RegistryReplaced,
    RegistryUnavailable,
    RevisionCompacted,
)
from corral.registry._logic import (
    KeyCheck,
    check_txn_branch,
    compare_holds,
    stamp_compare_holds,
)
from corral.registry._memory import DEFAULT_HISTORY
from corral.registry._records import parse_key

T = TypeVar("T")
W = TypeVar("W")
_log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL: Final = 0.05
DEFAULT_BUSY_TIMEOUT: Final = 10.0
DEFAULT_CHECKPOINT_EVERY: Final = 1000
DEFAULT_SWEEP_INTERVAL: Final = 1.0
DEFAULT_RESERVE_BYTES: Final = 8 * 1024 * 1024
RESERVE_SUFFIX: Final = ".reserve"
_WATCH_BATCH: Final = 1000

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    revision INTEGER NOT NULL,
    compacted INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, revision, compacted) VALUES (0, 1, 0);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases (expires);
CREATE TABLE IF NOT EXISTS info (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    revision INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    deleted INTEGER NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    version INTEGER NOT NULL,
    lease INTEGER,
    PRIMARY KEY (revision, seq)
) WITHOUT ROWID;
"""

_KV_COLUMNS: Final = "key, value, create_revision, mod_revision, version, lease"
_META: Final = "SELECT revision, compacted FROM meta"
_META_PROBED: Final = "SELECT revision, compacted, (SELECT min(expires) FROM leases) FROM meta"
_GET: Final = "SELECT * FROM kv WHERE key = ?"  # the columns are _KV_COLUMNS, in order
_STAMPS: Final = "SELECT create_revision, mod_revision, version FROM kv WHERE key = ?"
_EARLIEST_EXPIRY: Final = "SELECT min(expires) FROM leases"
_SCHEDULE_EVERY: Final = 16
_cancel_point: Final = trio.lowlevel.checkpoint_if_cancelled

PROBE_WINDOW: Final = 0.05
"""Seconds (lease clock) a probe for due leases stays valid; also the shortest TTL."""


_HOST_CLOCK_ID: Final = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_HOST_CLOCK_NAME: Final = "boottime" if hasattr(time, "CLOCK_BOOTTIME") else "monotonic"
_BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"
DEFAULT_GUARD_INTERVAL: Final = 1.0

host_clock: Final[Callable[[], float]] = functools.partial(time.clock_gettime, _HOST_CLOCK_ID)
host_clock.__doc__ = """The default lease clock, in seconds: ``CLOCK_BOOTTIME`` (else
``CLOCK_MONOTONIC``), shared by every process of the host and never stepped."""


def lease_epoch() -> str:
    """Which run of :func:`host_clock` stored expiry times belong to: the clock's
    name and this boot's id (without /proc, the boot time it implies, to the
    minute; a wall-clock step then only renews leases, never expires them)."""
    try:
        with open(_BOOT_ID_FILE, encoding="ascii") as file:
            boot = file.read(64).strip()
    except OSError:
        boot = ""
    if not boot:
        boot = "booted-" + str(round((time.time() - host_clock()) / 60))
    return f"{_HOST_CLOCK_NAME}:{boot}"


def _file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is no file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """``[prefix, end)`` covering every str key starting with ``prefix`` (TEXT
    compares as UTF-8 bytes, which orders like code points)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1])
        if code < 0x10FFFF:
            code = 0xE000 if code == 0xD7FF else code + 1
            return prefix, "".join([*chars[:-1], chr(code)])
        chars.pop()
    return prefix, None


def _kv(row: tuple[Any, ...]) -> KeyValue:
    return KeyValue(*row)


_REUSE_ENTRIES: Final = 1024
_REUSE_MAX_VALUE: Final = 16 * 1024


class _Reuse:
    """The KeyValue last built for each recently read key, with the row it came
    from. A frozen KeyValue costs more to build than the SELECT that found it, and
    most reads find the row unchanged: when the row read now equals the one
    remembered, the same (immutable) object is returned. Every read still reads
    its row, so this can never answer with a stale value. Bounded: at most
    _REUSE_ENTRIES keys, values up to _REUSE_MAX_VALUE bytes."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[Any, ...], KeyValue]] = {}

    def kv(self, row: tuple[Any, ...]) -> KeyValue:
        seen = self._seen.get(row[0])
        if seen is not None and seen[0] == row:
            return seen[1]
        kv = KeyValue(*row)
        if len(row[1]) <= _REUSE_MAX_VALUE:
            if len(self._seen) >= _REUSE_ENTRIES:
                self._seen.clear()
            self._seen[row[0]] = (row, kv)
        return kv


@dataclass(slots=True)
class _Tx:
    """One write transaction: the revision as it stands inside it."""

    cur: sqlite3.Cursor
    now: float
    revision: int
    compacted: int
    start_revision: int


@dataclass(slots=True)
class _When:
    """What a write transaction is told: the lease clock, whether a lease may be
    due (else it skips the probe), and how much history to keep."""

    now: float
    none_due: bool
    history: int


@dataclass(slots=True)
class _Slot(Generic[T]):
    """A write waiting for a group commit."""

    job: Callable[[_Tx], T]
    taken: bool = False
    done: bool = False
    value: Any = None
    error: BaseException | None = None
    finished: trio.Event = field(default_factory=trio.Event)

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        value: T = self.value
        return value


class _Reserve:
    """A ballast file beside the database: space the file system keeps for the
    registry, given up when a write finds the disk full. Blocking file work."""

    __slots__ = ("path", "size")

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def wanted(self) -> bool:
        """Absent, and twice its size is free: it can be made without filling the disk."""
        if os.path.exists(self.path):
            return False
        try:
            stat = os.statvfs(os.path.dirname(self.path) or ".")
        except OSError:
            return False
        return stat.f_bavail * stat.f_frsize >= 2 * self.size

    def make(self) -> bool:
        """Allocate it (when :meth:`wanted`); whether this call made it."""
        if not self.wanted():
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError:
            return False  # made by another process meanwhile, or not makeable here
        try:
            os.posix_fallocate(fd, 0, self.size)
        except OSError:
            os.unlink(self.path)
            return False
        finally:
            os.close(fd)
        return True

    def release(self) -> int:
        """Delete it; the bytes it held (0 when there was none)."""
        try:
            size = os.stat(self.path).st_size
            os.unlink(self.path)
        except FileNotFoundError:
            return 0
        return size


class SQLiteRegistry(Registry):
    """A :class:`Registry` in one SQLite file (WAL mode), safe to share between
    processes on one machine. Open it with :meth:`open` (or
    :func:`corral.registry.open_registry` with ``sqlite:///path``).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        *,
        clock: Callable[[], float],
        poll_interval: float,
        synchronous: str,
        key_check: KeyCheck,
        history: int,
        busy_timeout: float,
        checkpoint_every: int,
        write_conn: sqlite3.Connection | None,
        identity: tuple[int, int] | None = None,
        reserve_bytes: int = 0,
    ) -> None:
        self._conn = conn
        # Every statement on a connection goes through one cursor, made once:
        # Connection.execute makes (and drops) a cursor per statement, which costs
        # as much as a small statement itself. Safe because every statement here
        # runs to its end before the next one starts (one-row reads, fetchall,
        # writes), so none leaves a read snapshot open.
        self._cursor = conn.cursor()
        self._path = path
        self._identity = identity if identity is not None else _file_identity(path)
        self._lost: bool | None = None  # once the file is gone: True deleted, False replaced
        self._clock = clock
        self._poll_interval = poll_interval
        self._synchronous = synchronous
        self._key_check: KeyCheck = functools.lru_cache(maxsize=4096)(key_check)
        self._history = max(1, history)
        self._busy_timeout = busy_timeout
        self._checkpoint_every = checkpoint_every
        self._write_conn = write_conn  # set when commits sync: writes go to a thread
        self._write_cursor = None if write_conn is None else write_conn.cursor()
        self._queue: list[_Slot[Any]] = []
        self._write_lock = trio.Lock()
        self._changed = trio.lowlevel.ParkingLot()
        self._commits_since_checkpoint = 0
        self._checkpoint_done: trio.Event | None = None  # set while a checkpoint runs
        self._gather: list[_Slot[Any]] | None = None  # the batch a writer is gathering
        self._grouping = False  # the last batch had company: keep gathering
        self._ops = 0
        self._earliest_expiry = -math.inf  # cached probe: no lease expires before this
        self._probe_valid_until = -math.inf  # ... as long as the clock is before this
        self._direct_until = -math.inf  # the smaller of the two: get reads directly before it
        self._reuse = _Reuse()
        self._closed = False
        self._reserve = _Reserve(path + RESERVE_SUFFIX, reserve_bytes) if reserve_bytes else None

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] | None = None,
        poll_interval: float | None = None,
        synchronous: str | None = None,
        key_check: KeyCheck | None = None,
        history: int = DEFAULT_HISTORY,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> SQLiteRegistry:
        """Open (creating if needed) the registry file at ``path``.

        Args:
            path: the database file; its directory is created if missing.
            clock: lease clock, seconds (default :func:`host_clock`, which every
                process of the host shares and wall-clock steps do not move).
            poll_interval: how often a watcher polls for other processes' writes (s).
            synchronous: "NORMAL" (default: commits do not sync; checkpoints run in a
                worker thread), "FULL" or "EXTRA" (each commit syncs, in a worker thread).
            key_check: refuses keys outside the key space (default :func:`parse_key`).
            history: how many revisions of watch history to keep.
            busy_timeout: how long to wait for another process's write lock.
            checkpoint_every: commits between WAL checkpoints (NORMAL mode).
            reserve_bytes: the size of ``<path>.reserve``, the space kept for the
                registry's writes on a full disk (0: none; see the module docstring).

        Raises:
            RegistryUnavailable: the file cannot be opened or is not a registry.
        """
        path = os.fspath(path)
        sync = (synchronous or "NORMAL").upper()
        if sync not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be NORMAL, FULL or EXTRA, not {synchronous!r}")
        threaded = sync != "NORMAL"

        lease_clock = clock if clock is not None else host_clock

        def connect(
            now: float,
        ) -> tuple[sqlite3.Connection, sqlite3.Connection | None, tuple[int, int] | None]:
            """One attempt; every step is idempotent, so a busy attempt is redone whole.
            ``now`` is read on the loop: an injected clock may be trio's."""
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            opened: list[sqlite3.Connection] = []
            try:
                setup = _connect(path, sync, busy_timeout, opened)
                # Switching a fresh file to WAL reads, then writes, the header: SQLite
                # refuses it at once (no busy handler) when another process races it.
                setup.execute("PRAGMA journal_mode=WAL")
                setup.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        setup.execute(statement)
                _rebase_leases(setup, lease_epoch(), now)
                setup.execute("COMMIT")
                setup.close()
                # The loop's connection never waits on a lock inside SQLite: a busy
                # database is retried with trio.sleep instead. Its pragmas read the
                # schema, so they run while it still waits like the others.
                conn = _connect(path, sync, busy_timeout, opened)
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute("PRAGMA busy_timeout=0")
                write_conn = _connect(path, sync, busy_timeout, opened) if threaded else None
                identity = _file_identity(path)
                if reserve_bytes:
                    _Reserve(path + RESERVE_SUFFIX, reserve_bytes).make()
            except BaseException:
                for each in opened:
                    each.close()
                raise
            return conn, write_conn, identity

        # SQLite's busy handler waits inside an attempt; this covers what it does not.
        patience = _Patience(busy_timeout, started=trio.current_time())
        while True:
            try:
                conn, write_conn, identity = await trio.to_thread.run_sync(connect, lease_clock())
                break
            except sqlite3.Error as exc:
                if not await patience.wait(exc):
                    raise RegistryUnavailable(
                        f"cannot open the SQLite registry at {path}: {exc}; check the path and "
                        "that the file is a corral registry (if the database stayed locked, "
                        "find the process holding it)"
                    ) from exc
        return cls(
            conn,
            path,
            clock=lease_clock,
            poll_interval=poll_interval if poll_interval is not None else DEFAULT_POLL_INTERVAL,
            synchronous=sync,
            key_check=key_check if key_check is not None else parse_key,
            history=history,
            busy_timeout=busy_timeout,
            checkpoint_every=checkpoint_every,
            write_conn=write_conn,
            identity=identity,
            reserve_bytes=reserve_bytes,
        )

    @property
    def path(self) -> str:
        return self._path

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        # _pass_checkpoint and the probe of _read, inlined: get is the hottest call.
        self._ops += 1
        if self._ops % _SCHEDULE_EVERY:
            await _cancel_point()
        else:
            await trio.lowlevel.checkpoint()
        if self._clock() < self._direct_until:
            try:  # the fast path: no lease can be due, read directly
                row = self._cursor.execute(_GET, (key,)).fetchone()
            except sqlite3.Error:
                pass  # the slow path below retries and reports
            else:
                return None if row is None else self._reuse.kv(row)
        return await self._read(functools.partial(self._get_row, key=key), checkpointed=True)

    def _get_row(self, cur: sqlite3.Cursor, key: str) -> KeyValue | None:
        row = cur.execute(_GET, (key,)).fetchone()
        return None if row is None else self._reuse.kv(row)

    async def range(self, prefix: str) -> list[KeyValue]:
        return await self._read(functools.partial(_range, prefix=prefix))

    async def revision(self) -> int:
        revision, _ = await self._read(_meta)
        return revision

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        self._key_check(key)
        value = bytes(value)

        def job(tx: _Tx) -> int:
            if lease is not None:
                _check_lease(tx.cur, lease)
            _put(tx.cur, tx.revision + 1, 0, key, value, lease)
            tx.revision += 1
            return tx.revision

        return await self._write(job)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        def job(tx: _Tx) -> int:
            (deleted,) = _apply(tx, [Delete(key, prefix)])
            assert isinstance(deleted, int)
            return deleted

        return await self._write(job)

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        if len(on_success) == 1 and type(on_success[0]) is Put:
            self._key_check(on_success[0].key)  # a lone put: nothing to conflict with
        else:
            check_txn_branch(on_success, self._key_check)
        if on_failure:
            check_txn_branch(on_failure, self._key_check)
        compares = tuple(compares)
        success, failure = tuple(on_success), tuple(on_failure)

        def job(tx: _Tx) -> TxnResult:
            execute = tx.cur.execute
            known: dict[str, tuple[int, int, int] | None] = {}
            succeeded = True
            for compare in compares:  # every key is read: a Put reuses what was read
                if compare.target is CompareTarget.VALUE:
                    # Not through _Reuse: a guarded write changes the row it
                    # compared, so remembering it would only churn the cache.
                    row = execute(_GET, (compare.key,)).fetchone()
                    known[compare.key] = None if row is None else (row[2], row[3], row[4])
                    succeeded = succeeded and compare_holds(
                        compare, None if row is None else KeyValue(*row)
                    )
                else:  # a guard on revisions or version reads neither key nor value
                    stamps = known[compare.key] = execute(_STAMPS, (compare.key,)).fetchone()
                    succeeded = succeeded and stamp_compare_holds(compare, stamps)
            responses = _apply(tx, success if succeeded else failure, known)
            return TxnResult(succeeded, tx.revision, tuple(responses))

        return await self._write(job)

    # ------------------------------------------------------------------ leases

    async def grant(self, ttl: float) -> Lease:
        """Grant a lease; a TTL under PROBE_WINDOW (50 ms) is raised to it, as etcd
        raises TTLs to its minimum. ``Lease.ttl`` is the TTL granted."""
        if not ttl > 0 or not math.isfinite(ttl):
            raise ValueError(f"a lease TTL must be a finite number of seconds > 0, got {ttl}")
        ttl = max(float(ttl), PROBE_WINDOW)

        def job(tx: _Tx) -> Lease:
            cursor = tx.cur.execute(
                "INSERT INTO leases (ttl, expires) VALUES (?, ?)", (ttl, tx.now + ttl)
            )
            assert cursor.lastrowid is not None
            return Lease(cursor.lastrowid, ttl)

        return await self._write(job)

    async def keepalive(self, lease_id: int) -> float:
        def job(tx: _Tx) -> float:
            row = tx.cur.execute("SELECT ttl FROM leases WHERE id = ?", (lease_id,)).fetchone()
            if row is None:
                raise LeaseNotFound(lease_id)
            ttl: float = row[0]
            tx.cur.execute("UPDATE leases SET expires = ? WHERE id = ?", (tx.now + ttl, lease_id))
            return ttl

        return await self._write(job)

    async def revoke(self, lease_id: int) -> None:
        await self._write(lambda tx: _end_lease(tx, lease_id))

    # ------------------------------------------------------------------ watch

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        revision, compacted = await self._read(_meta)
        start = revision + 1 if start_revision is None else max(1, start_revision)
        if start <= compacted:
            raise RevisionCompacted(start, compacted)
        stream = self._stream(prefix, start)
        try:
            yield stream
        finally:
            await stream.aclose()

    async def _stream(self, prefix: str, next_revision: int) -> AsyncGenerator[WatchEvent, None]:
        while True:
            events, next_revision = await self._read(
                functools.partial(_changes_since, prefix=prefix, next_revision=next_revision)
            )
            if events:
                for event in events:
                    yield event
                continue
            with trio.move_on_after(self._poll_interval):
                await self._changed.park()

    # ------------------------------------------------------------------ sweeping

    async def sweep(self) -> None:
        """Expire every lease whose time has come (reads and writes do this too)."""
        await self._read(_meta)

    async def run_sweeper(self, interval: float = DEFAULT_SWEEP_INTERVAL) -> None:
        """Sweep every ``interval`` seconds until cancelled, so a lease held by a
        process that died disappears (with its DELETE events) even when this
        process neither reads nor watches. :func:`open_registry` runs one."""
        while True:
            await trio.sleep(interval)
            try:
                await self.sweep()
                await self.keep_reserve()
            except trio.ClosedResourceError:
                return
            except RegistryReplaced:  # fatal, logged once; guard_file stops the owner
                return
            except Exception:  # housekeeping: log, and let the next sweep retry
                _log.warning("registry sweep of %s failed", self._path, exc_info=True)

    async def keep_reserve(self) -> None:
        """Make ``<file>.reserve`` again when it is gone and twice its size is free
        (the sweeper calls this every second; a stat and a statvfs when it is there)."""
        reserve = self._reserve
        if reserve is None or not reserve.wanted():
            await trio.lowlevel.checkpoint()
            return
        if await trio.to_thread.run_sync(reserve.make):
            _log.info(
                "registry %s: the %d-byte reserve %s is in place again",
                self._path,
                reserve.size,
                reserve.path,
            )

    async def _make_room(self, exc: sqlite3.Error) -> None:
        """A write found the disk full: give up the reserve (saying so in one line)
        and checkpoint, so that the write, tried again, has room: the freed space,
        or the WAL's own, which a checkpoint lets the next write reuse."""
        reserve = self._reserve
        freed = 0 if reserve is None else await trio.to_thread.run_sync(reserve.release)
        if reserve is not None and freed:
            _log.warning(
                "registry %s: the disk is full (%s); released the %d-byte reserve %s so "
                "the registry's own writes go through: free space on that file system (the "
                "reserve is made again once %d bytes are free)",
                self._path,
                exc,
                freed,
                reserve.path,
                2 * reserve.size,
            )
        while self._checkpoint_done is not None:
            await self._checkpoint_done.wait()
        with trio.CancelScope(shield=True):
            await self._checkpoint()

    async def guard_file(self, interval: float = DEFAULT_GUARD_INTERVAL) -> NoReturn:
        """Check every ``interval`` seconds that the file at :attr:`path` is still
        the one this registry opened; run it beside whatever uses the registry, so
        a deleted or replaced file stops that work even when nothing else touches
        the registry.

        Raises:
            RegistryReplaced: once the file is deleted or replaced (at once, if an
                operation of this registry already found so).
            trio.ClosedResourceError: this registry was closed.
        """
        while True:
            self._check_open()
            self._check_file()
            await trio.sleep(interval)

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._direct_until = -math.inf
        self._changed.unpark_all()
        connections = [self._conn] if self._write_conn is None else [self._conn, self._write_conn]

        def close() -> None:
            for conn in connections:
                conn.close()

        # Shielded, so a cancelled close still closes. Closing the last connection
        # to the file checkpoints the WAL, which syncs: that runs in a thread.
        with trio.CancelScope(shield=True):
            async with self._write_lock:  # let an in-flight threaded commit finish
                await trio.to_thread.run_sync(close)

    # ------------------------------------------------------------------ internals

    def _when(self) -> _When:
        """The lease clock now, and whether the cached probe says no lease is due
        (then a write skips probing for one: exact for the reason _read gives)."""
        now = self._clock()
        return _When(now, now < self._direct_until, self._history)

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this SQLiteRegistry is closed")
        if self._lost is not None:
            raise RegistryReplaced(self._path, deleted=self._lost)

    def _check_file(self) -> None:
        """Raise RegistryReplaced (from now on) unless the file at the path is the
        one opened. A stat: about a microsecond."""
        if self._lost is None:
            found = _file_identity(self._path)
            if found == self._identity:
                return
            self._lost = found is None
            self._probe_valid_until = self._direct_until = -math.inf  # no more fast reads
            _log.error("%s", RegistryReplaced(self._path, deleted=self._lost))
        raise RegistryReplaced(self._path, deleted=self._lost)

    async def _pass_checkpoint(self) -> None:
        """Reads and on-loop commits finish without waiting for anything, so they
        are cancel points always but schedule points only every 16th call: a full
        checkpoint would cost as much as the read itself."""
        self._ops += 1
        if self._ops % _SCHEDULE_EVERY:
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            await trio.lowlevel.checkpoint()

    async def _read(self, read: Callable[[sqlite3.Cursor], T], *, checkpointed: bool = False) -> T:
        """Run a read on the loop (WAL readers never wait for the disk), first
        expiring leases whose time has come.

        Probing for a due lease costs a statement, so its answer (the earliest
        expiry) is reused for PROBE_WINDOW seconds of the lease clock. That is
        exact because no lease is shorter than the window: a lease granted after
        the probe, here or in another process, cannot fall due within it, and a
        keepalive only moves an expiry later.
        """
        if not checkpointed:
            await self._pass_checkpoint()
        patience: _Patience | None = None
        while True:
            self._check_open()
            try:
                now = self._clock()
                if now >= self._probe_valid_until or now >= self._earliest_expiry:
                    self._check_file()
                    earliest = self._cursor.execute(_EARLIEST_EXPIRY).fetchone()[0]
                    self._earliest_expiry = math.inf if earliest is None else float(earliest)
                    self._probe_valid_until = now + PROBE_WINDOW
                    self._direct_until = min(self._probe_valid_until, self._earliest_expiry)
                if now < self._earliest_expiry:
                    return read(self._cursor)
            except sqlite3.Error as exc:
                # WAL readers wait only while another process recovers the WAL
                # index or (a fresh file) switches it to WAL.
                patience = patience or _Patience(self._busy_timeout)
                if not await patience.wait(exc):
                    raise _unavailable(self._path, exc) from exc
                continue
            await self._write(_nothing)  # every write expires due leases first
            self._probe_valid_until = self._direct_until = -math.inf

    async def _write(self, job: Callable[[_Tx], T]) -> T:
        if self._closed or self._lost is not None:
            self._check_open()
        if _file_identity(self._path) != self._identity:
            self._check_file()  # raises RegistryReplaced
        if self._write_conn is not None:
            return await self._write_in_thread(job)
        self._ops += 1
        if self._gather is None and not self._grouping and self._ops % _SCHEDULE_EVERY:
            # The common case: nobody else is writing; commit at once.
            await _cancel_point()
            while self._checkpoint_done is not None:
                await self._checkpoint_done.wait()
            if not self._closed and self._lost is None:
                try:  # _on_loop's first attempt, without its coroutine
                    value = _run_one(self._cursor, job, self._when())
                except sqlite3.Error:
                    pass  # busy or failing: _on_loop retries, waits, and reports
                else:
                    if self._committed():
                        with trio.CancelScope(shield=True):
                            await self._checkpoint()
                    return value
            return await self._on_loop(_run_one, job)
        return await self._write_grouped(job)

    async def _write_grouped(self, job: Callable[[_Tx], T]) -> T:
        """Group commit on the loop. The first writer yields once so the writers
        runnable right now can join its batch, then commits them all in one
        transaction (a savepoint and a revision each). Grouping stays on while
        batches hold more than one write, and is tried every 16th write."""
        await trio.lowlevel.checkpoint_if_cancelled()
        slot: _Slot[T] = _Slot(job)
        if self._gather is not None:  # someone is gathering: join the batch
            joined = self._gather
            joined.append(slot)
            try:
                await slot.finished.wait()
            except BaseException:
                if not slot.taken:
                    # By now another batch may be gathering: leave the one joined.
                    if slot in joined:
                        joined.remove(slot)
                    raise
                with trio.CancelScope(shield=True):  # in flight: see it out
                    await slot.finished.wait()
                raise
            return slot.result()
        batch = self._gather = [slot]
        try:
            # A schedule point but no cancel point (that was above): the writers
            # runnable now join this batch meanwhile.
            await trio.lowlevel.cancel_shielded_checkpoint()
            if len(batch) == 1 and self._checkpoint_done is None:
                # Alone after all: commit as the common case does, no shield (no
                # other write is at stake) and no savepoint.
                self._gather = None
                slot.taken = True
                try:
                    slot.value = await self._on_loop(_run_one, job)
                except Exception as exc:  # unavailable or closed
                    slot.error = exc
            else:
                with trio.CancelScope(shield=True):  # other writes ride on this one
                    while self._checkpoint_done is not None:
                        await self._checkpoint_done.wait()
                    self._gather = None
                    for queued in batch:
                        queued.taken = True
                    try:
                        if len(batch) == 1:
                            slot.value = await self._on_loop(_run_one, job)
                        else:
                            await self._on_loop(_run_batch, batch)
                    except Exception as exc:  # unavailable or closed: the batch failed
                        for queued in batch:
                            queued.error = exc
        finally:
            # While this batch committed, a later writer may have started gathering
            # the next one: that batch is not ours to close.
            if self._gather is batch:
                self._gather = None
            for queued in batch:
                queued.done = True
                queued.finished.set()
        self._grouping = len(batch) > 1
        return slot.result()

    async def _write_in_thread(self, job: Callable[[_Tx], T]) -> T:
        slot: _Slot[T] = _Slot(job)
        self._queue.append(slot)
        try:
            async with self._write_lock:
                if not slot.taken:
                    batch, self._queue = self._queue, []
                    for queued in batch:
                        queued.taken = True
                    await self._commit_in_thread(batch)
        except BaseException:
            if not slot.taken:
                self._queue.remove(slot)
                raise
            if not slot.done:  # our write is in flight under another task: see it out
                with trio.CancelScope(shield=True):
                    await slot.finished.wait()
            raise
        if not slot.done:
            await slot.finished.wait()
        return slot.result()

    async def _on_loop(self, transaction: Callable[[sqlite3.Cursor, W, _When], T], work: W) -> T:
        """Run ``transaction(cursor, work, when)`` on the loop's connection,
        retrying while another process holds the write lock (up to busy_timeout).
        Once it has committed, nothing here is a cancel point: a write that
        raises Cancelled did not happen."""
        patience: _Patience | None = None
        made_room = False
        while True:
            self._check_open()
            try:
                value = transaction(self._cursor, work, self._when())
                break
            except sqlite3.Error as exc:
                if _is_full(exc) and not made_room:
                    made_room = True
                    await self._make_room(exc)
                    continue
                patience = patience or _Patience(self._busy_timeout)
                if not await patience.wait(exc):  # another process holds the write lock
                    raise _unavailable(self._path, exc) from exc
        if self._committed():
            with trio.CancelScope(shield=True):
                await self._checkpoint()
        return value

    def _committed(self) -> bool:
        """After a commit on the loop: wake this process's watchers; True when a
        checkpoint is due (the caller runs it, shielded)."""
        if self._changed:  # a watcher is parked (an empty unpark_all costs 5% of a write)
            self._changed.unpark_all()
        self._commits_since_checkpoint += 1
        return (
            self._commits_since_checkpoint >= self._checkpoint_every
            and self._checkpoint_done is None
        )

    async def _commit_in_thread(self, batch: list[_Slot[Any]]) -> None:
        """Commit ``batch`` on the syncing connection in a worker thread, retrying
        while another process holds the write lock. Every slot is finished however
        this ends; a batch holding other tasks' writes is seen through even if this
        task is cancelled (a lone write may be cancelled before it starts)."""
        cur = self._write_cursor
        assert cur is not None
        patience = _Patience(self._busy_timeout, started=trio.current_time())
        made_room = False
        try:
            with trio.CancelScope(shield=len(batch) > 1):
                while True:
                    try:
                        await trio.to_thread.run_sync(_run_batch, cur, batch, self._when())
                        break
                    except sqlite3.Error as exc:
                        if _is_full(exc) and not made_room:
                            made_room = True
                            await self._make_room(exc)
                            continue
                        # SQLite's busy handler waited already; this catches what it
                        # does not cover.
                        if not await patience.wait(exc):
                            error = _unavailable(self._path, exc)
                            for slot in batch:
                                slot.error = error
                            break
        except Exception as exc:  # a bug: fail the batch rather than strand it
            for slot in batch:
                slot.error = exc
        finally:
            for slot in batch:
                slot.done = True
                slot.finished.set()
            if self._changed:
                self._changed.unpark_all()

    async def _checkpoint(self) -> None:
        """Move the WAL into the database file in a worker thread: this is where
        the disk syncs in NORMAL mode. Writes on the loop wait for it: a checkpoint
        racing a stream of commits never catches up, and the WAL only grows."""
        done = self._checkpoint_done = trio.Event()
        self._commits_since_checkpoint = 0
        path, sync, identity = self._path, self._synchronous, self._identity

        def checkpoint() -> None:
            if _file_identity(path) != identity:
                return  # connecting would create (or open) a file that is not ours
            opened: list[sqlite3.Connection] = []
            try:
                _connect(path, sync, self._busy_timeout, opened).execute(
                    "PRAGMA wal_checkpoint(PASSIVE)"
                )
            finally:
                for conn in opened:
                    conn.close()

        try:
            await trio.to_thread.run_sync(checkpoint)
        except sqlite3.Error:
            pass  # a checkpoint is housekeeping; the next one retries
        finally:
            self._checkpoint_done = None
            done.set()


# ---------------------------------------------------------------------- SQL


def _connect(
    path: str, synchronous: str, busy_timeout: float, opened: list[sqlite3.Connection]
) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    opened.append(conn)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA journal_size_limit=67108864")
    return conn


_RETRIED: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_PROTOCOL})


def _is_busy(exc: sqlite3.Error) -> bool:
    """Another process holds a lock (SQLITE_BUSY and its extended codes: RECOVERY,
    SNAPSHOT, TIMEOUT), or WAL readers raced past SQLite's own retries (PROTOCOL)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "locked" in str(exc)
    return code & 0xFF in _RETRIED


class _Patience:
    """Waits out a busy database: sleeps 1 ms, doubling up to 50 ms, until
    ``timeout`` seconds have passed since ``started`` (default: the first refusal)."""

    __slots__ = ("_deadline", "_delay", "_timeout")

    def __init__(self, timeout: float, started: float | None = None) -> None:
        self._timeout = timeout
        self._delay = 0.001
        self._deadline = None if started is None else started + timeout

    async def wait(self, exc: sqlite3.Error) -> bool:
        """Sleep before the next try; False (no sleep) when ``exc`` is not a busy
        database or the time is up."""
        if not _is_busy(exc):
            return False
        now = trio.current_time()
        if self._deadline is None:
            self._deadline = now + self._timeout
        if now >= self._deadline:
            return False
        await trio.sleep(min(self._delay, self._deadline - now))
        self._delay = min(self._delay * 2, 0.05)
        return True


def _is_full(exc: sqlite3.Error) -> bool:
    """The write needed space the file system does not have (SQLITE_FULL)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "disk is full" in str(exc)
    return int(code) & 0xFF == sqlite3.SQLITE_FULL


def _unavailable(path: str, exc: sqlite3.Error) -> RegistryUnavailable:
    if _is_full(exc):
        return RegistryUnavailable(
            f"SQLite registry {path} failed: {exc}; the file system holding it is full "
            f"and the registry's reserve ({path}{RESERVE_SUFFIX}) is used up: free space there"
        )
    return RegistryUnavailable(
        f"SQLite registry {path} failed: {exc}; if another process holds the write lock "
        "for long, find it; otherwise check the disk"
    )


def _meta(cur: sqlite3.Cursor) -> tuple[int, int]:
    revision, compacted = cur.execute(_META).fetchone()
    return revision, compacted


def _get(cur: sqlite3.Cursor, key: str) -> KeyValue | None:
    row = cur.execute(_GET, (key,)).fetchone()
    return None if row is None else KeyValue(*row)


def _range(cur: sqlite3.Cursor, prefix: str) -> list[KeyValue]:
    low, high = _prefix_bounds(prefix)
    if high is None:
        rows = cur.execute(
            f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? ORDER BY key", (low,)
        ).fetchall()
    else:
        rows = cur.execute(
            f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? AND key < ? ORDER BY key", (low, high)
        ).fetchall()
    return [_kv(row) for row in rows]


def _changes_since(
    cur: sqlite3.Cursor, *, prefix: str, next_revision: int
) -> tuple[list[WatchEvent], int]:
    """Events under ``prefix`` from ``next_revision`` on, and the revision to ask
    for next. One read transaction, so another process's compaction cannot remove
    rows between reading the revision and reading the rows."""
    cur.execute("BEGIN")
    try:
        return _changes_in_snapshot(cur, prefix=prefix, next_revision=next_revision)
    finally:
        cur.execute("COMMIT")


def _changes_in_snapshot(
    cur: sqlite3.Cursor, *, prefix: str, next_revision: int
) -> tuple[list[WatchEvent], int]:
    revision, compacted = _meta(cur)
    if next_revision <= compacted:
        raise RevisionCompacted(next_revision, compacted)
    if revision < next_revision:
        return [], next_revision
    low, high = _prefix_bounds(prefix)
    rows = cur.execute(
        "SELECT revision, deleted, key, value, create_revision, version, lease FROM changes "
        "WHERE revision >= ? AND revision <= ? AND key >= ? AND (? IS NULL OR key < ?) "
        "ORDER BY revision, seq",
        (next_revision, min(revision, next_revision + _WATCH_BATCH - 1), low, high, high),
    ).fetchall()
    events = [
        WatchEvent(
            EventType.DELETE if deleted else EventType.PUT,
            KeyValue(key, bytes(value), create, rev, version, lease),
        )
        for rev, deleted, key, value, create, version, lease in rows
    ]
    return events, min(revision, next_revision + _WATCH_BATCH - 1) + 1


def _rebase_leases(conn: sqlite3.Connection, epoch: str, now: float) -> None:
    """Inside the opening transaction: when the stored expiry times were taken on
    another run of the lease clock (another boot, or wall-clock times from before
    the host clock), renew every lease for its full TTL from ``now``."""
    row = conn.execute("SELECT value FROM info WHERE name = 'lease_epoch'").fetchone()
    if row is not None and row[0] == epoch:
        return
    conn.execute("UPDATE leases SET expires = ? + ttl", (now,))
    conn.execute("INSERT OR REPLACE INTO info (name, value) VALUES ('lease_epoch', ?)", (epoch,))


def _begin(cur: sqlite3.Cursor, when: _When) -> _Tx:
    """Open a write transaction and expire the leases whose time has come (none
    when ``when.none_due``: the caller knows no lease is due yet)."""
    now = when.now
    cur.execute("BEGIN IMMEDIATE")
    if when.none_due:
        revision, compacted = cur.execute(_META).fetchone()
        earliest = None
    else:
        revision, compacted, earliest = cur.execute(_META_PROBED).fetchone()
    tx = _Tx(cur, now, revision, compacted, revision)
    if earliest is not None and earliest <= now:
        for (lease_id,) in cur.execute(
            "SELECT id FROM leases WHERE expires <= ? ORDER BY expires, id", (now,)
        ).fetchall():
            _end_lease(tx, lease_id)
    return tx


def _finish(tx: _Tx, history: int) -> None:
    """Record the new revision, compact old history now and then, and commit."""
    cur = tx.cur
    if tx.revision != tx.start_revision:
        floor = tx.revision - history
        if floor > tx.compacted and (floor - tx.compacted >= max(1, history // 10)):
            cur.execute("DELETE FROM changes WHERE revision <= ?", (floor,))
            tx.compacted = floor
        cur.execute("UPDATE meta SET revision = ?, compacted = ?", (tx.revision, tx.compacted))
    cur.execute("COMMIT")


def _run_one(cur: sqlite3.Cursor, job: Callable[[_Tx], T], when: _When) -> T:
    """One write in one transaction; if it raises, nothing of it stays."""
    tx = _begin(cur, when)
    try:
        value = job(tx)
        _finish(tx, when.history)
    except BaseException:
        if cur.connection.in_transaction:
            cur.execute("ROLLBACK")
        raise
    return value


def _run_batch(cur: sqlite3.Cursor, batch: list[_Slot[Any]], when: _When) -> None:
    """A group commit: each write in its own savepoint (one that raises leaves no
    trace and fails alone), all in one transaction."""
    tx = _begin(cur, when)
    try:
        for slot in batch:
            cur.execute("SAVEPOINT job")
            before = tx.revision
            slot.error = None  # a retried batch starts afresh
            try:
                slot.value = slot.job(tx)
            except (RegistryError, ValueError, TypeError) as exc:
                cur.execute("ROLLBACK TO job")
                tx.revision = before
                slot.error = exc
            cur.execute("RELEASE job")
        _finish(tx, when.history)
    except BaseException:
        if cur.connection.in_transaction:
            cur.execute("ROLLBACK")
        raise


def _end_lease(tx: _Tx, lease_id: int) -> None:
    cur = tx.cur
    if cur.execute("DELETE FROM leases WHERE id = ?", (lease_id,)).rowcount == 0:
        return
    keys = [
        row[0]
        for row in cur.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease_id,))
    ]
    if keys:
        _apply(tx, [Delete(key) for key in keys])


def _apply(
    tx: _Tx, ops: Sequence[TxnOp], known: dict[str, tuple[int, int, int] | None] | None = None
) -> list[list[KeyValue] | int | None]:
    """Run ``ops`` as one revision (bumped only when something changed).

    ``known`` holds the stamps (create revision, mod revision, version) of the
    keys read by the txn's compares; a Put reuses them instead of
    reading the key again (a branch writes each key at most once, so they are
    still current when the Put runs). An op that raises (a lease that does not
    exist) raises out of the transaction, which the caller rolls back whole."""
    cur = tx.cur
    revision = tx.revision + 1
    seq = 0
    responses: list[list[KeyValue] | int | None] = []
    for op in ops:
        if isinstance(op, Put):
            if op.lease is not None:
                _check_lease(cur, op.lease)
            previous = known.get(op.key, _UNKNOWN) if known else _UNKNOWN
            _put(cur, revision, seq, op.key, bytes(op.value), op.lease, previous)
            seq += 1
            responses.append(None)
        elif isinstance(op, Get):
            responses.append(_range(cur, op.key) if op.prefix else _listed(_get(cur, op.key)))
        else:
            matching = _range(cur, op.key) if op.prefix else _listed(_get(cur, op.key))
            gone = [kv.key for kv in matching]
            for key in gone:
                cur.execute("DELETE FROM kv WHERE key = ?", (key,))
                cur.execute(
                    "INSERT INTO changes (revision, seq, deleted, key, value, create_revision, "
                    "version, lease) VALUES (?, ?, 1, ?, x'', 0, 0, NULL)",
                    (revision, seq, key),
                )
                seq += 1
            responses.append(len(gone))
    if seq:
        tx.revision = revision
    return responses


def _check_lease(cur: sqlite3.Cursor, lease_id: int) -> None:
    if cur.execute("SELECT 1 FROM leases WHERE id = ?", (lease_id,)).fetchone() is None:
        raise LeaseNotFound(lease_id)


class _Unknown:
    """A key's previous state has not been read yet."""


_UNKNOWN: Final = _Unknown()


def _put(
    cur: sqlite3.Cursor,
    revision: int,
    seq: int,
    key: str,
    value: bytes,
    lease: int | None,
    previous: tuple[int, int, int] | _Unknown | None = _UNKNOWN,
) -> None:
    if isinstance(previous, _Unknown):
        row = cur.execute(
            "SELECT create_revision, version FROM kv WHERE key = ?", (key,)
        ).fetchone()
    else:
        row = None if previous is None else (previous[0], previous[2])
    # The key's state is known here, so an UPDATE or a plain INSERT does, and the
    # common lease-less write spells NULL out (SQLite then skips the lease index).
    if row is None:
        create, version = revision, 1
        cur.execute(_INSERT_KV, (key, value, create, revision, version, lease))
    else:
        create, version = row[0], row[1] + 1
        if lease is None:
            cur.execute(_UPDATE_KV_NO_LEASE, (value, revision, version, key))
        else:
            cur.execute(_UPDATE_KV, (value, revision, version, lease, key))
    if lease is None:
        cur.execute(_INSERT_CHANGE_NO_LEASE, (revision, seq, key, value, create, version))
    else:
        cur.execute(_INSERT_CHANGE, (revision, seq, key, value, create, version, lease))


_INSERT_KV: Final = (
    "INSERT INTO kv (key, value, create_revision, mod_revision, version, lease) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_UPDATE_KV: Final = (
    "UPDATE kv SET value = ?, mod_revision = ?, version = ?, lease = ? WHERE key = ?"
)
_UPDATE_KV_NO_LEASE: Final = (
    "UPDATE kv SET value = ?, mod_revision = ?, version = ?, lease = NULL WHERE key = ?"
)
_INSERT_CHANGE: Final = (
    "INSERT INTO changes (revision, seq, deleted, key, value, create_revision, version, lease) "
    "VALUES (?, ?, 0, ?, ?, ?, ?, ?)"
)
_INSERT_CHANGE_NO_LEASE: Final = (
    "INSERT INTO changes (revision, seq, deleted, key, value, create_revision, version, lease) "
    "VALUES (?, ?, 0, ?, ?, ?, ?, NULL)"
)


def _nothing(tx: _Tx) -> None:
    """A write that only expires due leases (as every write does first)."""


def _listed(kv: KeyValue | None) -> list[KeyValue]:
    return [] if kv is None else [kv]
