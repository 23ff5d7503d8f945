"""The Reconciler actor: gathers a pass's inputs, plans (pure), asks its siblings to act,
publishes what this node serves."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from corral._errors import CorralError
from corral.actors.port_allocator import EnsurePair, ReleasePorts
from corral.actors.process_supervisor import (
    AppPaths,
    ForgetProcess,
    ListProcesses,
    ProcessesChanged,
    ProcessGeneration,
    StartProcess,
    StopProcess,
)
from corral.actors.reconciler._backoff import (
    DEFAULT_BASE,
    DEFAULT_CAP,
    FailedRevision,
    forget_settled,
    record_failure,
)
from corral.actors.reconciler._plan import (
    Action,
    BlockedStart,
    PassInputs,
    Remove,
    Replace,
    Start,
    Stop,
    app_views,
    plan_pass,
    process_views,
    serving_set,
    should_skip,
    with_serving,
)
from corral.registry import (
    APPS_PREFIX,
    PLACEMENT_PREFIX,
    AppRecord,
    Compare,
    DecodedRecords,
    Deployment,
    Get,
    InvalidName,
    KeyValue,
    NodeAssignment,
    NodeRecord,
    PlacementRecord,
    PortClaim,
    Put,
    Registry,
    RegistryError,
    RolloutOptions,
    ServingEntry,
    Undecodable,
    app_key,
    assign_key,
    node_key,
    node_ports_prefix,
    placement_key,
    read_records,
    validate_name,
)
from corral.supervision import Actor, ActorRef, SupervisionError, UnhandledMessage
from corral.supervision import sleep as wheel_sleep
from corral.transport import message

log = logging.getLogger("corral.actors.reconciler")

Materialize = Callable[[str, Deployment], Awaitable[Path]]
"""``materialize(app, deployment) -> revision directory``: gets the revision's files
onto disk (fetch, verify the digest, unpack) and returns where they are."""


@message("reconciler.kick")
@dataclass(frozen=True)
class Kick:
    """Run a pass soon (it still skips when nothing moved)."""

    reason: str = ""


@message("reconciler.tick")
@dataclass(frozen=True)
class Tick:
    """The pass timer (every ``interval`` seconds)."""


@message("reconciler.run_pass")
@dataclass(frozen=True)
class RunPass:
    """Run a pass now and reply with its summary (see :class:`PassSummary`). ``force``:
    a full pass even when nothing moved."""

    force: bool = False


@message("reconciler.withdraw")
@dataclass(frozen=True)
class Withdraw:
    """Take every instance this node serves out of the routing table, then wait for the
    requests in flight: publish each one not ready (and keep doing so until this actor
    stops), then sleep the longest ``drain_ms`` of the apps that were ready, at most
    ``max_drain`` seconds. Replies with the names of the apps withdrawn, once drained.

    The node sends it before it stops, so its apps are SIGTERMed only once no proxy
    sends them new requests.
    """

    max_drain: float = 5.0


@message("reconciler.last_pass")
@dataclass(frozen=True)
class LastPass:
    """Reply with the summary of the last pass (a dict), or None before the first."""


@dataclass(slots=True)
class PassSummary:
    """What one pass did: when (wall time), at which change token, whether it skipped,
    the actions taken (each with ``ok`` and, on failure, ``error``; a start held back
    by the unpack backoff has ``deferred``), other errors, and the revisions this node
    failed to get onto disk (``failed``: app, revision, reason, attempts, retry_in)."""

    time: float
    token: int | None
    skipped: bool
    reasons: list[str] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duration: float = 0.0
    serving: int = 0
    published: bool = False
    failed: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "token": self.token,
            "skipped": self.skipped,
            "acted": bool(self.actions),
            "reasons": list(self.reasons),
            "actions": [dict(a) for a in self.actions],
            "errors": list(self.errors),
            "duration": self.duration,
            "serving": self.serving,
            "published": self.published,
            "failed": [dict(f) for f in self.failed],
        }


_MAX_REASONS = 8


async def remove_tree(root: Path, *, batch: int = 200) -> None:
    """Delete ``root`` and everything under it (a missing ``root`` is fine), yielding
    to other tasks every ``batch`` entries: an unpacked revision can hold many files,
    and the node's loop must not stall while they go (and no thread is involved).

    Raises:
        OSError: an entry could not be removed.
    """
    for _ in _remove_in_batches(root, batch):
        await trio.lowlevel.checkpoint()


def _remove_in_batches(root: Path, batch: int) -> Iterator[None]:
    if not os.path.lexists(root):
        return
    if os.path.islink(root) or not os.path.isdir(root):
        os.unlink(root)
        return
    done = 0
    for directory, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(directory, name))
        for name in dirnames:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                os.rmdir(path)
        done += len(filenames) + len(dirnames)
        if done >= batch:
            done = 0
            yield
    os.rmdir(root)


#: Apps read again per transaction in a pass that reads only what changed (2 Gets each).
_READS_PER_TXN = 32


def _first(response: object) -> KeyValue | None:
    """The key a txn Get found, or None."""
    if isinstance(response, list) and response and isinstance(response[0], KeyValue):
        return response[0]
    return None


def _indexed_apps(record: object) -> dict[str, str] | None:
    """The apps this node's assignment index lists, each with its stamp ("" in an index
    written without stamps); None when it cannot be decoded. ``record``: the decoded
    index (None: there is none)."""
    if record is None:
        return {}
    if not isinstance(record, NodeAssignment):
        return None
    return {app: record.stamps.get(app, "") for app in record.apps}


class Reconciler(Actor):
    """Makes this node run what the registry assigns it, and publishes what it serves.

    A pass runs every ``interval`` seconds, as soon as this node's assignment index
    (``assign/<node>``) changes, and when its process table changed. The index is the
    one key the node watches: the coordinator writes it, in the same fenced transaction,
    with every placement change the node acts on (an app placed on it or taken off it,
    the revision its rollout names for the node, the app's spec: see
    :meth:`~corral.registry.PlacementRecord.stamp_for`), so a write for other nodes
    delivers nothing here. A pass first reads the change token, the index's
    ``mod_revision``, together with this node's own record (in one transaction: the
    record is re-created without the serving set when its lease lapsed). With both as
    the last pass left them, the process table unchanged and no timer due, it stops
    there: one read, whatever else the cluster writes.

    Otherwise it reads only what concerns the node: the records of the apps whose stamp
    in the index changed, or that entered or left it, kept with those of every app the
    node serves or keeps state for from one pass to the next. A change costs O(changed
    apps). Every app that concerns the node (in its index, served, or with a working
    directory or port claims here) is read again by name, O(its apps) and never
    O(all apps): on its first pass, after the watch or a pass broke (changes may have
    been missed), and at least every ``full_pass_every`` seconds. That is also how the
    deletion of an app this node keeps state for but no longer serves (its directory
    and ports are removed then) reaches it, as no index moves for it. Every app and
    placement is read only when the index cannot be decoded, or a pass is forced.

    Args:
        node_id: this node's id.
        data_dir: the node's data directory (app working directories live under it).
        registry: the shared registry.
        materialize: gets a revision's files onto disk, returns its directory.
        interval: seconds between timer passes.
        full_pass_every: every app that concerns the node is read again at least this
            often, even when nothing moved.
        port_allocator, process_supervisor: the names of the sibling actors.
        wall_clock: wall time for pass summaries.
        ask_timeout: seconds to wait for a sibling's reply.
        debounce: seconds to gather more triggers before a pass starts.
        materialize_timeout: seconds one ``materialize`` call may take before the start
            is given up (and counted as a failure).
        materialize_backoff, materialize_backoff_cap: after a revision failed to get
            onto disk, its next try waits ``materialize_backoff`` seconds, doubled for
            each failure in a row up to the cap (see :mod:`._backoff`); meanwhile the
            instance is reported failed with the reason.
        instance: this node process's instance token; when set, the serving set is
            published only onto a node record that carries it, never onto one another
            process with the same node id holds.
        max_drain: the most seconds a ready instance is left out of the routing table
            before it is stopped (its app's ``drain_ms``, capped by this): the stop of
            an app no longer served here publishes it not ready first, so requests in
            flight finish and no new ones come before its process gets SIGTERM.
    """

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        registry: Registry,
        materialize: Materialize,
        interval: float = 5.0,
        full_pass_every: float = 60.0,
        port_allocator: str = "port_allocator",
        process_supervisor: str = "process_supervisor",
        wall_clock: Callable[[], float] = time.time,
        ask_timeout: float = 30.0,
        debounce: float = 0.05,
        materialize_timeout: float = 300.0,
        materialize_backoff: float = DEFAULT_BASE,
        materialize_backoff_cap: float = DEFAULT_CAP,
        instance: str | None = None,
        max_drain: float = 5.0,
    ) -> None:
        super().__init__()
        self._node_id = node_id
        self._instance = instance
        self._data_dir = Path(data_dir)
        self._registry = registry
        self._materialize = materialize
        self._interval = interval
        self._full_pass_every = full_pass_every
        self._names = (port_allocator, process_supervisor)
        self._wall = wall_clock
        self._ask_timeout = ask_timeout
        self._debounce = debounce
        self._materialize_timeout = materialize_timeout
        self._backoff = (materialize_backoff, materialize_backoff_cap)
        self._failed: dict[str, FailedRevision] = {}
        # Starts no port pair could be given for (published starting, with the reason).
        self._blocked: dict[str, BlockedStart] = {}
        self._wake = trio.Event()
        self._force = False
        self._reasons: list[str] = []
        self._waiters: list[trio.Event] = []
        self._last: PassSummary | None = None
        self._skipped_since = 0  # skipped passes since the last reconcile.pass event
        self._last_token: int | None = None
        self._last_generation: str | None = None
        self._retry_due = False
        self._next_full = -float("inf")
        self._assigned: set[str] = set()
        self._local: set[str] = set()
        # The apps this node holds port claims for, as the last full or periodic pass
        # read them.
        self._claimed: set[str] = set()
        # The index's stamps as the last pass read them (an app whose stamp moves since
        # is read again), and whether the watch broke (so changes may have been missed
        # and the next pass reads everything).
        self._stamps: dict[str, str] = {}
        self._rescan = False
        # The records of the apps this node serves or keeps state for, as last read.
        self._records: dict[str, AppRecord] = {}
        # The records read by name, each decoded once per version (the periodic refresh
        # reads every app that concerns the node again, and most have not moved), and
        # the apps of the assignment index at its mod_revision (see _indexed).
        self._decoded = DecodedRecords()
        self._index_apps: tuple[int, dict[str, str] | None] | None = None
        self._placed: dict[str, PlacementRecord] = {}
        self._unknown: set[str] = set()
        # The mod revision of this node's record as the last pass left it.
        self._own_revision = -1
        # Apps published not ready while they drain before a stop; every app, once
        # the node withdrew from routing on its way out.
        self._draining: set[str] = set()
        self._withdrawn = False
        self._max_drain = max_drain

    # ------------------------------------------------------------------ lifecycle

    async def started(self) -> None:
        parent = self.ctx.path.rsplit("/", 1)[0]
        ports, processes = self._names
        self._ports: ActorRef = self.ctx.system.ref(f"{parent}/{ports}")
        self._processes: ActorRef = self.ctx.system.ref(f"{parent}/{processes}")
        self._request("startup")
        self.ctx.start_task(self._pass_loop)
        self.ctx.start_task(self._watch)
        self.ctx.every(self._interval, Tick())

    async def handle(self, message: object) -> object:
        match message:
            case Tick():
                self._request("timer")
                return None
            case Kick():
                self._request(message.reason or "kick")
                return None
            case ProcessesChanged():
                self._request("process table changed")
                return None
            case RunPass():
                done = trio.Event()
                self._waiters.append(done)
                self._request("asked", force=message.force)
                await done.wait()
                assert self._last is not None
                return self._last.to_dict()
            case LastPass():
                return None if self._last is None else self._last.to_dict()
            case Withdraw():
                return await self._withdraw(None, message.max_drain)
        raise UnhandledMessage(message)

    def _request(self, reason: str, *, force: bool = False) -> None:
        if len(self._reasons) < _MAX_REASONS and reason not in self._reasons:
            self._reasons.append(reason)
        self._force = self._force or force
        self._wake.set()

    async def _pass_loop(self) -> None:
        while True:
            await self._wake.wait()
            if self._debounce > 0:
                await wheel_sleep(self._debounce)
            self._wake = trio.Event()
            force, self._force = self._force, False
            reasons, self._reasons = self._reasons, []
            waiters, self._waiters = self._waiters, []
            self._last = summary = await self._pass(force, reasons)
            # One event per pass that did work, with the skipped ones since (a skipped
            # pass is frequent and cheap: an event each would flood the log).
            if summary.skipped:
                self._skipped_since += 1
            else:
                self.ctx.emit(
                    "reconcile.pass",
                    duration=summary.duration,
                    skipped_since=self._skipped_since,
                    errors=len(summary.errors),
                )
                self._skipped_since = 0
            for waiter in waiters:
                waiter.set()

    # ------------------------------------------------------------------ watching

    async def _watch(self) -> None:
        # A prefix watch: also delivers ``assign/<node>-b`` and the like, which are
        # dropped here.
        key = assign_key(self._node_id)
        delay = 0.5
        while True:
            try:
                start = await self._registry.revision() + 1
                async with self._registry.watch(key, start) as events:
                    delay = 0.5
                    async for event in events:
                        if event.kv.key == key:
                            self._request(f"{key} changed")
            except RegistryError as exc:
                log.warning("watch on %s failed (%s); retrying in %gs", key, exc, delay)
                self._rescan = True
                await trio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # ------------------------------------------------------------------ one pass

    async def _pass(self, force: bool, reasons: list[str]) -> PassSummary:
        began, t0 = self._wall(), trio.current_time()
        summary = PassSummary(time=began, token=None, skipped=False, reasons=reasons)
        try:
            # One read: the assignment index, and this node's own record (re-created
            # after its lease lapsed, it no longer carries the serving set).
            heads = await self._registry.txn(
                [], [Get(assign_key(self._node_id)), Get(node_key(self._node_id))]
            )
            index, own = (_first(response) for response in heads.responses)
            token = 0 if index is None else index.mod_revision
            own_revision = 0 if own is None else own.mod_revision
            summary.token = token
            indexed = self._indexed(index)
            generation = await self._processes.ask(ProcessGeneration(), self._ask_timeout)
            now = trio.current_time()
            # The index lists what the coordinator assigns this node: only an index that
            # cannot be decoded (or an operator's forced pass) has the node read every app.
            read_all = force or indexed is None
            # Every app that concerns the node, read again by name: periodically, on a
            # node's first pass, and after a watch or a pass broke (changes may have
            # been missed).
            refresh = now >= self._next_full or self._rescan or self._last_token is None
            timer_due = (
                read_all
                or refresh
                or self._retry_due
                or own_revision != self._own_revision
                or any(f.retry_at <= now for f in self._failed.values())
            )
            if should_skip(
                token=token,
                last_token=self._last_token,
                generation=str(generation),
                last_generation=self._last_generation,
                timer_due=timer_due,
            ):
                summary.skipped = True
                return summary
            indexed = indexed or {}
            self._rescan = False
            if read_all or refresh:
                # Only this node's port allocator claims ports, for apps a pass starts
                # (in the process table from then on): read again with the rest, for
                # the claims a previous life of the node left.
                await self._read_claims()
            local = self._local_state() | self._claimed
            if read_all:
                await self._read_everything()
            else:
                stamps = self._stamps
                dirty = {app for app, stamp in indexed.items() if stamps.get(app) != stamp}
                if refresh:
                    dirty |= (
                        self._records.keys()
                        | self._placed.keys()
                        | self._unknown
                        | self._local
                        | local
                    )
                await self._read_changed(dirty, frozenset(indexed))
            if read_all or refresh:
                self._next_full = t0 + self._full_pass_every
            await self._full_pass(summary, own, local)
            self._stamps = indexed
            self._last_token, self._last_generation = token, str(generation)
        except (RegistryError, SupervisionError) as exc:
            self._rescan = True  # what the failed pass had to read is read again in full
            summary.errors.append(f"pass failed: {exc}")
            self.ctx.emit("reconcile.failed", app=None, action="pass", error=str(exc))
            log.warning("reconcile pass failed: %s", exc)
        finally:
            summary.duration = trio.current_time() - t0
            summary.failed = [
                self._failed[app].to_dict(trio.current_time()) for app in sorted(self._failed)
            ]
        self._retry_due = bool(summary.errors)
        return summary

    async def _read_everything(self) -> None:
        """Read every app and placement record (the full pass's inputs)."""
        apps, bad_apps = await read_records(self._registry, APPS_PREFIX)
        placements, bad_placements = await read_records(self._registry, PLACEMENT_PREFIX)
        self._records = {r.name: r for r in apps.values() if isinstance(r, AppRecord)}
        self._placed = {
            key.split("/", 1)[1]: r
            for key, r in placements.items()
            if isinstance(r, PlacementRecord)
        }
        self._unknown = {bad.key.split("/", 1)[1] for bad in (*bad_apps, *bad_placements)}
        self._decoded.clear()  # a full read starts again from what is there now

    async def _read_changed(self, dirty: set[str], indexed: frozenset[str]) -> None:
        """Read again only the ``dirty`` apps (their stamp in the index moved), and those
        that entered or left this node's assignment index since the records kept were
        read."""
        node = self._node_id
        kept = {app for app, placement in self._placed.items() if node in placement.nodes}
        names = sorted(dirty | (indexed ^ kept))
        # Two reads per app, in transactions well under etcd's 128 operations.
        for start in range(0, len(names), _READS_PER_TXN):
            chunk = names[start : start + _READS_PER_TXN]
            ops: list[Get] = []
            for name in chunk:
                ops += [Get(app_key(name)), Get(placement_key(name))]
            result = await self._registry.txn([], ops)
            for i, name in enumerate(chunk):
                self._update_cached(name, result.responses[2 * i], result.responses[2 * i + 1])

    def _indexed(self, index: KeyValue | None) -> dict[str, str] | None:
        """:func:`_indexed_apps` of the index read, once per version (every pass reads it,
        and it moves only when the coordinator changes what the node is assigned); the
        pass reads it, never alters it."""
        if index is None:
            return {}
        known = self._index_apps
        if known is None or known[0] != index.mod_revision:
            apps = _indexed_apps(self._decoded.decode(index))
            known = self._index_apps = (index.mod_revision, apps)
        return known[1]

    def _update_cached(self, name: str, app: object, placement: object) -> None:
        self._unknown.discard(name)
        self._records.pop(name, None)
        self._placed.pop(name, None)
        for kvs, key in ((app, app_key(name)), (placement, placement_key(name))):
            kv = kvs[0] if isinstance(kvs, list) and kvs else None
            if not isinstance(kv, KeyValue):
                self._decoded.forget(key)  # gone: what is kept stays bounded
                continue
            record = self._decoded.decode(kv)
            if isinstance(record, AppRecord):
                self._records[name] = record
            elif isinstance(record, PlacementRecord):
                self._placed[name] = record
            elif isinstance(record, Undecodable):
                self._unknown.add(name)

    async def _read_claims(self) -> None:
        """Read the apps this node holds port claims for (each claim decoded once per
        version: they seldom change, and are read again every ``full_pass_every``)."""
        claimed = set()
        for kv in await self._registry.range(node_ports_prefix(self._node_id)):
            claim = self._decoded.decode(kv)
            if isinstance(claim, PortClaim) and claim.node == self._node_id:
                claimed.add(claim.app)
        self._claimed = claimed

    async def _full_pass(self, summary: PassSummary, own: KeyValue | None, local: set[str]) -> None:
        """Plan and act on what the pass read; ``local``: the apps this node keeps state
        for (a working directory, port claims)."""
        rows = await self._processes.ask(ListProcesses(), self._ask_timeout)

        records = self._records
        by_app = self._placed
        unknown = set(self._unknown)
        processes = process_views(rows)
        running = {app: p.revision for app, p in processes.items() if p.phase == "live"}
        views = app_views(self._node_id, records.values(), by_app, running)
        wanted = {
            name: view.revision
            for name, view in views.items()
            if view.should_run and view.revision is not None
        }
        self._failed = forget_settled(self._failed, wanted)
        self._blocked = {
            app: start for app, start in self._blocked.items() if wanted.get(app) == start.revision
        }
        actions = plan_pass(
            PassInputs(
                apps=views,
                unknown=frozenset(unknown),
                processes=processes,
                local_state=frozenset(local),
            )
        )
        stopping = {action.app for action in actions if isinstance(action, Stop)}
        if stopping:
            await self._withdraw(stopping, self._max_drain, rows)
        for action in actions:
            outcome = action.to_dict()
            waiting = self._waiting(action)
            if waiting is not None:
                outcome.update(ok=False, deferred=True, error=waiting)
                summary.actions.append(outcome)
                continue
            error = await self._apply(action, records)
            outcome["ok"] = error is None
            if error is not None:
                outcome["error"] = error
                summary.errors.append(error)
                self.ctx.emit(
                    "reconcile.failed", app=action.app, action=outcome["action"], error=error
                )
            summary.actions.append(outcome)

        self._draining -= stopping  # stopped now: no longer in the serving set
        if summary.actions or stopping:  # the table as the actions left it
            rows = await self._processes.ask(ListProcesses(), self._ask_timeout)
        serving = serving_set(rows, self._failed.values(), self._blocked.values())
        summary.serving = len(serving)
        summary.published = await self._publish(serving, summary, own)
        self._assigned = {name for name, view in views.items() if view.assigned}
        self._local = local | {row["app"] for row in rows}
        # Keep only the records of apps that concern this node: the next pass that is
        # not a full one reads nothing else again.
        keep = self._assigned | self._local
        self._records = {name: r for name, r in records.items() if name in keep}
        self._placed = {name: p for name, p in by_app.items() if name in keep}

    def _local_state(self) -> set[str]:
        root = AppPaths.apps_root(self._data_dir)
        if not root.is_dir():
            return set()
        names = set()
        for entry in root.iterdir():
            try:
                names.add(validate_name("app", entry.name))
            except InvalidName:
                continue
        return names

    # ------------------------------------------------------------------ acting

    def _waiting(self, action: Action) -> str | None:
        """Why a start must wait out the unpack backoff, or None when it may go."""
        if not isinstance(action, Start | Replace):
            return None
        failure = self._failed.get(action.app)
        now = trio.current_time()
        if failure is None or not failure.waiting(action.revision, now):
            return None
        return (
            f"app {action.app}: revision {action.revision[:12]} failed to get onto disk "
            f"{failure.attempts} time(s) in a row ({failure.reason}); next try in "
            f"{failure.retry_at - now:.3g} s"
        )

    def _failed_to_materialize(
        self, app: str, revision: str, reason: str, *, starting: bool = False
    ) -> str:
        """Record the failure, schedule the retry; returns the pass error."""
        now = trio.current_time()
        base, cap = self._backoff
        failure = record_failure(
            self._failed.get(app),
            app,
            revision,
            reason,
            now,
            base=base,
            cap=cap,
            starting=starting,
        )
        self._failed[app] = failure
        delay = failure.retry_at - now
        self.ctx.after(delay, Kick(f"retry {app} revision {revision[:12]}"))
        self.ctx.emit(
            "reconcile.unpack_failed",
            app=app,
            revision=revision,
            reason=reason,
            attempts=failure.attempts,
            retry_in=delay,
        )
        return (
            f"app {app}: cannot get revision {revision[:12]} onto disk: {reason} "
            f"(attempt {failure.attempts}; next try in {delay:g} s)"
        )

    async def _apply(self, action: Action, records: Mapping[str, AppRecord]) -> str | None:
        app = action.app
        try:
            match action:
                case Start() | Replace():
                    # the current deployment, or the previous one mid-rollout
                    deployment = records[app].deployment_at(action.revision)
                    assert deployment is not None
                    return await self._start(action, deployment, records[app].memory_mb)
                case Stop():
                    log.info("stopping app %s: %s", app, action.reason)
                    await self._processes.ask(StopProcess(app, action.reason), self._ask_timeout)
                    self.ctx.emit("reconcile.stop", app=app, reason=action.reason)
                    return None
                case Remove():
                    return await self._remove(app)
        except SupervisionError as exc:
            return f"app {app}: {type(action).__name__.lower()} failed: {exc}"
        raise AssertionError(f"unknown action {action!r}")

    async def _start(
        self, action: Start | Replace, deployment: Deployment, memory_mb: int
    ) -> str | None:
        app = action.app
        try:
            with trio.fail_after(self._materialize_timeout):
                directory = await self._materialize(app, deployment)
        except trio.TooSlowError:
            return self._failed_to_materialize(
                app, action.revision, f"took longer than {self._materialize_timeout:g} s"
            )
        except Exception as exc:
            log.warning(
                "app %s: cannot materialize %s: %s",
                app,
                action.revision,
                exc,
                exc_info=not isinstance(exc, CorralError),  # a refusal needs no traceback
            )
            # An error marked ``unreachable`` (no holder gave a copy) may pass: the
            # instance is shown starting, with the reason, rather than failed.
            unreachable = getattr(exc, "unreachable", False) is True
            return self._failed_to_materialize(app, action.revision, str(exc), starting=unreachable)
        self._failed.pop(app, None)
        verify = isinstance(action, Start) and not action.after_stop
        reply = await self._ports.ask(EnsurePair(app, verify=verify), self._ask_timeout)
        if not reply.get("ok"):
            message = str(reply.get("message"))
            self.ctx.emit("placement.unavailable", app=app, node=self._node_id, message=message)
            # Published with the instance (ps shows it); the pass error has the next pass
            # try again.
            self._blocked[app] = BlockedStart(app, deployment.revision, message)
            return f"app {app}: {message}"
        self._blocked.pop(app, None)
        accepted = await self._processes.ask(
            StartProcess(
                app=app,
                revision=deployment.revision,
                command=tuple(deployment.command),
                cwd=str(directory),
                public_port=reply["public"],
                internal_port=reply["internal"],
                env=dict(deployment.env),
                health=deployment.health,
                memory_mb=memory_mb,
            ),
            self._ask_timeout,
        )
        if not accepted:
            return f"app {app}: the process supervisor is shutting down"
        kind = "restart" if isinstance(action, Replace) else "start"
        log.info(
            "%s app %s revision %s on ports %d/%d",
            kind,
            app,
            deployment.revision[:12],
            reply["public"],
            reply["internal"],
        )
        self.ctx.emit(
            f"reconcile.{kind}",
            app=app,
            revision=deployment.revision,
            public_port=reply["public"],
            internal_port=reply["internal"],
        )
        return None

    async def _remove(self, app: str) -> str | None:
        if not await self._processes.ask(ForgetProcess(app), self._ask_timeout):
            return None  # still stopping: a later pass removes it
        reply = await self._ports.ask(ReleasePorts(app), self._ask_timeout)
        if not reply.get("ok"):
            return f"app {app}: cannot release its ports: {reply.get('message')}"
        self._claimed.discard(app)
        root = AppPaths.of(self._data_dir, app).root
        try:
            await remove_tree(root)
        except OSError as exc:
            return f"app {app}: cannot remove its working directory {root}: {exc}"
        log.info("app %s was deleted: removed %s, released ports %s", app, root, reply["released"])
        self.ctx.emit("reconcile.remove", app=app, released=reply["released"])
        return None

    def _routed_out(self, serving: dict[str, ServingEntry]) -> dict[str, ServingEntry]:
        """``serving`` with every app withdrawn from routing published not ready."""
        if not self._withdrawn and not self._draining.intersection(serving):
            return serving
        return {
            app: dataclasses.replace(entry, ready=False)
            if self._withdrawn or app in self._draining
            else entry
            for app, entry in serving.items()
        }

    def _drain_of(self, app: str) -> float:
        record = self._records.get(app)
        # An app whose record is gone (deleted) drains for the default time.
        options = record.rollout if record is not None else RolloutOptions()
        return options.drain_ms / 1000

    async def _withdraw(
        self, apps: set[str] | None, max_drain: float, rows: list[Any] | None = None
    ) -> list[str]:
        """Publish ``apps`` (None: every app, from now on) not ready and wait the longest
        drain time of those that were ready, at most ``max_drain`` seconds; returns them.
        Nothing is waited for when none was ready, or the withdrawal was not published
        (no proxy routes to this node's record then either)."""
        if rows is None:
            rows = await self._processes.ask(ListProcesses(), self._ask_timeout)
        serving = serving_set(rows, self._failed.values(), self._blocked.values())
        # Ready as published: one already withdrawn has nothing left to drain.
        ready = sorted(
            app
            for app, entry in self._routed_out(serving).items()
            if entry.ready and (apps is None or app in apps)
        )
        if apps is None:
            self._withdrawn = True
        else:
            self._draining |= set(ready)
        if not ready:
            return []
        summary = PassSummary(time=self._wall(), token=None, skipped=False)
        if not await self._publish(serving, summary):
            log.info("not waiting to drain %s: %s", ", ".join(ready), "; ".join(summary.errors))
            return ready
        drain = max(0.0, min(max_drain, max(self._drain_of(app) for app in ready)))
        log.info("%s out of routing; %.1f s to drain before the stop", ", ".join(ready), drain)
        self.ctx.emit("reconcile.withdrawn", apps=ready, drain=drain, everything=apps is None)
        await trio.sleep(drain)
        return ready

    async def _publish(
        self,
        serving: dict[str, ServingEntry],
        summary: PassSummary,
        read: KeyValue | None = None,
    ) -> bool:
        """Publish ``serving`` onto this node's record; ``read``: the record as this pass
        read it, tried first (a compare-and-swap: a record changed since is read again)."""
        key = node_key(self._node_id)
        for _ in range(5):
            # Read at every attempt: a withdrawal made while this one waited wins.
            serving = self._routed_out(serving)
            current, read = (
                (read, None) if read is not None else (await self._registry.get(key), None)
            )
            if current is None:
                summary.errors.append(
                    f"node record {key} does not exist yet; its serving set is published on a "
                    "later pass"
                )
                return False
            record = self._decoded.decode(current)
            if not isinstance(record, NodeRecord):
                summary.errors.append(f"node record {key} cannot be decoded; not publishing")
                return False
            if self._instance is not None and record.instance not in ("", self._instance):
                summary.errors.append(
                    f"node record {key} is held by another process (instance "
                    f"{record.instance[:12]}); not publishing onto it"
                )
                return False
            updated = with_serving(record, serving)
            if updated is None:
                self._own_revision = current.mod_revision
                return False
            result = await self._registry.txn(
                [Compare.mod_revision_is(key, current.mod_revision)],
                [Put(key, updated.encode(), lease=current.lease)],
            )
            if result.succeeded:
                self._own_revision = result.revision
                self.ctx.emit(
                    "reconcile.published", serving=len(serving), change_token=updated.change_token
                )
                return True
        summary.errors.append(f"node record {key} kept changing under 5 attempts to publish")
        return False
