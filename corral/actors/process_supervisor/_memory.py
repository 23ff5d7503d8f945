"""An in-memory launcher: processes that exist only as objects, on trio's clock.

For virtual-time tests of everything above the operating system: restarts,
backoff, crash loops, reconcile passes. A test scripts how an app behaves with
:meth:`MemoryLauncher.behave` and ends a process with :meth:`MemoryProcess.exit`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import trio

from corral.actors.process_supervisor._errors import SpawnFailed
from corral.actors.process_supervisor._launcher import LaunchSpec
from corral.actors.process_supervisor._policy import PidRecord


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How the processes of one app behave.

    Args:
        exit_after: seconds after start at which the process exits by itself (None: never).
        exit_code: its exit code when it does.
        ignore_term: it ignores SIGTERM and only dies by SIGKILL after the grace period.
        ready_after: seconds until it answers on its port (None: never).
        spawn_error: starting it fails with this message (``SpawnFailed``).
        spawn_raises: starting it raises this (any exception: a launcher's bug).
    """

    exit_after: float | None = None
    exit_code: int = 1
    ignore_term: bool = False
    ready_after: float | None = 0.0
    spawn_error: str | None = None
    spawn_raises: Exception | None = None


#: Orders every launch and exit of every MemoryLauncher in this interpreter, so the
#: timelines of several launchers (several nodes) merge into one order.
_SEQUENCE = itertools.count()


@dataclass(frozen=True, slots=True)
class LaunchEvent:
    """A process of a :class:`MemoryLauncher` started (``"start"``) or ended (``"exit"``).

    ``time`` is trio's clock; ``seq`` orders events that share a time, across launchers.
    """

    time: float
    seq: int
    kind: str
    app: str
    pid: int


class MemoryProcess:
    """One simulated process (see ``LaunchedProcess``)."""

    def __init__(
        self,
        spec: LaunchSpec,
        pid: int,
        behaviour: Behaviour,
        timeline: list[LaunchEvent] | None = None,
    ) -> None:
        self.spec = spec
        self._pid = pid
        self.behaviour = behaviour
        self.started_at = trio.current_time()
        self.ended_at: float | None = None
        self._timeline = timeline if timeline is not None else []
        self._note("start")
        self.exit_code: int | None = None
        self.signals: list[str] = []
        self._exited = trio.Event()
        self._stop_done = trio.Event()
        self._stopping = False
        self._reaped = False
        #: What its readiness check answers (a test sets it False to fail the checks).
        self.healthy = True

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def reaped(self) -> bool:
        return self._reaped

    @property
    def limit_exceeded(self) -> str | None:
        return None  # simulated processes use no memory

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def exit(self, code: int = 1) -> None:
        """Make the process exit now with ``code`` (a crash, from the test's side)."""
        if not self._exited.is_set():
            self.exit_code = code
            self.ended_at = trio.current_time()
            self._note("exit")
            self._exited.set()

    def _note(self, kind: str) -> None:
        self._timeline.append(
            LaunchEvent(trio.current_time(), next(_SEQUENCE), kind, self.spec.app, self._pid)
        )

    async def _run(self) -> None:
        assert self.behaviour.exit_after is not None
        with trio.move_on_after(self.behaviour.exit_after):
            await self._exited.wait()
            return
        self.exit(self.behaviour.exit_code)

    async def wait_exited(self) -> None:
        await self._exited.wait()

    async def wait_ready(self) -> bool:
        after = self.behaviour.ready_after
        if after is None:
            await trio.sleep(self.spec.ready_timeout)
            return False
        await trio.sleep(after)
        return True

    async def check_ready(self) -> bool:
        return self.healthy and self.alive and self.behaviour.ready_after is not None

    async def finish(self) -> int:
        await self._exited.wait()
        return await self.reap()

    async def stop(self, grace: float) -> int:
        if self._stopping:
            await self._stop_done.wait()
            return await self.reap()
        self._stopping = True
        try:
            if self.alive:
                self.signals.append("SIGTERM")
                if not self.behaviour.ignore_term:
                    self.exit(-15)
                with trio.move_on_after(grace):
                    await self._exited.wait()
                self.kill()
            return await self.reap()
        finally:
            self._stop_done.set()

    def kill(self) -> None:
        if self.alive:
            self.signals.append("SIGKILL")
            self.exit(-9)

    async def reap(self) -> int:
        await self._exited.wait()
        self._reaped = True
        await trio.lowlevel.checkpoint()
        assert self.exit_code is not None
        return self.exit_code


class MemoryLauncher:
    """A ``Launcher`` whose processes are :class:`MemoryProcess` objects.

    ``spawned`` lists every process ever started, in order; ``timeline`` every start
    and exit (:class:`LaunchEvent`), in order.
    """

    def __init__(self) -> None:
        self._pids = itertools.count(1000)
        self._behaviours: dict[str, Behaviour] = {}
        self.spawned: list[MemoryProcess] = []
        self.timeline: list[LaunchEvent] = []
        self.leftovers: list[PidRecord] = []

    def behave(self, app: str, behaviour: Behaviour) -> None:
        """Make the next processes of ``app`` behave as described."""
        self._behaviours[app] = behaviour

    def processes(self, app: str) -> list[MemoryProcess]:
        """Every process started for ``app``, oldest first."""
        return [p for p in self.spawned if p.spec.app == app]

    def alive(self) -> list[MemoryProcess]:
        """The processes that have not exited."""
        return [p for p in self.spawned if p.alive]

    async def spawn(self, spec: LaunchSpec, nursery: trio.Nursery) -> MemoryProcess:
        await trio.lowlevel.checkpoint()
        behaviour = self._behaviours.get(spec.app, Behaviour())
        if behaviour.spawn_error is not None:
            raise SpawnFailed(f"cannot start app {spec.app!r}: {behaviour.spawn_error}")
        if behaviour.spawn_raises is not None:
            raise behaviour.spawn_raises
        process = MemoryProcess(spec, next(self._pids), behaviour, self.timeline)
        self.spawned.append(process)
        if behaviour.exit_after is not None:  # only a process that ends by itself needs one
            nursery.start_soon(process._run)
        return process

    async def end_leftovers(
        self, data_dir: Path, grace: float, *, node_id: str | None = None
    ) -> list[PidRecord]:
        await trio.lowlevel.checkpoint()
        ended, self.leftovers = self.leftovers, []
        return ended

    @property
    def adopts_orphans(self) -> bool:
        return False  # nothing outlives its MemoryProcess

    async def reap_orphans(self) -> int:
        await trio.lowlevel.checkpoint()
        return 0
