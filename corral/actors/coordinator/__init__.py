"""The Coordinator: one lease, fenced writes, skipped idle passes, instant hand-back.

The actor (:class:`Coordinator`, :func:`coordinator_child_spec`) is a thin shell
around three pure pieces, public so they can be tested and reused:

* :func:`node_states` — node states from the records, the membership view
  (:class:`MemberStatus`) and the ``down/<node>`` entries, with the entries to write;
* :func:`view_from_kvs` / :func:`plan_input_from_view` — registry records to the
  planner's input (node states with the operator's intent applied);
* :func:`inputs_digest` / :func:`needs_time` — when a pass can be skipped (a pass
  runs each tick and, through a watch of the input prefixes, promptly after a change);
  an :class:`InputCache` carried between passes makes both cost O(changed records);
* :func:`plan_writes` — decisions to fenced, ordered transaction batches;
* :func:`plan_rollout` — a rolling deploy's next actions, run for every app each
  pass and kept in its placement record (:func:`plan_rollout_writes`);
* :class:`ReportLog` — when a report over unchanged inputs is repeated.

It answers :class:`GetCoordinatorState` with a :class:`CoordinatorState`.
"""

from corral.actors.coordinator._actor import (
    DEFAULT_LEASE_TTL,
    DEFAULT_WATCH_DEBOUNCE,
    Coordinator,
    GetCoordinatorState,
    KickCoordinator,
    coordinator_child_spec,
)
from corral.actors.coordinator._errors import (
    CoordinatorError,
    FenceRejected,
    LeadershipLost,
    LeaseExpired,
)
from corral.actors.coordinator._inputs import (
    INPUT_PREFIXES,
    InputCache,
    RegistryView,
    inputs_digest,
    needs_time,
    placed_nodes,
    plan_input_from_view,
    states_from_view,
    view_from_kvs,
    with_placements,
)
from corral.actors.coordinator._membership import (
    MEMBER_STATES,
    CurrentDown,
    MemberState,
    MemberStatus,
    NodeStates,
    NodeStatus,
    effective_state,
    node_states,
)
from corral.actors.coordinator._reports import ReportKey, ReportLog
from corral.actors.coordinator._rollout import (
    ROLLOUT_CHANGES,
    ObservedInstance,
    PutBack,
    RolloutAction,
    RolloutDone,
    RolloutHalted,
    RolloutInputs,
    RolloutPlan,
    RolloutWait,
    SwitchRevision,
    TakeOut,
    plan_rollout,
    restart_phase,
    rollout_inputs,
    rollout_status,
)
from corral.actors.coordinator._state import (
    AppRollout,
    CoordinatorPass,
    CoordinatorState,
    PassCounts,
)
from corral.actors.coordinator._writes import (
    DEFAULT_MAX_WRITES,
    CurrentPlacement,
    DownBatch,
    PlacementWrite,
    WriteBatch,
    WritePlan,
    fence_guard,
    plan_down_writes,
    plan_rollout_writes,
    plan_writes,
)

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_WRITES",
    "DEFAULT_WATCH_DEBOUNCE",
    "INPUT_PREFIXES",
    "MEMBER_STATES",
    "ROLLOUT_CHANGES",
    "AppRollout",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorPass",
    "CoordinatorState",
    "CurrentDown",
    "CurrentPlacement",
    "DownBatch",
    "FenceRejected",
    "GetCoordinatorState",
    "InputCache",
    "KickCoordinator",
    "LeadershipLost",
    "LeaseExpired",
    "MemberState",
    "MemberStatus",
    "NodeStates",
    "NodeStatus",
    "ObservedInstance",
    "PassCounts",
    "PlacementWrite",
    "PutBack",
    "RegistryView",
    "ReportKey",
    "ReportLog",
    "RolloutAction",
    "RolloutDone",
    "RolloutHalted",
    "RolloutInputs",
    "RolloutPlan",
    "RolloutWait",
    "SwitchRevision",
    "TakeOut",
    "WriteBatch",
    "WritePlan",
    "coordinator_child_spec",
    "effective_state",
    "fence_guard",
    "inputs_digest",
    "needs_time",
    "node_states",
    "placed_nodes",
    "plan_down_writes",
    "plan_input_from_view",
    "plan_rollout",
    "plan_rollout_writes",
    "plan_writes",
    "restart_phase",
    "rollout_inputs",
    "rollout_status",
    "states_from_view",
    "view_from_kvs",
    "with_placements",
]
