"""The node agent: ProcessSupervisor, PortAllocator and Reconciler under one supervisor."""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from corral.actors.port_allocator import PortAllocator, bind_probe
from corral.actors.process_supervisor import Launcher, ProcessSupervisor, RestartPolicy
from corral.actors.reconciler._actor import Materialize, Reconciler
from corral.actors.reconciler._backoff import DEFAULT_BASE, DEFAULT_CAP
from corral.registry import Registry
from corral.supervision import ChildSpec, Restart, Strategy, SupervisorSpec


@dataclass(frozen=True)
class AgentSpec:
    """How to run this node's agent; :meth:`supervisor_spec` gives the subtree to drop
    into the node's actor tree.

    The children are started in order — ``process_supervisor`` (which first ends what a
    previous life of the node left running), ``port_allocator`` (which loads the local
    port state), ``reconciler`` — and stopped in reverse, so the processes are the last
    thing to go and every one of them is gone before the agent has stopped.

    Args:
        node_id: this node's id.
        data_dir: the node's data directory (``<data_dir>/apps/<name>/`` per app).
        registry: the shared registry.
        materialize: ``materialize(app, deployment) -> revision directory``.
        port_range_start, port_range_end: the port range (both ends included).
        port_quarantine_ms: how long a released port is kept from other apps.
        clock: wall time for the port quarantine (survives restarts) and timestamps.
        random: the random source of port draws (default: a fresh ``random.Random``).
        bind_host: the host apps are told to bind (``CORRAL_BIND_HOST``).
        probe_host: where free ports are probed ("0.0.0.0": any listener on the machine).
        port_probe: ``probe(host, port) -> bool``, True when the port is free (default: a
            real bind and release; tests of many nodes in one process may inject one).
        grace: seconds between SIGTERM and SIGKILL when stopping a process.
        restart_policy: crash backoff and crash-loop detection.
        launcher: how processes are started (default: real processes).
        interval: seconds between reconcile passes.
        full_pass_every: a full pass at least this often even when nothing moved.
        ready_timeout: seconds after which a process that never answered on its port
            counts as running.
        materialize_backoff, materialize_backoff_cap: the wait before a revision that
            failed to get onto disk is tried again, doubled per failure up to the cap.
        instance: this node process's instance token; when set, the serving set is
            published only onto a node record carrying it (a record another process
            took over is left to that process).
        max_drain: the most seconds a ready instance is left out of the routing table
            before it is stopped (its app's ``drain_ms``, capped by this).
        name: the supervisor's name in the tree.
    """

    PROCESS_SUPERVISOR: ClassVar[str] = "process_supervisor"
    PORT_ALLOCATOR: ClassVar[str] = "port_allocator"
    RECONCILER: ClassVar[str] = "reconciler"

    node_id: str
    data_dir: Path
    registry: Registry
    materialize: Materialize
    port_range_start: int = 24000
    port_range_end: int = 24998
    port_quarantine_ms: int = 600_000
    clock: Callable[[], float] = time.time
    random: _random.Random = field(default_factory=_random.Random)
    bind_host: str = "127.0.0.1"
    probe_host: str = "0.0.0.0"
    port_probe: Callable[[str, int], bool] = bind_probe
    grace: float = 10.0
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    launcher: Launcher | None = None
    interval: float = 5.0
    full_pass_every: float = 60.0
    instance: str | None = None
    ready_timeout: float = 30.0
    materialize_backoff: float = DEFAULT_BASE
    materialize_backoff_cap: float = DEFAULT_CAP
    max_drain: float = 5.0
    name: str = "agent"

    def children(self) -> list[ChildSpec]:
        """The three child specs, in start order."""
        return [
            ChildSpec(
                name=self.PROCESS_SUPERVISOR,
                factory=lambda: ProcessSupervisor(
                    node_id=self.node_id,
                    data_dir=self.data_dir,
                    launcher=self.launcher,
                    policy=self.restart_policy,
                    grace=self.grace,
                    bind_host=self.bind_host,
                    ready_timeout=self.ready_timeout,
                    notify=self.RECONCILER,
                    wall_clock=self.clock,
                ),
                restart=Restart.PERMANENT,
                # stopping() waits for every process: its grace, the SIGKILL, the reaping
                shutdown_grace=self.grace + 15.0,
            ),
            ChildSpec(
                name=self.PORT_ALLOCATOR,
                factory=lambda: PortAllocator(
                    node_id=self.node_id,
                    data_dir=self.data_dir,
                    registry=self.registry,
                    port_range_start=self.port_range_start,
                    port_range_end=self.port_range_end,
                    quarantine_ms=self.port_quarantine_ms,
                    clock=self.clock,
                    random=self.random,
                    bind_host=self.probe_host,
                    probe=self.port_probe,
                ),
                restart=Restart.PERMANENT,
                shutdown_grace=5.0,
            ),
            ChildSpec(
                name=self.RECONCILER,
                factory=lambda: Reconciler(
                    node_id=self.node_id,
                    data_dir=self.data_dir,
                    registry=self.registry,
                    materialize=self.materialize,
                    interval=self.interval,
                    full_pass_every=self.full_pass_every,
                    port_allocator=self.PORT_ALLOCATOR,
                    process_supervisor=self.PROCESS_SUPERVISOR,
                    wall_clock=self.clock,
                    materialize_backoff=self.materialize_backoff,
                    materialize_backoff_cap=self.materialize_backoff_cap,
                    instance=self.instance,
                    max_drain=self.max_drain,
                ),
                restart=Restart.PERMANENT,
                shutdown_grace=5.0,
            ),
        ]

    def supervisor_spec(self) -> SupervisorSpec:
        """The agent's supervisor (one-for-one: a crashed actor restarts alone; the
        Reconciler notices a restarted ProcessSupervisor by its new generation)."""
        return SupervisorSpec(
            name=self.name,
            children=self.children(),
            strategy=Strategy.ONE_FOR_ONE,
            max_restarts=5,
            within=60.0,
        )
