"""From registry records to the planner's input, and the digest of it (pure).

Theory of operation
-------------------
A pass reads five prefixes — ``apps/``, ``nodes/``, ``intent/``,
``placement/``, ``down/`` — into a :class:`RegistryView`: the decoded records,
each placement and down entry with the ``mod_revision`` its write will be
guarded on, and every key that could not be decoded.
:func:`plan_input_from_view` turns the view into the planner's frozen
:class:`~corral.actors.planner.PlanInput`:

* an app is its name, replicas, selector, resources and the pinned, retired
  and blocked flags — nothing else (deployments, domains and app labels are
  not decisions the planner makes, so they are not handed to it);
* a node is one whose leased record exists, or one whose record lapsed while
  a placement still names it, with the state :func:`~._membership.node_states`
  decides from the record, the membership view and the down entries (a
  lapsed record without membership is ``down``, keeping its work for the
  grace period), then the operator's intent on top: draining makes it
  ``left`` (a drain is a decision) and a forced drain (``intent.force``) sets
  ``drain_forced`` too, so the planner stops pinned work there instead of
  refusing the drain; cordoning makes an ``alive`` or ``suspect`` node
  ``cordoned`` — a node already ``down`` or ``left`` stays so, or cordoning a
  dead node would pin its work to it for ever;
* a placement is its sorted nodes and when each was placed, plus the nodes
  where a forced drain stopped a pinned instance: the record keeps those in
  ``placed_at`` but not in ``nodes`` (see :mod:`._writes`), and what its
  instances reserve (``reserved``: the resources the app declared when they
  were placed, so a redeploy asking for other resources is placed again, and
  is part of the digest like every other field);
* an undecodable key of any of the four kinds is passed on by name, and the
  planner pauses the pass.

:func:`inputs_digest` hashes exactly those inputs (not the policy, not the
time), in a canonical form, so the coordinator can skip a pass whose inputs
have not moved: the planner is a function of them, and would decide what is
already decided.

:func:`needs_time` says when the same inputs may still decide differently
later — a move deferred by a cooldown, a ``down`` node whose grace lapses —
so those passes are not skipped.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Generic, TypeVar

from corral.actors.coordinator._membership import (
    CurrentDown,
    MemberStatus,
    NodeStates,
    effective_state,
    node_states,
)
from corral.actors.coordinator._writes import CurrentPlacement
from corral.actors.planner import (
    AppSpec,
    Decisions,
    NodeCapacity,
    NodeInfo,
    Placement,
    PlanInput,
    Policy,
    allocatable,
    reserved_by_placements,
)
from corral.registry import (
    APPS_PREFIX,
    DOWN_PREFIX,
    INTENT_PREFIX,
    NODES_PREFIX,
    PLACEMENT_PREFIX,
    AppRecord,
    KeyValue,
    NodeDown,
    NodeIntent,
    NodeRecord,
    PlacementRecord,
    Record,
    Undecodable,
    decode_record,
)

__all__ = [
    "INPUT_PREFIXES",
    "InputCache",
    "RegistryView",
    "effective_state",
    "inputs_digest",
    "needs_time",
    "placed_nodes",
    "plan_input_from_view",
    "states_from_view",
    "view_from_kvs",
    "with_placements",
]

_V = TypeVar("_V")

#: The prefixes a pass reads, in the order it reads them.
INPUT_PREFIXES = (APPS_PREFIX, NODES_PREFIX, INTENT_PREFIX, PLACEMENT_PREFIX, DOWN_PREFIX)


@dataclass(frozen=True, slots=True)
class RegistryView:
    """The records one pass read.

    Attributes:
        apps: by app name.
        nodes: by node id (only nodes whose leased record exists).
        intents: by node id.
        placements: by app name, with the mod revision read.
        down: ``down/<node>`` entries by node id, with the mod revision read.
        undecodable: keys whose value could not be decoded (or that sit under
            one of the prefixes but outside the key space), sorted by key.
    """

    apps: Mapping[str, AppRecord] = field(default_factory=dict)
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    intents: Mapping[str, NodeIntent] = field(default_factory=dict)
    placements: Mapping[str, CurrentPlacement] = field(default_factory=dict)
    undecodable: tuple[Undecodable, ...] = ()
    down: Mapping[str, CurrentDown] = field(default_factory=dict)


class SectionHistory:
    """The keys each version of a line of :class:`Section` objects changed (the last
    ``depth`` versions)."""

    __slots__ = ("_log", "latest")

    def __init__(self, depth: int = 64) -> None:
        self._log: deque[tuple[int, frozenset[str]]] = deque(maxlen=depth)
        self.latest = 0

    def record(self, version: int, changed: frozenset[str]) -> None:
        self._log.append((version, changed))
        self.latest = version

    def between(self, old: int, new: int) -> frozenset[str] | None:
        """The keys changed from version ``old`` to ``new``; None when not kept."""
        if old == new:
            return frozenset()
        log = self._log
        if old > new or not log or log[0][0] > old + 1:
            return None
        changed: set[str] = set()
        for version, keys in log:
            if old < version <= new:
                changed |= keys
        return frozenset(changed)


class Section(dict[str, _V]):
    """One part of a :class:`RegistryView` (its apps, nodes, placements...): a dict in
    key order that knows the line of sections it belongs to, so a consumer that kept
    results for an earlier section of the line asks :meth:`changes_since` which keys
    differ (added, removed or given another value) and updates only those (see
    :class:`InputCache`). With any other mapping it starts over.
    """

    __slots__ = ("history", "version")

    def __init__(self, items: Iterable[tuple[str, _V]] = ()) -> None:
        super().__init__(items)
        self.history = SectionHistory()
        self.version = 0

    def derive(self, updates: Mapping[str, _V | None]) -> Section[_V]:
        """A new section of the line: this one with ``updates`` applied (None removes the
        key), in key order; ``self`` when nothing changes."""
        changed = {
            key
            for key, value in updates.items()
            if (value is None and key in self) or (value is not None and self.get(key) is not value)
        }
        if not changed:
            return self
        if all(key in self and updates[key] is not None for key in changed):
            new = Section(self.items())  # the same keys: the order holds
            for key in changed:
                value = updates[key]
                assert value is not None
                new[key] = value
        else:
            merged = dict(self)
            for key in changed:
                value = updates[key]
                if value is None:
                    del merged[key]
                else:
                    merged[key] = value
            new = Section(sorted(merged.items()))
        if self.history.latest == self.version:  # the newest of its line: extend it
            new.history, new.version = self.history, self.version + 1
            self.history.record(new.version, frozenset(changed))
        return new

    def changes_since(self, earlier: Mapping[str, object] | None) -> frozenset[str] | None:
        """The keys that differ from ``earlier``, a section of the same line; None when
        ``earlier`` is not one (or too old to tell)."""
        if isinstance(earlier, Section) and earlier.history is self.history:
            return self.history.between(earlier.version, self.version)
        return None


def classify(
    key: str, record: Record | Undecodable, mod_revision: int
) -> tuple[str, str, object]:
    """Where a decoded input record goes in a :class:`RegistryView`: its section's name
    (``apps``, ``nodes``, ``intents``, ``placements``, ``down`` or ``undecodable``), its
    name there, and the value (a placement or down entry with its ``mod_revision``; a
    record of the wrong kind for its key is :class:`~corral.registry.Undecodable`)."""
    name = key.partition("/")[2]
    if isinstance(record, Undecodable):
        return "undecodable", key, record
    if isinstance(record, AppRecord):
        return "apps", name, record
    if isinstance(record, NodeRecord):
        return "nodes", name, record
    if isinstance(record, NodeIntent):
        return "intents", name, record
    if isinstance(record, PlacementRecord):
        return "placements", name, CurrentPlacement(record, mod_revision)
    if isinstance(record, NodeDown):
        return "down", name, CurrentDown(record, mod_revision)
    return "undecodable", key, Undecodable(key, f"a {type(record).__name__} is not expected here")


def view_from_kvs(
    kvs: Iterable[KeyValue],
    *,
    memo: dict[str, tuple[int, Record | Undecodable]] | None = None,
) -> RegistryView:
    """Decode what a pass read from :data:`INPUT_PREFIXES` (in any order).

    A value of the wrong kind for its key, or one that breaks its schema, is
    :class:`~corral.registry.Undecodable`; it never raises.

    Args:
        memo: key -> (mod_revision, decoded) from the previous pass, updated in place
            to this pass's keys: a key at the same mod_revision holds the same bytes,
            so an unchanged record is not decoded again (records are frozen).
    """
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    seen: dict[str, tuple[int, Record | Undecodable]] = {}
    for kv in kvs:
        known = None if memo is None else memo.get(kv.key)
        if known is not None and known[0] == kv.mod_revision:
            record = known[1]
        else:
            record = decode_record(kv.key, kv.value)
        if memo is not None:
            seen[kv.key] = (kv.mod_revision, record)
        section, name, value = classify(kv.key, record, kv.mod_revision)
        sections[section][name] = value
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return view_of_sections({name: Section(sorted(s.items())) for name, s in sections.items()})


#: The parts of a view, by name.
_SECTIONS = ("apps", "nodes", "intents", "placements", "down", "undecodable")


def view_of_sections(sections: Mapping[str, Mapping[str, Any]]) -> RegistryView:
    """The view made of sections in key order (see :data:`_SECTIONS`; ``undecodable``
    by key)."""
    return RegistryView(
        apps=sections["apps"],
        nodes=sections["nodes"],
        intents=sections["intents"],
        placements=sections["placements"],
        undecodable=tuple(sections["undecodable"].values()),
        down=sections["down"],
    )


class InputCache:
    """An optional memo for :func:`plan_input_from_view`, :func:`states_from_view` and
    :func:`inputs_digest`, carried from one pass to the next.

    It is purely an optimisation: with it they return exactly what they return
    without it (equal inputs, equal states, the same digest), for any sequence of
    views. A pass at fleet size reads thousands of records of which a few changed;
    building and validating an :class:`~corral.actors.planner.AppSpec` and a
    :class:`~corral.actors.planner.Placement` for each, and canonicalizing each for
    the digest, cost more than the rest of the pass. So:

    * each is kept per app, and reused while the view hands back *the very record
      object* it was built from (:func:`view_from_kvs` with its ``memo``, and the
      coordinator's :class:`~._view.ViewStore`, return an unchanged record as the same
      object; records are frozen);
    * when a section of the view is a :class:`Section` derived from the one the last
      pass used, only its ``changed`` keys are looked at, and so only they are
      canonicalized again for the digest: a pass costs O(changed records), plus
      copying references. Any other mapping is looked at whole.

    A node's digest part is kept while its :class:`~corral.actors.planner.NodeInfo`
    (and allocatable room) compares equal.

    Only what the last pass used is kept, so the memo stays the size of the view.
    One cache serves one sequence of passes (one coordinator); it is not
    thread-safe; :meth:`clear` empties it.
    """

    __slots__ = (
        "_app_text",
        "_apps",
        "_apps_dirty",
        "_apps_names",
        "_apps_out",
        "_joined",
        "_node_parts",
        "_placed",
        "_placed_by",
        "_placed_out",
        "_placed_source",
        "_placement_text",
        "_placements",
        "_placements_dirty",
        "_sized",
        "_specs",
    )

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything; the next pass builds every input anew."""
        # Each app's AppSpec, the output (and its names in order); each app's Placement;
        # for each, the names whose value changed since the digest last looked (None:
        # any may have).
        self._apps: _PerKey[AppRecord, AppSpec] = _PerKey(_app)
        self._apps_out: tuple[AppSpec, ...] = ()
        self._apps_names: tuple[str, ...] = ()
        self._apps_dirty: set[str] | None = None
        self._placements: _PerKey[CurrentPlacement, Placement] = _PerKey(
            _placement_of, _record_of
        )
        self._placements_dirty: set[str] | None = None
        # The digest's canonical text per app and per placement, each with the value
        # it was built for; the joined texts of the last digest (apps, placements).
        self._app_text: dict[str, tuple[AppSpec, str]] = {}
        self._placement_text: dict[str, tuple[Placement, str]] = {}
        self._joined: dict[str, tuple[object, str]] = {}
        self._node_parts: dict[str, tuple[NodeInfo, tuple[int, int] | None, str]] = {}
        # The apps declaring resources of an apps tuple, and the reservations of those
        # on a placements mapping.
        self._sized: tuple[object, object, list[AppSpec], tuple[dict[str, int], dict[str, int]]]
        self._sized = (None, None, [], ({}, {}))
        # Every node a placement names: how many placements name each, what each
        # placement named, and the answer for the placements mapping it was built from.
        self._placed: dict[str, int] = {}
        self._placed_by: dict[str, tuple[str, ...]] = {}
        self._placed_source: Mapping[str, CurrentPlacement] | None = None
        self._placed_out: frozenset[str] = frozenset()
        # The node spec of each app.
        self._specs: _PerKey[AppRecord, str] = _PerKey(AppRecord.node_spec)

    def __len__(self) -> int:
        return len(self._apps.values) + len(self._placements.values)

    def apps(self, records: Mapping[str, AppRecord]) -> tuple[AppSpec, ...]:
        """The planner's app for each record, sorted by name."""
        if records is self._apps.mapping:
            return self._apps_out
        self._apps_dirty = _noted(self._apps_dirty, self._apps.update(records))
        specs = self._apps.values
        self._apps_names = tuple(specs)
        self._apps_out = tuple(specs.values())
        return self._apps_out

    def placements(self, current: Mapping[str, CurrentPlacement]) -> dict[str, Placement]:
        """The planner's placement for each record, by app (sorted)."""
        if current is not self._placements.mapping:
            changed = self._placements.update(current)
            self._placements_dirty = _noted(self._placements_dirty, changed)
        return self._placements.values

    def node_specs(self, records: Mapping[str, AppRecord]) -> Mapping[str, str]:
        """:meth:`~corral.registry.AppRecord.node_spec` of each app, by name."""
        self._specs.update(records)
        return self._specs.values

    def placed(self, current: Mapping[str, CurrentPlacement]) -> frozenset[str]:
        """:func:`placed_nodes` of a view with these placements."""
        if current is self._placed_source:
            return self._placed_out
        changed = _changes(current, self._placed_source)
        counts, named = self._placed, self._placed_by
        if changed is None:
            counts, named = {}, {}
            changed = frozenset(current)
        for app in changed:
            for node in named.pop(app, ()):
                counts[node] -= 1
                if not counts[node]:
                    del counts[node]
            placed = current.get(app)
            if placed is not None:
                nodes = (*placed.record.nodes, *placed.record.placed_at)
                named[app] = nodes
                for node in nodes:
                    counts[node] = counts.get(node, 0) + 1
        self._placed, self._placed_by = counts, named
        self._placed_source = current
        self._placed_out = frozenset(counts)
        return self._placed_out


_S = TypeVar("_S")


def _same(item: object) -> object:
    return item


class _PerKey(Generic[_S, _V]):
    """A value derived from each item of a mapping, kept from one call to the next.

    An item whose source (``source_of(item)``: the item itself by default) is the very
    object a value was derived from keeps that value; for a :class:`Section` of the
    line last seen, only its changed keys are looked at at all. ``values`` is in key
    order, and a new dict whenever a value changed (one handed out is never altered).
    """

    __slots__ = ("_derive", "_entries", "_source_of", "mapping", "values")

    def __init__(
        self, derive: Callable[[_S], _V], source_of: Callable[[_S], object] = _same
    ) -> None:
        self._derive, self._source_of = derive, source_of
        self._entries: dict[str, tuple[object, _V]] = {}  # key -> (source, value)
        self.values: dict[str, _V] = {}
        #: The mapping ``values`` was derived from.
        self.mapping: Mapping[str, _S] | None = None

    def update(self, mapping: Mapping[str, _S]) -> frozenset[str] | None:
        """Derive the values of ``mapping``. Returns the keys looked at, or None when
        every key was."""
        if mapping is self.mapping:
            return frozenset()
        changed = _changes(mapping, self.mapping)
        self.mapping = mapping
        derive, source_of, entries = self._derive, self._source_of, self._entries
        if changed is None:
            kept: dict[str, tuple[object, _V]] = {}
            for key, item in _in_order(mapping):
                source, hit = source_of(item), entries.get(key)
                kept[key] = hit if hit is not None and hit[0] is source else (source, derive(item))
            self._entries = kept
            self.values = {key: value for key, (_, value) in kept.items()}
            return None
        same_keys = True
        for key in changed:
            found = mapping.get(key)
            if found is None:
                same_keys &= entries.pop(key, None) is None
                continue
            source, hit = source_of(found), entries.get(key)
            same_keys &= hit is not None
            if hit is None or hit[0] is not source:
                entries[key] = (source, derive(found))
        if same_keys:
            values = dict(self.values)  # the same keys: the order holds
            for key in changed:
                if key in entries:
                    values[key] = entries[key][1]
        else:  # a key came or went: the values stay in key order
            self._entries = entries = {key: entries[key] for key in mapping}
            values = {key: value for key, (_, value) in entries.items()}
        self.values = values
        return changed


def _noted(dirty: set[str] | None, changed: frozenset[str] | None) -> set[str] | None:
    """Names changed since the digest looked, given the keys an update looked at."""
    if changed is None:
        return None
    if dirty is not None:
        dirty.update(changed)
    return dirty


def _changes(
    current: Mapping[str, object], previous: Mapping[str, object] | None
) -> frozenset[str] | None:
    """The keys ``current`` changed from ``previous`` when both are sections of one line
    (see :class:`Section`); None when that is not known (look at every key)."""
    return current.changes_since(previous) if isinstance(current, Section) else None


def _in_order(mapping: Mapping[str, _V]) -> Iterable[tuple[str, _V]]:
    """The items of ``mapping`` sorted by key (a :class:`Section` is already)."""
    return mapping.items() if isinstance(mapping, Section) else sorted(mapping.items())


def _app(record: AppRecord) -> AppSpec:
    return AppSpec(
        name=record.name,
        replicas=record.replicas,
        selector=record.selector,
        memory_mb=record.memory_mb,
        disk_mb=record.disk_mb,
        pinned=record.pinned,
        retired=record.retired,
        blocked=record.blocked,
    )


def _record_of(placed: CurrentPlacement) -> PlacementRecord:
    return placed.record


def _placement_of(placed: CurrentPlacement) -> Placement:
    return _placement(placed.record)


def _placement(record: PlacementRecord) -> Placement:
    serving = set(record.nodes)
    return Placement(
        nodes=tuple(record.nodes),
        placed_at={node: when for node, when in record.placed_at.items() if node in serving},
        stopped=tuple(sorted(node for node in record.placed_at if node not in serving)),
        reserved=record.reserved,
    )


def placed_nodes(view: RegistryView) -> frozenset[str]:
    """Every node a placement record names: serving the app, or holding an instance
    a forced drain stopped (``placed_at`` keys outside ``nodes``)."""
    return frozenset(
        node
        for current in view.placements.values()
        for node in (*current.record.nodes, *current.record.placed_at)
    )


def states_from_view(
    view: RegistryView,
    *,
    policy: Policy,
    now: float,
    membership: Mapping[str, MemberStatus] | None = None,
    remembered: Mapping[str, NodeRecord] | None = None,
    cache: InputCache | None = None,
) -> NodeStates:
    """:func:`~._membership.node_states` over what one pass read.

    Args:
        view: what the pass read.
        policy: the planner's brakes (its grace period).
        now: wall-clock time of the pass.
        membership: node id -> status from SWIM; None until SWIM is wired in.
        remembered: the last record the coordinator saw of each node.
        cache: the memo of the previous passes (see :class:`InputCache`).
    """
    return node_states(
        view.nodes,
        intents=view.intents,
        down={node: current.record for node, current in view.down.items()},
        placed=placed_nodes(view) if cache is None else cache.placed(view.placements),
        now=now,
        grace_period_s=policy.grace_period_s,
        membership=membership,
        remembered=remembered,
    )


def plan_input_from_view(
    view: RegistryView,
    *,
    policy: Policy,
    now: float,
    membership: Mapping[str, MemberStatus] | None = None,
    states: NodeStates | None = None,
    cache: InputCache | None = None,
) -> PlanInput:
    """The planner's input for one pass.

    Args:
        view: what the pass read.
        policy: the planner's brakes.
        now: wall-clock time of the pass (placement and down times are wall-clock).
        membership: node id -> status from SWIM (used when ``states`` is not given).
        states: the node states already decided for this pass
            (:func:`states_from_view`); by default decided here, with no memory.
        cache: the memo of the previous passes (see :class:`InputCache`).

    Returns:
        A :class:`~corral.actors.planner.PlanInput` with apps and nodes sorted.
    """
    if states is None:
        states = states_from_view(view, policy=policy, now=now, membership=membership)
    if cache is None:
        cache = InputCache()  # the same code path, remembering nothing
    return PlanInput(
        apps=cache.apps(view.apps),
        nodes=states.nodes,
        placements=cache.placements(view.placements),
        policy=policy,
        now=now,
        undecodable=tuple(u.key for u in view.undecodable),
    )


def with_placements(
    view: RegistryView,
    written: Mapping[str, CurrentPlacement | None],
    down: Mapping[str, CurrentDown | None] | None = None,
) -> RegistryView:
    """The view as it stands after a pass wrote ``written`` placements and ``down``
    entries (None = deleted)."""
    placements = dict(view.placements)
    for app, current in written.items():
        if current is None:
            placements.pop(app, None)
        else:
            placements[app] = current
    entries = dict(view.down)
    for node, entry in (down or {}).items():
        if entry is None:
            entries.pop(node, None)
        else:
            entries[node] = entry
    return dataclasses.replace(
        view, placements=dict(sorted(placements.items())), down=dict(sorted(entries.items()))
    )


def inputs_digest(inputs: PlanInput, *, cache: InputCache | None = None) -> str:
    """A sha256 hex digest of what the planner decides from.

    Covers the apps, nodes, placements and undecodable keys of ``inputs`` —
    not the policy and not ``now`` — in a canonical form (sorted mappings),
    so equal inputs always give equal digests.

    Of a node's capacity only what can change a decision counts, so the
    refresh every node writes every 30 s does not make every pass run:

    * always, whether it reported capacity, whether its disk is readable,
      and whether its free disk is above the floor (apps declaring nothing
      still keep the floor);
    * when some live app declares resources, its allocatable memory and disk
      (:func:`~corral.actors.planner.allocatable`), which move only when
      placements or the node's totals do.

    Measured free memory and disk above the floor are not covered: the
    planner reads them as a second check whenever a pass runs for another
    reason, but their drift alone decides nothing new.

    Args:
        inputs: the planner's input.
        cache: the memo of the previous passes (see :class:`InputCache`): each
            app's, placement's and node's canonical part is encoded once while it
            stays the same object (the same value, for a node). The digest is the
            same with or without it.
    """
    if cache is None:
        cache = InputCache()  # the same code path, remembering nothing
    sized, reserved = _reservations(inputs, cache)
    known_nodes, kept_nodes = cache._node_parts, {}
    nodes = []
    for node in sorted(inputs.nodes, key=_id_of):
        cap = node.capacity
        room = (
            allocatable(cap, reserved[0].get(node.id, 0), reserved[1].get(node.id, 0))
            if cap is not None and sized
            else None
        )
        hit = known_nodes.get(node.id)
        if hit is not None and hit[0] == node and hit[1] == room:
            text = hit[2]
        else:
            canonical = _canonical(dataclasses.replace(node, capacity=None))
            canonical["capacity"] = None if cap is None else _capacity_input(cap)
            if room is not None:
                canonical["capacity"]["allocatable"] = list(room)
            text = _encode(canonical)
        kept_nodes[node.id] = (node, room, text)
        nodes.append(text)
    cache._node_parts = kept_nodes
    apps = _joined_apps(inputs.apps, cache)
    placements = _joined_placements(inputs.placements, cache)
    # Exactly ``json.dumps(document, sort_keys=True, separators=(",", ":"))`` of
    # {"apps": [...], "nodes": [...], "placements": {...}, "undecodable": [...]},
    # assembled from the kept parts.
    encoded = "".join(
        (
            '{"apps":[',
            apps,
            '],"nodes":[',
            ",".join(nodes),
            '],"placements":{',
            placements,
            '},"undecodable":',
            _encode(sorted(inputs.undecodable)),
            "}",
        )
    )
    return hashlib.sha256(encoded.encode()).hexdigest()


def _reservations(
    inputs: PlanInput, cache: InputCache
) -> tuple[list[AppSpec], tuple[dict[str, int], dict[str, int]]]:
    """The live apps declaring resources, and what their placements reserve per node
    (kept while the inputs' apps and placements are the same objects)."""
    apps_of, placements_of, sized, reserved = cache._sized
    if apps_of is not inputs.apps:
        sized = [a for a in inputs.apps if a.declares_resources and not (a.retired or a.blocked)]
    if apps_of is not inputs.apps or placements_of is not inputs.placements:
        reserved = reserved_by_placements(sized, inputs.placements) if sized else ({}, {})
        cache._sized = (inputs.apps, inputs.placements, sized, reserved)
    return sized, reserved


def _joined_apps(apps: tuple[AppSpec, ...], cache: InputCache) -> str:
    """The canonical texts of ``apps`` (sorted by name), joined by commas."""
    texts = cache._app_text
    if apps is cache._apps_out and cache._apps_dirty is not None:
        # Built by the cache: only the apps it changed since need a new text.
        names: Iterable[str] = cache._apps_names
        specs = cache._apps.values
        for name in cache._apps_dirty:
            spec = specs.get(name)
            if spec is None:
                texts.pop(name, None)
            elif (hit := texts.get(name)) is None or hit[0] is not spec:
                texts[name] = (spec, _encode(_canonical(spec)))
    else:
        ordered = sorted(apps, key=_name_of)
        kept: dict[str, tuple[AppSpec, str]] = {}
        for spec in ordered:
            hit = texts.get(spec.name)
            kept[spec.name] = (
                hit if hit is not None and hit[0] is spec else (spec, _encode(_canonical(spec)))
            )
        cache._app_text = texts = kept
        names = [spec.name for spec in ordered]
    if apps is cache._apps_out:
        cache._apps_dirty = set()
        joined = cache._joined.get("apps")
        if joined is not None and joined[0] is apps:
            return joined[1]
    else:
        cache._apps_dirty = None  # the texts are those of other inputs now
    text = ",".join([texts[name][1] for name in names])
    cache._joined["apps"] = (apps, text)
    return text


def _joined_placements(placements: Mapping[str, Placement], cache: InputCache) -> str:
    """``"<app>":<canonical text>`` of each placement (sorted by app), joined by commas."""
    texts = cache._placement_text
    if placements is cache._placements.values and cache._placements_dirty is not None:
        names: Iterable[str] = placements  # built by the cache: in app order
        for app in cache._placements_dirty:
            value = placements.get(app)
            if value is None:
                texts.pop(app, None)
            elif (hit := texts.get(app)) is None or hit[0] is not value:
                texts[app] = (value, f"{_encode(app)}:{_encode(_canonical(value))}")
    else:
        names = sorted(placements)
        kept: dict[str, tuple[Placement, str]] = {}
        for app in names:
            value = placements[app]
            hit = texts.get(app)
            kept[app] = (
                hit
                if hit is not None and hit[0] is value
                else (value, f"{_encode(app)}:{_encode(_canonical(value))}")
            )
        cache._placement_text = texts = kept
    if placements is cache._placements.values:
        cache._placements_dirty = set()
        joined = cache._joined.get("placements")
        if joined is not None and joined[0] is placements:
            return joined[1]
    else:
        cache._placements_dirty = None
    text = ",".join([texts[app][1] for app in names])
    cache._joined["placements"] = (placements, text)
    return text


_name_of = attrgetter("name")
_id_of = attrgetter("id")


def _encode(value: Any) -> str:
    """Canonical JSON text of an already canonical value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _capacity_input(cap: NodeCapacity) -> dict[str, Any]:
    """The part of a node's capacity that decides even when no app declares resources:
    whether its disk is readable, and whether its free disk is above the floor."""
    return {
        "readable": cap.disk_mb > 0,
        "above_floor": 10 * cap.disk_free_mb >= cap.disk_floor_x10,
    }


#: Field names per dataclass type, looked up once (``dataclasses.fields`` is slow and a
#: pass canonicalizes every app, node and placement).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_SCALARS: frozenset[type] = frozenset({str, int, bool, type(None)})


def _canonical(value: Any) -> Any:
    cls = type(value)
    if cls in _SCALARS:
        return value
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: _canonical(getattr(value, name)) for name in names}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 5 and 5.0 are the same input
    return value


def needs_time(inputs: PlanInput, decisions: Decisions) -> bool:
    """Whether a pass over these same inputs could decide differently later.

    True when a move was deferred (cooldowns lapse, the disruption budget
    refills) or a ``down`` node with a known ``down_since`` still holds work
    (its grace period lapses).
    """
    if decisions.deferred:
        return True
    holding = {node for p in inputs.placements.values() for node in p.nodes}
    return any(
        node.state == "down" and node.down_since is not None and node.id in holding
        for node in inputs.nodes
    )
