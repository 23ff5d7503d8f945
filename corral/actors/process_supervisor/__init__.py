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
from corral.actors.process_supervisor._launcher import Launcher
from corral.actors.process_supervisor._layout import AppPaths
from corral.actors.process_supervisor._memory import LaunchEvent, MemoryLauncher, MemoryProcess
from corral.actors.process_supervisor._os import enable_subreaper, write_json_atomically
from corral.actors.process_supervisor._policy import LIVE_STATES, RestartPolicy

__all__ = [
    "LIVE_STATES",
    "AppPaths",
    "ForgetProcess",
    "LaunchEvent",
    "Launcher",
    "ListProcesses",
    "MemoryLauncher",
    "MemoryProcess",
    "ProcessGeneration",
    "ProcessStillRunning",
    "ProcessSupervisor",
    "ProcessSupervisorError",
    "ProcessesChanged",
    "RestartPolicy",
    "SpawnFailed",
    "StartProcess",
    "StopProcess",
    "enable_subreaper",
    "write_json_atomically",
]
