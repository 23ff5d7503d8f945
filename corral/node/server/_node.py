"""``corral node run``: one node, assembled under a root supervisor.

::

    /                     root supervisor (one_for_one)
    ├── registration      NodeRegistration: the node lease and nodes/<id>
    ├── peers             PeerDirectory: other nodes' peer addresses -> transport
    ├── membership        SwimMembership: SWIM + Lifeguard with the other nodes
    ├── agent/            Reconciler, PortAllocator, ProcessSupervisor
    ├── coordinator       Coordinator: campaigns for lease/coordinator, places apps
    └── api               ApiServer: the HTTP API (Starlette on Hypercorn's Trio worker)

First the node takes its apps out of the routing table (the reconciler publishes
each instance not ready) and gives their requests in flight each app's drain
time (``drain_ms``, at most 5 s and half ``--shutdown-grace-ms``), so no proxy
sends them new requests by the time they get SIGTERM. Then the children, which
start in that order, stop in reverse: the API stops taking
requests, the coordinator hands its lease back (a successor takes over at
once), the agent stops every app process, membership leaves the cluster (every
member hears ``left`` — the lease holder moves the node's work at once instead
of waiting out a grace — and the transport flushes those goodbyes before it
closes), and last the registration revokes the node lease so ``nodes/<id>``
disappears.

The coordinator reads the local SWIM view once per pass (through a
:class:`~corral.actors.membership.MembershipFeed`), and membership nudges it
with :class:`~corral.actors.coordinator.KickCoordinator` whenever that view
changes, so a member found dead or gone is acted on at once, not a tick later.

SIGTERM or SIGINT starts that shutdown; a second signal ends the node at
once (its app processes are killed first, so nothing is left behind either
way).

Before anything starts, the node checks two things in the registry:

* the cluster secret: ``cluster/secret-fingerprint`` holds an HMAC of the
  secret, set by the first node; a node with another secret refuses to start;
* the node id: a live ``nodes/<id>`` held by another process refuses the
  start. Each process writes a random instance token into its record; a
  running node that later finds its record held by another instance (it was
  paused past its lease and a newcomer took the id) stops the same way a
  signal stops it, then exits with one line saying why.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil
import trio

from corral.actors.coordinator import (
    CoordinatorState,
    GetCoordinatorState,
    KickCoordinator,
    MemberStatus,
    coordinator_child_spec,
)
from corral.actors.membership import (
    GetMembership,
    MembershipFeed,
    SwimConfig,
    membership_child_spec,
    registry_seeds,
)
from corral.actors.node_record import (
    HeldElsewhere,
    NodeIdentity,
    claim_on_start,
    node_registration_child_spec,
)
from corral.actors.planner import Policy
from corral.actors.port_allocator import ListPorts
from corral.actors.process_supervisor import ListProcesses, enable_subreaper
from corral.actors.reconciler import AgentSpec, LastPass, Withdraw
from corral.node._config import SETTINGS, NodeConfig, load_config_file, resolve_node_config
from corral.node._errors import ConfigError
from corral.node._identity import (
    SECRET_FILE,
    TOKEN_FILE,
    ensure_node_id,
    ensure_secret_file,
    new_instance_token,
    persist_node_id,
    probe_capacity,
    process_running,
    same_fingerprint,
    secret_fingerprint,
)
from corral.node._logging import configure_logging, log_event, set_log_node
from corral.node.artifacts import (
    ArtifactLimits,
    ArtifactStore,
    Materializer,
    sweep_partial_files,
)
from corral.node.artifacts._replicator import ArtifactReplicator, GetArtifactState
from corral.node.server._api import ApiServices, build_api, build_metrics_app, record_json
from corral.node.server._deadline import DeadlineRegistry
from corral.node.server._events import EventLog
from corral.node.server._metrics import (
    InstrumentedRegistry,
    MetricsSources,
    NodeMetrics,
    read_routes,
    registry_observer,
)
from corral.node.server._peers import PeerDirectory
from corral.node.server._server import ApiServer
from corral.node.server._views import Coordination, CoordinatorUnavailable
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    SECRET_FINGERPRINT_KEY,
    Compare,
    CoordinatorLease,
    Get,
    NodeRecord,
    PlacementRecord,
    Put,
    Registry,
    RegistryError,
    RegistryReplaced,
    SecretFingerprint,
    SQLiteRegistry,
    decode_record,
    node_key,
    open_registry,
    read_records,
    validate_digest,
)
from corral.supervision import (
    ActorSystem,
    ChildSpec,
    Event,
    Strategy,
    SupervisionError,
    SupervisorSpec,
    open_actor_system,
)
from corral.transport import Transport, TransportError, open_websocket_transport

log = logging.getLogger("corral.node")

AGENT = "agent"
COORDINATOR = "coordinator"
MEMBERSHIP = "membership"
ROUTING = "routing"
#: Seconds an app process gets between SIGTERM and SIGKILL, at most.
PROCESS_STOP_GRACE = 10.0

ASK_TIMEOUT = 2.0
#: How often a view asks the lease holder's coordinator before saying it cannot, and the
#: pause between asks (a coordinator busy with a pass answers a moment later).
HOLDER_ASK_TRIES = 3
HOLDER_RETRY_PAUSE = 0.3
#: Seconds all those asks may take together (a view must answer a client in time).
HOLDER_ASK_BUDGET = 4.0


@dataclass(frozen=True)
class NodeRuntime:
    """What the node resolved at start: its id, secrets and where things live."""

    config: NodeConfig
    node_id: str
    token: str
    secret: str
    #: A random token naming this process in ``nodes/<id>`` (a new one per start).
    instance: str = field(default_factory=new_instance_token)

    @property
    def apps_dir(self) -> Path:
        return self.config.data_dir / "apps"

    @property
    def artifacts_dir(self) -> Path:
        return self.config.data_dir / "artifacts"

    @property
    def api_address(self) -> str:
        return f"{self.config.advertise}:{self.config.api.port}"

    @property
    def peer_address(self) -> str:
        return f"{self.config.advertise}:{self.config.listen.port}"

    def identity(self) -> NodeIdentity:
        """Who this node process is, as its ``nodes/<id>`` record says."""
        config = self.config
        return NodeIdentity(
            node_id=self.node_id,
            labels=dict(config.labels),
            rack=config.rack,
            datacenter=config.datacenter,
            peer_address=self.peer_address,
            api_address=self.api_address,
            advertise_host=config.advertise,
            instance=self.instance,
            pid=os.getpid(),
            hostname=socket.gethostname(),
        )


def prepare_runtime(config: NodeConfig, hostname: str | None = None) -> NodeRuntime:
    """Create the data directory and resolve the node id, token and secret (files, 0600).

    Raises:
        ConfigError: the data directory cannot be used, or the node id is refused.
    """
    try:
        config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--data-dir {config.data_dir} cannot be created: {exc}") from exc
    node_id = ensure_node_id(
        config.data_dir, config.node_id, hostname or socket.gethostname(), persist=False
    )
    token = ensure_secret_file(config.data_dir / TOKEN_FILE, config.token)
    secret = ensure_secret_file(config.data_dir / SECRET_FILE, config.secret)
    return NodeRuntime(
        config=config, node_id=node_id, token=token, secret=secret, instance=new_instance_token()
    )


def check_bindable(config: NodeConfig) -> None:
    """Fail early, in one line, when the API or peer address is taken."""
    addresses = [("--api", config.api), ("--listen", config.listen)]
    if config.metrics_listen is not None:
        addresses.append(("--metrics-listen", config.metrics_listen))
    for flag, address in addresses:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address.host, address.port))
            except OSError as exc:
                raise ConfigError(
                    f"{flag} {address} cannot be used ({exc.strerror}); is another corral node "
                    f"running there? pick another address with {flag}"
                ) from None


class NodeServices:
    """The node's view of itself for the API: state, actors, events."""

    def __init__(
        self,
        runtime: NodeRuntime,
        registry: Registry,
        events: EventLog,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self.runtime = runtime
        self.registry = registry
        self.events = events
        self.system: ActorSystem | None = None
        self.transport: Transport | None = None  # set once it is open
        self.metrics = metrics
        if metrics is not None:
            metrics.sources = MetricsSources(
                actors=self.actors,
                coordinator=lambda: self.ask(f"/{COORDINATOR}", GetCoordinatorState()),
                processes=lambda: self.ask(
                    f"/{AGENT}/{AgentSpec.PROCESS_SUPERVISOR}", ListProcesses()
                ),
                ports=lambda: self.ask(f"/{AGENT}/{AgentSpec.PORT_ALLOCATOR}", ListPorts()),
                reconcile=lambda: self.ask(f"/{AGENT}/{AgentSpec.RECONCILER}", LastPass()),
                transport=lambda: {} if self.transport is None else self.transport.stats(),
                membership=lambda: self.ask(f"/{MEMBERSHIP}", GetMembership()),
                routes=lambda: read_routes(registry, time.time()),
            )

    async def ask(
        self, path: str, message: object, node: str | None = None, wait_s: float = ASK_TIMEOUT
    ) -> Any:
        if self.system is None:
            # Children run before the system they belong to is handed back.
            return {"error": "the node is still starting"}
        try:
            ref = self.system.ref(path, node=node)
            return await ref.ask(message, timeout=wait_s)
        except (SupervisionError, TransportError) as exc:
            # A view that cannot be had is reported in the state, never a 500.
            return {"error": str(exc)}

    async def state(self) -> dict[str, Any]:
        me = self.runtime.node_id
        state: dict[str, Any] = {"node_id": me, "data_dir": str(self.runtime.config.data_dir)}
        try:
            kv = await self.registry.get(node_key(me))
            record = None if kv is None else decode_record(kv.key, kv.value)
            state["node"] = record_json(record) if isinstance(record, NodeRecord) else None
            lease_kv = await self.registry.get(COORDINATOR_LEASE_KEY)
            lease = None if lease_kv is None else decode_record(lease_kv.key, lease_kv.value)
            if isinstance(lease, CoordinatorLease) and lease_kv is not None:
                state["lease"] = {
                    "holder": lease.holder,
                    "acquired_at": lease.acquired_at,
                    "fence": lease_kv.create_revision,
                }
            else:
                state["lease"] = None
            state["coordinating"] = bool(state["lease"] and state["lease"]["holder"] == me)
            placements, undecodable = await read_records(self.registry, "placement/")
            state["placements"] = {
                key.removeprefix("placement/"): record_json(p)
                for key, p in sorted(placements.items())
                if isinstance(p, PlacementRecord)
            }
            # This node's view: the apps the coordinator placed here.
            state["assigned"] = sorted(
                app for app, p in state["placements"].items() if me in p.get("nodes", [])
            )
            state["undecodable"] = [{"key": u.key, "reason": u.reason} for u in undecodable]
        except RegistryError as exc:
            state["registry_error"] = str(exc)
        state.update(await self._actor_views(state))
        return state

    async def _actor_views(self, state: dict[str, Any]) -> dict[str, Any]:
        views: dict[str, Any] = {}
        for name, view in ACTOR_VIEWS.items():
            views[name] = await view(self, {**state, **views})
        coordination = await coordination_view(self, {**state, **views})
        views["coordination"] = coordination.to_json()
        views["unplaced"] = unplaced_view(coordination)
        # The JSON of GET /v1/state: this node's own coordinator's state, as asked.
        local = views.get("coordinator")
        if isinstance(local, CoordinatorState):
            views["coordinator"] = local.to_json()
        return views

    async def coordination(self) -> Coordination:
        """The lease holder's coordinator state (policy, deferred moves, stranded
        instances...), or why it cannot be had."""
        try:
            kv = await self.registry.get(COORDINATOR_LEASE_KEY)
        except RegistryError as exc:
            return CoordinatorUnavailable(None, f"the registry is unavailable: {exc}")
        lease = None if kv is None else decode_record(kv.key, kv.value)
        holder = lease.holder if isinstance(lease, CoordinatorLease) else None
        return await ask_holder(self, holder)

    def actors(self) -> dict[str, Any]:
        assert self.system is not None
        tree: dict[str, Any] = self.system.tree().to_dict()
        return tree

    def recent_events(self) -> list[dict[str, Any]]:
        return self.events.recent()

    async def withdraw_from_routing(self) -> None:
        """Before the node stops its apps: take them out of the routing table and give
        their requests in flight the drain time (see :class:`Withdraw`); never raises."""
        drain = stop_drain(self.runtime.config)
        with trio.move_on_after(drain + ASK_TIMEOUT):
            answer = await self.ask(
                f"/{AGENT}/{AgentSpec.RECONCILER}", Withdraw(max_drain=drain), wait_s=drain + 5
            )
            if isinstance(answer, dict):
                log.warning("could not take the apps out of routing first: %s", answer["error"])


#: name -> async function adding a view to GET /v1/state (filled in by the assembly).
ACTOR_VIEWS: dict[str, Callable[[NodeServices, dict[str, Any]], Any]] = {}


def root_spec(
    runtime: NodeRuntime,
    registry: Registry,
    services: NodeServices,
    transport: Any,
    *,
    on_taken: Callable[[HeldElsewhere], None] | None = None,
    replaces: str = "",
) -> tuple[ChildSpec | SupervisorSpec, ...]:
    """The node's top-level children, in start order.

    ``on_taken`` is called when another process holds ``nodes/<id>``; ``replaces``
    is the instance of a gone previous life the registration may overwrite."""
    config = runtime.config
    grace = config.shutdown_grace_ms / 1000
    identity = runtime.identity()
    artifacts = ArtifactStore(
        registry,
        runtime.artifacts_dir,
        node_id=runtime.node_id,
        secret=runtime.secret,
        limits=ArtifactLimits.from_mb(config.max_artifact_mb),
    )
    materialize = Materializer(artifacts, runtime.apps_dir)

    def api_app() -> Any:
        return build_api(
            ApiServices(
                token=runtime.token,
                secret=runtime.secret,
                node_id=runtime.node_id,
                registry=registry,
                artifacts=artifacts,
                state=services.state,
                actors=services.actors,
                events=services.recent_events,
                wall_clock=time.time,
                coordinator=services.coordination,
                metrics=None if services.metrics is None else services.metrics.scrape,
                registry_name=config.registry_url,
            )
        )

    children: list[ChildSpec | SupervisorSpec] = [
        node_registration_child_spec(
            identity,
            registry,
            capacity_probe=lambda: probe_capacity(config.data_dir),
            lease_ttl=config.node_ttl_ms / 1000,
            on_taken=on_taken,
            replaces=replaces,
            shutdown_grace=grace,
        ),
        ChildSpec(
            name="peers",
            factory=lambda: PeerDirectory(
                registry, transport, forget_after=config.grace_period_ms / 1000
            ),
            shutdown_grace=1.0,
        ),
    ]
    feed = MembershipFeed()
    children += membership_specs(runtime, registry, feed)
    children += agent_specs(runtime, registry, materialize)
    children.append(artifacts_spec(runtime, registry, artifacts, services))
    children += coordinator_specs(runtime, registry, membership=feed.statuses)
    children += routing_specs(runtime, registry, membership=feed.statuses)
    children.append(
        ChildSpec(name="api", factory=lambda: ApiServer(api_app, config.api), shutdown_grace=3.0)
    )
    metrics, metrics_listen = services.metrics, config.metrics_listen
    if metrics is not None and metrics_listen is not None:
        children.append(
            ChildSpec(
                name="metrics",
                factory=lambda: ApiServer(
                    lambda: build_metrics_app(metrics.scrape), metrics_listen
                ),
                shutdown_grace=3.0,
            )
        )
    return tuple(children)


#: The most seconds an instance drains, out of the routing table, before it is stopped.
MAX_STOP_DRAIN = 5.0


def stop_drain(config: NodeConfig) -> float:
    """How long an instance may drain before its stop: its app's ``drain_ms``, at most
    :data:`MAX_STOP_DRAIN` and half the node's shutdown grace."""
    return min(MAX_STOP_DRAIN, config.shutdown_grace_ms / 1000 / 2)


def agent_specs(
    runtime: NodeRuntime, registry: Registry, materialize: Materializer
) -> list[ChildSpec | SupervisorSpec]:
    """Reconciler, PortAllocator and ProcessSupervisor under the ``agent`` supervisor."""
    config = runtime.config
    agent = AgentSpec(
        node_id=runtime.node_id,
        data_dir=config.data_dir,
        registry=registry,
        materialize=materialize,
        port_range_start=config.port_range_start,
        port_range_end=config.port_range_end,
        port_quarantine_ms=config.port_quarantine_ms,
        bind_host=config.advertise,
        grace=min(PROCESS_STOP_GRACE, config.shutdown_grace_ms / 1000),
        instance=runtime.instance,
        max_drain=stop_drain(config),
        name=AGENT,
    )
    return [agent.supervisor_spec()]


ARTIFACTS = "artifacts"


def artifacts_spec(
    runtime: NodeRuntime, registry: Registry, store: ArtifactStore, services: NodeServices
) -> ChildSpec:
    """The ArtifactReplicator: copies of live revisions here and (on the lease holder)
    their assignment to nodes; see :mod:`corral.node.artifacts._replicator`."""
    config = runtime.config

    async def running() -> dict[str, set[str]] | None:
        # app -> the artifact digests its processes run: the name of the unpacked
        # revision directory each runs in (a revision id is not a digest). None when
        # that cannot be told, so nothing is released or removed this pass.
        listed = await services.ask(f"/{AGENT}/{AgentSpec.PROCESS_SUPERVISOR}", ListProcesses())
        if not isinstance(listed, list):
            return None
        digests: dict[str, set[str]] = {}
        for process in listed:
            if not isinstance(process, dict) or not process.get("revision"):
                continue
            directory = Path(str(process.get("directory") or ""))
            try:
                if directory.parent.name != "revisions":
                    raise ValueError(f"{directory} is not a revision directory")
                validate_digest(directory.name)
            except ValueError:
                return None
            digests.setdefault(str(process["app"]), set()).add(directory.name)
        return digests

    return ChildSpec(
        name=ARTIFACTS,
        factory=lambda: ArtifactReplicator(
            node_id=runtime.node_id,
            registry=registry,
            store=store,
            apps_dir=runtime.apps_dir,
            running=running,
            copies=config.artifact_copies,
            interval=config.artifact_interval_ms / 1000,
        ),
        shutdown_grace=1.0,
    )


async def artifacts_view(services: NodeServices, state: dict[str, Any]) -> Any:
    """Disk used by artifact copies and unpacked revisions, and fetches in flight."""
    return await services.ask(f"/{ARTIFACTS}", GetArtifactState())


def swim_config(config: NodeConfig) -> SwimConfig:
    """The SWIM settings from the node's (memberlist's LAN profile for the rest)."""
    return SwimConfig(
        probe_interval=config.probe_interval_ms / 1000,
        probe_timeout=config.probe_timeout_ms / 1000,
        indirect_checks=config.indirect_checks,
        suspicion_mult=config.suspicion_mult,
    )


def membership_specs(
    runtime: NodeRuntime, registry: Registry, feed: MembershipFeed
) -> list[ChildSpec | SupervisorSpec]:
    """SwimMembership, joining through the nodes of the registry's records; its view goes
    to ``feed`` and every change nudges the coordinator and the routing renderer."""
    from corral.actors.routing import MembershipChanged

    return [
        membership_child_spec(
            seeds=registry_seeds(registry),
            config=swim_config(runtime.config),
            on_view=feed.on_view,
            notify=(
                (f"/{COORDINATOR}", KickCoordinator("membership changed")),
                (f"/{ROUTING}", MembershipChanged()),
            ),
            name=MEMBERSHIP,
            shutdown_grace=3.0,
        )
    ]


def coordinator_specs(
    runtime: NodeRuntime,
    registry: Registry,
    membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
) -> list[ChildSpec | SupervisorSpec]:
    """The Coordinator: campaigns for ``lease/coordinator`` and places apps while it holds it
    (``membership``: the local SWIM view it combines with the records)."""
    config = runtime.config
    return [
        coordinator_child_spec(
            runtime.node_id,
            registry,
            policy=policy_from_config(config),
            lease_ttl=config.lease_ttl_ms / 1000,
            membership=membership,
            name=COORDINATOR,
            shutdown_grace=min(5.0, config.shutdown_grace_ms / 1000),
        )
    ]


def policy_from_config(config: NodeConfig) -> Policy:
    """The coordinator's policy from the node's settings (the lease holder's apply)."""
    return Policy(
        grace_period_s=config.grace_period_ms / 1000,
        cooldown_s=config.cooldown_ms / 1000,
        disruption_budget=config.disruption_budget,
        min_usable_fraction=config.min_usable_percent / 100,
    )


def routing_specs(
    runtime: NodeRuntime,
    registry: Registry,
    membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
) -> list[ChildSpec | SupervisorSpec]:
    """The RoutingRenderer: renders ``routing`` while this node holds the coordinator
    lease (``membership``: the local SWIM view; instances on a suspect node leave the
    table), and pushes each table to the ``--proxy caddy=URL`` admin endpoints."""
    from corral.actors.routing import routing_renderer_child_spec
    from corral.proxy import caddy_pusher

    pushers = {f"caddy={url}": caddy_pusher(url) for url in runtime.config.proxies}
    return [
        routing_renderer_child_spec(
            runtime.node_id, registry, pushers=pushers, membership=membership, name=ROUTING
        )
    ]


async def processes_view(services: NodeServices, state: dict[str, Any]) -> Any:
    return await services.ask(f"/{AGENT}/{AgentSpec.PROCESS_SUPERVISOR}", ListProcesses())


async def reconcile_view(services: NodeServices, state: dict[str, Any]) -> Any:
    return await services.ask(f"/{AGENT}/{AgentSpec.RECONCILER}", LastPass())


async def coordinator_view(services: NodeServices, state: dict[str, Any]) -> Any:
    return await services.ask(f"/{COORDINATOR}", GetCoordinatorState())


async def ask_holder(
    services: NodeServices, holder: str | None, local: object = None
) -> Coordination:
    """Ask the coordinator of ``holder`` (the lease holder) for its state: this node's
    own (``local``, when already asked) when it holds the lease, else over the peer
    transport. Never raises: a :class:`CoordinatorUnavailable` says why it failed."""
    if not holder:
        return CoordinatorUnavailable(None, "no coordinator holds the lease right now")
    node = None if holder == services.runtime.node_id else holder
    answer = local if node is None and isinstance(local, CoordinatorState) else None
    tries = 0
    deadline = trio.current_time() + HOLDER_ASK_BUDGET
    while not isinstance(answer, CoordinatorState):
        # The holder may be busy with a pass (it handles one message at a time) or not
        # yet reachable over the transport: ask again, a bounded number of times within
        # a bounded time.
        pause = HOLDER_RETRY_PAUSE if tries else 0.0
        left = deadline - trio.current_time() - pause
        if tries == HOLDER_ASK_TRIES or left <= 0:
            break
        await trio.sleep(pause)
        tries += 1
        answer = await services.ask(
            f"/{COORDINATOR}", GetCoordinatorState(), node=node, wait_s=min(ASK_TIMEOUT, left)
        )
    if isinstance(answer, CoordinatorState):
        return answer
    why = answer.get("error") if isinstance(answer, dict) else answer
    return CoordinatorUnavailable(
        holder, f"cannot ask coordinator {holder}: {why} (asked {tries} times)"
    )


async def coordination_view(services: NodeServices, state: dict[str, Any]) -> Coordination:
    """The lease holder's coordinator state (see :meth:`NodeServices.coordination`)."""
    lease = state.get("lease") or {}
    return await ask_holder(services, lease.get("holder"), state.get("coordinator"))


def unplaced_view(coordination: Coordination) -> Any:
    """The coordinator's unplaced apps (as JSON), or ``{"error": ...}`` when its state
    cannot be had; none while no node holds the lease."""
    if isinstance(coordination, CoordinatorState):
        return [asdict(u) for u in coordination.unplaced]
    if coordination.holder is None:
        return []
    return {"error": coordination.error}


ACTOR_VIEWS.update(
    {
        "processes": processes_view,
        "reconcile": reconcile_view,
        "coordinator": coordinator_view,
        "artifacts": artifacts_view,
    }
)


async def check_node_id_free(runtime: NodeRuntime, registry: Registry) -> str:
    """Refuse to start when another live process already holds this node id.

    A record left by this node's previous life on this host, whose process is
    gone, is taken over (see :func:`corral.actors.node_record.claim_on_start`).

    Returns:
        The instance token of the previous life the registration may overwrite
        ("" when there is none).

    Raises:
        ConfigError: naming the process holding the id and what to do.
    """
    kv = await registry.get(node_key(runtime.node_id))
    record = None if kv is None else decode_record(kv.key, kv.value)
    stored = record if isinstance(record, NodeRecord) else None
    identity = runtime.identity()
    running = (
        stored is not None
        and stored.hostname == identity.hostname
        and process_running(stored.pid, stored.started_at)
    )
    claim = claim_on_start(identity, stored, holder_running=running)
    if claim.refused is not None:
        raise ConfigError(claim.refused.refused_message())
    return claim.replaces


async def check_cluster_secret(
    runtime: NodeRuntime, registry: Registry, *, wall_clock: Callable[[], float] = time.time
) -> bool:
    """Check this node's cluster secret against the registry's fingerprint of it.

    The first node of a cluster writes the fingerprint (a guarded txn: only when
    absent); every later node must have the same secret.

    Returns:
        True when this node set the fingerprint, False when it matched.

    Raises:
        ConfigError: the secret differs (or the stored fingerprint is unreadable),
            naming where this node's secret came from and how to fix it.
        RegistryError: the registry failed.
    """
    mine = secret_fingerprint(runtime.secret)
    record = SecretFingerprint(mine, set_by=runtime.node_id, set_at=wall_clock())
    result = await registry.txn(
        [Compare.absent(SECRET_FINGERPRINT_KEY)],
        [Put(SECRET_FINGERPRINT_KEY, record.encode())],
        [Get(SECRET_FINGERPRINT_KEY)],
    )
    if result.succeeded:
        log.info("node %s set the cluster secret fingerprint", runtime.node_id)
        return True
    found = result.responses[0]
    kvs = found if isinstance(found, list) else []
    stored = decode_record(kvs[0].key, kvs[0].value) if kvs else None
    source = (
        "--secret / CORRAL_SECRET / the config file's secret"
        if runtime.config.secret
        else f"{runtime.config.data_dir / SECRET_FILE}"
    )
    if not isinstance(stored, SecretFingerprint):
        why = getattr(stored, "reason", "it vanished while being read")
        raise ConfigError(
            f"the registry's {SECRET_FINGERPRINT_KEY} cannot be read ({why}); this node "
            "does not start. If the cluster's secret is known, delete that key and start "
            "a node that has it: the key is set again from its secret"
        )
    if same_fingerprint(stored.fingerprint, mine):
        return False
    raise ConfigError(
        f"the cluster secret of node {runtime.node_id} (from {source}) is not the cluster's: "
        f"the registry's {SECRET_FINGERPRINT_KEY} was set by node {stored.set_by} from its "
        "secret, and peers would refuse this node. Give this node the cluster's secret: copy "
        f"the secret file from the data directory of a cluster node (such as {stored.set_by}) "
        f"to {runtime.config.data_dir / SECRET_FILE}, or pass it with --secret or CORRAL_SECRET"
    )


async def run_node(
    config: NodeConfig,
    *,
    stop: trio.Event,
    task_status: trio.TaskStatus[NodeRuntime] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one node until ``stop`` is set, then shut it down cleanly.

    Raises:
        ConfigError: the data directory, node id, cluster secret or an address cannot
            be used; or, after a clean stop of its apps, another process took
            ``nodes/<id>`` while this one ran.
        RegistryError: the registry cannot be opened; RegistryReplaced: its file
            was deleted or replaced while the node ran (the node stopped cleanly).
    """
    check_bindable(config)  # before anything is written under --data-dir
    runtime = prepare_runtime(config)
    set_log_node(runtime.node_id)
    metrics = NodeMetrics(runtime.node_id)
    # Every event is counted; in the JSON log each is also a line.
    listeners = [metrics.observe]
    if config.log_format == "json":
        listeners.append(_log_event)
    events = EventLog(listeners=listeners)
    # The first reason the node must stop by itself; it stops cleanly, then raises it.
    fatal: list[Exception] = []
    halt = trio.Event()

    def halt_for(reason: Exception) -> None:
        if not fatal:
            fatal.append(reason)
        halt.set()

    def on_taken(held: HeldElsewhere) -> None:
        halt_for(ConfigError(held.taken_message()))

    async def halt_on_stop() -> None:
        await stop.wait()
        halt.set()

    async def stop_if_registry_file_lost(registry: SQLiteRegistry) -> None:
        try:
            await registry.guard_file()
        except RegistryReplaced as exc:
            log.error("node %s stopping: %s", runtime.node_id, exc)
            halt_for(exc)

    async with open_registry(
        config.registry_url,
        options=config.registry_options,
        lease_ttl=min(config.lease_ttl_ms, config.node_ttl_ms) / 1000,
    ) as opened:
        registry = InstrumentedRegistry(
            opened, registry_backend(config.registry_url), registry_observer(metrics)
        )
        await check_cluster_secret(runtime, registry)
        replaces = await check_node_id_free(runtime, registry)
        persist_node_id(config.data_dir, runtime.node_id)
        # No other process runs as this node now: what partial files there are, a
        # killed one left.
        removed, freed = await trio.to_thread.run_sync(sweep_partial_files, config.data_dir)
        if removed:
            log.info(
                "removed %d partial file(s) of %d bytes an interrupted write left in %s",
                removed,
                freed,
                config.data_dir,
            )
        # What the API's views read (corral state, metrics) answers within the API's
        # deadline, naming the registry, when the registry stops answering.
        api_registry = DeadlineRegistry(registry, config.registry_url)
        services = NodeServices(runtime, api_registry, events, metrics)
        async with open_websocket_transport(
            runtime.node_id,
            (config.listen.host, config.listen.port),
            secret=runtime.secret,
        ) as transport:
            services.transport = transport
            children = root_spec(
                runtime, registry, services, transport, on_taken=on_taken, replaces=replaces
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(halt_on_stop)
                async with open_actor_system(
                    runtime.node_id,
                    transport,
                    children=children,
                    root=SupervisorSpec(
                        name="node", strategy=Strategy.ONE_FOR_ONE, max_restarts=10, within=60.0
                    ),
                ) as system:
                    services.system = system
                    nursery.start_soon(events.follow, system)
                    if isinstance(opened, SQLiteRegistry):
                        nursery.start_soon(stop_if_registry_file_lost, opened)
                    log.info(
                        "node %s up: api http://%s, peers %s, registry %s, data %s",
                        runtime.node_id,
                        config.api,
                        config.listen,
                        config.registry_url,
                        config.data_dir,
                    )
                    system.emit("node.started", node=runtime.node_id, api=str(config.api))
                    task_status.started(runtime)
                    await halt.wait()
                    if not fatal:
                        log.info("node %s stopping", runtime.node_id)
                    await services.withdraw_from_routing()
                nursery.cancel_scope.cancel()
    if fatal:
        # The one line saying why (printed by the command line); the apps are stopped.
        raise fatal[0]
    log.info("node %s stopped", runtime.node_id)


def kill_descendants() -> list[int]:
    """SIGKILL every process below this one (a forced stop must leave none behind)."""
    killed: list[int] = []
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return killed
    for child in children:
        try:
            child.kill()
            killed.append(child.pid)
        except psutil.Error:
            continue
    return killed


async def serve_until_signalled(config: NodeConfig) -> None:
    """Run the node; the first SIGTERM/SIGINT stops it cleanly, a second forces it.

    The node process becomes a child subreaper first (Linux), so an app's descendant
    that double-forks away is re-parented to the node and ends with its app.
    """
    if not enable_subreaper():
        log.info("not a child subreaper here: escaped app descendants go to init")
    stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if not stop.is_set():
                        log.info(
                            "%s: stopping cleanly (send it again to force)",
                            signal.Signals(signum).name,
                        )
                        stop.set()
                    else:
                        killed = kill_descendants()
                        log.warning("forced stop; killed %d app process(es)", len(killed))
                        os._exit(128 + signum)

            nursery.start_soon(watch)
            await run_node(config, stop=stop)
            nursery.cancel_scope.cancel()


def registry_backend(url: str) -> str:
    """The registry's kind for metric labels: ``sqlite``, ``etcd``, ``memory``..."""
    scheme, sep, _ = url.partition("://")
    return scheme if sep and scheme else "unknown"


def _log_event(event: Event) -> None:
    log_event(event.kind, event.path, event.fields)


def config_from_args(
    args: argparse.Namespace, env: dict[str, str] | os._Environ[str]
) -> NodeConfig:
    flags: dict[str, object] = {}
    for name in SETTINGS:
        flags[name] = getattr(args, name.replace("-", "_"), None)
    config_path = args.config or env.get("CORRAL_CONFIG")
    file_values = load_config_file(Path(config_path)) if config_path else {}
    return resolve_node_config(
        flags, env, file_values, cwd=Path.cwd(), file_name=str(config_path or "")
    )


def node_run_command(args: argparse.Namespace, stderr: TextIO) -> int:
    """``corral node run``; returns the exit status."""
    config = config_from_args(args, os.environ)
    configure_logging(stderr, config.log_format)
    try:
        try:
            trio.run(serve_until_signalled, config)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
    except RegistryError as exc:
        print(f"corral: error: the registry cannot be used: {exc}", file=stderr)
        return 1
    return 0


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error a nursery wrapped (so it reads as one line), or the group itself."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        elif not isinstance(error, trio.Cancelled):
            leaves.append(error)

    walk(group)
    return leaves[0] if len(leaves) == 1 else group
