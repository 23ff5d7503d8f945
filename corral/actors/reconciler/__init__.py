"""Reconciler: makes this node run what the registry assigns it, and publishes it.

Also home of :class:`AgentSpec`, the node agent's supervisor (ProcessSupervisor,
PortAllocator, Reconciler) that the node assembly drops into its actor tree.
"""

from corral.actors.reconciler._actor import (
    Kick,
    LastPass,
    Materialize,
    PassSummary,
    Reconciler,
    RunPass,
    Tick,
    Withdraw,
)
from corral.actors.reconciler._agent import AgentSpec
from corral.actors.reconciler._backoff import (
    FailedRevision,
    forget_settled,
    record_failure,
    retry_delay,
)
from corral.actors.reconciler._errors import PassFailed, ReconcilerError
from corral.actors.reconciler._plan import (
    STOP_NOT_SERVED,
    STOP_TEARDOWN,
    Action,
    AppView,
    PassInputs,
    ProcessView,
    Remove,
    Replace,
    Start,
    Stop,
    app_views,
    desired_revision,
    plan_pass,
    process_views,
    serving_set,
    should_skip,
    with_serving,
)

__all__ = [
    "STOP_NOT_SERVED",
    "STOP_TEARDOWN",
    "Action",
    "AgentSpec",
    "AppView",
    "FailedRevision",
    "Kick",
    "LastPass",
    "Materialize",
    "PassFailed",
    "PassInputs",
    "PassSummary",
    "ProcessView",
    "Reconciler",
    "ReconcilerError",
    "Remove",
    "Replace",
    "RunPass",
    "Start",
    "Stop",
    "Tick",
    "Withdraw",
    "app_views",
    "desired_revision",
    "forget_settled",
    "plan_pass",
    "process_views",
    "record_failure",
    "retry_delay",
    "serving_set",
    "should_skip",
    "with_serving",
]
