"""The rolling-deploy controller (pure): what to do next to bring an app's
instances onto its target revision without an outage.

Theory of operation
-------------------
The lease holder calls :func:`plan_rollout` for an app each pass, with the app's
target revision and rollout options, the nodes its placement names, what each of
them publishes (revision, ready), which nodes every proxy has stopped routing to,
the bookkeeping read from the placement (a :class:`~corral.registry.RolloutRecord`,
or None) and the wall-clock ``now``. It gets back the bookkeeping to write (under
the fence, only when it changed) and the actions that bookkeeping stands for.

The record *is* the rollout: nodes run the revision it names for them, the routing
renderer leaves out the nodes it lists as out of the table, and a coordinator that
takes over reads it and carries on. Because every decision is a function of the
record and the observations, replaying a state (a hand-off, a pass that ran twice,
a write that was lost) decides the same thing again: a node switched to the target
is recorded so, and is never switched again.

Each placed node goes through these steps, in order (its ``since`` is when it
entered the step)::

    pending --admit--> out-of-table --proxies applied, or drain_ms--> draining
       --drain_ms--> restarting (told to run the target) --ready on it--> done

=====================  ===================================================
step                   leaves it when
=====================  ===================================================
pending                admitted: fewer than ``max_parallel`` nodes are out
                       of the table or restarting (lowest node id first)
out-of-table           every proxy applied a table without it, or
                       ``drain_ms`` passed since it was taken out
draining               ``drain_ms`` passed: its in-flight requests are done
restarting             it runs the target and is ready: it is put back (done);
                       not so within ``ready_timeout_ms``: the rollout halts
=====================  ===================================================

* **Width.** At most ``max_parallel`` nodes are out of the table or restarting at
  any moment; the next is admitted only once one of them is ready on the target.
* **Nothing to spare, nothing to drain.** A node admitted while no other placed
  instance is ready in the table (a one-instance app, or the others down) goes
  straight to restarting: taking it out first would only lengthen the gap, which
  stays the restart plus the readiness time.
* **RolloutHalted.** A node not ready on the target ``ready_timeout_ms`` after it was told
  to switch halts the rollout with the reason (its published state and reason).
  Nothing more is admitted; nodes out of the table but not yet switched go back
  into it on the revision they run; the pending ones keep theirs. Nodes already
  restarting that become ready are still put back. A halted rollout stays halted
  until the target changes.
* **A new target mid-rollout** (a new deploy, or a rollback, which is just a
  rollout to the previous revision): the record starts over for the new target
  from where each node is. Nodes out of the table stay out (they count against the
  width); one restarting onto the abandoned revision is switched to the new target
  at once; nodes done on the abandoned revision are pending again. A node already
  on the new target (one the abandoned rollout had not reached) is done at once.
* **Placement changes.** A node newly placed that runs the target is done; one that
  runs another revision is pending. A node no longer placed leaves the record.
* **A node that publishes no instance is not guessed at.** A placed node whose
  record is not in the view (it lapsed: the node, or the registry, was cut off; a
  coordinator taking over after a registry stall may find most records gone), or
  lists no instance of the app (a record just written again after it lapsed does
  not list the instances yet), may well still run the old revision. It is not added
  to the record until it publishes an instance (then it is pending, or done if that
  runs the target): the record names no revision for it, so its reconciler keeps the
  previous revision if that is what it runs, and starts the app's revision if it
  runs nothing (a node newly placed has no traffic to drain). The rollout is not done
  while a placed node is left out so. (Marking such a node done on the target told
  its reconciler to restart onto it at once, outside the width: a successor that
  began a rollout, or listed nodes coming back, from a view a registry stall had
  emptied restarted every instance together.) A node the record already lists keeps
  its entry whatever it publishes.
* **RolloutDone.** Once every placed node is done, the plan says :class:`RolloutDone` and the
  record is cleared (None): with no record, nodes run the app's revision.
* A pinned app rolls in place like any other: the controller never moves an
  instance, it only restarts it where it is.

Everything here is a function of its arguments: no clock, no I/O, no trio.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from corral.registry import (
    OUT_OF_TABLE_STEPS,
    AppRecord,
    NodeRecord,
    NodeRollout,
    PlacementRecord,
    RolloutOptions,
    RolloutRecord,
    RolloutStep,
    ServingEntry,
)

#: The steps that count against ``max_parallel``: out of the table or restarting.
_BUSY: frozenset[str] = OUT_OF_TABLE_STEPS


@dataclass(frozen=True, slots=True)
class ObservedInstance:
    """What a node publishes about its instance of the app: the revision it runs,
    whether it is ready (answering, so in the routing table unless left out), and
    its state and reason (shown when a rollout halts on it)."""

    revision: str
    ready: bool
    state: str = ""
    reason: str = ""

    @classmethod
    def of(cls, entry: ServingEntry) -> ObservedInstance:
        """The instance a node's serving entry describes: ready when it is ``running``
        and passes its readiness check (a record that publishes no readiness counts a
        running instance as ready, as the routing table does)."""
        ready = entry.state == "running" and entry.ready is not False
        return cls(entry.revision, ready, entry.state, entry.reason)


@dataclass(frozen=True, slots=True)
class RolloutInputs:
    """Everything one rollout decision is made from.

    Args:
        target: the revision the app is deployed at (its deployment's revision).
        options: the app's rollout options.
        placed: the nodes its placement names.
        instances: what each node publishes for the app (a node missing runs nothing).
        proxies_applied: the nodes for which every registered proxy has applied a
            routing table without this app's instance on them.
        record: the bookkeeping as read from the placement (None: no rollout).
        now: wall-clock seconds.
    """

    target: str
    options: RolloutOptions
    placed: Sequence[str]
    instances: Mapping[str, ObservedInstance]
    proxies_applied: frozenset[str]
    record: RolloutRecord | None
    now: float


@dataclass(frozen=True, slots=True)
class TakeOut:
    """Leave ``node``'s instance out of the routing table."""

    node: str


@dataclass(frozen=True, slots=True)
class RolloutWait:
    """``node`` waits in ``step`` until ``until`` at the latest (for the proxies,
    the drain, or readiness)."""

    node: str
    step: RolloutStep
    until: float


@dataclass(frozen=True, slots=True)
class SwitchRevision:
    """Tell ``node`` to run ``revision`` (stop the old process, start the new one on
    the same ports)."""

    node: str
    revision: str


@dataclass(frozen=True, slots=True)
class PutBack:
    """Put ``node``'s instance back into the routing table."""

    node: str


@dataclass(frozen=True, slots=True)
class RolloutHalted:
    """The rollout stops here, for ``reason``; the nodes not reached keep their revision."""

    reason: str


@dataclass(frozen=True, slots=True)
class RolloutDone:
    """Every placed node runs ``revision`` and is back in the table."""

    revision: str


RolloutAction: TypeAlias = (
    TakeOut | RolloutWait | SwitchRevision | PutBack | RolloutHalted | RolloutDone
)
#: The actions that change something (a :class:`RolloutWait` only says what is awaited).
ROLLOUT_CHANGES: tuple[type, ...] = (TakeOut, SwitchRevision, PutBack, RolloutHalted, RolloutDone)


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """The bookkeeping to keep (None: no rollout; clear it), the actions it stands
    for, and the earliest time a pass is due again without anything changing (None:
    nothing is awaited on a clock)."""

    record: RolloutRecord | None
    actions: tuple[RolloutAction, ...] = ()
    wake_at: float | None = None


def plan_rollout(inputs: RolloutInputs) -> RolloutPlan:
    """Decide the app's rollout's next actions (see the module docstring).

    Returns:
        The record to write and the actions, in the order they happened; a plan for
        the record it returned, with the same observations and ``now``, changes
        nothing (no action of :data:`ROLLOUT_CHANGES`).
    """
    actions: list[RolloutAction] = []
    record = _begin(inputs, actions)
    if record is None:
        return RolloutPlan(None)
    nodes = dict(record.nodes)
    halted = record.halted
    # Every transition moves a node one step on (at most 4 each) or admits one: a
    # fixpoint comes within that many rounds.
    for _ in range(4 * len(nodes) + 2):
        changed, halted = _advance(inputs, nodes, halted, actions)
        if not halted:
            changed |= _admit(inputs, nodes, actions)
        if not changed:
            break
    if (
        not halted
        and all(entry.step == "done" for entry in nodes.values())
        and not _unlisted(inputs, nodes)
    ):
        actions.append(RolloutDone(inputs.target))
        return RolloutPlan(None, tuple(actions))
    new = dataclasses.replace(record, nodes=nodes, halted=halted)
    waits = [_wait(inputs, node, entry) for node, entry in new.nodes.items()]
    actions += [w for w in waits if w is not None]
    due = [w.until for w in waits if w is not None]
    return RolloutPlan(new, tuple(actions), min(due) if due else None)


def rollout_inputs(
    app: AppRecord,
    placement: PlacementRecord,
    nodes: Mapping[str, NodeRecord],
    unrouted: frozenset[str],
    now: float,
) -> RolloutInputs | None:
    """The inputs of ``app``'s rollout decision, from what a coordinator pass read:
    the app's record, its placement (with the rollout it carries), the node records
    (each placed node's published instance) and the nodes every proxy has stopped
    routing to (``unrouted``). None when nothing is to roll: the app has no
    deployment, or it is retired, blocked or being torn down (its rollout, if any,
    is cleared)."""
    if app.deployment is None or app.retired or app.blocked or app.teardown_pending:
        return None
    instances = {}
    for node in placement.nodes:
        record = nodes.get(node)
        entry = None if record is None else record.serving.get(app.name)
        if entry is not None:
            instances[node] = ObservedInstance.of(entry)
    return RolloutInputs(
        target=app.deployment.revision,
        options=app.rollout,
        placed=tuple(placement.nodes),
        instances=instances,
        proxies_applied=unrouted & frozenset(placement.nodes),
        record=placement.rollout,
        now=now,
    )


def restart_phase(entry: NodeRollout, instance: ObservedInstance | None) -> str:
    """How far a node in the ``restarting`` step is, for display: ``stopping`` (it
    still runs another revision), ``starting`` (nothing runs yet) or
    ``waiting-ready`` (it runs the target, not ready yet); any other step is
    returned as it is."""
    if entry.step != "restarting":
        return entry.step
    if instance is None:
        return "starting"
    return "waiting-ready" if instance.revision == entry.revision else "stopping"


def rollout_status(record: RolloutRecord | None) -> str | None:
    """``rolling D/N`` (done of placed), ``halted: reason``, or None with no rollout."""
    if record is None:
        return None
    if record.halted:
        return f"halted: {record.halted}"
    done = sum(entry.step == "done" for entry in record.nodes.values())
    return f"rolling {done}/{len(record.nodes)}"


# --------------------------------------------------------------------------- steps


def _begin(inputs: RolloutInputs, actions: list[RolloutAction]) -> RolloutRecord | None:
    """The record this pass starts from: the one read (its nodes matched to the
    placement), a new one when the target changed, or None when nothing rolls."""
    record = inputs.record
    placed = sorted(set(inputs.placed))
    if record is not None and record.revision == inputs.target:
        nodes = {
            node: record.nodes[node] if node in record.nodes else _newcomer(inputs, node)
            for node in placed
            if node in record.nodes or node in inputs.instances
        }
        return dataclasses.replace(record, nodes=nodes)
    if record is None and not any(
        node in inputs.instances and inputs.instances[node].revision != inputs.target
        for node in placed
    ):
        # every placed node runs the target, or publishes nothing (it keeps what it
        # runs, or starts the target: no rollout names it)
        return None
    nodes = {}
    for node in placed:
        entry = None if record is None else record.nodes.get(node)
        if entry is None and node not in inputs.instances:
            continue  # listed once it publishes an instance (see _unlisted)
        nodes[node] = _newcomer(inputs, node) if entry is None else _retarget(inputs, entry)
        if entry is not None and entry.step == "restarting" and entry.revision != inputs.target:
            actions.append(SwitchRevision(node, inputs.target))
    return RolloutRecord(inputs.target, nodes, started_at=inputs.now)


def _unlisted(inputs: RolloutInputs, nodes: Mapping[str, NodeRollout]) -> bool:
    """Whether a placed node is left out of the record because it publishes no
    instance: what it runs is not known, so the rollout is not done."""
    return any(node not in nodes for node in inputs.placed)


def _newcomer(inputs: RolloutInputs, node: str) -> NodeRollout:
    """A placed node the record does not list yet, which publishes an instance: done
    when that runs the target, pending otherwise (one publishing none is not listed)."""
    instance = inputs.instances[node]
    if instance.revision == inputs.target:
        return NodeRollout(inputs.target, "done", inputs.now)
    return NodeRollout(instance.revision, "pending", inputs.now)


def _retarget(inputs: RolloutInputs, entry: NodeRollout) -> NodeRollout:
    """A node of the previous rollout, in the rollout to a new target."""
    if entry.step == "done":
        return NodeRollout(entry.revision, "pending", inputs.now)
    if entry.step == "restarting" and entry.revision != inputs.target:
        # out of the table and mid-restart onto the abandoned revision: switch it
        # to the new target now (the width does not change)
        return NodeRollout(inputs.target, "restarting", inputs.now)
    return entry


def _ready_on(inputs: RolloutInputs, node: str, revision: str) -> bool:
    instance = inputs.instances.get(node)
    return instance is not None and instance.revision == revision and instance.ready


def _advance(
    inputs: RolloutInputs,
    nodes: dict[str, NodeRollout],
    halted: str,
    actions: list[RolloutAction],
) -> tuple[bool, str]:
    """Move every node on by the steps it has finished; returns (changed, halted)."""
    changed = False
    drain = inputs.options.drain_ms / 1000
    ready_timeout = inputs.options.ready_timeout_ms / 1000
    target = inputs.target
    for node in sorted(nodes):
        entry = nodes[node]
        new = entry
        if entry.step == "pending":
            if entry.revision == target:
                new = NodeRollout(target, "done", inputs.now)
        elif entry.step in ("out-of-table", "draining") and _ready_on(inputs, node, target):
            # already on the target (a rollback reached a node the abandoned rollout
            # had taken out but not switched): nothing to restart
            new = NodeRollout(target, "done", inputs.now)
            actions.append(PutBack(node))
        elif entry.step == "out-of-table":
            if halted:
                new = NodeRollout(entry.revision, "pending", inputs.now)
                actions.append(PutBack(node))
            elif node in inputs.proxies_applied:
                new = NodeRollout(entry.revision, "draining", inputs.now)
            elif inputs.now >= entry.since + drain:
                new = NodeRollout(entry.revision, "draining", entry.since + drain)
        elif entry.step == "draining":
            if halted:
                new = NodeRollout(entry.revision, "pending", inputs.now)
                actions.append(PutBack(node))
            elif inputs.now >= entry.since + drain:
                new = NodeRollout(target, "restarting", inputs.now)
                if entry.revision != target:
                    actions.append(SwitchRevision(node, target))
        elif entry.step == "restarting":
            if _ready_on(inputs, node, entry.revision):
                new = NodeRollout(entry.revision, "done", inputs.now)
                actions.append(PutBack(node))
            elif not halted and inputs.now >= entry.since + ready_timeout:
                halted = _halt_reason(inputs, node, entry)
                actions.append(RolloutHalted(halted))
                changed = True
        if new != entry:
            nodes[node] = new
            changed = True
    return changed, halted


def _admit(
    inputs: RolloutInputs, nodes: dict[str, NodeRollout], actions: list[RolloutAction]
) -> bool:
    """Take pending nodes out of the table while the width allows (lowest id first)."""
    busy = sum(entry.step in _BUSY for entry in nodes.values())
    changed = False
    for node in sorted(nodes):
        if busy >= inputs.options.max_parallel:
            break
        entry = nodes[node]
        if entry.step != "pending" or entry.revision == inputs.target:
            continue
        busy += 1
        changed = True
        if _others_serve(inputs, nodes, node):
            nodes[node] = NodeRollout(entry.revision, "out-of-table", inputs.now)
            actions.append(TakeOut(node))
        else:
            nodes[node] = NodeRollout(inputs.target, "restarting", inputs.now)
            actions.append(SwitchRevision(node, inputs.target))
    return changed


def _others_serve(inputs: RolloutInputs, nodes: Mapping[str, NodeRollout], node: str) -> bool:
    """Whether another placed instance is ready and in the table to take ``node``'s
    requests while it is out."""
    return any(
        other != node
        and entry.step not in _BUSY
        and _ready_on(inputs, other, inputs.instances[other].revision)
        for other, entry in nodes.items()
        if other in inputs.instances
    )


def _halt_reason(inputs: RolloutInputs, node: str, entry: NodeRollout) -> str:
    instance = inputs.instances.get(node)
    if instance is None:
        seen = "it runs nothing"
    elif instance.revision != entry.revision:
        seen = f"it still runs revision {instance.revision[:12]}"
    elif instance.state == "running":
        seen = "it runs, but its readiness check does not pass"
    else:
        seen = f"it is {instance.state or 'not ready'}"
        if instance.reason:
            seen += f": {instance.reason}"
    return (
        f"revision {entry.revision[:12]} was not ready on node {node} within "
        f"{inputs.options.ready_timeout_ms} ms ({seen}); the nodes not reached keep "
        "their revision; roll back, or deploy a fixed revision"
    )


def _wait(inputs: RolloutInputs, node: str, entry: NodeRollout) -> RolloutWait | None:
    """What ``node`` waits for, and until when at the latest."""
    drain = inputs.options.drain_ms / 1000
    if entry.step in ("out-of-table", "draining"):
        return RolloutWait(node, entry.step, entry.since + drain)
    if entry.step == "restarting":
        until = entry.since + inputs.options.ready_timeout_ms / 1000
        return RolloutWait(node, entry.step, until) if until > inputs.now else None
    return None
