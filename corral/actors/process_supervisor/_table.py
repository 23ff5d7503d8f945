"""The process table: one runner task per app, keeping its process as asked.

The table is declarative: :meth:`ProcessTable.ensure` says "run this", and
:meth:`ProcessTable.stop` says "run nothing"; the app's runner task works out the
rest (start, stop the old revision before starting a new one, restart after a
crash with backoff, report crash loops). The actor only forwards messages.

One app's trouble stays its own: whatever a runner meets while starting,
watching or stopping its process (a launcher error, a ``ValueError`` for a NUL
byte in an argument, a bug) marks that app ``failed`` with the reason, and the
runner tries again after its backoff. It never ends the runner's task, so it
never crashes the actor, and never touches another app's process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import secrets
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from corral.actors.process_supervisor._errors import (
    ProcessStillRunning,
    ProcessSupervisorError,
    SpawnFailed,
)
from corral.actors.process_supervisor._launcher import LaunchedProcess, Launcher, LaunchSpec
from corral.actors.process_supervisor._layout import AppPaths
from corral.actors.process_supervisor._policy import (
    LIVE_STATES,
    CrashHistory,
    ProcessState,
    RestartPolicy,
    decide_restart,
    instance_marker,
    marker_scope,
    process_environment,
)
from corral.actors.process_supervisor._readiness import Readiness, after_check
from corral.registry import HealthSpec
from corral.supervision import sleep as wheel_sleep

log = logging.getLogger("corral.actors.process_supervisor")

SHUTDOWN_REASON = "the node is shutting down"
#: Seconds after its SIGTERM a process still running is reported as overdue (a
#: warning and a ``process.stop-overdue`` event naming when it will be killed), rather
#: than only once its grace ran out: a drain waiting on it says why at once.
STOP_OVERDUE_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class StartRequest:
    """Run ``command`` of ``revision`` for ``app`` in ``cwd`` on the given ports.

    ``env`` is the deployment's environment; corral adds its own variables.
    ``memory_mb`` is the app's declared memory, enforced as a limit (0: none).
    """

    app: str
    revision: str
    command: tuple[str, ...]
    cwd: str
    public_port: int
    internal_port: int
    env: Mapping[str, str] = field(default_factory=dict)
    health: HealthSpec | None = None
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One row of the node's process table (``corral ps``, ``GET /v1/state``).

    ``state`` is the supervisor's view (starting, running, backoff, failed, stopping,
    stopped); ``crash_loop`` says whether the app is in a crash loop (consecutive quick
    exits or failed starts, until a run lasts long enough); ``last_error`` why its last
    start (or stop) failed. ``started_at`` is wall time. ``ready``: it is running and
    its readiness check passes (see ``_readiness``).
    """

    app: str
    state: ProcessState
    pid: int | None
    revision: str
    public_port: int
    internal_port: int
    restarts: int
    started_at: float | None
    last_exit_code: int | None
    crash_loop: bool
    last_error: str | None
    stop_reason: str | None
    ready: bool = False
    #: the working directory it runs in (its unpacked revision: ``.../revisions/<digest>``).
    directory: str = ""

    @property
    def live(self) -> bool:
        """Whether the app's process runs or will be restarted (not stopping or stopped)."""
        return self.state in LIVE_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "state": self.state,
            "pid": self.pid,
            "revision": self.revision,
            "public_port": self.public_port,
            "internal_port": self.internal_port,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "last_exit_code": self.last_exit_code,
            "crash_loop": self.crash_loop,
            "last_error": self.last_error,
            "stop_reason": self.stop_reason,
            "ready": self.ready,
            "directory": self.directory,
        }


class _Watch:
    """The watch of one running process: ``scope`` is the runner's (readiness),
    ``exit_waiter`` the helper's that awaits the exit; ``woken`` says how it ended
    (True: a wake, False: the exit, None: not yet)."""

    __slots__ = ("exit_waiter", "scope", "woken")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.exit_waiter = trio.CancelScope()
        self.woken: bool | None = None


class _Slot:
    def __init__(self, app: str) -> None:
        self.app = app
        self.desired: StartRequest | None = None
        self.current: StartRequest | None = None
        self.wake = trio.Event()
        self.state: ProcessState = "stopped"
        self.pid: int | None = None
        self.started_at: float | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.crash_loop = False
        self.last_error: str | None = None
        self.stop_reason: str | None = None
        self.history = CrashHistory()
        self.process: LaunchedProcess | None = None
        self.runner_active = False
        self.readiness = Readiness()
        self.watch: _Watch | None = None

    def info(self) -> ProcessInfo:
        shown = self.current or self.desired
        return ProcessInfo(
            app=self.app,
            state=self.state,
            pid=self.pid,
            revision=shown.revision if shown else "",
            public_port=shown.public_port if shown else 0,
            internal_port=shown.internal_port if shown else 0,
            restarts=self.restarts,
            started_at=self.started_at,
            last_exit_code=self.last_exit_code,
            crash_loop=self.crash_loop,
            last_error=self.last_error,
            stop_reason=self.stop_reason,
            ready=self.state == "running" and self.readiness.ready,
            directory=str(shown.cwd) if shown else "",
        )


@dataclass(frozen=True, slots=True)
class _Outcome:
    exited_on_its_own: bool
    code: int | None
    uptime: float


EventSink = Callable[..., None]


class ProcessTable:
    """Keeps each app's process as asked, on trio.

    Args:
        node_id: this node's id (``CORRAL_NODE`` of every process).
        data_dir: the node's data directory; logs and pid files go to
            ``<data_dir>/apps/<app>/``.
        launcher: how processes are started (``OsLauncher`` or ``MemoryLauncher``).
        start_soon: starts a runner task in a nursery that outlives the calls
            (the actor's ``ctx.start_task`` or a test's ``nursery.start_soon``).
        policy: restart backoff and crash-loop detection.
        grace: seconds between SIGTERM and SIGKILL when stopping.
        bind_host: the host apps should bind (``CORRAL_BIND_HOST``); readiness is
            probed there (on 127.0.0.1 for a wildcard).
        ready_timeout: seconds after which a process that never answered on its port
            counts as running anyway (it may not serve HTTP at all).
        wall_clock: wall time for ``started_at``.
        base_env: the environment processes inherit (default: the node's).
        on_event: ``on_event(kind, **fields)`` for observability events.
        on_change: called after any change of the table.
    """

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        launcher: Launcher,
        start_soon: Callable[..., Any],
        policy: RestartPolicy | None = None,
        grace: float = 10.0,
        bind_host: str = "127.0.0.1",
        ready_timeout: float = 30.0,
        wall_clock: Callable[[], float] = time.time,
        base_env: Mapping[str, str] | None = None,
        on_event: EventSink | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self._launcher = launcher
        self._start_soon = start_soon
        self.policy = policy or RestartPolicy()
        self.grace = grace
        self.bind_host = bind_host
        self.ready_timeout = ready_timeout
        self._wall = wall_clock
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._on_event = on_event
        self._on_change = on_change
        self._slots: dict[str, _Slot] = {}
        self._active = 0
        self._idle = trio.Event()
        self._idle.set()
        self._closing = False
        self.generation = 0
        # Per spawn: this table's life and a count make each start's marker unique.
        self._life = secrets.token_hex(4)
        self._marker_scope = marker_scope(node_id, data_dir)
        self._spawns = itertools.count(1)

    # ------------------------------------------------------------------ commands

    def ensure(self, request: StartRequest) -> bool:
        """Run ``request`` for its app: start it, or replace a process that runs
        something else (stopping it first). Returns False when the table is shutting
        down and refused."""
        if self._closing:
            return False
        slot = self._slots.get(request.app)
        if slot is None:
            slot = self._slots[request.app] = _Slot(request.app)
        if slot.desired == request:
            return True
        slot.desired = request
        slot.stop_reason = None
        if slot.runner_active:
            self._wake(slot)
        else:
            slot.runner_active = True
            if self._active == 0:
                self._idle = trio.Event()
            self._active += 1
            self._start_soon(self._run, slot)
        self._changed()
        return True

    def stop(self, app: str, reason: str) -> bool:
        """Stop ``app``'s process (SIGTERM, grace, SIGKILL) and do not restart it.
        Returns False when nothing was running or asked to run."""
        slot = self._slots.get(app)
        if slot is None or slot.desired is None:
            return False
        slot.desired = None
        slot.stop_reason = reason
        self._wake(slot)
        self._changed()
        return True

    def forget(self, app: str) -> bool:
        """Drop ``app``'s stopped entry. Returns False when there was none.

        Raises:
            ProcessStillRunning: its process is not stopped yet.
        """
        slot = self._slots.get(app)
        if slot is None:
            return False
        if slot.runner_active or slot.state != "stopped":
            raise ProcessStillRunning(
                f"app {app!r} is still {slot.state}; stop it and wait until it is stopped"
            )
        del self._slots[app]
        self._changed()
        return True

    # ------------------------------------------------------------------ queries

    def info(self, app: str) -> ProcessInfo | None:
        slot = self._slots.get(app)
        return None if slot is None else slot.info()

    def snapshot(self) -> list[ProcessInfo]:
        """Every app's row, sorted by app."""
        return [self._slots[app].info() for app in sorted(self._slots)]

    @property
    def active(self) -> int:
        """How many apps have a runner (a process running, starting, backing off or stopping)."""
        return self._active

    async def wait_idle(self) -> None:
        """Return once no runner is active."""
        await self._idle.wait()

    async def shutdown(self, reason: str = SHUTDOWN_REASON) -> None:
        """Stop every process (concurrently, each SIGTERM -> grace -> SIGKILL) and refuse
        new ones; return once nothing runs. Safe to call under a shielded scope."""
        self._closing = True
        for app in sorted(self._slots):
            self.stop(app, reason)
        with trio.move_on_after(self.grace + 5.0):
            await self._idle.wait()
        self.kill_all()
        with trio.move_on_after(5.0):
            for slot in list(self._slots.values()):
                if slot.process is not None and not slot.process.reaped:
                    await slot.process.reap()

    def kill_all(self) -> None:
        """SIGKILL every process now (synchronous: usable from any cleanup path)."""
        for slot in self._slots.values():
            if slot.process is not None and not slot.process.reaped:
                slot.process.kill()

    # ------------------------------------------------------------------ runner

    def _changed(self) -> None:
        self.generation += 1
        if self._on_change is not None:
            self._on_change()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, **fields)

    def _launch_spec(self, request: StartRequest) -> LaunchSpec:
        host = self.bind_host if self.bind_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        instance = instance_marker(
            self._marker_scope, request.app, f"{self._life}.{next(self._spawns)}"
        )
        return LaunchSpec(
            app=request.app,
            node_id=self.node_id,
            revision=request.revision,
            command=tuple(request.command),
            cwd=Path(request.cwd),
            paths=AppPaths.of(self.data_dir, request.app),
            public_port=request.public_port,
            internal_port=request.internal_port,
            instance=instance,
            env=process_environment(
                self._base_env,
                request.env,
                app=request.app,
                node_id=self.node_id,
                public_port=request.public_port,
                internal_port=request.internal_port,
                bind_host=self.bind_host,
                instance=instance,
            ),
            ready_host=host,
            ready_timeout=self.ready_timeout,
            health=request.health,
            memory_mb=request.memory_mb,
        )

    async def _run(self, slot: _Slot) -> None:
        try:
            while not self._closing:
                slot.wake = trio.Event()
                request = slot.desired
                if request is None:
                    break
                try:
                    outcome = await self._run_once(slot, request)
                except Exception as exc:
                    # Anything at all: this app is failed, the others go on.
                    outcome = self._failed(slot, request, exc)
                if not outcome.exited_on_its_own:
                    continue
                await self._back_off(slot, outcome)
        finally:
            slot.runner_active = False
            slot.state = "stopped"
            slot.pid = None
            slot.process = None
            self._active -= 1
            if self._active == 0:
                self._idle.set()
            self._changed()

    def _failed(self, slot: _Slot, request: StartRequest, exc: BaseException) -> _Outcome:
        phase = "stop" if slot.state == "stopping" else "start" if slot.pid is None else "run"
        error = _bounded(f"could not {phase} app {slot.app!r}: {describe(exc)}")
        # The traceback once; a retry that fails the same way says only the line.
        repeated = error == slot.last_error
        slot.last_error = error
        slot.current = request
        slot.state = "failed"
        slot.pid = None
        slot.process = None
        log.error("%s", error, exc_info=None if repeated else exc)
        self._emit("process.failed", app=slot.app, phase=phase, error=slot.last_error)
        self._changed()
        return _Outcome(True, None, 0.0)

    async def _back_off(self, slot: _Slot, outcome: _Outcome) -> None:
        decision = decide_restart(self.policy, slot.history, uptime=outcome.uptime)
        slot.history = decision.history
        entering_loop = decision.crash_loop and not slot.crash_loop
        slot.crash_loop = decision.crash_loop
        if slot.state != "failed":
            slot.state = "backoff"
        self._changed()
        self._emit(
            "process.exited",
            app=slot.app,
            code=outcome.code,
            uptime=round(outcome.uptime, 3),
            restart_in=decision.delay,
        )
        if entering_loop:
            log.warning(
                "app %s is crash-looping (%d exits or failed starts in a row, none up %gs); "
                "restarting every %gs",
                slot.app,
                decision.history.consecutive,
                self.policy.stable_after,
                decision.delay,
            )
            self._emit(
                "process.crash-loop",
                app=slot.app,
                exits=decision.history.consecutive,
                stable_after=self.policy.stable_after,
                backoff=decision.delay,
                last_exit_code=outcome.code,
            )
        with trio.move_on_after(decision.delay):
            await slot.wake.wait()
        if not slot.wake.is_set():
            slot.restarts += 1

    async def _run_once(self, slot: _Slot, request: StartRequest) -> _Outcome:
        spec = self._launch_spec(request)
        proc: LaunchedProcess | None = None
        async with trio.open_nursery() as nursery:
            try:
                try:
                    proc = await self._launcher.spawn(spec, nursery)
                except SpawnFailed as exc:
                    slot.last_error = _bounded(str(exc))
                    slot.current = request
                    slot.state = "failed"
                    log.error("%s", exc)
                    self._emit("process.spawn-failed", app=slot.app, error=slot.last_error)
                    self._changed()
                    return _Outcome(True, None, 0.0)
                spawned_at = trio.current_time()
                slot.process = proc
                slot.current = request
                slot.pid = proc.pid
                slot.started_at = self._wall()
                slot.readiness = Readiness()  # a restart is not ready until it passes again
                slot.state = "starting"
                slot.last_error = None
                self._changed()
                self._emit("process.started", app=slot.app, pid=proc.pid, revision=request.revision)
                woken = await self._watch(slot, proc, nursery)
                uptime = trio.current_time() - spawned_at
                if woken:
                    slot.state = "stopping"
                    self._changed()
                    code: int | None = await self._stop_telling(slot, proc)
                    reason = slot.stop_reason or "replaced by another revision or port pair"
                    if code == -signal.SIGKILL:
                        reason += (
                            f"; it was still running {self.grace:g} s after SIGTERM, so it "
                            "was killed (SIGKILL)"
                        )
                        log.warning("app %s: pid %d %s", slot.app, proc.pid, reason)
                    self._emit(
                        "process.stopped", app=slot.app, pid=proc.pid, code=code, reason=reason
                    )
                else:
                    code = await proc.finish()
                    exceeded = proc.limit_exceeded
                    if exceeded is not None:
                        slot.last_error = exceeded
                        log.warning("app %s: pid %d ended: %s", slot.app, proc.pid, exceeded)
                        self._emit(
                            "process.limit-exceeded", app=slot.app, pid=proc.pid, reason=exceeded
                        )
                slot.last_exit_code = code
                slot.pid = None
                slot.process = None
                return _Outcome(not woken, code, uptime)
            finally:
                if proc is not None and not proc.reaped:
                    # Cancelled (the actor or the node is going away, and nothing may
                    # outlive it), or something failed: still SIGTERM first, shielded,
                    # bounded by the grace.
                    with trio.CancelScope(shield=True):
                        await self._end_quietly(slot, proc)

    async def _stop_telling(self, slot: _Slot, proc: LaunchedProcess) -> int:
        """Stop ``proc`` (SIGTERM, the grace, SIGKILL) and return its exit code; one still
        running ``STOP_OVERDUE_AFTER`` s after its SIGTERM is reported then, with the
        seconds left before it is killed."""

        async def report_overdue() -> None:
            after = min(STOP_OVERDUE_AFTER, self.grace)
            with trio.move_on_after(after):
                await proc.wait_exited()
                return
            left = self.grace - after
            log.warning(
                "app %s: pid %d is still running %g s after SIGTERM; it is killed (SIGKILL) "
                "in %g s, at the end of its %g s grace",
                slot.app,
                proc.pid,
                after,
                left,
                self.grace,
            )
            self._emit(
                "process.stop-overdue",
                app=slot.app,
                pid=proc.pid,
                after=after,
                kill_in=round(left, 3),
                grace=self.grace,
            )

        async with trio.open_nursery() as nursery:
            if self.grace > STOP_OVERDUE_AFTER:
                nursery.start_soon(report_overdue)
            code = await proc.stop(self.grace)
            nursery.cancel_scope.cancel()
        return code

    async def _end_quietly(self, slot: _Slot, proc: LaunchedProcess) -> None:
        """Stop ``proc`` on a path that is already failing or cancelled: an error here is
        logged, never raised over the one that brought us here."""
        try:
            with trio.move_on_after(self.grace + 5.0):
                await proc.stop(self.grace)
            if not proc.reaped:
                proc.kill()
                with trio.move_on_after(5.0):
                    await proc.reap()
        except Exception:
            log.exception("app %s: ending pid %d failed; sending SIGKILL", slot.app, proc.pid)
            with contextlib.suppress(Exception):
                proc.kill()

    def _wake(self, slot: _Slot) -> None:
        """Wake ``slot``'s runner: it reads ``desired`` again (a wake during a backoff
        ends the backoff; during a watch, the watch)."""
        slot.wake.set()
        self._end_watch(slot, woken=True)

    def _end_watch(self, slot: _Slot, *, woken: bool) -> None:
        """End the watch of ``slot``'s process for a wake (True) or its exit (False);
        whichever comes first decides what the runner does next."""
        watch = slot.watch
        if watch is None or watch.woken is not None:
            return
        watch.woken = woken
        watch.scope.cancel()
        if woken:
            watch.exit_waiter.cancel()

    async def _watch(self, slot: _Slot, proc: LaunchedProcess, nursery: trio.Nursery) -> bool:
        """Wait until the process exits (False) or the slot is woken (True); meanwhile
        mark it running once ready, check its readiness, and clear a crash loop once it
        has run stably.

        Two tasks per process, not one per thing awaited: this one (the runner's) waits
        for readiness and checks it; one in ``nursery`` waits for the exit (and for
        ``stable_after``). The exit and a wake each end the watch by cancelling it.
        """
        if slot.wake.is_set():
            return True
        watch = slot.watch = _Watch()
        nursery.start_soon(self._await_exit, slot, proc, watch)
        try:
            with watch.scope:
                await self._await_ready(slot, proc)
                await self._check_readiness(slot, proc)
        finally:
            watch.exit_waiter.cancel()
            slot.watch = None
        return bool(watch.woken)

    async def _await_exit(self, slot: _Slot, proc: LaunchedProcess, watch: _Watch) -> None:
        with watch.exit_waiter:
            with trio.move_on_after(self.policy.stable_after):
                await proc.wait_exited()
                self._end_watch(slot, woken=False)
                return
            # The one place a crash loop ends: a run that lasted long enough.
            slot.history = CrashHistory()
            if slot.crash_loop:
                slot.crash_loop = False
                self._changed()
                self._emit("process.recovered", app=slot.app, pid=proc.pid)
            await proc.wait_exited()
            self._end_watch(slot, woken=False)

    async def _await_ready(self, slot: _Slot, proc: LaunchedProcess) -> None:
        answered = await proc.wait_ready()
        if not answered:
            log.info(
                "app %s did not answer on port %d within %gs; counting it as running",
                slot.app,
                slot.current.public_port if slot.current else 0,
                self.ready_timeout,
            )
        if slot.state == "starting":
            slot.state = "running"
            self._changed()

    async def _check_readiness(self, slot: _Slot, proc: LaunchedProcess) -> None:
        """Check the running process every interval for as long as it runs; publish
        (``_changed``) only when it turns ready or not ready."""
        health = slot.current.health if slot.current is not None else None
        spec = health or HealthSpec()
        timeout, interval = spec.timeout_ms / 1000, spec.interval_ms / 1000
        passed = False
        while True:
            # One scope bounds check after check, its deadline set for each one (a scope
            # per check was a third of the cost of a check on an idle node). A check
            # that overruns its deadline cancels the scope: the next gets a new one.
            with trio.CancelScope() as bound:
                while True:
                    bound.deadline = trio.current_time() + timeout
                    passed = False
                    try:
                        passed = await proc.check_ready()
                    except Exception as exc:  # a check's bug is a failed check, never a crash
                        log.debug("app %s: readiness check raised %s", slot.app, describe(exc))
                    bound.deadline = math.inf
                    if bound.cancel_called:
                        break  # it answered as its time ran out: this scope is spent
                    self._note_check(slot, proc, spec, passed)
                    await wheel_sleep(interval)
            self._note_check(slot, proc, spec, passed)  # False when it overran
            await wheel_sleep(interval)

    def _note_check(
        self, slot: _Slot, proc: LaunchedProcess, spec: HealthSpec, passed: bool
    ) -> None:
        before = slot.readiness
        slot.readiness = after_check(before, passed)
        if slot.readiness.ready == before.ready:
            return
        self._changed()
        if slot.readiness.ready:
            self._emit("process.ready", app=slot.app, pid=proc.pid)
            return
        log.warning(
            "app %s is not ready: %d readiness checks in a row failed (%s); "
            "it leaves the routing table, its process keeps running",
            slot.app,
            slot.readiness.failures,
            f"GET {spec.path}" if spec.path else "TCP connect to the public port",
        )
        self._emit(
            "process.unready",
            app=slot.app,
            pid=proc.pid,
            failures=slot.readiness.failures,
        )


#: How much of an error message a process row keeps (it is published in the node record).
MAX_ERROR_CHARS = 400


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception; the leaves of an exception group, joined."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in exc.exceptions)
    if isinstance(exc, ProcessSupervisorError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
