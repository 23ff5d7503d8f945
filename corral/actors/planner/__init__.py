"""The placement planner: a pure function from the cluster's state to placement decisions.

How to call it
--------------
::

    from corral.actors.planner import (
        AppSpec, NodeCapacity, NodeInfo, Placement, Policy, ScoreCache, next_placements, plan,
    )

    cache = ScoreCache()            # optional memo, one per coordinator; never changes results
    placements = {"shop": Placement(nodes=("n2",), placed_at={"n2": 900.0})}
    decisions = plan(
        apps=[AppSpec("shop", replicas=2, selector={"region": "eu"})],
        nodes=[
            NodeInfo("n1", labels={"region": "eu"}, rack="r1",
                     capacity=NodeCapacity(memory_mb=8192, memory_free_mb=8192,
                                       disk_mb=102400, disk_free_mb=90000)),
            NodeInfo("n2", state="suspect", labels={"region": "eu"}, rack="r2"),
        ],
        placements=placements,
        policy=Policy(),            # grace 300 s, cooldown 600 s, budget 5, fraction 0.5
        now=1000.0,                 # the caller's clock: the planner reads none
        undecodable=(),             # registry keys that failed to decode (pause the pass)
        cache=cache,
    )
    decisions.placements    # {"shop": ("n1", "n2")}: the whole target of every app
    decisions.removals      # () -- apply removals first...
    decisions.additions     # (("shop", "n1"),) -- ...then additions
    decisions_to_json(decisions)  # the ``corral plan`` output
    placements = next_placements(placements, decisions, 1000.0)  # stamps placed_at

``plan`` raises :class:`PlacementUnavailable` when no node is live at all. A paused pass
(``decisions.paused`` set) decided nothing: write nothing. Apps absent from
``decisions.placements`` (retired, blocked, deleted, unplaced) have no placement record,
unless ``decisions.stopped`` names them.

Drains: a node being drained is ``NodeInfo(state="left")``. One that runs a pinned app is
refused (``decisions.refused`` names the apps) and keeps all its work, unless the drain is
forced, ``NodeInfo(state="left", drain_forced=True)`` (``"drain": "forced"`` in a
``corral plan`` document): then the node is emptied and its pinned instances are stopped,
not started elsewhere. ``decisions.stopped`` lists them per app; hand them back as
``Placement(stopped=...)`` (``"stopped": [...]`` in the document) so later passes keep them
stopped, report them stranded, and start them on their node again when it takes work.
``parse_plan_document`` turns a ``corral plan`` JSON document into a :class:`PlanInput`
(run it with ``plan_input``); ``decisions_to_json`` is the inverse for the output.
"""

from corral.actors.planner._document import decisions_to_json, parse_plan_document
from corral.actors.planner._errors import InvalidPlanInput, PlacementUnavailable, PlannerError
from corral.actors.planner._planner import (
    ScoreCache,
    allocatable,
    plan,
    plan_input,
    reserved_by_placements,
)
from corral.actors.planner._types import (
    NODE_STATES,
    AppSpec,
    Decisions,
    Deferred,
    NodeCapacity,
    NodeInfo,
    NodeState,
    Pause,
    Placement,
    PlanInput,
    Policy,
    Refusal,
    Stranded,
    Unplaced,
    next_placements,
)

__all__ = [
    "NODE_STATES",
    "AppSpec",
    "Decisions",
    "Deferred",
    "InvalidPlanInput",
    "NodeCapacity",
    "NodeInfo",
    "NodeState",
    "Pause",
    "Placement",
    "PlacementUnavailable",
    "PlanInput",
    "PlannerError",
    "Policy",
    "Refusal",
    "ScoreCache",
    "Stranded",
    "Unplaced",
    "allocatable",
    "decisions_to_json",
    "next_placements",
    "parse_plan_document",
    "plan",
    "plan_input",
    "reserved_by_placements",
]
