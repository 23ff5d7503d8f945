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
from typing import Any

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
) -> PlanInput:
    """The planner's input for one pass.

    Args:
        view: what the pass read.
        policy: the planner's brakes.
        now: wall-clock time of the pass (placement and down times are wall-clock).
        membership: node id -> status from SWIM (used when ``states`` is not given).
        states: the node states already decided for this pass
            (:func:`states_from_view`); by default decided here, with no memory.

    Returns:
        A :class:`~corral.actors.planner.PlanInput` with apps and nodes sorted.
    """
    if states is None:
        states = states_from_view(view, policy=policy, now=now, membership=membership)
    return PlanInput(
        apps=tuple(_app(record) for _, record in sorted(view.apps.items())),
        nodes=states.nodes,
        placements={
            app: _placement(current.record) for app, current in sorted(view.placements.items())
        },
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


def inputs_digest(inputs: PlanInput) -> str:
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
    """
    sized = [a for a in inputs.apps if a.declares_resources and not (a.retired or a.blocked)]
    if sized:
        reserved = reserved_by_placements(sized, inputs.placements)
    nodes = []
    for node in sorted(inputs.nodes, key=lambda n: n.id):
        canonical = _canonical(dataclasses.replace(node, capacity=None))
        cap = node.capacity
        canonical["capacity"] = None if cap is None else _capacity_input(cap)
        if cap is not None and sized:
            mem, disk10 = allocatable(cap, reserved[0].get(node.id, 0), reserved[1].get(node.id, 0))
            canonical["capacity"]["allocatable"] = [mem, disk10]
        nodes.append(canonical)
    document = {
        "apps": [_canonical(app) for app in sorted(inputs.apps, key=lambda a: a.name)],
        "nodes": nodes,
        "placements": {app: _canonical(p) for app, p in sorted(inputs.placements.items())},
        "undecodable": sorted(inputs.undecodable),
    }
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


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
