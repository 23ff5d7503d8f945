"""Errors of the process supervisor.

::

    CorralError
    └── ProcessSupervisorError
        ├── SpawnFailed            the command could not be started (not found, not executable)
        └── ProcessStillRunning    local state was to be forgotten while its process still runs
"""

from __future__ import annotations

from corral._errors import CorralError


class ProcessSupervisorError(CorralError):
    """Base of the process supervisor's errors."""


class SpawnFailed(ProcessSupervisorError):
    """The app's command could not be started; the message names the command and the cause."""


class ProcessStillRunning(ProcessSupervisorError):
    """An app's entry was to be dropped while its process is not stopped yet."""
