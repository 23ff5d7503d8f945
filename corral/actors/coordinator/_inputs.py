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
  ``placed_at`` but not in ``nodes`` (see :mod:`._writes`);
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    apps: dict[str, AppRecord] = {}
    nodes: dict[str, NodeRecord] = {}
    intents: dict[str, NodeIntent] = {}
    placements: dict[str, CurrentPlacement] = {}
    down: dict[str, CurrentDown] = {}
    undecodable: list[Undecodable] = []
    seen: dict[str, tuple[int, Record | Undecodable]] = {}
    for kv in kvs:
        known = None if memo is None else memo.get(kv.key)
        if known is not None and known[0] == kv.mod_revision:
            record = known[1]
        else:
            record = decode_record(kv.key, kv.value)
        if memo is not None:
            seen[kv.key] = (kv.mod_revision, record)
        name = kv.key.partition("/")[2]
        if isinstance(record, Undecodable):
            undecodable.append(record)
        elif isinstance(record, AppRecord):
            apps[name] = record
        elif isinstance(record, NodeRecord):
            nodes[name] = record
        elif isinstance(record, NodeIntent):
            intents[name] = record
        elif isinstance(record, PlacementRecord):
            placements[name] = CurrentPlacement(record, kv.mod_revision)
        elif isinstance(record, NodeDown):
            down[name] = CurrentDown(record, kv.mod_revision)
        else:
            undecodable.append(
                Undecodable(kv.key, f"a {type(record).__name__} is not expected here")
            )
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return RegistryView(
        apps=dict(sorted(apps.items())),
        nodes=dict(sorted(nodes.items())),
        intents=dict(sorted(intents.items())),
        placements=dict(sorted(placements.items())),
        undecodable=tuple(sorted(undecodable, key=lambda u: u.key)),
        down=dict(sorted(down.items())),
    )


class InputCache:
    """An optional memo for :func:`plan_input_from_view` and :func:`inputs_digest`,
    carried from one pass to the next.

    It is purely an optimisation: with it both return exactly what they return
    without it (equal inputs, the same digest), for any sequence of views. A pass
    at fleet size reads thousands of records of which a few changed; building and
    validating an :class:`~corral.actors.planner.AppSpec` and a
    :class:`~corral.actors.planner.Placement` for each, and canonicalizing each for
    the digest, cost more than the rest of the pass. So each is kept per app, and
    reused while the view hands back *the very record object* it was built from:
    :func:`view_from_kvs` with its ``memo`` returns an unchanged key's record as
    the same object (records are frozen), so a record that changed is always a
    new object, and a pass costs O(changed records) here. A node's digest part is
    kept while its :class:`~corral.actors.planner.NodeInfo` (and allocatable room)
    compares equal.

    Only what the last pass used is kept, so the memo stays the size of the view.
    One cache serves one sequence of passes (one coordinator); it is not
    thread-safe; :meth:`clear` empties it.
    """

    __slots__ = ("_app_parts", "_apps", "_node_parts", "_placement_parts", "_placements")

    def __init__(self) -> None:
        self._apps: dict[str, tuple[AppRecord, AppSpec]] = {}
        self._placements: dict[str, tuple[PlacementRecord, Placement]] = {}
        self._app_parts: dict[str, tuple[AppSpec, str]] = {}
        self._placement_parts: dict[str, tuple[Placement, str]] = {}
        self._node_parts: dict[str, tuple[NodeInfo, tuple[int, int] | None, str]] = {}

    def clear(self) -> None:
        """Forget everything; the next pass builds every input anew."""
        self._apps, self._placements = {}, {}
        self._app_parts, self._placement_parts, self._node_parts = {}, {}, {}

    def __len__(self) -> int:
        return len(self._apps) + len(self._placements)

    def apps(self, records: Mapping[str, AppRecord]) -> tuple[AppSpec, ...]:
        """The planner's app for each record, sorted by name."""
        known, kept = self._apps, {}
        specs = []
        for name, record in sorted(records.items()):
            hit = known.get(name)
            spec = hit[1] if hit is not None and hit[0] is record else _app(record)
            kept[name] = (record, spec)
            specs.append(spec)
        self._apps = kept
        return tuple(specs)

    def placements(self, current: Mapping[str, CurrentPlacement]) -> dict[str, Placement]:
        """The planner's placement for each record, by app (sorted)."""
        known, kept = self._placements, {}
        out = {}
        for app, placed in sorted(current.items()):
            record = placed.record
            hit = known.get(app)
            value = hit[1] if hit is not None and hit[0] is record else _placement(record)
            kept[app] = (record, value)
            out[app] = value
        self._placements = kept
        return out


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


def _placement(record: PlacementRecord) -> Placement:
    serving = set(record.nodes)
    return Placement(
        nodes=tuple(record.nodes),
        placed_at={node: when for node, when in record.placed_at.items() if node in serving},
        stopped=tuple(sorted(node for node in record.placed_at if node not in serving)),
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
) -> NodeStates:
    """:func:`~._membership.node_states` over what one pass read.

    Args:
        view: what the pass read.
        policy: the planner's brakes (its grace period).
        now: wall-clock time of the pass.
        membership: node id -> status from SWIM; None until SWIM is wired in.
        remembered: the last record the coordinator saw of each node.
    """
    return node_states(
        view.nodes,
        intents=view.intents,
        down={node: current.record for node, current in view.down.items()},
        placed=placed_nodes(view),
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
    sized = [a for a in inputs.apps if a.declares_resources and not (a.retired or a.blocked)]
    reserved = reserved_by_placements(sized, inputs.placements) if sized else ({}, {})
    known_nodes, kept_nodes = cache._node_parts, {}
    nodes = []
    for node in sorted(inputs.nodes, key=lambda n: n.id):
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
    cache._app_parts, apps = _parts(
        sorted(((a.name, a) for a in inputs.apps), key=_by_name), cache._app_parts
    )
    cache._placement_parts, placements = _parts(
        sorted(inputs.placements.items(), key=_by_name), cache._placement_parts
    )
    # Exactly ``json.dumps(document, sort_keys=True, separators=(",", ":"))`` of
    # {"apps": [...], "nodes": [...], "placements": {...}, "undecodable": [...]},
    # assembled from the kept parts.
    encoded = "".join(
        (
            '{"apps":[',
            ",".join(text for _, text in apps),
            '],"nodes":[',
            ",".join(nodes),
            '],"placements":{',
            ",".join(f"{_encode(app)}:{text}" for app, text in placements),
            '},"undecodable":',
            _encode(sorted(inputs.undecodable)),
            "}",
        )
    )
    return hashlib.sha256(encoded.encode()).hexdigest()


def _encode(value: Any) -> str:
    """Canonical JSON text of an already canonical value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _by_name(item: tuple[str, object]) -> str:
    return item[0]


_V = TypeVar("_V")


def _parts(
    items: Iterable[tuple[str, _V]], known: Mapping[str, tuple[_V, str]]
) -> tuple[dict[str, tuple[_V, str]], list[tuple[str, str]]]:
    """The canonical JSON text of each (name, value), in order, and the memo to keep:
    a value that is the very object the last pass encoded keeps its text."""
    kept: dict[str, tuple[_V, str]] = {}
    texts: list[tuple[str, str]] = []
    for name, value in items:
        hit = known.get(name)
        text = hit[1] if hit is not None and hit[0] is value else _encode(_canonical(value))
        kept[name] = (value, text)
        texts.append((name, text))
    return kept, texts


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
