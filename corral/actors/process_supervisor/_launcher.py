"""The launcher interface: how the supervisor starts, watches and ends one process.

Two implementations: :class:`~corral.actors.process_supervisor._os.OsLauncher` (real
processes: own process group, pipes into rotating logs, pid files, psutil) and
:class:`~corral.actors.process_supervisor.MemoryLauncher` (an in-memory twin for
virtual-time tests). The supervisor's restart logic does not know which it drives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from corral.actors.process_supervisor._layout import AppPaths
from corral.actors.process_supervisor._policy import PidRecord
from corral.registry import HealthSpec


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one app's process.

    ``env`` is the complete environment (see ``process_environment``); ``cwd`` is the
    revision's directory; ``ready_host``/``public_port`` are probed for readiness;
    ``health`` is the app's readiness check (None: TCP on the public port);
    ``instance`` is this start's ``CORRAL_APP_INSTANCE`` marker (also in ``env``), by
    which its descendants are found even after they left its process group.
    ``memory_mb`` is the app's memory limit in MiB (0: none; see ``_limits``).
    """

    app: str
    node_id: str
    revision: str
    command: tuple[str, ...]
    cwd: Path
    paths: AppPaths
    public_port: int
    internal_port: int
    env: Mapping[str, str] = field(default_factory=dict)
    instance: str = ""
    ready_host: str = "127.0.0.1"
    ready_timeout: float = 30.0
    health: HealthSpec | None = None
    memory_mb: int = 0


class LaunchedProcess(Protocol):
    """One started process. Every method may be called once the process is gone."""

    @property
    def pid(self) -> int: ...

    @property
    def reaped(self) -> bool: ...

    @property
    def limit_exceeded(self) -> str | None:
        """Why the launcher ended the process for passing a limit (``memory limit 512
        MiB exceeded``), or None."""
        ...

    async def wait_exited(self) -> None:
        """Return once the process has exited (it is not reaped yet)."""

    async def wait_ready(self) -> bool:
        """Return True once it answers on its public port, False after the ready timeout."""

    async def check_ready(self) -> bool:
        """One readiness check (``LaunchSpec.health``): True when it passes. Never raises;
        the caller bounds how long it may take."""

    async def finish(self) -> int:
        """After it exited on its own: end what is left of its group, reap it, return
        its exit code (negative: killed by that signal)."""

    async def stop(self, grace: float) -> int:
        """SIGTERM to the whole tree, up to ``grace`` seconds, then SIGKILL; reap; return
        the exit code. Concurrent callers share one stop."""

    def kill(self) -> None:
        """SIGKILL the whole tree now, without waiting (for cancelled paths)."""

    async def reap(self) -> int:
        """Wait for the exit and collect it; return the exit code."""


class Launcher(Protocol):
    """Starts processes and ends those a previous life of the node left behind."""

    async def spawn(self, spec: LaunchSpec, nursery: trio.Nursery) -> LaunchedProcess:
        """Start ``spec`` in its own process group. Helper tasks (log pumps, exit
        watcher) run in ``nursery`` and end once the process is reaped.

        Raises:
            SpawnFailed: the command could not be started.
        """
        ...

    async def end_leftovers(
        self, data_dir: Path, grace: float, *, node_id: str | None = None
    ) -> list[PidRecord]:
        """Find processes recorded in pid files under ``data_dir`` that are still ours
        (see ``is_leftover``) and, given ``node_id``, every process whose environment
        carries a marker of an earlier life of that node (``is_marked_leftover``: the
        descendants that escaped their group); end them (SIGTERM, ``grace``, SIGKILL)
        and return their records. Stale pid files are removed; nothing is killed on pid
        alone."""
        ...

    @property
    def adopts_orphans(self) -> bool:
        """Whether orphaned app descendants can be re-parented to this process (it is a
        child subreaper), so that :meth:`reap_orphans` has anything to collect."""
        ...

    async def reap_orphans(self) -> int:
        """Collect the exit status of orphaned app descendants that the node adopted as
        a child subreaper (see ``orphans_to_reap``); return how many."""
        ...
