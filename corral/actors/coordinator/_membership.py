"""Node states for the planner: membership, registry records and down entries (pure).

Theory of operation
-------------------
The lease holder sees each node through two windows: the node's leased
registry record (``nodes/<id>``, gone a TTL after the node stops renewing it)
and, once SWIM is wired in, the membership view (:class:`MemberStatus` per
node: ``alive``, ``suspect``, ``dead`` or ``left``, with an incarnation). A
lapsed record alone says little — a registry blip, a GC pause or a stopped
process all look the same from the registry — so :func:`node_states` combines
both, one node at a time:

====================  ==========================  ================================
record                membership                  state
====================  ==========================  ================================
present               none (not wired, or no      the record's own (``alive``)
                      view of this node)
present               alive / suspect             alive / suspect
present or lapsed     dead                        ``down``
present               left                        ``alive``: a live, renewing
                                                  record contradicts the leave
lapsed                left                        ``left`` (moves at once)
lapsed                alive                       ``alive``: a registry blip; the
                                                  last known record gives capacity
                                                  and labels
lapsed                none, suspect               ``down``: the registry lost it
                                                  and SWIM cannot reach it
====================  ==========================  ================================

A graceful stop withdraws the node's record, so a leave is believed only once
the record is gone: a ``left`` said while the record still renews is not the
node's doing (a forged or stale claim), and moves nothing.

The operator's intent goes on top (:func:`~._inputs.effective_state`):
draining is ``left``, cordoning an alive or suspect node is ``cordoned``.

**down_since: one clock per down spell.** A ``down`` node keeps its work until
the policy's grace period after ``down_since`` lapses; the planner then relocates
it. ``down_since`` is the time of the pass that first decided the node was down
in its current *spell*, and is recorded in the registry as ``down/<node>``
(:class:`~corral.registry.NodeDown`, written under the coordinator's fence) so
that a successor coordinator neither restarts the grace clock nor forgets it: an
entry's ``down_since`` is reused for as long as the spell lasts. A pass that finds
the node back (alive, suspect with a live record, left) deletes the entry, so the
next spell starts a clock of its own.

A comeback no pass saw must end the spell too: a pass can miss one (the lease
holder stalled on the registry, or no node held the lease, while the node came
back and went down again), and the old clock would then move the work of a node
lost moments ago at once. So the entry says which spell it is (:func:`_spell`):
the node's membership incarnation when the spell began and its life (the
instance token of its live record; a remembered record may be a life ago). Only
a node raises its own incarnation (hearsay above what it announced is not
believed) and a new life starts above every earlier one, so a node seen at a
higher incarnation than the entry's spoke since the spell began; a live record
of another life means it restarted. Either way it came back, and its clock
starts now (:func:`_earlier_spell`). A lower incarnation (a successor that knows
the node only by hearsay, at 0) is no evidence and keeps the clock; with no
evidence at all (no membership view, the record lapsed) the clock is kept, as
before.

The entry also carries the node's last known labels, rack, datacenter and
capacity, so a successor knows a node whose record had already lapsed when it
took over. A node whose record lapsed while membership still reaches it gets an
entry too, with no ``down_since``, for the same reason.

**Memory.** The coordinator also keeps the last record it saw of every node
(``remembered``), so a record that lapses between two passes is still known
in full. What is known of a node without a record comes from that memory, or
else from its down entry; a node known from neither (its record lapsed while
no coordinator was looking, and nobody wrote an entry) has no labels or
capacity.

**Bounded growth.** A node without a record that no placement names (every
instance of its work was relocated, or it never had any) is dropped: it is
not handed to the planner, forgotten, and its entry deleted. A node whose
record is back and that is not down is alive again: its entry is deleted and
none of its work moved, if that happened within the grace.

Everything here is a function of its arguments: no clock, no I/O, no trio.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from corral.actors.planner import NodeCapacity, NodeInfo, NodeState
from corral.registry import MeasuredCapacity, NodeDown, NodeIntent, NodeRecord

__all__ = [
    "MEMBER_STATES",
    "CurrentDown",
    "MemberState",
    "MemberStatus",
    "NodeStates",
    "NodeStatus",
    "effective_state",
    "node_states",
]

MemberState = Literal["alive", "suspect", "dead", "left"]
"""How membership (SWIM) sees a member."""

MEMBER_STATES: Final[tuple[MemberState, ...]] = ("alive", "suspect", "dead", "left")


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member as the membership view reports it.

    Attributes:
        state: ``alive``, ``suspect``, ``dead`` (declared dead, not by leave) or
            ``left`` (a graceful leave).
        incarnation: the member's incarnation number (refutations raise it).
        since: wall-clock time the member entered ``state``, if known.
    """

    state: MemberState
    incarnation: int = 0
    since: float | None = None

    def __post_init__(self) -> None:
        if self.state not in MEMBER_STATES:
            raise ValueError(
                f"member state must be one of {', '.join(MEMBER_STATES)}, got {self.state!r}"
            )
        if isinstance(self.incarnation, bool) or not isinstance(self.incarnation, int) or (
            self.incarnation < 0
        ):
            raise ValueError(f"incarnation must be an integer >= 0, got {self.incarnation!r}")
        if self.since is not None and not math.isfinite(self.since):
            raise ValueError(f"since must be a finite time, got {self.since!r}")


@dataclass(frozen=True, slots=True)
class CurrentDown:
    """A ``down/<node>`` entry as a pass read it, with the mod revision its write is
    guarded on."""

    record: NodeDown
    mod_revision: int


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node's state as ``corral node ls`` shows it (the planner's, intent included).

    Attributes:
        node: the node id.
        state: what the planner is given.
        since: wall-clock time the node entered that state, as best known
            (membership's ``since``; ``down_since`` for a down node; the record's
            ``started_at`` otherwise), or None.
        down_since: when the node was decided down (``down`` nodes only).
        grace_until: when its grace lapses and its work moves (``down`` only).
        incarnation: the membership incarnation, None without a membership view.
        record: whether its leased registry record exists.
        reason: how the state was decided, in words.
    """

    node: str
    state: NodeState
    since: float | None
    down_since: float | None
    grace_until: float | None
    incarnation: int | None
    record: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "state": self.state,
            "since": self.since,
            "down_since": self.down_since,
            "grace_until": self.grace_until,
            "incarnation": self.incarnation,
            "record": self.record,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class NodeStates:
    """What :func:`node_states` decided.

    Attributes:
        nodes: the planner's nodes, sorted by id.
        statuses: the same nodes as ``corral node ls`` shows them, sorted by id.
        down_writes: node -> the ``down/<node>`` entry to write, or None to delete
            it; only entries that differ from what was read.
        remembered: the last known record of every node still handed to the
            planner (the coordinator keeps it for the next pass).
        next_deadline: the earliest grace deadline still ahead of ``now`` of a down
            node that holds work (wall-clock), or None: a pass is due then.
    """

    nodes: tuple[NodeInfo, ...] = ()
    statuses: tuple[NodeStatus, ...] = ()
    down_writes: Mapping[str, NodeDown | None] = field(default_factory=dict)
    remembered: Mapping[str, NodeRecord] = field(default_factory=dict)
    next_deadline: float | None = None


def effective_state(
    record_state: NodeState, intent: NodeIntent | None, membership: NodeState | None = None
) -> NodeState:
    """The state the planner is given for one node: its own state with the intent on top.

    Args:
        record_state: the node's state before intent (its record's, or what
            :func:`node_states` decided).
        intent: the operator's ``intent/<node>``, if any.
        membership: a state overriding ``record_state`` when given.

    Returns:
        ``left`` when draining; ``cordoned`` when cordoned and the node is
        ``alive`` or ``suspect``; otherwise the membership or record state.
    """
    state: NodeState = membership if membership is not None else record_state
    if intent is None:
        return state
    if intent.draining:
        return "left"
    if intent.cordoned and state in ("alive", "suspect"):
        return "cordoned"
    return state


def _capacity(capacity: MeasuredCapacity | None) -> NodeCapacity | None:
    if capacity is None:
        return None
    return NodeCapacity(
        memory_mb=capacity.memory_mb,
        memory_free_mb=capacity.memory_free_mb,
        disk_mb=capacity.disk_mb,
        disk_free_mb=capacity.disk_free_mb,
    )


def _from_entry(entry: NodeDown) -> NodeRecord:
    return NodeRecord(
        id=entry.node,
        labels=dict(entry.labels),
        rack=entry.rack,
        datacenter=entry.datacenter,
        capacity=entry.capacity,
    )


def _earlier_spell(
    entry: NodeDown, member: MemberStatus | None, record: NodeRecord | None
) -> bool:
    """Whether the node came back since ``entry``'s spell began, so its clock is not
    this spell's: membership knows it at a higher incarnation than the spell began at
    (only the node raises its incarnation: it refuted, or a new life spoke), or its
    live record is another life's (it restarted)."""
    if (
        entry.incarnation is not None
        and member is not None
        and member.incarnation > entry.incarnation
    ):
        return True
    return bool(
        record is not None
        and record.instance
        and entry.instance
        and record.instance != entry.instance
    )


def _spell(
    entry: NodeDown | None,
    member: MemberStatus | None,
    record: NodeRecord | None,
    now: float,
) -> tuple[float, int | None, str]:
    """A down node's ``(down_since, incarnation, instance)``: the entry's own while
    its spell lasts (filling in what it did not know), else a new spell's, from now.
    The life is taken from a live record only: a remembered one may be a life ago."""
    incarnation = None if member is None else member.incarnation
    instance = "" if record is None else record.instance
    if entry is None or entry.down_since is None or _earlier_spell(entry, member, record):
        return now, incarnation, instance
    return (
        entry.down_since,
        entry.incarnation if entry.incarnation is not None else incarnation,
        entry.instance or instance,
    )


def _written_fields(entry: NodeDown) -> tuple[object, ...]:
    """The fields an entry is rewritten for when they change (not the capacity: a
    live record's moves with every report; the next rewrite carries it)."""
    return (
        entry.down_since,
        entry.incarnation,
        entry.instance,
        entry.labels,
        entry.rack,
        entry.datacenter,
    )


def _base_state(
    record: NodeRecord | None, member: MemberStatus | None
) -> tuple[NodeState, str]:
    """The state before intent, and why (the table of the module docstring)."""
    if member is not None and member.state == "dead":
        return "down", "membership declared it dead"
    if member is not None and member.state == "left":
        if record is None:
            return "left", "it left the cluster (membership) and withdrew its record"
        return "alive", (
            "membership says it left, but its registry record is live and renewing "
            "(a leave counts once the record is withdrawn)"
        )
    if record is not None:
        if member is None:
            return record.state, "its registry record is live"
        if member.state == "suspect":
            return "suspect", "membership suspects it"
        return "alive", "membership says alive"
    if member is not None and member.state == "alive":
        return "alive", "its registry record lapsed but membership still reaches it"
    if member is not None:
        return "down", f"its registry record lapsed and membership says {member.state}"
    return "down", "its registry record lapsed and membership has no view of it"


def node_states(
    records: Mapping[str, NodeRecord],
    *,
    intents: Mapping[str, NodeIntent],
    down: Mapping[str, NodeDown],
    placed: Iterable[str],
    now: float,
    grace_period_s: float,
    membership: Mapping[str, MemberStatus] | None = None,
    remembered: Mapping[str, NodeRecord] | None = None,
) -> NodeStates:
    """Decide every node's state for one pass (see the module docstring).

    Args:
        records: live ``nodes/<id>`` records, by node id.
        intents: the operator's ``intent/<node>``, by node id.
        down: the ``down/<node>`` entries read this pass, by node id.
        placed: every node some placement record names (serving, or holding a
            stopped pinned instance).
        now: wall-clock time of the pass; the ``down_since`` of a node found
            down for the first time.
        grace_period_s: the policy's grace period (for ``grace_until`` and
            ``next_deadline``).
        membership: node id -> status from SWIM; None when membership is not
            wired in (the same as a view that knows no node).
        remembered: the last record the coordinator saw of each node.

    Returns:
        The planner's nodes, their statuses, the down entries to write or
        delete, the memory to keep and the next grace deadline.
    """
    remembered = remembered or {}
    members = membership or {}
    held = set(placed)
    infos: list[NodeInfo] = []
    statuses: list[NodeStatus] = []
    writes: dict[str, NodeDown | None] = {}
    memory: dict[str, NodeRecord] = {}
    deadlines: list[float] = []
    for node_id in sorted(set(records) | set(remembered) | set(down) | held):
        record = records.get(node_id)
        entry = down.get(node_id)
        if record is None and node_id not in held:
            # Nothing of it is left to protect: forget it (bounded growth).
            if entry is not None:
                writes[node_id] = None
            continue
        last = record or remembered.get(node_id) or (None if entry is None else _from_entry(entry))
        if last is None:
            last = NodeRecord(id=node_id)
        member = members.get(node_id)
        base, reason = _base_state(record, member)
        down_since: float | None = None
        incarnation: int | None = None
        instance = ""
        # A live record that itself says "down" (no node writes one today) is its
        # own source: its down_since is used as it is, and no entry is kept.
        self_declared = record is not None and member is None and base == "down"
        if self_declared:
            assert record is not None
            down_since = record.down_since
        elif base == "down":
            down_since, incarnation, instance = _spell(entry, member, record, now)
        wanted: NodeDown | None = None
        if not self_declared and (base == "down" or (record is None and base != "left")):
            wanted = NodeDown(
                node=node_id,
                down_since=down_since,
                labels=dict(last.labels),
                rack=last.rack,
                datacenter=last.datacenter,
                capacity=last.capacity,
                incarnation=incarnation,
                instance=instance,
            )
        if wanted is None:
            if entry is not None:
                writes[node_id] = None
        elif entry is None or _written_fields(entry) != _written_fields(wanted):
            writes[node_id] = wanted
        memory[node_id] = last
        intent = intents.get(node_id)
        state = effective_state(base, intent)
        if state != base:
            reason = f"{reason}; the operator {'drains' if state == 'left' else 'cordons'} it"
        down_at = down_since if state == "down" else None
        grace_until = None if down_at is None else down_at + grace_period_s
        if grace_until is not None and grace_until > now and node_id in held:
            deadlines.append(grace_until)
        if down_at is not None:
            since: float | None = down_at
        elif member is not None and member.since is not None:
            since = member.since
        else:
            since = last.started_at or None
        infos.append(
            NodeInfo(
                id=node_id,
                state=state,
                drain_forced=state == "left"
                and intent is not None
                and intent.draining
                and intent.force,
                labels=last.labels,
                rack=last.rack,
                datacenter=last.datacenter,
                down_since=down_at,
                capacity=_capacity(last.capacity),
            )
        )
        statuses.append(
            NodeStatus(
                node=node_id,
                state=state,
                since=since,
                down_since=down_at,
                grace_until=grace_until,
                incarnation=None if member is None else member.incarnation,
                record=record is not None,
                reason=reason,
            )
        )
    return NodeStates(
        nodes=tuple(infos),
        statuses=tuple(statuses),
        down_writes=writes,
        remembered=memory,
        next_deadline=min(deadlines) if deadlines else None,
    )
