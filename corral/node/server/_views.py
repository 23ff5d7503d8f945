"""What ``corral ps`` shows: one row per app instance, from registry records.

Theory of operation: the registry says what each app wants (``apps/``), where
the coordinator put it (``placement/``), what each node serves (``nodes/`` —
the ``serving`` map the Reconciler publishes) and what the operator intends for
each node (``intent/``). A row is an (app, node) pair that is placed there or
served there; its state is the serving state, or ``pending`` (no placement yet:
the coordinator has not decided, or cannot place it — ``corral state`` says
why), ``starting`` (placed, not serving yet), ``stopping`` (serving, no longer
placed), ``node-gone`` (placed on a node with no live record) or ``stopped``:
a pinned app's instance that a forced drain stopped. The coordinator keeps
such a node in the placement record's ``placed_at`` but not in its ``nodes``
(so a pinned app whose only instance was stopped has ``nodes == []``); the
instance is not started elsewhere, and starts on its node again once the
drain ends.

The RELOC column says whether the instance could be moved elsewhere, or why
not: it is pinned, it runs everywhere it may (``replicas all``), or no other
node could take it. An instance placed less than the coordinator's cooldown
ago moves only if its node is lost (drained, stopped, dead), never to
rebalance, and RELOC says how long that lasts. The cooldown is the
coordinator's own (:class:`CoordinatorView`, from the lease holder's state:
its policy, and the ``until`` of each move it deferred); when that state
cannot be had RELOC says the cooldown is unknown rather than guessing.

:func:`node_rows` is the node list (``corral node ls``): each node's state as
the lease holder's coordinator decided it (:class:`NodeStatesView`: membership,
records and down entries combined, with incarnation, since when and, for a
down node, when its grace lapses), with the operator's intent on top; when the
holder cannot be asked, each node's record with the intent on top, and the
answer says so. Pure: no I/O, no clock (``now`` is given).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from corral._text import duration
from corral.actors.coordinator import (
    CoordinatorState,
    NodeStatus,
    ObservedInstance,
    restart_phase,
    rollout_status,
)
from corral.actors.planner import (
    AppSpec,
    NodeCapacity,
    Placement,
    allocatable,
    reserved_by_placements,
)
from corral.registry import AppRecord, NodeIntent, NodeRecord, PlacementRecord, ServingEntry


@dataclass(frozen=True)
class PsRow:
    app: str
    node: str
    state: str
    public_port: int | None
    internal_port: int | None
    restarts: int
    revision: str | None
    reloc: str
    #: why the instance is in this state, when the state alone does not say (``stopped``,
    #: ``failed``, ``crash-loop``).
    reason: str | None = None
    #: the app's rolling deploy (``rolling 1/3``, ``halted: ...``; None: none) and
    #: this instance's step in it (see :func:`rollout_cells`).
    rollout: str | None = None
    rollout_step: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CoordinatorUnavailable:
    """Why the lease holder's coordinator state cannot be had, given in its place.

    Attributes:
        holder: the node that holds the lease (the one asked), or None when none does.
        error: what went wrong, in words.
    """

    holder: str | None
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder, "error": self.error}


#: What a node knows of the lease holder's coordinator.
Coordination = CoordinatorState | CoordinatorUnavailable


@dataclass(frozen=True)
class CoordinatorView:
    """What RELOC knows of the coordinator: its cooldown and the moves it deferred.

    Attributes:
        cooldown_s: the policy's cooldown after a placement; None when unknown.
        deferred: (app, node) -> when a move the coordinator deferred may go
            (wall-clock), or None for a move held back by the disruption budget.
        holder: the node whose coordinator answered (or was asked).
        error: why the coordinator's state could not be had (then ``cooldown_s``
            is None).
    """

    cooldown_s: float | None = None
    deferred: Mapping[tuple[str, str], float | None] = field(default_factory=dict)
    holder: str | None = None
    error: str | None = None

    @classmethod
    def from_state(cls, state: Coordination | None) -> CoordinatorView:
        """From the lease holder's coordinator state (whose ``node`` is the holder), or
        what a node gives in its place (:class:`CoordinatorUnavailable`; None: no
        coordinator holds the lease)."""
        if state is None:
            return cls(error="no coordinator holds the lease right now")
        if isinstance(state, CoordinatorUnavailable):
            return cls(holder=state.holder, error=state.error)
        deferred = {(d.app, d.node): d.until for d in state.deferred}
        return cls(cooldown_s=state.policy.cooldown_s, deferred=deferred, holder=state.node)

    def unknown_because(self) -> str:
        """Why the cooldown is unknown, in a few words (the full reason is ``error``)."""
        error = self.error or ""
        if self.holder is None:
            return "no node holds the coordinator lease yet"
        if "no reply" in error or "within" in error:
            return f"coordinator {self.holder} is busy and did not answer in time"
        return f"coordinator {self.holder} cannot be asked"

    def to_json(self) -> dict[str, Any]:
        """What ``GET /v1/ps`` says of the coordinator next to the rows."""
        if self.error is not None:
            return {"holder": self.holder, "error": self.error}
        return {"holder": self.holder, "cooldown_s": self.cooldown_s}


def stopped_reason(node: str, forced_drain: bool = True) -> str:
    """Why a stopped pinned instance stays stopped (``PsRow.reason``): the forced drain
    of its node, or (``forced_drain`` False: the drain ended, or its new resources do not
    fit there) its node cannot take it back yet."""
    if forced_drain:
        return f"forced drain of {node}; pinned, not started elsewhere"
    return (
        f"{node} cannot take it back yet (it takes no work, or lacks the room it asks; "
        "corral state says which); pinned, not started elsewhere"
    )


def _takes_work(node: NodeRecord, intent: NodeIntent | None) -> bool:
    if node.state != "alive":
        return False
    return intent is None or not (intent.cordoned or intent.draining)


def relocation(
    app: AppRecord,
    node: str,
    placed_on: frozenset[str],
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    *,
    placed_at: float | None = None,
    now: float | None = None,
    coordinator: CoordinatorView | None = None,
) -> str:
    """``yes``, ``yes (<limit>)`` or ``no (<why>)``: could this instance move off ``node``?

    Args:
        app, node: the instance.
        placed_on: every node the app is placed on.
        nodes, intents: node records and operator intents, by node id.
        placed_at: when the coordinator placed this instance (wall-clock), if known.
        now: the wall-clock time to judge the cooldown at; without it (or without
            ``coordinator``) the cooldown is not judged.
        coordinator: the coordinator's cooldown and deferred moves, or why they are
            unknown.
    """
    if app.pinned:
        return "no (pinned)"
    if app.replicas == "all":
        return "no (replicas all: runs on every eligible node)"
    others = [
        record
        for node_id, record in nodes.items()
        if node_id != node
        and node_id not in placed_on
        and _takes_work(record, intents.get(node_id))
        and all(record.labels.get(k) == v for k, v in app.selector.items())
    ]
    if not others:
        why = "no other node matches the selector" if app.selector else "no other node takes work"
        return f"no ({why})"
    if now is None or coordinator is None:
        return "yes"
    key = (app.name, node)
    if key in coordinator.deferred:
        until = coordinator.deferred[key]
        if until is None:
            return "yes (deferred by the disruption budget: moves on a later pass)"
    elif coordinator.cooldown_s is not None:
        until = None if placed_at is None else placed_at + coordinator.cooldown_s
    elif placed_at is not None:
        return f"yes (cooldown unknown: {coordinator.unknown_because()})"
    else:
        until = None
    if until is not None and now < until:
        return f"yes (only if its node is lost: cooldown, {duration(until - now)} left)"
    return "yes"


def _stopped_on(app: AppRecord, placement: PlacementRecord | None) -> frozenset[str]:
    """Nodes where a forced drain stopped this pinned app's instance: kept in the
    record's ``placed_at`` but not in its ``nodes`` (an unpinned app forgets them)."""
    if placement is None or not app.pinned or app.retired or app.blocked:
        return frozenset()
    return frozenset(placement.placed_at) - frozenset(placement.nodes)


def rollout_cells(
    placement: PlacementRecord | None, node: str, entry: ServingEntry | None
) -> tuple[str | None, str | None]:
    """The app's rollout status (``rolling 1/3``, ``halted: reason``) and ``node``'s
    step in it (``pending``, ``out-of-table``, ``draining``, ``stopping``,
    ``starting``, ``waiting-ready``, ``done``); (None, None) with no rollout."""
    rollout = None if placement is None else placement.rollout
    if rollout is None:
        return None, None
    step = rollout.nodes.get(node)
    phase = None
    if step is not None:
        phase = restart_phase(step, None if entry is None else ObservedInstance.of(entry))
    return rollout_status(rollout), phase


def ps_rows(
    apps: Mapping[str, AppRecord],
    placements: Mapping[str, PlacementRecord],
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    *,
    now: float | None = None,
    coordinator: CoordinatorView | None = None,
) -> list[PsRow]:
    """Rows sorted by app then node. Keys of every mapping are names (not registry keys).

    ``now`` (wall-clock) and ``coordinator`` let RELOC tell an instance still in its
    cooldown; without them the cooldown is not shown.
    """
    rows: list[PsRow] = []
    for name in sorted(apps):
        app = apps[name]
        placement = placements.get(name)
        placed_on = frozenset(placement.nodes if placement else ())
        stopped_on = _stopped_on(app, placement)
        serving_on = {node_id for node_id, record in nodes.items() if name in record.serving}
        if not placed_on and not serving_on and not stopped_on:
            state = (
                "retired"
                if app.retired
                else ("undeployed" if app.deployment is None else "pending")
            )
            rows.append(PsRow(name, "-", state, None, None, 0, None, "-"))
            continue
        for node_id in sorted(placed_on | serving_on | stopped_on):
            record = nodes.get(node_id)
            entry = record.serving.get(name) if record else None
            intent = intents.get(node_id)
            reason = (
                stopped_reason(
                    node_id, intent is not None and intent.draining and intent.force
                )
                if node_id in stopped_on
                else None
            )
            if entry is not None:
                state = entry.state if node_id in placed_on else "stopping"
            elif reason is not None:
                state = "stopped"
            elif record is None:
                state = "node-gone"
            else:
                state = "starting"
            reloc = (
                f"no ({reason})"
                if reason is not None
                else relocation(
                    app,
                    node_id,
                    placed_on,
                    nodes,
                    intents,
                    placed_at=placement.placed_at.get(node_id) if placement else None,
                    now=now,
                    coordinator=coordinator,
                )
            )
            rows.append(
                PsRow(
                    app=name,
                    node=node_id,
                    state=state,
                    # a revision that never got onto disk has no ports yet (0)
                    public_port=(entry.public_port or None) if entry else None,
                    internal_port=(entry.internal_port or None) if entry else None,
                    restarts=entry.restarts if entry else 0,
                    revision=entry.revision if entry else None,
                    reloc=reloc,
                    # why it is stopped, or why it is failed / crash-looping
                    reason=reason or (entry.reason if entry and entry.reason else None),
                )
            )
            status, step = rollout_cells(placement, node_id, entry)
            if status is not None:
                rows[-1] = replace(rows[-1], rollout=status, rollout_step=step)
    return rows


@dataclass(frozen=True)
class NodeRow:
    """One node as ``corral node ls`` shows it."""

    node: str
    state: str
    serving: int
    labels: dict[str, str]
    rack: str | None
    datacenter: str | None
    api_address: str | None
    coordinator: bool
    #: membership's incarnation (None until membership is wired in).
    incarnation: int | None = None
    #: wall-clock time the node entered its state, as the coordinator knows it.
    since: float | None = None
    #: when the coordinator decided it was down (down nodes only).
    down_since: float | None = None
    #: when its grace lapses and its work is relocated (down nodes only).
    grace_until: float | None = None
    #: memory and disk in MiB, total and free (the record's ``capacity``), when it says.
    capacity: dict[str, int] | None = None
    #: what the planner can still promise there: the totals minus the declared
    #: ``memory_mb`` / ``disk_mb`` of every instance placed on it (disk: minus the floor).
    allocatable: dict[str, int] | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class NodeStatesView:
    """The node states of the lease holder's coordinator (its last pass), or why not.

    Attributes:
        states: node id -> the coordinator's status of it (``state``, ``since``,
            ``down_since``, ``grace_until``, ``incarnation``...); None when unknown.
        holder: the node whose coordinator answered (or was asked).
        error: why the states could not be had (then ``states`` is None).
    """

    states: Mapping[str, NodeStatus] | None = None
    holder: str | None = None
    error: str | None = None

    @classmethod
    def from_state(cls, state: Coordination | None) -> NodeStatesView:
        """From the lease holder's coordinator state, or what a node gives in its place
        (:class:`CoordinatorUnavailable`; None: no coordinator holds the lease)."""
        view = CoordinatorView.from_state(state)
        if not isinstance(state, CoordinatorState):
            return cls(holder=view.holder, error=view.error)
        if not state.coordinating:
            return cls(
                holder=view.holder,
                error=f"coordinator {view.holder} does not report node states: it does not "
                "hold the lease",
            )
        return cls(states={status.node: status for status in state.node_states}, holder=view.holder)

    def to_json(self) -> dict[str, Any]:
        """What ``GET /v1/nodes`` says of where the states came from."""
        if self.error is not None:
            return {"source": "records", "holder": self.holder, "error": self.error}
        return {"source": "coordinator", "holder": self.holder}


def node_state(record: NodeRecord | None, intent: NodeIntent | None) -> str:
    """The node's state with the operator's intent on top, as the operator reads it.

    ``draining`` (``draining, forced`` for a forced drain) and ``cordoned`` come from
    the intent; otherwise the record's own state; ``gone`` when there is no live
    record (the node stopped or its lease lapsed) but an intent is still kept.
    """
    if record is None:
        base = "gone"
    else:
        base = record.state
    if intent is not None and intent.draining:
        text = "draining, forced" if intent.force else "draining"
        return text if record is not None else f"gone ({text})"
    if intent is not None and intent.cordoned:
        return "cordoned" if record is not None else "gone (cordoned)"
    return base


def _state_text(status: NodeStatus, intent: NodeIntent | None) -> str:
    """The coordinator's state of a node, with the intent named as the operator gave it
    (also when the coordinator has not run a pass since the intent was written)."""
    state: str = status.state
    if intent is not None and intent.draining:
        return "draining, forced" if intent.force else "draining"
    if intent is not None and intent.cordoned and state in ("alive", "suspect"):
        return "cordoned"
    return state


def node_rows(
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    coordinator: str | None,
    states: NodeStatesView | None = None,
    *,
    apps: Mapping[str, AppRecord] | None = None,
    placements: Mapping[str, PlacementRecord] | None = None,
) -> list[NodeRow]:
    """Every node with a live record, an operator intent or a state the coordinator
    keeps (a down node whose record lapsed), sorted by id.

    ``states``: the coordinator's node states; without them (or when they could not
    be had) each state is the record's with the intent on top (:func:`node_state`).
    ``apps`` and ``placements`` (by name) give each node's allocatable memory and disk.
    """
    known = {} if states is None or states.states is None else states.states
    reserved_mem, reserved_disk = reserved_by_placements(
        [
            AppSpec(
                a.name,
                memory_mb=a.memory_mb,
                disk_mb=a.disk_mb,
                retired=a.retired,
                blocked=a.blocked,
            )
            for a in (apps or {}).values()
        ],
        {
            name: Placement(nodes=tuple(p.nodes), reserved=p.reserved)
            for name, p in (placements or {}).items()
        },
    )
    rows: list[NodeRow] = []
    for node_id in sorted(set(nodes) | set(intents) | set(known)):
        record = nodes.get(node_id)
        status = known.get(node_id)
        rows.append(
            NodeRow(
                node=node_id,
                state=node_state(record, intents.get(node_id))
                if status is None
                else _state_text(status, intents.get(node_id)),
                serving=len(record.serving) if record else 0,
                labels=dict(record.labels) if record else {},
                rack=record.rack if record else None,
                datacenter=record.datacenter if record else None,
                api_address=(record.api_address or None) if record else None,
                coordinator=node_id == coordinator,
                incarnation=None if status is None else status.incarnation,
                since=None if status is None else status.since,
                down_since=None if status is None else status.down_since,
                grace_until=None if status is None else status.grace_until,
                capacity=record.capacity.to_json() if record and record.capacity else None,
                allocatable=_allocatable(
                    record, reserved_mem.get(node_id, 0), reserved_disk.get(node_id, 0)
                ),
            )
        )
    return rows


def _allocatable(record: NodeRecord | None, memory: int, disk: int) -> dict[str, int] | None:
    if record is None or record.capacity is None:
        return None
    c = record.capacity
    mem, disk10 = allocatable(
        NodeCapacity(c.memory_mb, c.memory_free_mb, c.disk_mb, c.disk_free_mb), memory, disk
    )
    return {"memory_mb": mem, "disk_mb": disk10 // 10}
