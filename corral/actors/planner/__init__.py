"""The placement planner: a pure function from the cluster's state to placement decisions.

How to call it
--------------
::

    from corral.actors.planner import (
        AppSpec, Capacity, NodeInfo, Placement, Policy, ScoreCache, plan, next_placements,
    )

    cache = ScoreCache()                      # optional memo, one per coordinator
    decisions = plan(
        apps=[AppSpec("shop", replicas=2, selector={"region": "eu"})],
        nodes=[
            NodeInfo("n1", labels={"region": "eu"}, rack="r1",
                     capacity=Capacity(8192, 8192, 102400, 90000)),
            NodeInfo("n2", state="suspect", labels={"region": "eu"}, rack="r2"),
        ],
        placements={"shop": Placement(nodes=("n2",), placed_at={"n2": 900.0})},
        policy=Policy(),                      # grace 300 s, cooldown 600 s, budget 5, 0.5
        now=1000.0,
        undecodable=(),                       # registry keys that failed to decode
        cache=cache,
    )
    decisions.placements     # {"shop": ("n1", "n2")}: the whole target, per app
    decisions.removals       # apply these first ...
    decisions.additions      # ... then these
    decisions.to_json()      # the ``corral plan`` document (also: decisions_to_json)
    state = next_placements(previous_placements, decisions, now)   # stamps placed_at

``plan`` raises :class:`PlacementUnavailable` when no node is live at all. A paused pass
(``decisions.paused`` set) decided nothing: write nothing. Apps absent from
``decisions.placements`` (retired, blocked, deleted, unplaced) have no placement record.
``parse_plan_document`` turns a ``corral plan`` JSON document into a :class:`PlanInput`
(run it with ``plan_input``); ``decisions_to_json`` is the inverse for the output.
"""

from corral.actors.planner._document import decisions_to_json, parse_plan_document
from corral.actors.planner._errors import InvalidPlanInput, PlacementUnavailable, PlannerError
from corral.actors.planner._planner import ScoreCache, plan, plan_input
from corral.actors.planner._rank import rendezvous_score
from corral.actors.planner._types import (
    NODE_STATES,
    PLACEMENT_UNAVAILABLE,
    AppSpec,
    Capacity,
    Decisions,
    Deferred,
    NodeInfo,
    NodeState,
    Pause,
    Placement,
    PlanInput,
    Policy,
    Refusal,
    RefusedDrain,
    Replicas,
    Stranded,
    Unplaced,
    next_placements,
)

__all__ = [
    "NODE_STATES",
    "PLACEMENT_UNAVAILABLE",
    "AppSpec",
    "Capacity",
    "Decisions",
    "Deferred",
    "InvalidPlanInput",
    "NodeInfo",
    "NodeState",
    "Pause",
    "Placement",
    "PlacementUnavailable",
    "PlanInput",
    "PlannerError",
    "Policy",
    "Refusal",
    "RefusedDrain",
    "Replicas",
    "ScoreCache",
    "Stranded",
    "Unplaced",
    "decisions_to_json",
    "next_placements",
    "parse_plan_document",
    "plan",
    "plan_input",
    "rendezvous_score",
]
