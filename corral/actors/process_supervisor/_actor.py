"""The ProcessSupervisor actor: a thin shell around :class:`ProcessTable`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.actors.process_supervisor._errors import ProcessStillRunning
from corral.actors.process_supervisor._launcher import Launcher
from corral.actors.process_supervisor._os import OsLauncher
from corral.actors.process_supervisor._policy import RestartPolicy
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.registry import HealthSpec
from corral.supervision import (
    Actor,
    ActorNotFound,
    ActorRef,
    ActorStopped,
    MailboxFull,
    UnhandledMessage,
)
from corral.transport import message


@message("process_supervisor.start")
@dataclass(frozen=True)
class StartProcess:
    """Run ``command`` of ``revision`` for ``app`` (replacing what runs for it, if
    anything else). Replies True, or False once the node is shutting down."""

    app: str
    revision: str
    command: tuple[str, ...]
    cwd: str
    public_port: int
    internal_port: int
    env: dict[str, str] = field(default_factory=dict)
    health: HealthSpec | None = None
    memory_mb: int = 0


@message("process_supervisor.stop")
@dataclass(frozen=True)
class StopProcess:
    """Stop ``app``'s process for ``reason``. Replies whether anything was running."""

    app: str
    reason: str


@message("process_supervisor.forget")
@dataclass(frozen=True)
class ForgetProcess:
    """Drop ``app``'s stopped entry. Replies True when it is gone (or was never there),
    False while its process is still running or stopping."""

    app: str


@message("process_supervisor.list")
@dataclass(frozen=True)
class ListProcesses:
    """Replies with the process table: a list of dicts (see ``ProcessInfo.to_dict``),
    one per app, sorted by app."""


@message("process_supervisor.generation")
@dataclass(frozen=True)
class ProcessGeneration:
    """Replies with a string that changes whenever the process table changes (and differs
    between two lives of the actor), so a reader can skip an unchanged table cheaply."""


@dataclass(frozen=True)
class _ReapOrphans:
    """Timer tick: collect the adopted orphans that died (a subreaper node only)."""


#: Seconds between two scans for dead adopted orphans (a zombie holds only a pid slot).
ORPHAN_SCAN_INTERVAL = 1.0


@message("process_supervisor.changed")
@dataclass(frozen=True)
class ProcessesChanged:
    """Told to the notified sibling (the Reconciler) when the table changed."""


_lives = itertools.count(1)


class ProcessSupervisor(Actor):
    """Runs each app's process as the Reconciler asks.

    On start it first ends what a previous life of the node left running (pid files
    under ``data_dir``, checked with psutil, and processes carrying a marker of this
    node in their environment); on stop (``stopping()``, shielded) every process is
    gone before it returns. Once a second it collects dead orphans the node adopted
    as a child subreaper (only when the launcher can adopt any: ``adopts_orphans``).

    Args:
        node_id: this node's id.
        data_dir: the node's data directory.
        launcher: how processes are started (default: real ones).
        policy: restart backoff and crash-loop detection.
        grace: seconds between SIGTERM and SIGKILL.
        bind_host: the host apps bind (``CORRAL_BIND_HOST``).
        ready_timeout: seconds after which a silent process counts as running.
        notify: the name of a sibling actor told ``ProcessesChanged`` (None: nobody).
        wall_clock: wall time for ``started_at``.
    """

    mailbox_size = 256

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        launcher: Launcher | None = None,
        policy: RestartPolicy | None = None,
        grace: float = 10.0,
        bind_host: str = "127.0.0.1",
        ready_timeout: float = 30.0,
        notify: str | None = "reconciler",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._node_id = node_id
        self._data_dir = Path(data_dir)
        self._launcher = launcher or OsLauncher()
        self._policy = policy or RestartPolicy()
        self._grace = grace
        self._bind_host = bind_host
        self._ready_timeout = ready_timeout
        self._notify_name = notify
        self._wall = wall_clock
        self._life = next(_lives)
        self._table: ProcessTable | None = None
        self._notified: ActorRef | None = None

    @property
    def table(self) -> ProcessTable:
        if self._table is None:
            raise RuntimeError("the process table exists once the actor has started")
        return self._table

    async def started(self) -> None:
        ended = await self._launcher.end_leftovers(
            self._data_dir, self._grace, node_id=self._node_id
        )
        for record in ended:
            self.ctx.log.warning(
                "ended pid %d of app %s, left running by a previous life of this node",
                record.pid,
                record.app,
            )
            self.ctx.emit("process.leftover-ended", app=record.app, pid=record.pid)
        self._table = ProcessTable(
            node_id=self._node_id,
            data_dir=self._data_dir,
            launcher=self._launcher,
            start_soon=self.ctx.start_task,
            policy=self._policy,
            grace=self._grace,
            bind_host=self._bind_host,
            ready_timeout=self._ready_timeout,
            wall_clock=self._wall,
            on_event=self.ctx.emit,
            on_change=self._notify,
        )
        if self._launcher.adopts_orphans:
            # Only a child subreaper adopts orphans: otherwise the scan finds nothing,
            # and a timer a second per node is most of an idle node's work.
            self.ctx.every(ORPHAN_SCAN_INTERVAL, _ReapOrphans())

    def _notify(self) -> None:
        if self._notify_name is None:
            return
        if self._notified is None:
            # Made once: a ref resolves its path whenever it is used (a restarted
            # reader is found), and a start changes the table four times.
            parent = self.ctx.path.rsplit("/", 1)[0]
            self._notified = self.ctx.system.ref(f"{parent}/{self._notify_name}")
        try:
            self._notified.tell_nowait(ProcessesChanged())
        except (ActorNotFound, ActorStopped, MailboxFull, UnhandledMessage):
            pass  # the reader also compares ProcessGeneration on its next pass

    async def handle(self, message: object) -> object:
        table = self.table
        match message:
            case StartProcess():
                return table.ensure(
                    StartRequest(
                        app=message.app,
                        revision=message.revision,
                        command=tuple(message.command),
                        cwd=message.cwd,
                        public_port=message.public_port,
                        internal_port=message.internal_port,
                        env=dict(message.env),
                        health=message.health,
                        memory_mb=message.memory_mb,
                    )
                )
            case StopProcess():
                return table.stop(message.app, message.reason)
            case ForgetProcess():
                try:
                    table.forget(message.app)
                except ProcessStillRunning:
                    return False
                return True
            case ListProcesses():
                return [info.to_dict() for info in table.snapshot()]
            case ProcessGeneration():
                return f"{self._life}:{table.generation}"
            case _ReapOrphans():
                try:
                    await self._launcher.reap_orphans()
                except Exception:  # housekeeping: never worth crashing every app's supervisor
                    self.ctx.log.exception("collecting adopted orphans failed")
                return None
        raise UnhandledMessage(message)

    async def stopping(self) -> None:
        if self._table is not None:
            await self._table.shutdown()
