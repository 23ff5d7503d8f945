"""Turning a pass's decisions into fenced registry transactions (pure).

Theory of operation
-------------------
The planner says, per application, which nodes should serve it. This module
compares that with the placement records as they were read, and produces the
writes that close the gap, grouped into transactions (*batches*) that the
coordinator sends one after the other.

* **Only differences are written.** A record whose node set already matches
  is left alone, so a pass over an unchanged cluster produces no batch at all.
  ``decidedAt`` moves only when the node set does.
* **Every batch is guarded twice.** Its first compare is "the lease key's
  create revision is still my fence": a coordinator whose lease lapsed (and
  was re-acquired by anyone, under a larger fence) writes nothing. Then one
  compare per written key pins the ``mod_revision`` read at the start of the
  pass (or absence), so a record written since — by a newer coordinator with
  a larger fence, say — is never overwritten by a decision made without it.
* **Larger fences win.** A record already carrying a fence larger than the
  writer's is not touched at all; the plan lists it as ``superseded``, which
  can only mean the writer's lease is no longer the newest, so the caller
  drops its role.
* **Removals go first.** Deletions and writes that only take nodes away come
  before writes that add a node, across batches as well as within one, so a
  reader never sees a new placement before the removal it pairs with. (A
  move inside one record is one atomic write, so it is never split.)
* **A missing record is pending.** A planner answer of "no nodes" for an app
  deletes its record rather than writing an empty one, and an app the
  planner could not place is simply not in ``targets``.
* **Stopped pinned instances are remembered in the record.** A node where a
  forced drain stopped a pinned app's instance (``stopped``) stays a key of
  the record's ``placed_at`` (with the time it was placed) but leaves
  ``nodes``: no node runs it, and the next pass knows it belongs to that
  node and is not to be started elsewhere. The record is kept for that even
  when ``nodes`` is empty. (The record schema has no field of its own for
  this; ``placed_at`` keys outside ``nodes`` mean exactly this and nothing
  else, and only the coordinator writes placement records.)
* **Down entries are written the same way.** ``down/<node>`` entries (when a
  node was decided down, see :mod:`._membership`) go in their own batches,
  sent before the placement batches, each guarded by the fence and by the
  entry's ``mod_revision`` as read (:func:`plan_down_writes`).
* **Each node's assignment index moves with what the node acts on.** A batch
  that adds a node to a placement, takes it from one, or changes the node's
  stamp in one (:meth:`~corral.registry.PlacementRecord.stamp_for`: the app's
  spec, or the revision the rollout names for the node) also writes
  ``assign/<node>`` (:class:`~corral.registry.NodeAssignment`: every app whose
  placement names the node, with its stamp, as it stands once the batch lands;
  deleted when none does), in the same fenced transaction. A node's reconciler
  watches that one key and reads it as its change token, so a write that does
  not concern the node costs it nothing, and one that does reaches it. The
  index is guarded by the fence alone: only the coordinator writes it, and it
  is derived from the placements the batch's own guards pin.
* **An app's spec is kept in its placement.** Given the app records, every
  placement written carries the app's
  :meth:`~corral.registry.AppRecord.node_spec`, and :func:`plan_rollout_writes`
  rewrites a placement whose spec is no longer the app's (a new revision, a
  memory limit, a flag the nodes stop for): that is what moves the index of
  the app's nodes when only the app record changed.
* **A rollout is carried over.** A record rewritten for its node set keeps the
  rollout it carries (:class:`~corral.registry.RolloutRecord`); the rollout's
  own changes are written by :func:`plan_rollout_writes`.
* **Batches stay small.** At most ``max_writes`` placement writes, and at most
  ``max_writes`` index writes, per transaction, under etcd's default limit of
  128 operations per txn. A placement touching more nodes than that (a new
  ``replicas: "all"`` app on a large fleet) carries the first ``max_writes``
  index writes; the rest follow in fence-guarded batches of their own right
  after it.

Everything here is a function of its arguments: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AppRecord,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    NodeAssignment,
    NodeDown,
    PlacementRecord,
    Put,
    RolloutRecord,
    assign_key,
    down_key,
    placement_key,
)

__all__ = [
    "DEFAULT_MAX_WRITES",
    "CurrentPlacement",
    "DownBatch",
    "PlacementWrite",
    "WriteBatch",
    "WritePlan",
    "fence_guard",
    "plan_down_writes",
    "plan_rollout_writes",
    "plan_writes",
]

#: Writes per transaction. etcd refuses a txn with more than 128 operations
#: per branch by default; the guards count towards the compare list.
DEFAULT_MAX_WRITES = 64


@dataclass(frozen=True, slots=True)
class CurrentPlacement:
    """A placement record as read at the start of the pass."""

    record: PlacementRecord
    mod_revision: int


@dataclass(frozen=True, slots=True)
class PlacementWrite:
    """One record change: ``record`` is None for a deletion."""

    app: str
    record: PlacementRecord | None
    previous: tuple[str, ...] | None
    observed_mod_revision: int

    @property
    def key(self) -> str:
        return placement_key(self.app)

    @property
    def nodes(self) -> tuple[str, ...] | None:
        return None if self.record is None else tuple(self.record.nodes)

    @property
    def is_removal(self) -> bool:
        """True when the write only takes nodes away (or deletes the record)."""
        if self.record is None:
            return True
        if self.previous is None:
            return False
        return set(self.record.nodes) < set(self.previous)

    def guard(self) -> Compare:
        if self.observed_mod_revision == 0:
            return Compare.absent(self.key)
        return Compare.mod_revision_is(self.key, self.observed_mod_revision)

    def operation(self) -> Put | Delete:
        if self.record is None:
            return Delete(self.key)
        return Put(self.key, self.record.encode())


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """One transaction: every compare must hold for any of the writes to land."""

    compares: tuple[Compare, ...]
    operations: tuple[Put | Delete, ...]
    writes: tuple[PlacementWrite, ...]


@dataclass(frozen=True, slots=True)
class WritePlan:
    """What a pass writes, in order.

    Attributes:
        batches: transactions to send one after the other; empty when nothing
            changed.
        superseded: apps whose record carries a fence larger than the
            writer's; they are left untouched.
        unchanged: apps whose record already matches the decision.
    """

    batches: tuple[WriteBatch, ...] = ()
    superseded: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    removals: int = 0
    placements: int = 0
    records: Mapping[str, PlacementRecord | None] = field(default_factory=dict)

    @property
    def writes(self) -> tuple[PlacementWrite, ...]:
        return tuple(write for batch in self.batches for write in batch.writes)


def fence_guard(fence: int) -> Compare:
    """The guard every coordinator write carries: the lease key's create
    revision is still ``fence``. An absent key has create revision 0, which is
    never a fence."""
    return Compare(COORDINATOR_LEASE_KEY, CompareTarget.CREATE_REVISION, CompareOp.EQUAL, fence)


def plan_writes(
    targets: Mapping[str, tuple[str, ...] | None],
    current: Mapping[str, CurrentPlacement],
    *,
    fence: int,
    decided_at: float,
    max_writes: int = DEFAULT_MAX_WRITES,
    stopped: Mapping[str, tuple[str, ...]] | None = None,
    apps: Mapping[str, AppRecord] | None = None,
    specs: Mapping[str, str] | None = None,
    reserved: Mapping[str, tuple[int, int]] | None = None,
) -> WritePlan:
    """Plan the transactions that make the placement records match ``targets``.

    Args:
        targets: app -> the nodes that should serve it (any order, no
            duplicates), or None for "remove its placement record". Apps not
            named here are not touched.
        current: app -> the record and its mod revision, as read this pass.
        stopped: app -> nodes where a forced drain stopped its pinned instance
            (the planner's ``Decisions.stopped``); kept in the record's
            ``placed_at`` only. An app named here should be in ``targets``.
        fence: the writer's lease fence (create revision of the lease key).
        decided_at: wall-clock time stamped on every record written.
        max_writes: most writes in one transaction (>= 1).
        apps: the app records by name; a record written for an app named here
            carries its :meth:`~corral.registry.AppRecord.node_spec` (the others
            keep the spec they had).
        specs: the node spec of each app, when the caller keeps them (see
            :meth:`~._inputs.InputCache.node_specs`): used instead of computing each
            from ``apps``.
        reserved: app -> ``(memory_mb, disk_mb)`` its placed instances reserve (what
            it declares: every instance a pass leaves placed reserves that). A record
            written for an app named here carries it, and one whose node set is
            unchanged is rewritten when it recorded another size (a resource change
            placed in place); the others keep what they recorded.

    Returns:
        The plan; ``records`` maps each written app to its new record (None
        for a deletion).

    Raises:
        ValueError: ``fence`` < 1 or ``max_writes`` < 1.
    """
    if fence < 1:
        raise ValueError(f"fence must be a create revision (>= 1), got {fence}")
    if max_writes < 1:
        raise ValueError(f"max_writes must be at least 1, got {max_writes}")

    removals: list[PlacementWrite] = []
    placements: list[PlacementWrite] = []
    superseded: list[str] = []
    unchanged: list[str] = []
    for app in sorted(targets):
        wanted = targets[app]
        existing = current.get(app)
        if existing is not None and existing.record.fence > fence:
            superseded.append(app)
            continue
        held = (stopped or {}).get(app, ())
        spec = _spec_of(app, apps, specs)
        write = _write_for(
            app,
            wanted,
            held,
            existing,
            fence=fence,
            decided_at=decided_at,
            spec=spec,
            reserved=None if reserved is None else reserved.get(app),
        )
        if write is None:
            unchanged.append(app)
        elif write.is_removal:
            removals.append(write)
        else:
            placements.append(write)

    ordered = removals + placements
    batches = _batches(ordered, current, fence, max_writes)
    return WritePlan(
        batches=batches,
        superseded=tuple(superseded),
        unchanged=tuple(unchanged),
        removals=len(removals),
        placements=len(placements),
        records={write.app: write.record for write in ordered},
    )


def _write_for(
    app: str,
    wanted: tuple[str, ...] | None,
    stopped: tuple[str, ...],
    existing: CurrentPlacement | None,
    *,
    fence: int,
    decided_at: float,
    spec: str | None = None,
    reserved: tuple[int, int] | None = None,
) -> PlacementWrite | None:
    nodes = () if wanted is None else tuple(sorted(set(wanted)))
    held = tuple(sorted(set(stopped) - set(nodes)))
    if not nodes and not held:
        if existing is None:
            return None
        return PlacementWrite(app, None, tuple(existing.record.nodes), existing.mod_revision)
    if existing is None:
        placed_at = dict.fromkeys((*nodes, *held), decided_at)
        record = PlacementRecord(
            nodes=list(nodes),
            decided_at=decided_at,
            fence=fence,
            placed_at=placed_at,
            spec=spec or "",
            reserved=reserved,
        )
        return PlacementWrite(app, record, None, 0)
    previous = tuple(existing.record.nodes)
    old_placed = existing.record.placed_at
    previously_held = tuple(sorted(node for node in old_placed if node not in previous))
    if reserved is None:
        reserved = existing.record.reserved
    if (
        tuple(sorted(previous)) == nodes
        and previously_held == held
        and reserved == existing.record.reserved
    ):
        return None
    # Kept instances keep their placement time (absent means "long ago", as
    # the planner reads it); added ones are stamped now. A stopped instance
    # keeps the time it had, or is stamped now when it had none.
    placed_at = {node: decided_at for node in nodes if node not in previous}
    placed_at.update(
        {node: old_placed[node] for node in nodes if node in previous and node in old_placed}
    )
    placed_at.update({node: old_placed.get(node, decided_at) for node in held})
    # The rollout goes on across a node-set change: its next pass matches it to the
    # new nodes (see :mod:`._rollout`).
    record = PlacementRecord(
        nodes=list(nodes),
        decided_at=decided_at,
        fence=fence,
        placed_at=placed_at,
        rollout=existing.record.rollout,
        spec=existing.record.spec if spec is None else spec,
        reserved=reserved,
    )
    return PlacementWrite(app, record, previous, existing.mod_revision)


def plan_rollout_writes(
    rollouts: Mapping[str, RolloutRecord | None],
    current: Mapping[str, CurrentPlacement],
    *,
    fence: int,
    max_writes: int = DEFAULT_MAX_WRITES,
    apps: Mapping[str, AppRecord] | None = None,
    specs: Mapping[str, str] | None = None,
) -> tuple[WriteBatch, ...]:
    """The transactions that put each app's rollout bookkeeping, and its spec, into its
    placement record: only the records whose rollout differs from the one read, or
    whose spec is no longer the app's, each rewritten under ``fence`` with its node set
    untouched, and guarded like every placement write (fence, and the ``mod_revision``
    read). The assignment index of every node whose stamp moved (the app's spec
    changed, or the revision the rollout names for the node did) is written in the
    same transaction: that is how the node learns of it.

    Args:
        rollouts: app -> the rollout to keep (None: clear it).
        current: app -> its placement record and mod revision, as read (every
            placement: an index written lists every app of its node); an app
            without one, or whose record carries a larger fence, is not written.
        fence: the writer's lease fence.
        max_writes: most writes in one transaction (>= 1).
        apps: the app records by name (None: specs are left as they are).
        specs: the node spec of each app, when the caller keeps them: used instead of
            computing each from ``apps``.

    Raises:
        ValueError: ``fence`` < 1 or ``max_writes`` < 1.
    """
    if fence < 1:
        raise ValueError(f"fence must be a create revision (>= 1), got {fence}")
    if max_writes < 1:
        raise ValueError(f"max_writes must be at least 1, got {max_writes}")
    writes: list[PlacementWrite] = []
    for app in sorted(rollouts):
        existing = current.get(app)
        if existing is None or existing.record.fence > fence:
            continue
        found = _spec_of(app, apps, specs)
        spec = existing.record.spec if found is None else found
        if existing.record.rollout == rollouts[app] and existing.record.spec == spec:
            continue
        new = dataclasses.replace(existing.record, rollout=rollouts[app], fence=fence, spec=spec)
        writes.append(PlacementWrite(app, new, tuple(existing.record.nodes), existing.mod_revision))
    return _batches(writes, current, fence, max_writes)


def _spec_of(
    app: str, apps: Mapping[str, AppRecord] | None, specs: Mapping[str, str] | None
) -> str | None:
    """The node spec of ``app``: from ``specs`` when given, else from its record in
    ``apps``; None when neither knows it."""
    if specs is not None:
        return specs.get(app)
    record = None if apps is None else apps.get(app)
    return None if record is None else record.node_spec()


def _batches(
    ordered: Sequence[PlacementWrite],
    current: Mapping[str, CurrentPlacement],
    fence: int,
    max_writes: int,
) -> tuple[WriteBatch, ...]:
    """Group the writes into transactions, each carrying the assignment index of every
    node whose part in its writes moved (see the module docstring)."""
    if not ordered:
        return ()
    placed = {app: existing.record for app, existing in current.items()}
    assigned: dict[str, set[str]] = {}
    for app, record in placed.items():
        for node in record.nodes:
            assigned.setdefault(node, set()).add(app)
    batches: list[WriteBatch] = []
    chunk: list[PlacementWrite] = []
    touched: set[str] = set()

    def close() -> None:
        index = [_index_write(node, assigned.get(node, ()), placed) for node in sorted(touched)]
        first, rest = index[:max_writes], index[max_writes:]
        batches.append(
            WriteBatch(
                compares=(fence_guard(fence), *(write.guard() for write in chunk)),
                operations=(*(write.operation() for write in chunk), *first),
                writes=tuple(chunk),
            )
        )
        for start in range(0, len(rest), max_writes):
            batches.append(
                WriteBatch((fence_guard(fence),), tuple(rest[start : start + max_writes]), ())
            )
        chunk.clear()
        touched.clear()

    for write in ordered:
        before = set(write.previous or ())
        after = set(write.nodes or ())
        moved = before ^ after
        old, new = placed.get(write.app), write.record
        if old is not None and new is not None:
            moved |= {n for n in before & after if old.stamp_for(n) != new.stamp_for(n)}
        if chunk and (len(chunk) >= max_writes or len(touched | moved) > max_writes):
            close()
        for node in before - after:
            apps = assigned.get(node)
            if apps is not None:
                apps.discard(write.app)
        for node in after - before:
            assigned.setdefault(node, set()).add(write.app)
        if new is None:
            placed.pop(write.app, None)
        else:
            placed[write.app] = new
        chunk.append(write)
        touched |= moved
    close()
    return tuple(batches)


def _index_write(
    node: str, apps: Iterable[str], placed: Mapping[str, PlacementRecord]
) -> Put | Delete:
    names = sorted(apps)
    if not names:
        return Delete(assign_key(node))
    stamps = {app: placed[app].stamp_for(node) for app in names}
    return Put(assign_key(node), NodeAssignment(node, names, stamps).encode())


@dataclass(frozen=True, slots=True)
class DownBatch:
    """One transaction of ``down/<node>`` writes: ``entries`` maps each node written
    to its new entry (None: deleted)."""

    compares: tuple[Compare, ...]
    operations: tuple[Put | Delete, ...]
    entries: Mapping[str, NodeDown | None]


def plan_down_writes(
    writes: Mapping[str, NodeDown | None],
    observed: Mapping[str, int],
    *,
    fence: int,
    max_writes: int = DEFAULT_MAX_WRITES,
) -> tuple[DownBatch, ...]:
    """The transactions that write (or delete, for None) the ``down/<node>`` entries.

    Args:
        writes: node -> the entry to write, or None to delete it.
        observed: node -> the mod revision of its entry as read (absent: no entry).
        fence: the writer's lease fence.
        max_writes: most writes in one transaction (>= 1).

    Returns:
        Batches in node order; a deletion of an entry that was not read is dropped.

    Raises:
        ValueError: ``fence`` < 1 or ``max_writes`` < 1.
    """
    if fence < 1:
        raise ValueError(f"fence must be a create revision (>= 1), got {fence}")
    if max_writes < 1:
        raise ValueError(f"max_writes must be at least 1, got {max_writes}")
    nodes = [node for node in sorted(writes) if writes[node] is not None or node in observed]
    batches: list[DownBatch] = []
    for start in range(0, len(nodes), max_writes):
        chunk = nodes[start : start + max_writes]
        compares = [fence_guard(fence)]
        operations: list[Put | Delete] = []
        for node in chunk:
            key = down_key(node)
            revision = observed.get(node, 0)
            compares.append(
                Compare.absent(key) if revision == 0 else Compare.mod_revision_is(key, revision)
            )
            entry = writes[node]
            operations.append(Delete(key) if entry is None else Put(key, entry.encode()))
        batches.append(
            DownBatch(tuple(compares), tuple(operations), {node: writes[node] for node in chunk})
        )
    return tuple(batches)
