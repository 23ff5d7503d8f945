"""The ArtifactReplicator: copies of every live revision on enough nodes, and no more.

One actor per node (``/artifacts``), a thin shell around :mod:`corral.node.artifacts._copy_plan`.
Each pass — every ``interval`` seconds, and whenever ``apps/``, ``copies/`` or
``held/`` change — it reads the registry in one transaction and then:

* **on the lease holder only** (``lease/coordinator`` names this node; its create
  revision is the fence): plans the holders of each live revision and writes every
  changed ``copies/<digest>`` in transactions guarded on the fence, so a stale
  holder writes nothing; deletes the assignments of revisions no app uses any more,
  and the registry-kept bytes (``artifacts/<digest>``) nothing has referred to for
  ``blob_grace`` seconds (the grace covers a deploy between storing its bytes and
  writing ``apps/<name>``), and the ``held/<node>`` of every node that has had no
  ``nodes/<node>`` record for ``release_grace`` seconds (a departed node's key would
  stay forever; one that comes back writes its key again on its next pass);
* **on every node**: starts a fetch of each copy assigned here and missing (from a
  holder, same rack first; streamed in a worker thread, sha256 checked, at most the
  store's ``concurrent_fetches`` at once); releases the copies it has that are
  neither assigned here, nor run by a local process, nor live and not yet assigned,
  once that has lasted ``release_grace`` seconds; removes unpacked revision
  directories other than each app's current and previous (never one a local
  process runs), also after ``release_grace``, so a pass that read the registry
  just before a deploy never removes the revision that deploy unpacked; and
  writes ``held/<node>`` when what it has changed.

A copy this node finds corrupt while serving it (or reading it) is dropped by the
store, which tells this actor: it writes ``held/<node>`` without it at once and runs
a pass, which fetches it again from another holder when it is assigned here.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from corral.node._errors import ArtifactError, InsufficientStorage
from corral.node.artifacts._artifact_store import (
    ArtifactStore,
    Peer,
    order_peers,
    removed_revision_path,
    tree_bytes,
)
from corral.node.artifacts._copy_plan import (
    DEFAULT_COPIES,
    Site,
    keep_plan,
    live_revisions,
    plan_copies,
    revisions_to_remove,
)
from corral.registry import (
    APPS_PREFIX,
    ARTIFACTS_PREFIX,
    COORDINATOR_LEASE_KEY,
    COPIES_PREFIX,
    HELD_PREFIX,
    NODES_PREFIX,
    PLACEMENT_PREFIX,
    AppRecord,
    CoordinatorLease,
    CopyAssignment,
    Delete,
    Get,
    HeldCopies,
    KeyValue,
    NodeRecord,
    PlacementRecord,
    Put,
    Registry,
    RegistryError,
    copies_key,
    decode_record,
    held_key,
    validate_digest,
)
from corral.supervision import Actor, ActorStopped, MailboxFull, UnhandledMessage
from corral.transport import message

log = logging.getLogger("corral.node.artifacts")

#: Seconds between passes (``--artifact-interval-ms``).
DEFAULT_INTERVAL = 20.0
#: Writes per guarded transaction (etcd allows 128 operations in one).
TXN_BATCH = 64
#: Every this many passes the lease holder reads every ``artifacts/`` key for bytes no
#: assignment names (left by a failed deploy or a lease holder that went away).
BLOB_SCAN_EVERY = 30

#: ``running() -> app -> revisions its local processes run``, or None when that cannot
#: be known right now (then nothing is released or removed on this pass).
Running = Callable[[], Awaitable[Mapping[str, set[str]] | None]]


@message("artifacts.replicate")
@dataclass(frozen=True)
class Replicate:
    """Run a pass now (``why`` says what asked). Replies with the pass count, whether
    this node assigns copies (it holds the lease), and the fetches in flight."""

    why: str = ""


@message("artifacts.state")
@dataclass(frozen=True)
class GetArtifactState:
    """Replies with what this node holds, fetches and failed to fetch, and the disk
    its artifacts and unpacked revisions use (JSON-able)."""


@dataclass(frozen=True)
class _Fetched:
    digest: str
    error: str | None


@dataclass(frozen=True)
class _Dropped:
    """The store dropped this node's copy of ``digest``: it did not match its digest."""

    digest: str


async def _no_processes() -> Mapping[str, set[str]] | None:
    return {}


def _revision_dirs(apps_dir: Path) -> dict[str, list[str]]:
    """app -> the unpacked revision directories on disk (partial ones excluded)."""
    found: dict[str, list[str]] = {}
    try:
        apps = list(os.scandir(apps_dir))
    except FileNotFoundError:
        return found
    for app in apps:
        revisions = Path(app.path) / "revisions"
        try:
            entries = [e.name for e in os.scandir(revisions) if e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        digests = []
        for name in entries:
            try:
                digests.append(validate_digest(name))
            except ValueError:
                continue
        if digests:
            found[app.name] = sorted(digests)
    return found


def disk_usage(store: ArtifactStore, apps_dir: Path) -> dict[str, Any]:
    """Bytes used by artifact copies and by unpacked revisions (blocking)."""
    held = store.held()
    revisions = _revision_dirs(apps_dir)
    per_app = {
        app: {d: tree_bytes(apps_dir / app / "revisions" / d) for d in digests}
        for app, digests in revisions.items()
    }
    return {
        "artifact_bytes": sum(held.values()),
        "artifacts": len(held),
        "revision_bytes": sum(sum(sizes.values()) for sizes in per_app.values()),
        "revisions": {app: sorted(sizes) for app, sizes in sorted(per_app.items())},
    }


class ArtifactReplicator(Actor):
    """See the module docstring.

    Args:
        node_id: this node's id.
        registry: the shared registry.
        store: this node's artifact store (fetches, releases, what it holds).
        apps_dir: ``<data-dir>/apps`` (unpacked revisions live below it).
        running: the revisions local processes run, per app.
        copies: holders each live revision gets at least (``--artifact-copies``).
        interval: seconds between passes (``--artifact-interval-ms``).
        release_grace: seconds a copy stays unwanted before it is released.
        blob_grace: seconds registry-kept bytes stay unreferenced before they are deleted.
        watch: also run a pass when ``apps/``, ``copies/`` or ``held/`` change.
    """

    def __init__(
        self,
        *,
        node_id: str,
        registry: Registry,
        store: ArtifactStore,
        apps_dir: Path,
        running: Running = _no_processes,
        copies: int = DEFAULT_COPIES,
        interval: float = DEFAULT_INTERVAL,
        release_grace: float | None = None,
        blob_grace: float | None = None,
        watch: bool = True,
    ) -> None:
        super().__init__()
        self._node_id = node_id
        self._registry = registry
        self._store = store
        self._apps_dir = apps_dir
        self._running = running
        self._copies = copies
        self._interval = interval
        self._release_grace = 3 * interval if release_grace is None else release_grace
        self._blob_grace = 3 * interval if blob_grace is None else blob_grace
        self._watch = watch
        self._since: dict[str, float] = {}
        self._blob_since: dict[str, float] = {}
        self._unlisted_since: dict[str, float] = {}
        self._doomed_since: dict[tuple[str, str], float] = {}
        self._fetching: set[str] = set()
        self._failed: dict[str, str] = {}
        self._published: dict[str, int] | None = None
        self._passes = 0
        self._coordinating = False
        self._queued = False
        self._sizes: dict[str, int] = {}
        self._stop_listening: Callable[[], None] | None = None

    async def started(self) -> None:
        self._stop_listening = self._store.on_drop(self._copy_dropped)
        self.ctx.every(self._interval, Replicate("interval"))
        if self._watch:
            for prefix in (APPS_PREFIX, COPIES_PREFIX, HELD_PREFIX):
                self.ctx.start_task(self._follow, prefix)
        self.ctx.ref.tell_nowait(Replicate("start"))

    async def _follow(self, prefix: str) -> None:
        """Ask for a pass after each burst of changes under ``prefix``."""
        while True:
            try:
                async with self._registry.watch(prefix) as events:
                    async for _event in events:
                        if self._queued:
                            continue  # a pass is queued already: it sees this change
                        if prefix == HELD_PREFIX and not self._coordinating:
                            continue  # what nodes hold matters to the assigner only
                        self._queued = True
                        await self.ctx.ref.tell(Replicate(f"{prefix} changed"))
            except RegistryError as exc:
                log.warning("watch of %s failed (%s); watching again", prefix, exc)
            await trio.sleep(1.0)

    async def stopping(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()

    def _copy_dropped(self, digest: str) -> None:
        try:
            self.ctx.ref.tell_nowait(_Dropped(digest))
        except (MailboxFull, ActorStopped):
            pass  # the next pass finds the copy gone all the same

    async def handle(self, message: object) -> object:
        match message:
            case _Dropped():
                self.ctx.emit("artifact.corrupt_dropped", digest=message.digest)
                try:
                    await self._publish(await self._store.run_blocking(self._store.held))
                    await self._pass()
                except RegistryError as exc:
                    log.warning("artifact pass skipped: the registry failed: %s", exc)
                return None
            case Replicate():
                try:
                    await self._pass()
                except RegistryError as exc:
                    log.warning("artifact pass skipped: the registry failed: %s", exc)
                return {
                    "passes": self._passes,
                    "coordinating": self._coordinating,
                    "fetching": sorted(self._fetching),
                }
            case _Fetched():
                self._fetching.discard(message.digest)
                if message.error is None:
                    self._failed.pop(message.digest, None)
                    self.ctx.emit("artifact.fetched", digest=message.digest)
                    await self._publish(await self._store.run_blocking(self._store.held))
                else:
                    self._failed[message.digest] = message.error
                    self.ctx.emit("artifact.fetch_failed", digest=message.digest)
                return None
            case GetArtifactState():
                return await self._state()
        raise UnhandledMessage(message)

    async def _state(self) -> dict[str, Any]:
        usage = await self._store.run_blocking(disk_usage, self._store, self._apps_dir)
        return {
            **usage,
            "coordinating": self._coordinating,
            "passes": self._passes,
            "fetching": sorted(self._fetching),
            "failed": dict(sorted(self._failed.items())),
        }

    async def _pass(self) -> None:
        self._queued = False
        self._passes += 1
        snapshot = await self._registry.txn(
            [],
            [
                Get(APPS_PREFIX, prefix=True),
                Get(PLACEMENT_PREFIX, prefix=True),
                Get(NODES_PREFIX, prefix=True),
                Get(HELD_PREFIX, prefix=True),
                Get(COPIES_PREFIX, prefix=True),
                Get(COORDINATOR_LEASE_KEY),
            ],
            [],
        )
        batches = [r if isinstance(r, list) else [] for r in snapshot.responses]
        apps: dict[str, AppRecord] = {}
        placements: dict[str, PlacementRecord] = {}
        sites: dict[str, Site] = {}
        records: dict[str, NodeRecord] = {}
        held: dict[str, frozenset[str]] = {}
        sizes: dict[str, int] = {}
        assigned: dict[str, CopyAssignment] = {}
        for kv in (kv for batch in batches[:5] for kv in batch):
            record = decode_record(kv.key, kv.value)
            if isinstance(record, AppRecord):
                apps[record.name] = record
            elif isinstance(record, PlacementRecord):
                placements[kv.key.removeprefix(PLACEMENT_PREFIX)] = record
            elif isinstance(record, NodeRecord):
                sites[record.id] = Site(record.rack, record.datacenter)
                records[record.id] = record
            elif isinstance(record, HeldCopies):
                held[record.node] = frozenset(record.copies)
                sizes.update(record.copies)
            elif isinstance(record, CopyAssignment):
                assigned[record.digest] = record
        live = live_revisions(apps, placements)
        lease_kv = batches[5][0] if batches[5] else None
        lease = None if lease_kv is None else decode_record(lease_kv.key, lease_kv.value)
        self._coordinating = (
            lease_kv is not None
            and isinstance(lease, CoordinatorLease)
            and lease.holder == self._node_id
        )
        if self._coordinating and lease_kv is not None:
            assigned = await self._assign(
                lease_kv.create_revision, live, sites, held, sizes, assigned, batches[4]
            )
        holders = {d: a.holders for d, a in assigned.items()}
        self._sizes = {**sizes, **{d: a.size for d, a in assigned.items() if a.size}}

        def peers(digest: str) -> list[Peer]:
            """Who to fetch from: the assigned holders and every node that says it
            has a copy, same rack first (from this pass's snapshot)."""
            having = [n for n, digests in held.items() if digest in digests]
            return order_peers(digest, self._node_id, records, [*holders.get(digest, ()), *having])

        await self._keep(
            holders, apps, live, held.get(self._node_id), peers, listed=self._node_id in records
        )

    async def _assign(
        self,
        fence: int,
        live: Mapping[str, Any],
        sites: Mapping[str, Site],
        held: Mapping[str, frozenset[str]],
        sizes: Mapping[str, int],
        assigned: dict[str, CopyAssignment],
        copies_kvs: list[KeyValue],
    ) -> dict[str, CopyAssignment]:
        """Write the changed assignments and drop the dead ones, under ``fence``;
        returns the assignments as they now stand (or as they were, if the fence failed)."""
        # Imported here: the coordinator package is heavy and may import node modules.
        from corral.actors.coordinator import fence_guard

        live_held = {n: d for n, d in held.items() if n in sites}
        plan = plan_copies(live, sites, live_held, self._copies)
        writes: list[Put | Delete] = []
        wanted: dict[str, CopyAssignment] = {}
        for digest, holders in plan.items():
            old = assigned.get(digest)
            size = sizes.get(digest, 0 if old is None else old.size)
            new = CopyAssignment(digest, list(holders), size, list(live[digest].apps))
            wanted[digest] = new
            if old != new:
                writes.append(Put(copies_key(digest), new.encode()))
        for kv in copies_kvs:
            digest = kv.key.removeprefix(COPIES_PREFIX)
            if digest not in plan:
                writes.append(Delete(kv.key))
        dead = {kv.key.removeprefix(COPIES_PREFIX) for kv in copies_kvs} - set(plan)
        writes += await self._collect_blobs(set(plan), dead)
        writes += self._collect_held(held, sites)
        for start in range(0, len(writes), TXN_BATCH):
            result = await self._registry.txn(
                [fence_guard(fence)], writes[start : start + TXN_BATCH], []
            )
            if not result.succeeded:
                log.info("artifact assignments not written: the fence %s was lost", fence)
                self._coordinating = False
                return assigned
        if writes:
            self.ctx.emit("artifacts.assigned", revisions=len(plan), writes=len(writes))
        return wanted

    async def _collect_blobs(self, live: set[str], dead: set[str]) -> list[Put | Delete]:
        """Deletes of registry-kept bytes nothing has referred to for the grace.

        The candidates are the revisions whose assignment goes now (``dead``), those
        already waiting out the grace, and, every :data:`BLOB_SCAN_EVERY` passes, every
        ``artifacts/`` key (that read carries the bytes, so it is not done each pass)."""
        now = trio.current_time()
        candidates = dead | set(self._blob_since)
        if self._passes % BLOB_SCAN_EVERY == 1:
            for kv in await self._registry.range(ARTIFACTS_PREFIX):
                candidates.add(kv.key.removeprefix(ARTIFACTS_PREFIX))
        deletes: list[Put | Delete] = []
        for digest in sorted(candidates):
            if digest in live:
                self._blob_since.pop(digest, None)
                continue
            first = self._blob_since.setdefault(digest, now)
            if now - first >= self._blob_grace:
                deletes.append(Delete(f"{ARTIFACTS_PREFIX}{digest}"))
                del self._blob_since[digest]
        return deletes

    def _collect_held(
        self, held: Mapping[str, frozenset[str]], sites: Mapping[str, Site]
    ) -> list[Put | Delete]:
        """Deletes of the ``held/<node>`` of nodes without a record for the grace."""
        now = trio.current_time()
        unlisted = {node for node in held if node not in sites}
        self._unlisted_since = {
            node: self._unlisted_since.get(node, now) for node in sorted(unlisted)
        }
        deletes: list[Put | Delete] = []
        for node, first in sorted(self._unlisted_since.items()):
            if now - first >= self._release_grace:
                deletes.append(Delete(held_key(node)))
                del self._unlisted_since[node]
        if deletes:
            self.ctx.emit("artifacts.held_removed", nodes=len(deletes))
        return deletes

    async def _keep(
        self,
        assignments: Mapping[str, list[str]],
        apps: Mapping[str, AppRecord],
        live: Mapping[str, Any],
        published: frozenset[str] | None,
        peers: Callable[[str], list[Peer]],
        *,
        listed: bool = True,
    ) -> None:
        known = await self._running()
        running = known or {}
        in_use = {d for digests in running.values() for d in digests}
        have = await self._store.run_blocking(self._store.held)
        plan = keep_plan(
            self._node_id,
            assignments,
            have,
            running=in_use,
            live=live,
            since=self._since,
            now=trio.current_time(),
            grace=self._release_grace,
        )
        self._since = plan.since
        if known is None:
            log.info("the local processes cannot be listed: nothing is released this pass")
        for digest in plan.release if known is not None else ():
            if await self._store.run_blocking(self._store.release, digest):
                self.ctx.emit("artifact.released", digest=digest)
                have.pop(digest, None)
        for digest in plan.fetch:
            if digest not in self._fetching:
                self._fetching.add(digest)
                self.ctx.start_task(self._fetch, digest, peers(digest))
        on_disk = await self._store.run_blocking(_revision_dirs, self._apps_dir)
        # A directory is removed only once it has been doomed for the grace: a pass
        # whose snapshot predates a deploy must not remove the revision just unpacked.
        now = trio.current_time()
        doomed = {
            (app, digest): self._doomed_since.get((app, digest), now)
            for app, digests in revisions_to_remove(on_disk, apps, running).items()
            for digest in digests
            if known is not None
        }
        self._doomed_since = {}
        for (app, digest), first in sorted(doomed.items()):
            if now - first < self._release_grace:
                self._doomed_since[(app, digest)] = first
                continue
            target = self._apps_dir / app / "revisions" / digest
            await self._store.run_blocking(_remove_revision, target)
            self.ctx.emit("artifact.revision_removed", app=app, digest=digest)
        if published is None and self._published is not None and not listed:
            # The lease holder deleted the key of this node without a record: written
            # again once the record is back, not fought over until then.
            return
        if published is None or published != frozenset(have) or self._published != have:
            # The key as read differs from what this node has, or is gone: write it.
            await self._publish(have, force=published != frozenset(have))

    async def _fetch(self, digest: str, peers: list[Peer]) -> None:
        error: str | None = None
        try:
            await self._store.fetch_copy(digest, peers, self._sizes.get(digest))
        except RegistryError as exc:
            error = f"the registry failed: {exc}"
        except (ArtifactError, InsufficientStorage, OSError) as exc:
            error = str(exc)
            log.warning("cannot fetch a copy of %s: %s", digest[:12], exc)
        await self.ctx.ref.tell(_Fetched(digest, error))

    async def _publish(self, have: dict[str, int], *, force: bool = False) -> None:
        if self._published == have and not force:
            return
        await self._registry.put(held_key(self._node_id), HeldCopies(self._node_id, have).encode())
        self._published = dict(have)


def _remove_revision(target: Path) -> None:
    """Delete an unpacked revision: renamed aside first, so no half-deleted directory
    is ever seen under its name."""
    aside = removed_revision_path(target)
    try:
        os.rename(target, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)
