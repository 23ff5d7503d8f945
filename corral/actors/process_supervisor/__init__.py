"""ProcessSupervisor: runs each served app as one real process and keeps it running.

Processes start in their own process group with their ports in the environment,
write to rotating logs in the app's directory, restart with backoff after a
crash (a crash loop is reported, not spun), and are stopped with SIGTERM, a
grace period, then SIGKILL of the whole tree, found by parentage and by the
``CORRAL_APP_INSTANCE`` marker every process inherits. A node that restarts ends
what its previous life left running (pid files checked with psutil, and marked
processes) before starting anything. One app's failure to start or stop is its
own: it is marked ``failed`` with the reason, and no other app is touched.
"""

from corral.actors.process_supervisor._actor import (
    ForgetProcess,
    ListProcesses,
    ProcessesChanged,
    ProcessGeneration,
    ProcessSupervisor,
    StartProcess,
    StopProcess,
)
from corral.actors.process_supervisor._errors import (
    ProcessStillRunning,
    ProcessSupervisorError,
    SpawnFailed,
)
from corral.actors.process_supervisor._launcher import LaunchedProcess, Launcher, LaunchSpec
from corral.actors.process_supervisor._layout import AppPaths
from corral.actors.process_supervisor._logs import RotatingLog
from corral.actors.process_supervisor._memory import (
    Behaviour,
    LaunchEvent,
    MemoryLauncher,
    MemoryProcess,
)
from corral.actors.process_supervisor._os import (
    OsLauncher,
    OsProcess,
    enable_subreaper,
    write_json_atomically,
)
from corral.actors.process_supervisor._policy import (
    INSTANCE_VAR,
    LIVE_STATES,
    ChildProcess,
    CrashHistory,
    ObservedProcess,
    OrphanScan,
    PidRecord,
    ProcessState,
    RestartDecision,
    RestartPolicy,
    backoff_schedule,
    decide_restart,
    instance_marker,
    is_leftover,
    is_marked_leftover,
    marker_scope,
    orphans_to_reap,
    parse_instance_marker,
    process_environment,
)
from corral.actors.process_supervisor._table import (
    ProcessInfo,
    ProcessTable,
    StartRequest,
)

__all__ = [
    "INSTANCE_VAR",
    "LIVE_STATES",
    "AppPaths",
    "Behaviour",
    "ChildProcess",
    "CrashHistory",
    "ForgetProcess",
    "LaunchEvent",
    "LaunchSpec",
    "LaunchedProcess",
    "Launcher",
    "ListProcesses",
    "MemoryLauncher",
    "MemoryProcess",
    "ObservedProcess",
    "OrphanScan",
    "OsLauncher",
    "OsProcess",
    "PidRecord",
    "ProcessGeneration",
    "ProcessInfo",
    "ProcessState",
    "ProcessStillRunning",
    "ProcessSupervisor",
    "ProcessSupervisorError",
    "ProcessTable",
    "ProcessesChanged",
    "RestartDecision",
    "RestartPolicy",
    "RotatingLog",
    "SpawnFailed",
    "StartProcess",
    "StartRequest",
    "StopProcess",
    "backoff_schedule",
    "decide_restart",
    "enable_subreaper",
    "instance_marker",
    "is_leftover",
    "is_marked_leftover",
    "marker_scope",
    "orphans_to_reap",
    "parse_instance_marker",
    "process_environment",
    "write_json_atomically",
]
