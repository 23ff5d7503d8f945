"""The fleet simulator: many full nodes in one process, fault schedules, invariants.

Theory of operation
-------------------
:func:`open_fleet` runs N complete nodes — registration, coordinator, and the node
agent (reconciler, port allocator, in-memory processes) — on one
:class:`~corral.transport.MemoryNetwork` and one memory registry, on trio's clock.
Under ``trio.testing.MockClock(autojump_threshold=0)`` ten virtual minutes of a
fleet cost only the CPU its actors use.

Faults are plain data (:class:`Fault`): kill a node and restart it, stall its
registry calls, partition it from the others, or cut it off from the registry,
each for a while. :func:`random_faults` draws a schedule from a seed (pure: the
same seed gives the same schedule, so a failure that prints its seed can be
replayed), and :meth:`Fleet.run_faults` applies one.

An :class:`InvariantChecker` runs alongside and records every violation:

* **fence**: no placement is written under a fence older than one already seen
  (a stale coordinator's write);
* **one-per-node**: no app has two live instances on one node;
* **ports**: no port is held by two apps of one node;
* **overlap**: a ``replicas: N`` app never runs on more than N nodes for longer
  than ``overlap_window`` seconds. The window: a node cut off from the registry
  (or stalled) for D seconds keeps its processes until it reconnects and learns
  they moved, while their replacements start once its record lapsed (the lease
  TTL) and its grace passed; so the overlap lasts about D - TTL - grace, plus one
  reconcile pass for the node to stop them once it hears. The default, the lease
  TTL + 10 s, holds for cut-offs up to about twice the TTL plus the grace (the
  longest :func:`random_faults` draws with ``max_duration`` <= TTL); pass a larger
  one for longer outages;
* **restart**: no instance restarts unless it moved, its revision changed or it
  crashed: a process that starts on a node where the app's previous process
  ended is a restart, allowed only when that one ended by itself or was killed
  with its node (no SIGTERM: corral did not stop it), the node began a new life
  in between, the two revisions differ, or a placement write took the node off
  the app in between;
* **relocation**: nothing is relocated off a suspect node, or off a down node
  within its grace. A node in a fault (kill, stall, partition or registry
  outage; the fleet tells the checker through
  :meth:`InvariantChecker.fault_began`) is suspect while its record stands, and
  down once the record lapses: no placement write may take it off an app before
  ``grace`` seconds (default the policy's ``grace_period_s``) have passed since
  that lapse (the coordinator's ``down_since`` is never earlier). Removals of a
  deleted or retired app's instances do not count;
* **converged** (:meth:`InvariantChecker.check_converged`, at the end, once the
  faults are healed): every app that can be placed runs on
  ``min(replicas, live nodes)`` nodes.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import trio

from corral.actors.planner import Policy
from corral.actors.process_supervisor import MemoryLauncher, MemoryProcess
from corral.registry import (
    NODES_PREFIX,
    PLACEMENT_PREFIX,
    AppRecord,
    EventType,
    MeasuredCapacity,
    PlacementRecord,
    Registry,
    decode_record,
)
from corral.testing._cluster import (
    DEFAULT_TEST_CAPACITY,
    Cluster,
    agent_node_children,
    open_cluster,
)

__all__ = [
    "Fault",
    "FaultKind",
    "Fleet",
    "InvariantChecker",
    "Violation",
    "open_fleet",
    "random_faults",
]

FaultKind = Literal["kill", "stall", "partition", "registry-outage"]
FAULT_KINDS: tuple[FaultKind, ...] = ("kill", "stall", "partition", "registry-outage")


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: ``kind`` hits ``node`` at ``at`` (seconds after the schedule starts)
    and lasts ``duration`` seconds (then the node restarts, or is healed)."""

    at: float
    kind: FaultKind
    node: str
    duration: float


def random_faults(
    seed: int,
    nodes: Sequence[str],
    *,
    count: int = 5,
    span: float = 300.0,
    max_duration: float = 60.0,
    kinds: Sequence[FaultKind] = FAULT_KINDS,
) -> tuple[Fault, ...]:
    """A fault schedule drawn from ``seed`` (the same seed, the same schedule).

    At most one fault is active per node at a time, and a node gets as long as its
    last fault lasted to recover before its next one; at most a third of the nodes
    (at least one) are hit at all, so a majority stays healthy.

    Raises:
        ValueError: no nodes, or a count, span or duration below zero.
    """
    if not nodes:
        raise ValueError("a fault schedule needs at least one node")
    if count < 0 or span < 0 or max_duration < 0:
        raise ValueError(
            f"count, span and max_duration must be >= 0, got {count}, {span}, {max_duration}"
        )
    rng = random.Random(seed)
    victims = rng.sample(sorted(nodes), max(1, len(nodes) // 3))
    busy_until: dict[str, float] = {}
    faults: list[Fault] = []
    for _ in range(count):
        at = round(rng.uniform(0.0, span), 3)
        node = rng.choice(victims)
        if busy_until.get(node, -math.inf) > at:
            continue
        duration = round(rng.uniform(1.0, max(1.0, max_duration)), 3)
        # The node gets as long again to recover before its next fault: back-to-back
        # faults would be one long one, past what the overlap window allows for.
        busy_until[node] = at + 2 * duration
        faults.append(Fault(at, rng.choice(list(kinds)), node, duration))
    return tuple(sorted(faults, key=lambda f: (f.at, f.node)))


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant broken at ``time`` (trio's clock)."""

    time: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"t={self.time:.3f} {self.invariant}: {self.detail}"


@dataclass
class InvariantChecker:
    """Watches a :class:`~corral.testing.Cluster` and records broken invariants (see the
    module docstring). Start :meth:`run` in a nursery; read :attr:`violations`."""

    cluster: Cluster
    overlap_window: float
    interval: float = 1.0
    #: seconds a node in trouble keeps its work (default: the cluster policy's grace).
    grace: float | None = None
    violations: list[Violation] = field(default_factory=list)
    #: app -> its replica count, as the fleet was told (see :meth:`expect`).
    cluster_apps: dict[str, int | str] = field(default_factory=dict)
    _max_fence: int = 0
    _over_since: dict[str, float] = field(default_factory=dict)
    _reported: set[tuple[str, str]] = field(default_factory=set)
    # overlap: per node, its launcher's timeline length and whether it ran at the last
    # look, and the apps it ran then; per app, on how many nodes it runs; apps to weigh.
    _generation: dict[str, tuple[int, bool]] = field(default_factory=dict)
    _node_apps: dict[str, frozenset[str]] = field(default_factory=dict)
    _nodes_of: dict[str, int] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    # restart: per node, how many of its launcher's processes were looked at; per
    # (node, app) the last process seen and the node's life then; the (node, app)
    # pairs a placement write took the node off since; starts to judge next check.
    _scanned: dict[str, int] = field(default_factory=dict)
    _last: dict[tuple[str, str], tuple[MemoryProcess, int]] = field(default_factory=dict)
    _hosts_of: dict[str, set[str]] = field(default_factory=dict)
    _moved: set[tuple[str, str]] = field(default_factory=set)
    _pending: list[tuple[str, MemoryProcess, MemoryProcess, int, int]] = field(default_factory=list)
    # relocation: each app's nodes as last written; the nodes in a fault, and when the
    # record of each of those lapsed during it.
    _placed: dict[str, frozenset[str]] = field(default_factory=dict)
    _in_trouble: set[str] = field(default_factory=set)
    _lapsed_at: dict[str, float] = field(default_factory=dict)

    def _violate(self, invariant: str, subject: str, detail: str) -> None:
        if (invariant, subject) in self._reported:
            return
        self._reported.add((invariant, subject))
        self.violations.append(Violation(trio.current_time(), invariant, detail))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check until cancelled: every placement write as it lands, the rest every
        ``interval`` seconds."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._watch_fences)
            await nursery.start(self._watch_lapses)
            task_status.started()
            while True:
                self.check_now()
                await trio.sleep(self.interval)

    def fault_began(self, node: str) -> None:
        """``node`` is in trouble from now on (killed, stalled, partitioned or cut off)."""
        self._in_trouble.add(node)
        self._lapsed_at.pop(node, None)

    def fault_ended(self, node: str) -> None:
        """``node`` is healthy again (restarted or healed)."""
        self._in_trouble.discard(node)
        self._lapsed_at.pop(node, None)

    def _grace(self) -> float:
        return self.cluster.policy.grace_period_s if self.grace is None else self.grace

    async def _watch_fences(self, *, task_status: trio.TaskStatus[None]) -> None:
        registry = self.cluster.registry
        start = await registry.revision() + 1
        async with registry.watch(PLACEMENT_PREFIX, start) as events:
            task_status.started()
            async for event in events:
                app = event.kv.key[len(PLACEMENT_PREFIX) :]
                if event.type is not EventType.PUT:
                    self._placement_changed(app, frozenset(), deleted=True)
                    continue
                record = decode_record(event.kv.key, event.kv.value)
                if not isinstance(record, PlacementRecord):
                    continue
                self._placement_changed(app, frozenset(record.nodes), deleted=False)
                if record.fence < self._max_fence:
                    self._violate(
                        "fence",
                        f"{event.kv.key}@{event.kv.mod_revision}",
                        f"{event.kv.key} written under fence {record.fence} after fence "
                        f"{self._max_fence} had written",
                    )
                self._max_fence = max(self._max_fence, record.fence)

    async def _watch_lapses(self, *, task_status: trio.TaskStatus[None]) -> None:
        registry = self.cluster.registry
        start = await registry.revision() + 1
        async with registry.watch(NODES_PREFIX, start) as events:
            task_status.started()
            async for event in events:
                node = event.kv.key[len(NODES_PREFIX) :]
                if event.type is EventType.PUT:
                    self._lapsed_at.pop(node, None)
                elif node in self._in_trouble:
                    self._lapsed_at.setdefault(node, trio.current_time())

    def _placement_changed(self, app: str, nodes: frozenset[str], *, deleted: bool) -> None:
        before = self._placed.get(app, frozenset())
        self._placed[app] = nodes
        for host in self._hosts_of.get(app, ()):
            if host not in nodes:
                self._moved.add((host, app))
        if deleted or not nodes:
            return  # the app is gone or retired: its instances stop, nothing moves
        now = trio.current_time()
        grace = self._grace()
        for host in sorted(before - nodes):
            if host not in self._in_trouble:
                continue
            lapsed = self._lapsed_at.get(host)
            if lapsed is None:
                why = "while it was suspect (in a fault, its record standing)"
            elif now - lapsed < grace:
                why = f"{now - lapsed:g} s after its record lapsed, within the {grace:g} s grace"
            else:
                continue
            self._violate("relocation", f"{app}/{host}@{now}", f"{app} was taken off {host} {why}")

    def check_now(self) -> None:
        """Check the instance invariants against what runs right now.

        Only nodes whose processes started or ended since the last check (or that
        stopped or started running) are looked at again, and only apps whose node count
        changed, or that run on too many nodes, are weighed against their replicas: an
        idle fleet costs a check O(nodes), not O(instances)."""
        now = trio.current_time()
        self._judge_restarts()
        touched = self._dirty
        self._dirty = set()
        for node_id, node in self.cluster.nodes.items():
            self._scan_starts(node_id, node.launcher, node.life)
            generation = (len(node.launcher.timeline), node.running)
            if self._generation.get(node_id) == generation:
                continue
            self._generation[node_id] = generation
            apps = self._node_apps_now(node_id, node.launcher) if node.running else frozenset()
            before = self._node_apps.get(node_id, frozenset())
            self._node_apps[node_id] = apps
            for app in apps - before:
                self._nodes_of[app] = self._nodes_of.get(app, 0) + 1
                touched.add(app)
            for app in before - apps:
                self._nodes_of[app] -= 1
                touched.add(app)
        touched.update(self._over_since)
        for app in sorted(touched):
            want = self.cluster_apps.get(app)
            if not isinstance(want, int):
                self._over_since.pop(app, None)
                continue
            running = self._nodes_of.get(app, 0)
            if running <= want:
                self._over_since.pop(app, None)
                continue
            since = self._over_since.setdefault(app, now)
            if now - since > self.overlap_window:
                self._violate(
                    "overlap",
                    app,
                    f"{app} (replicas {want}) ran on {running} nodes for {now - since:g} s, "
                    f"longer than the {self.overlap_window:g} s window",
                )

    def _node_apps_now(self, node_id: str, launcher: MemoryLauncher) -> frozenset[str]:
        """The apps with a live process on the node; checks one-per-node and ports."""
        apps: dict[str, int] = {}
        ports: dict[int, str] = {}
        for process in launcher.alive():
            app = process.spec.app
            apps[app] = apps.get(app, 0) + 1
            for port in (process.spec.public_port, process.spec.internal_port):
                holder = ports.setdefault(port, app)
                if holder != app:
                    self._violate(
                        "ports",
                        f"{node_id}:{port}",
                        f"port {port} of {node_id} is held by {holder} and {app}",
                    )
        for app, count in apps.items():
            if count > 1:
                self._violate(
                    "one-per-node", f"{node_id}/{app}", f"{app} runs {count} times on {node_id}"
                )
        return frozenset(apps)

    def _scan_starts(self, node_id: str, launcher: MemoryLauncher, life: int) -> None:
        spawned = launcher.spawned
        start = self._scanned.get(node_id, 0)
        if start == len(spawned):
            return
        self._scanned[node_id] = len(spawned)
        for process in spawned[start:]:
            app = process.spec.app
            key = (node_id, app)
            last = self._last.get(key)
            self._last[key] = (process, life)
            self._hosts_of.setdefault(app, set()).add(node_id)
            if last is not None:
                # Judged at the next check, once the placement write that may explain it
                # has surely reached the watch.
                self._pending.append((node_id, last[0], process, last[1], life))

    def _judge_restarts(self) -> None:
        pending, self._pending = self._pending, []
        for node_id, before, after, life_before, life_after in pending:
            app = after.spec.app
            moved = (node_id, app) in self._moved
            self._moved.discard((node_id, app))
            if (
                moved
                or life_before != life_after
                or before.spec.revision != after.spec.revision
                or "SIGTERM" not in before.signals
            ):
                continue
            self._violate(
                "restart",
                f"{node_id}/{app}/{after.pid}",
                f"{app} restarted on {node_id} (pid {before.pid} stopped by SIGTERM, "
                f"pid {after.pid} started) with the same revision, though it neither moved "
                "nor crashed",
            )

    def expect(self, app: AppRecord) -> None:
        """Tell the checker an app exists with its replica count (the fleet does)."""
        self.cluster_apps[app.name] = app.replicas
        self._dirty.add(app.name)

    def check_converged(self) -> list[str]:
        """Every app runs on ``min(replicas, live nodes)`` nodes (or on every live node
        for ``"all"``); returns (and records) what does not."""
        live = len(self.cluster.running)
        running = self.cluster.instances()
        missing = []
        for app, replicas in sorted(self.cluster_apps.items()):
            want = live if replicas == "all" else min(int(replicas), live)
            have = len(running.get(app, ()))
            if have != want:
                missing.append(f"{app} runs on {have} node(s), not {want}")
                self._violate("converged", app, missing[-1])
        return missing


class Fleet:
    """A running fleet (build it with :func:`open_fleet`)."""

    def __init__(self, cluster: Cluster, checker: InvariantChecker) -> None:
        self.cluster = cluster
        self.checker = checker

    @property
    def violations(self) -> list[Violation]:
        return self.checker.violations

    async def put_app(self, app: AppRecord) -> None:
        """Create or change an app (the checker learns its replica count)."""
        self.checker.expect(app)
        await self.cluster.put_app(app)

    async def run_faults(self, faults: Sequence[Fault]) -> None:
        """Apply a schedule (times from now) and return once every fault has ended."""
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            for fault in faults:
                nursery.start_soon(self._one_fault, t0, fault)

    async def _one_fault(self, t0: float, fault: Fault) -> None:
        await trio.sleep_until(t0 + fault.at)
        cluster = self.cluster
        if fault.node not in cluster.running:
            return
        self.checker.fault_began(fault.node)
        try:
            if fault.kind == "kill":
                await cluster.kill(fault.node)
                await trio.sleep(fault.duration)
                await cluster.restart(fault.node)
                return
            if fault.kind == "partition":
                others = [n for n in cluster.nodes if n != fault.node]
                cluster.partition([fault.node], others)
                await trio.sleep(fault.duration)
                cluster.heal()
                return
            cluster.cut_registry(fault.node, hang=fault.kind == "stall")
            await trio.sleep(fault.duration)
            if fault.node in cluster.running:
                cluster.restore_registry(fault.node)
        finally:
            self.checker.fault_ended(fault.node)


def fleet_node_ids(nodes: int, racks: int) -> dict[str, str]:
    """Node id -> rack for a fleet of ``nodes`` spread over ``racks`` racks."""
    width = len(str(max(nodes, 1)))
    return {f"n{i:0{width}d}": f"rack-{i % max(racks, 1)}" for i in range(nodes)}


@asynccontextmanager
async def open_fleet(
    nodes: int,
    *,
    racks: int = 1,
    lease_ttl: float = 45.0,
    policy: Policy | None = None,
    capacity: MeasuredCapacity | None = DEFAULT_TEST_CAPACITY,
    overlap_window: float | None = None,
    check_interval: float = 1.0,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    registry: Registry | None = None,
    grace: float | None = None,
    data_dir: Path | None = None,
) -> AsyncIterator[Fleet]:
    """Run ``nodes`` full nodes (``n0``, ``n1``...; registration, coordinator, node agent
    on in-memory processes) spread over ``racks`` racks, with an
    :class:`InvariantChecker` running, for the duration of the block.

    Args:
        nodes: how many nodes.
        racks: how many racks they are spread over (round robin).
        lease_ttl: the coordinator's and the nodes' lease TTL, seconds.
        policy: the planner's policy.
        capacity: what every node reports.
        overlap_window: see :class:`InvariantChecker` (default ``lease_ttl`` + 10 s).
        check_interval: seconds between two instance checks.
        labels: node id -> labels.
        registry: the shared registry (default a fresh MemoryRegistry; one passed
            in, a CountingRegistry say, is left open).
        grace: how long the checker expects a node in trouble to keep its work
            (default the policy's ``grace_period_s``).
        data_dir: each node gets ``<data_dir>/<node id>``. Default: a temporary
            directory, on a memory file system when there is one (``/dev/shm``): nodes
            write their port ledgers and process state with fsync, which costs
            milliseconds each on a disk and a thousand times less there.
    """
    window = lease_ttl + 10.0 if overlap_window is None else overlap_window
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            memory_fs = _memory_fs()
            data_dir = Path(
                stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="corral-fleet-", dir=memory_fs)
                )
            )
        async with _open_fleet(
            nodes,
            racks=racks,
            lease_ttl=lease_ttl,
            policy=policy,
            capacity=capacity,
            window=window,
            check_interval=check_interval,
            labels=labels,
            registry=registry,
            grace=grace,
            data_dir=data_dir,
        ) as fleet:
            yield fleet


_SHM = "/dev/shm"


def _memory_fs() -> str | None:
    """``/dev/shm`` when it is a writable directory (a memory file system), else None."""
    return _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None


@asynccontextmanager
async def _open_fleet(
    nodes: int,
    *,
    racks: int,
    lease_ttl: float,
    policy: Policy | None,
    capacity: MeasuredCapacity | None,
    window: float,
    check_interval: float,
    labels: Mapping[str, Mapping[str, str]] | None,
    registry: Registry | None,
    grace: float | None,
    data_dir: Path,
) -> AsyncIterator[Fleet]:
    async with open_cluster(
        [],
        registry=registry,
        lease_ttl=lease_ttl,
        policy=policy,
        children=agent_node_children,
        capacity=capacity,
        data_dir=data_dir,
    ) as cluster:
        for node_id, rack in fleet_node_ids(nodes, racks).items():
            await cluster.add_node(
                node_id, rack=rack, capacity=capacity, labels=(labels or {}).get(node_id)
            )
        checker = InvariantChecker(
            cluster, overlap_window=window, interval=check_interval, grace=grace
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(checker.run)
            try:
                yield Fleet(cluster, checker)
            finally:
                nursery.cancel_scope.cancel()
