"""Several corral nodes in one process: the Cluster harness.

Each node is an :class:`~corral.supervision.ActorSystem` on one shared
:class:`~corral.transport.MemoryNetwork`, running a ``node`` supervisor
(NodeRegistration and Coordinator by default; :func:`agent_node_children` adds
the node agent on an in-memory launcher; pass ``children=`` for your own), and
reaching one shared registry through its own :class:`~corral.testing.RegistryGate`.
All of them sit behind one :class:`~corral.testing.CountingRegistry`, so a test can
count writes::

    async with open_cluster(3) as cluster:             # node-1, node-2, node-3
        holder = await cluster.wait_for_coordinator()
        await cluster.kill(holder)                      # crash: no cleanup reaches anyone
        successor = await cluster.wait_for_coordinator(exclude={holder})
        cluster.cut_registry("node-2", hang=True)       # a paused / partitioned node
        cluster.partition({"node-1"}, {"node-2", "node-3"})

Faults:

* :meth:`Cluster.stop` — a clean shutdown (SIGTERM): every actor's cleanup
  runs and reaches the registry (leases are handed back).
* :meth:`Cluster.kill` — a crash (SIGKILL): the node's registry gate and
  network link are cut first, so its cleanup reaches nothing; its leases
  lapse a TTL later. The node's in-memory processes die with it (a machine
  that went away).
* :meth:`Cluster.restart` — a new life of a stopped or killed node, same id.
* :meth:`Cluster.partition` / :meth:`Cluster.heal` — the transport.
* :meth:`Cluster.cut_registry` / :meth:`Cluster.restore_registry` — one
  node's registry link: refused (``RegistryUnavailable``) or hanging (calls
  wait, then arrive late).

With the agent (``children=agent_node_children``) every node runs its apps
as :class:`~corral.actors.process_supervisor.MemoryProcess` objects:
:meth:`Cluster.instances` says which nodes run what now, and
:meth:`Cluster.running_counts` replays every start and exit in order::

    async with open_cluster(3, children=agent_node_children) as cluster:
        ...
        assert cluster.instances() == {"shop": ["node-1", "node-3"]}
        assert max(n for _, n in cluster.running_counts("shop")) <= 2

With ``swim=SwimConfig(...)`` every node also runs SWIM membership
(``/node/membership``, joining through the registry's node records) over the
memory network, and its coordinator reads that node's own SWIM view and is
nudged on every change, as ``corral node run`` wires it: a killed node is
found dead by SWIM, a stopped one leaves, and network faults
(:meth:`MemoryNetwork.set_drop_rate`, ``set_delay``, :meth:`Cluster.partition`)
reach membership as they would between machines::

    async with open_cluster(3, swim=SwimConfig(), children=agent_node_children) as c:
        await c.wait_for_members()                      # every node sees every node alive
        await c.kill("node-2")                          # suspect, then dead, then down

Time comes from trio, so the whole harness runs under
``MockClock(autojump_threshold=0)``; the default wall clock is virtual too
(:func:`virtual_wall_clock`), so placements carry deterministic times.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from corral.actors.coordinator import (
    CoordinatorState,
    GetCoordinatorState,
    KickCoordinator,
    MemberStatus,
    coordinator_child_spec,
)
from corral.actors.membership import (
    MEMBERSHIP,
    MembershipFeed,
    SwimConfig,
    membership_child_spec,
    registry_seeds,
)
from corral.actors.node_record import NodeIdentity, node_registration_child_spec
from corral.actors.planner import Policy
from corral.actors.process_supervisor import AppPaths, LaunchEvent, MemoryLauncher
from corral.actors.reconciler import AgentSpec
from corral.registry import (
    AppRecord,
    Deployment,
    MeasuredCapacity,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    Record,
    Registry,
    Undecodable,
    app_key,
    decode_record,
    node_key,
    placement_key,
)
from corral.supervision import (
    ActorRef,
    ActorSystem,
    ChildSpec,
    Event,
    SupervisionError,
    SupervisorSpec,
    open_actor_system,
)
from corral.testing._registry import CountingRegistry, RegistryGate
from corral.transport import MemoryNetwork

__all__ = [
    "DEFAULT_TEST_CAPACITY",
    "VIRTUAL_EPOCH",
    "Cluster",
    "ClusterNode",
    "CoordinatorInterval",
    "NodeContext",
    "agent_node_children",
    "default_node_children",
    "open_cluster",
    "virtual_wall_clock",
]

#: What every harness node reports unless told otherwise (MiB).
DEFAULT_TEST_CAPACITY = MeasuredCapacity(
    memory_mb=16_384, memory_free_mb=16_384, disk_mb=200_000, disk_free_mb=200_000
)
#: Unix time at trio time zero for :func:`virtual_wall_clock`.
VIRTUAL_EPOCH = 1_700_000_000.0
#: Name of every node's top supervisor: actors live at ``/node/<name>``.
NODE_SUPERVISOR = "node"


def virtual_wall_clock() -> float:
    """Unix time that moves with trio's clock (MockClock-friendly)."""
    return VIRTUAL_EPOCH + trio.current_time()


@dataclass(frozen=True)
class NodeContext:
    """What a node's child specs are built from (one per node life)."""

    node_id: str
    registry: Registry
    identity: NodeIdentity
    capacity: MeasuredCapacity | None
    wall_clock: Callable[[], float]
    lease_ttl: float
    node_lease_ttl: float
    policy: Policy
    life: int
    data_dir: Path
    launcher: MemoryLauncher
    #: the membership view the coordinator combines with the records (None: not wired).
    membership: Callable[[], Mapping[str, MemberStatus]] | None = None
    #: the instance token of the node's previous life, whose record this life may take.
    replaces: str = ""
    #: SWIM settings when the node runs membership (None: it does not).
    swim: SwimConfig | None = None
    #: where that node's SWIM view goes (set with ``swim``).
    feed: MembershipFeed | None = None


ChildrenFactory = Callable[[NodeContext], Sequence[ChildSpec | SupervisorSpec]]


def default_node_children(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
    """NodeRegistration (``/node/registration``), SwimMembership (``/node/membership``,
    with ``ctx.swim`` only), then Coordinator (``/node/coordinator``)."""
    capacity = ctx.capacity
    children: list[ChildSpec | SupervisorSpec] = [
        node_registration_child_spec(
            ctx.identity,
            ctx.registry,
            capacity_probe=lambda: capacity,
            wall_clock=ctx.wall_clock,
            lease_ttl=ctx.node_lease_ttl,
            replaces=ctx.replaces,
        ),
    ]
    if ctx.swim is not None and ctx.feed is not None:
        seed = f"swim/{ctx.node_id}/{ctx.life}"
        children.append(
            membership_child_spec(
                seeds=registry_seeds(ctx.registry),
                config=ctx.swim,
                on_view=ctx.feed.on_view,
                rng_factory=lambda: random.Random(seed),
                wall_clock=ctx.wall_clock,
                notify=(
                    (f"/{NODE_SUPERVISOR}/coordinator", KickCoordinator("membership changed")),
                ),
            )
        )
    children.append(
        coordinator_child_spec(
            ctx.node_id,
            ctx.registry,
            ctx.policy,
            ctx.lease_ttl,
            ctx.wall_clock,
            membership=ctx.membership,
        )
    )
    return children


def agent_node_children(ctx: NodeContext) -> list[ChildSpec | SupervisorSpec]:
    """:func:`default_node_children` plus the node agent (``/node/agent``: ProcessSupervisor,
    PortAllocator, Reconciler) running apps on the node's
    :class:`~corral.actors.process_supervisor.MemoryLauncher` in ``ctx.data_dir``.

    A revision is "materialized" as an empty directory; port draws are seeded per node
    and life, and every port of the default range counts as free (nothing binds it).
    """
    data_dir = ctx.data_dir

    async def materialize(app: str, deployment: Deployment) -> Path:
        directory = AppPaths.of(data_dir, app).revision_dir(deployment.digest)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    agent = AgentSpec(
        node_id=ctx.node_id,
        data_dir=data_dir,
        registry=ctx.registry,
        materialize=materialize,
        clock=ctx.wall_clock,
        random=random.Random(f"{ctx.node_id}/{ctx.life}"),
        probe_host="127.0.0.1",
        port_probe=_always_free,
        launcher=ctx.launcher,
    )
    return [*default_node_children(ctx), agent.supervisor_spec()]


def _always_free(host: str, port: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class CoordinatorInterval:
    """A stretch of time one node was entitled to coordinate (trio time)."""

    node: str
    fence: int
    start: float
    end: float  # math.inf while still coordinating


@dataclass
class ClusterNode:
    """One node of the cluster, across its lives.

    ``data_dir`` and ``launcher`` (the in-memory processes of every life) are the
    node's own and outlive each life, as a machine's disk and process table would.
    """

    node_id: str
    identity: NodeIdentity
    capacity: MeasuredCapacity | None
    data_dir: Path
    launcher: MemoryLauncher = field(default_factory=MemoryLauncher)
    life: int = 0
    system: ActorSystem | None = None
    gate: RegistryGate | None = None
    history: list[Event] = field(default_factory=list)
    _scope: trio.CancelScope | None = None
    _stop: trio.Event = field(default_factory=trio.Event)
    _done: trio.Event = field(default_factory=trio.Event)

    @property
    def running(self) -> bool:
        return self.system is not None

    def ref(self, name: str) -> ActorRef:
        """The ref of ``/node/<name>`` in this node's current life."""
        if self.system is None:
            raise RuntimeError(f"node {self.node_id} is not running; restart() it first")
        return self.system.ref(f"/{NODE_SUPERVISOR}/{name}")

    @property
    def coordinator(self) -> ActorRef:
        return self.ref("coordinator")

    @property
    def registration(self) -> ActorRef:
        return self.ref("registration")

    @property
    def membership(self) -> ActorRef:
        """The node's SwimMembership (with ``swim=``)."""
        return self.ref(MEMBERSHIP)

    @property
    def reconciler(self) -> ActorRef:
        """The agent's Reconciler (with :func:`agent_node_children`)."""
        return self.ref(f"{AgentSpec.name}/{AgentSpec.RECONCILER}")

    def events(self) -> list[Event]:
        """Every event of every life of this node, oldest first."""
        current = self.system.events() if self.system is not None else []
        return [*self.history, *current]


class Cluster:
    """Nodes on one in-memory network and one registry. Build it with :func:`open_cluster`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        registry: Registry,
        network: MemoryNetwork,
        *,
        lease_ttl: float,
        node_lease_ttl: float,
        policy: Policy,
        wall_clock: Callable[[], float],
        children: ChildrenFactory,
        data_dir: Path,
        membership: Mapping[str, MemberStatus] | None = None,
        swim: SwimConfig | None = None,
    ) -> None:
        if membership is not None and swim is not None:
            raise ValueError("give membership= (a fixed view) or swim= (SWIM runs), not both")
        self._nursery = nursery
        self.registry = CountingRegistry(registry)
        self.network = network
        self.lease_ttl = lease_ttl
        self.node_lease_ttl = node_lease_ttl
        self.policy = policy
        self.wall_clock = wall_clock
        self._children = children
        self.data_dir = data_dir
        self.membership = membership
        self.swim = swim
        #: node id -> the SWIM view of its current life (with ``swim``).
        self.feeds: dict[str, MembershipFeed] = {}
        self.nodes: dict[str, ClusterNode] = {}

    # ------------------------------------------------------------------ membership

    def node(self, node_id: str) -> ClusterNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(
                f"no node {node_id!r} in this cluster (nodes: {sorted(self.nodes)})"
            ) from None

    @property
    def running(self) -> list[str]:
        """Ids of the nodes running now, sorted."""
        return sorted(n for n, node in self.nodes.items() if node.running)

    async def add_node(
        self,
        node_id: str,
        *,
        labels: Mapping[str, str] | None = None,
        rack: str | None = None,
        datacenter: str | None = None,
        capacity: MeasuredCapacity | None = DEFAULT_TEST_CAPACITY,
    ) -> ClusterNode:
        """Start a new node; returns once its actors have started."""
        if node_id in self.nodes:
            raise ValueError(f"node {node_id!r} already exists; restart() it instead")
        identity = NodeIdentity(
            node_id,
            labels=dict(labels or {}),
            rack=rack,
            datacenter=datacenter,
            peer_address=f"memory://{node_id}",
            api_address="",
            advertise_host="127.0.0.1",
        )
        node = ClusterNode(node_id, identity, capacity, data_dir=self.data_dir / node_id)
        self.nodes[node_id] = node
        await self._nursery.start(self._run_life, node)
        return node

    async def stop(self, node_id: str) -> None:
        """Shut a node down cleanly (SIGTERM): its cleanups reach the registry."""
        node = self.node(node_id)
        if not node.running:
            return
        node._stop.set()
        await node._done.wait()

    async def kill(self, node_id: str) -> None:
        """Crash a node (SIGKILL): nothing it would still send reaches anyone, and its
        in-memory processes end at the same instant (the machine went away)."""
        node = self.node(node_id)
        if not node.running:
            return
        assert node.gate is not None
        assert node._scope is not None
        node.gate.kill()
        self.network.kill(node_id)
        for process in node.launcher.alive():
            process.kill()
        node._scope.cancel()
        await node._done.wait()

    async def restart(self, node_id: str) -> ClusterNode:
        """Start a new life of a node (stopping the current one cleanly first)."""
        node = self.node(node_id)
        await self.stop(node_id)
        self.network.revive(node_id)
        node._stop = trio.Event()
        node._done = trio.Event()
        await self._nursery.start(self._run_life, node)
        return node

    def _membership_view(self) -> Callable[[], Mapping[str, MemberStatus]] | None:
        view = self.membership
        if view is None:
            return None
        return lambda: dict(view)

    async def _run_life(
        self, node: ClusterNode, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        node.life += 1
        gate = RegistryGate(self.registry, name=node.node_id)
        node.gate = gate
        feed: MembershipFeed | None = None
        membership = self._membership_view()
        if self.swim is not None:
            feed = self.feeds[node.node_id] = MembershipFeed()
            membership = feed.statuses
        # Each life is its own instance; it may take over the record of the life before
        # (the harness ended that one), as a real node takes over its dead predecessor's.
        identity = dataclasses.replace(node.identity, instance=f"{node.node_id}.life{node.life}")
        replaces = f"{node.node_id}.life{node.life - 1}" if node.life > 1 else ""
        ctx = NodeContext(
            node_id=node.node_id,
            registry=gate,
            identity=identity,
            replaces=replaces,
            capacity=node.capacity,
            wall_clock=self.wall_clock,
            lease_ttl=self.lease_ttl,
            node_lease_ttl=self.node_lease_ttl,
            policy=self.policy,
            life=node.life,
            data_dir=node.data_dir,
            launcher=node.launcher,
            membership=membership,
            swim=self.swim,
            feed=feed,
        )
        spec = SupervisorSpec(name=NODE_SUPERVISOR, children=tuple(self._children(ctx)))
        system: ActorSystem | None = None
        try:
            with trio.CancelScope() as scope:
                node._scope = scope
                transport = self.network.connect(node.node_id)
                async with open_actor_system(
                    node.node_id, transport, event_log_size=100_000
                ) as system:
                    node.system = system
                    await system.spawn(spec)
                    task_status.started()
                    await node._stop.wait()
        finally:
            if system is not None:
                node.history.extend(system.events())
            node.system = None
            node._scope = None
            node._done.set()

    # ------------------------------------------------------------------ faults

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut the network between groups of nodes (see MemoryNetwork.partition)."""
        self.network.partition(*groups)

    def heal(self) -> None:
        """Remove every network cut."""
        self.network.heal()

    def cut_registry(
        self, node_id: str, *, hang: bool = False, ops: Collection[str] | None = None
    ) -> None:
        """Cut one node off from the registry.

        Args:
            node_id: the node.
            hang: calls wait (and go through once restored) instead of failing
                with RegistryUnavailable.
            ops: only these operations ("txn", "keepalive", ...); default all.
        """
        gate = self._gate(node_id)
        if hang:
            gate.hang(ops)
        else:
            gate.fail(ops)

    def restore_registry(self, node_id: str) -> None:
        """Reconnect a node to the registry; held calls go through now."""
        self._gate(node_id).restore()

    def _gate(self, node_id: str) -> RegistryGate:
        gate = self.node(node_id).gate
        if gate is None or not self.node(node_id).running:
            raise RuntimeError(f"node {node_id} is not running")
        return gate

    # ------------------------------------------------------------------ observing

    async def coordinator_state(
        self, node_id: str, *, ask_timeout: float = 1.0
    ) -> CoordinatorState | None:
        """The node's coordinator state, or None when it is not running or does
        not answer within ``ask_timeout`` (busy in a hung registry call, say)."""
        node = self.node(node_id)
        if not node.running:
            return None
        try:
            state = await node.coordinator.ask(GetCoordinatorState(), timeout=ask_timeout)
        except SupervisionError:
            return None
        assert isinstance(state, CoordinatorState)
        return state

    async def coordinator_states(
        self, *, ask_timeout: float = 1.0
    ) -> dict[str, CoordinatorState | None]:
        """Every node's coordinator state (None for nodes not answering)."""
        return {
            node_id: await self.coordinator_state(node_id, ask_timeout=ask_timeout)
            for node_id in sorted(self.nodes)
        }

    async def coordinators(self, *, ask_timeout: float = 1.0) -> list[str]:
        """Nodes whose coordinator says it is coordinating now."""
        states = await self.coordinator_states(ask_timeout=ask_timeout)
        return [n for n, state in states.items() if state is not None and state.coordinating]

    async def wait_for_coordinator(
        self,
        *,
        exclude: Collection[str] = (),
        within: float | None = None,
        poll: float = 0.05,
    ) -> str:
        """Wait until some node (not in ``exclude``) coordinates; return its id.

        Raises:
            TimeoutError: none did ``within`` seconds (default: three lease TTLs).
        """
        limit = 3 * self.lease_ttl if within is None else within
        with trio.move_on_after(limit):
            while True:
                for node_id in await self.coordinators():
                    if node_id not in exclude:
                        return node_id
                await trio.sleep(poll)
        raise TimeoutError(
            f"no coordinator (other than {sorted(exclude)}) within {limit} s; "
            f"running nodes: {self.running}"
        )

    def member_states(self, node_id: str) -> dict[str, str]:
        """Node id -> state in ``node_id``'s SWIM view now (with ``swim``; empty before
        its first view)."""
        feed = self.feeds.get(node_id)
        return {} if feed is None else {n: s.state for n, s in feed.statuses().items()}

    async def wait_for_members(
        self,
        *,
        nodes: Collection[str] | None = None,
        within: float = 60.0,
        poll: float = 0.1,
    ) -> None:
        """Wait until every running node (or each of ``nodes``) sees every running node
        alive in its SWIM view.

        Raises:
            TimeoutError: naming the views that had not converged ``within`` seconds.
        """
        views: dict[str, dict[str, str]] = {}
        with trio.move_on_after(within):
            while True:
                watched = sorted(nodes) if nodes is not None else self.running
                expected = dict.fromkeys(self.running, "alive")
                views = {n: self.member_states(n) for n in watched}
                if all(
                    {k: v for k, v in view.items() if k in expected} == expected
                    for view in views.values()
                ):
                    return
                await trio.sleep(poll)
        raise TimeoutError(f"SWIM views did not converge within {within} s: {views}")

    async def put_app(self, app: AppRecord) -> None:
        """Write ``apps/<name>`` (as an operator would)."""
        await self.registry.put(app_key(app.name), app.encode())

    async def placement(self, app: str) -> PlacementRecord | None:
        """The app's placement record, or None when it has none."""
        record = await self._read(placement_key(app))
        assert record is None or isinstance(record, PlacementRecord), record
        return record

    async def node_record(self, node_id: str) -> NodeRecord | None:
        """The node's record, or None when it has none (not registered, or lapsed)."""
        record = await self._read(node_key(node_id))
        assert record is None or isinstance(record, NodeRecord), record
        return record

    async def _read(self, key: str) -> Record | Undecodable | None:
        kv = await self.registry.get(key)
        return None if kv is None else decode_record(kv.key, kv.value)

    def instances(self) -> dict[str, list[str]]:
        """App -> the running nodes whose in-memory launcher runs a live process of it
        now (sorted; apps running nowhere are absent)."""
        running: dict[str, set[str]] = {}
        for node_id, node in self.nodes.items():
            if node.running:
                for process in node.launcher.alive():
                    running.setdefault(process.spec.app, set()).add(node_id)
        return {app: sorted(nodes) for app, nodes in sorted(running.items())}

    def launch_timeline(self) -> list[tuple[str, LaunchEvent]]:
        """Every start and exit of every node's in-memory processes, in the order they
        happened (all lives)."""
        merged = [
            (node_id, event)
            for node_id, node in self.nodes.items()
            for event in node.launcher.timeline
        ]
        merged.sort(key=lambda item: item[1].seq)
        return merged

    def running_counts(self, app: str) -> list[tuple[float, int]]:
        """After each start or exit of one of ``app``'s processes, in order: the time and
        on how many nodes it ran at that instant."""
        live: dict[str, set[int]] = {}
        counts: list[tuple[float, int]] = []
        for node_id, event in self.launch_timeline():
            if event.app != app:
                continue
            pids = live.setdefault(node_id, set())
            if event.kind == "start":
                pids.add(event.pid)
            else:
                pids.discard(event.pid)
            counts.append((event.time, sum(1 for p in live.values() if p)))
        return counts

    def events(self, kind: str | None = None) -> list[tuple[str, Event]]:
        """Every node's events (all lives), by time, optionally of one kind."""
        merged = [
            (node_id, event)
            for node_id, node in self.nodes.items()
            for event in node.events()
            if kind is None or event.kind == kind
        ]
        merged.sort(key=lambda item: (item[1].time, item[0]))
        return merged

    def coordinator_intervals(self) -> list[CoordinatorInterval]:
        """When each node was entitled to coordinate, from its events.

        An interval starts at ``coordinator.acquired`` and ends at the matching
        ``coordinator.lost`` (at its ``until``: the moment the lease may have
        lapsed) or ``coordinator.handing-back``; one still open ends at infinity.
        """
        intervals: list[CoordinatorInterval] = []
        for node_id, node in sorted(self.nodes.items()):
            open_: tuple[int, float] | None = None
            for event in node.events():
                if event.kind == "coordinator.acquired":
                    open_ = (int(event.fields["fence"]), event.time)
                elif event.kind in ("coordinator.lost", "coordinator.handing-back") and open_:
                    end = float(event.fields.get("until", event.time))
                    intervals.append(CoordinatorInterval(node_id, open_[0], open_[1], end))
                    open_ = None
            if open_ is not None:
                end = math.inf if node.running else node.events()[-1].time
                intervals.append(CoordinatorInterval(node_id, open_[0], open_[1], end))
        intervals.sort(key=lambda i: (i.start, i.node))
        return intervals

    def assert_single_coordinator(self) -> list[CoordinatorInterval]:
        """Check that no two nodes were ever entitled to coordinate at once and
        that fences only grew; return the intervals.

        Raises:
            AssertionError: naming the overlapping intervals.
        """
        intervals = self.coordinator_intervals()
        for before, after in itertools.pairwise(intervals):
            if after.start < before.end:
                raise AssertionError(f"two coordinators at once: {before} and {after}")
            if after.fence <= before.fence:
                raise AssertionError(f"fence did not grow: {before} then {after}")
        return intervals

    async def aclose(self) -> None:
        """Stop every running node cleanly, all at once (one by one, each stop handed the
        lease to the next node and moved the work of the one that left: a thousand
        nodes ran a thousand placement passes on their way out)."""
        async with trio.open_nursery() as nursery:
            for node_id in sorted(self.nodes, reverse=True):
                nursery.start_soon(self.stop, node_id)


@asynccontextmanager
async def open_cluster(
    nodes: int | Iterable[str] = 3,
    *,
    registry: Registry | None = None,
    network: MemoryNetwork | None = None,
    lease_ttl: float = 45.0,
    node_lease_ttl: float | None = None,
    policy: Policy | None = None,
    wall_clock: Callable[[], float] = virtual_wall_clock,
    children: ChildrenFactory = default_node_children,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    capacity: MeasuredCapacity | None = DEFAULT_TEST_CAPACITY,
    data_dir: Path | None = None,
    membership: Mapping[str, MemberStatus] | None = None,
    swim: SwimConfig | None = None,
) -> AsyncIterator[Cluster]:
    """Run a cluster of in-process nodes for the duration of the block.

    Args:
        nodes: how many (named ``node-1``...) or their ids.
        registry: the shared registry (default a fresh MemoryRegistry, closed
            on exit; one passed in is left open).
        network: the shared MemoryNetwork (default a fresh one).
        lease_ttl: the coordinator lease TTL in seconds.
        node_lease_ttl: the node records' lease TTL (default ``lease_ttl``).
        policy: the planner's policy (default ``Policy()``).
        wall_clock: unix time for records (default virtual, from trio's clock).
        children: builds each node's child specs (default registration + coordinator;
            :func:`agent_node_children` adds the node agent).
        labels: node id -> labels.
        capacity: what every node reports.
        data_dir: each node gets ``<data_dir>/<node id>`` (default: a temporary
            directory, removed on exit).
        membership: node id -> :class:`~corral.actors.coordinator.MemberStatus`, the
            membership view every coordinator reads (each pass reads it anew, so a
            test may change the mapping as it goes); None: membership is not wired in.
        swim: run SWIM membership on every node with these settings, each
            coordinator reading its own node's view (not with ``membership``).

    Leaving the block stops every node cleanly.
    """
    ids = [f"node-{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
    base = registry if registry is not None else MemoryRegistry()
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if data_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="corral-cluster-")
        data_dir = Path(scratch.name)
    try:
        async with trio.open_nursery() as nursery:
            cluster = Cluster(
                nursery,
                base,
                network if network is not None else MemoryNetwork(),
                lease_ttl=lease_ttl,
                node_lease_ttl=lease_ttl if node_lease_ttl is None else node_lease_ttl,
                policy=policy if policy is not None else Policy(),
                wall_clock=wall_clock,
                children=children,
                data_dir=data_dir,
                membership=membership,
                swim=swim,
            )
            try:
                for node_id in ids:
                    await cluster.add_node(
                        node_id, labels=(labels or {}).get(node_id), capacity=capacity
                    )
                yield cluster
            finally:
                with trio.CancelScope(shield=True):
                    await cluster.aclose()
    finally:
        if registry is None:
            await base.aclose()
        if scratch is not None:
            scratch.cleanup()
