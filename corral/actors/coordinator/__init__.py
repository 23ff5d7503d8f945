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
from corral.actors.coordinator._membership import MEMBER_STATES, MemberStatus, NodeStatus
from corral.actors.coordinator._rollout import ObservedInstance, restart_phase, rollout_status
from corral.actors.coordinator._state import CoordinatorState
from corral.actors.coordinator._writes import (
    CurrentPlacement,
    WriteBatch,
    fence_guard,
    plan_rollout_writes,
    plan_writes,
)

__all__ = [
    "MEMBER_STATES",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorState",
    "CurrentPlacement",
    "FenceRejected",
    "GetCoordinatorState",
    "KickCoordinator",
    "LeadershipLost",
    "LeaseExpired",
    "MemberStatus",
    "NodeStatus",
    "ObservedInstance",
    "WriteBatch",
    "coordinator_child_spec",
    "fence_guard",
    "plan_rollout_writes",
    "plan_writes",
    "restart_phase",
    "rollout_status",
]
