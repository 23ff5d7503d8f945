"""``GET /metrics``: the node's Prometheus metrics, one ``CollectorRegistry`` per node.

Theory of operation: most of what an operator graphs the node already knows and
already shows — the actor tree, the coordinator's state, the process table, the
port ledger, the last reconcile pass, the SWIM view, the routing table and the
proxies' records (as ``GET /v1/routes`` reads them), the transport's frame counts
(:meth:`Transport.stats`, plain ints). So the metrics are read at scrape time from
those same views (:class:`MetricsSources`), not counted inside the actors:
a scrape asks the actors (as ``GET /v1/state`` does), hands the answers to a
custom collector, and renders the text. Three kinds of series need more:

* counts of things that happen between scrapes (process starts, exits, crash
  loops; reconciler actions and passes; refused transport frames; lost peers)
  come from the actor system's event stream: the node's event log hands each
  event to :meth:`NodeMetrics.observe`;
* registry latency comes from :class:`InstrumentedRegistry`, a thin wrapper the
  node assembly puts around its registry;
* pass durations are histograms of the passes scrapes see: each scrape adds the
  coordinator's and the reconciler's last pass when it is new. A pass event that
  carries its ``duration`` (``coordinator.pass``, ``reconcile.pass``) is counted
  exactly instead.

Rendering (``generate_latest``) is synchronous; it runs on the event loop while
the series are few and in a worker thread once there are many.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.actors.coordinator import MEMBER_STATES, CoordinatorState
from corral.actors.planner import NODE_STATES
from corral.actors.routing import read_routes_answer
from corral.registry import (
    Compare,
    KeyValue,
    Lease,
    Registry,
    RegistryError,
    TxnOp,
    TxnResult,
    WatchEvent,
)
from corral.supervision import Event
from corral.transport import FrameCounts

#: Past this many actors plus apps, the text is rendered in a worker thread.
RENDER_INLINE_LIMIT = 200
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REGISTRY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: At most this many distinct label values per event-counted series (a hostile or
#: buggy peer name must not grow the registry without bound).
MAX_LABEL_VALUES = 500
#: The outcomes every node reports for coordinator passes, 0 until they happen.
PASS_OUTCOMES = ("applied", "paused", "refused", "skipped")
#: What the coordinator counts next to its passes that is a change of the lease.
LEASE_CHANGES = frozenset({"acquired", "lost"})

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class MetricsSources:
    """Where a scrape reads the node's views (each never raises: an unavailable view
    is a dict with ``error``)."""

    actors: Callable[[], JSONDict]
    coordinator: Callable[[], Awaitable[Any]]
    processes: Callable[[], Awaitable[Any]]
    ports: Callable[[], Awaitable[Any]]
    reconcile: Callable[[], Awaitable[Any]]
    #: frames sent and received by peer (:meth:`Transport.stats`), a plain read.
    transport: Callable[[], Mapping[str, FrameCounts]] | None = None
    #: this node's SWIM view (the membership actor's ``MembershipView``).
    membership: Callable[[], Awaitable[Any]] | None = None
    #: the routing table's version and each proxy's (``GET /v1/routes``'s answer).
    routes: Callable[[], Awaitable[Any]] | None = None


@dataclass
class _Snapshot:
    actors: Any = None
    coordinator: Any = None
    processes: Any = None
    ports: Any = None
    reconcile: Any = None
    transport: Any = None
    membership: Any = None
    routes: Any = None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _walk(tree: Any, depth: int = 0) -> Iterable[Mapping[str, Any]]:
    if not isinstance(tree, Mapping) or depth > 64:
        return
    yield tree
    for child in tree.get("children") or ():
        yield from _walk(child, depth + 1)


def free_ports(ledger: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(free, held, quarantined) ports of the pool, from ``ListPorts``'s snapshot."""
    span = ledger.get("range")
    if not isinstance(span, Mapping):
        return None
    start, end = _number(span.get("start")), _number(span.get("end"))
    if start is None or end is None:
        return None
    size = int(end - start + 1)
    held: set[Any] = set()
    for pair in (ledger.get("holdings") or {}).values():
        if isinstance(pair, Mapping):
            held.update(p for p in (pair.get("public"), pair.get("internal")) if p is not None)
    quarantined = len(ledger.get("quarantine") or {})
    return max(0, size - len(held) - quarantined), len(held), quarantined


class _ViewCollector(Collector):
    """Turns the last scrape's snapshot into metric families (called by the registry)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.snapshot = _Snapshot()

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot
        yield from self._actors(snap.actors)
        yield from self._coordinator(snap.coordinator)
        yield from self._processes(snap.processes)
        yield from self._ports(snap.ports)
        yield from self._reconcile(snap.reconcile)
        yield from self._transport(snap.transport)
        yield from self._membership(snap.membership)
        yield from self._routes(snap.routes)

    def _actors(self, tree: Any) -> Iterable[Metric]:
        depth = GaugeMetricFamily(
            "corral_actor_mailbox_depth", "Messages waiting in the actor's mailbox", labels=["path"]
        )
        handled = CounterMetricFamily(
            "corral_actor_messages_handled",
            "Messages the actor handled (since it last started)",
            labels=["path"],
        )
        restarts = CounterMetricFamily(
            "corral_actor_restarts", "Times the actor was restarted", labels=["path"]
        )
        for node in _walk(tree):
            path = node.get("path")
            if not isinstance(path, str):
                continue
            for family, key in (
                (depth, "mailbox_depth"),
                (handled, "messages_handled"),
                (restarts, "restarts"),
            ):
                value = _number(node.get(key))
                if value is not None:
                    family.add_metric([path], value)
        yield from (depth, handled, restarts)

    def _coordinator(self, state: Any) -> Iterable[Metric]:
        if not isinstance(state, CoordinatorState):
            return  # the coordinator could not be asked: {"error": ...}
        coordinating = GaugeMetricFamily(
            "corral_coordinator_coordinating", "1 while this node holds the coordinator lease"
        )
        coordinating.add_metric([], 1.0 if state.coordinating else 0.0)
        yield coordinating
        if state.fence is not None:
            family = GaugeMetricFamily("corral_coordinator_fence", "The fence of the lease")
            family.add_metric([], float(state.fence))
            yield family
        passes = CounterMetricFamily(
            "corral_coordinator_passes",
            "Coordinator passes on this node, by outcome",
            labels=["outcome"],
        )
        lease = CounterMetricFamily(
            "corral_coordinator_lease_changes",
            "Times this node's coordinator acquired or lost the lease",
            labels=["change"],
        )
        counts = asdict(state.passes)
        for outcome in sorted(set(PASS_OUTCOMES) | set(counts) - LEASE_CHANGES):
            passes.add_metric([outcome], float(counts.get(outcome, 0)))
        for change in sorted(LEASE_CHANGES):
            lease.add_metric([change], float(counts.get(change, 0)))
        yield passes
        yield lease
        for name, help_text, items in (
            ("unplaced", "Apps the coordinator cannot place (fully)", state.unplaced),
            (
                "deferred",
                "Moves the coordinator put off (cooldown, disruption budget)",
                state.deferred,
            ),
            ("stranded", "Pinned instances kept on a lost or force-drained node", state.stranded),
        ):
            family = GaugeMetricFamily(f"corral_coordinator_{name}", help_text)
            family.add_metric([], float(len(items)))
            yield family
        if state.coordinating:
            yield _by_state(
                "corral_coordinator_node_states",
                "Nodes per state, as the lease holder's last pass decided them",
                (status.state for status in state.node_states),
                NODE_STATES,
            )

    def _processes(self, table: Any) -> Iterable[Metric]:
        if not isinstance(table, list):
            return
        restarts = CounterMetricFamily(
            "corral_process_restarts", "Restarts of the app's process", labels=["app"]
        )
        looping = GaugeMetricFamily(
            "corral_process_crash_loop",
            "1 while the app's process is in a crash loop",
            labels=["app"],
        )
        running = GaugeMetricFamily(
            "corral_process_running", "1 while the app's process runs", labels=["app"]
        )
        for row in table:
            if not isinstance(row, Mapping) or not isinstance(row.get("app"), str):
                continue
            app = row["app"]
            restarts.add_metric([app], _number(row.get("restarts")) or 0.0)
            looping.add_metric([app], 1.0 if row.get("crash_loop") else 0.0)
            running.add_metric([app], 1.0 if row.get("state") == "running" else 0.0)
        yield from (restarts, looping, running)

    def _ports(self, ledger: Any) -> Iterable[Metric]:
        counted = free_ports(ledger) if isinstance(ledger, Mapping) else None
        if counted is None:
            return
        for name, value, help_text in zip(
            ("free", "held", "quarantined"),
            counted,
            (
                "Ports of the pool no app holds or waits for",
                "Ports apps of this node hold",
                "Released ports resting before another app may have them",
            ),
            strict=True,
        ):
            family = GaugeMetricFamily(f"corral_ports_{name}", help_text)
            family.add_metric([], float(value))
            yield family

    def _reconcile(self, last: Any) -> Iterable[Metric]:
        if not isinstance(last, Mapping) or "error" in last:
            return
        serving = _number(last.get("serving"))
        if serving is not None:
            family = GaugeMetricFamily("corral_reconcile_serving", "Apps this node serves")
            family.add_metric([], serving)
            yield family

    def _transport(self, stats: Any) -> Iterable[Metric]:
        if not isinstance(stats, Mapping):
            return
        sent = CounterMetricFamily(
            "corral_transport_frames_sent", "Frames sent to the peer", labels=["peer"]
        )
        received = CounterMetricFamily(
            "corral_transport_frames_received", "Frames received from the peer", labels=["peer"]
        )
        for peer in sorted(str(p) for p in stats)[:MAX_LABEL_VALUES]:
            counts = stats[peer]
            if isinstance(counts, tuple) and len(counts) == 2:
                for family, value in zip((sent, received), counts, strict=True):
                    number = _number(value)
                    if number is not None:
                        family.add_metric([peer[:100]], number)
        yield from (sent, received)

    def _membership(self, view: Any) -> Iterable[Metric]:
        members = getattr(view, "members", None)
        if not isinstance(members, tuple | list):
            return
        yield _by_state(
            "corral_membership_members",
            "Members per SWIM state in this node's view (itself included)",
            (getattr(member, "state", None) for member in members),
            MEMBER_STATES,
        )

    def _routes(self, answer: Any) -> Iterable[Metric]:
        if not isinstance(answer, Mapping) or "error" in answer:
            return
        version = answer.get("version")
        if isinstance(version, Mapping):
            for part in ("fence", "revision"):
                value = _number(version.get(part))
                if value is not None:
                    family = GaugeMetricFamily(
                        f"corral_routing_table_{part}",
                        f"The {part} of the routing table in the registry",
                    )
                    family.add_metric([], value)
                    yield family
        fence = GaugeMetricFamily(
            "corral_proxy_applied_fence",
            "The fence of the table the proxy applied",
            labels=["proxy"],
        )
        revision = GaugeMetricFamily(
            "corral_proxy_applied_revision",
            "The revision of the table the proxy applied",
            labels=["proxy"],
        )
        lag = GaugeMetricFamily(
            "corral_proxy_lag_seconds",
            "Seconds since the proxy applied a table, while it serves an older one (0 current)",
            labels=["proxy"],
        )
        rows = answer.get("proxies")
        for row in (rows if isinstance(rows, list) else [])[:MAX_LABEL_VALUES]:
            if not isinstance(row, Mapping) or not isinstance(row.get("id"), str):
                continue
            proxy = row["id"][:100]
            applied = row.get("applied")
            if isinstance(applied, Mapping):
                for family, part in ((fence, "fence"), (revision, "revision")):
                    value = _number(applied.get(part))
                    if value is not None:
                        family.add_metric([proxy], value)
            seconds = _number(row.get("lag_s"))
            if seconds is not None:
                lag.add_metric([proxy], seconds)
        yield from (fence, revision, lag)


def _by_state(name: str, help_text: str, states: Iterable[object], known: Iterable[str]) -> Metric:
    """A gauge of how many of ``states`` are each of ``known`` (every one present, 0 or
    more; a state not known is left out)."""
    counts = dict.fromkeys(known, 0)
    for state in states:
        if isinstance(state, str) and state in counts:
            counts[state] += 1
    family = GaugeMetricFamily(name, help_text, labels=["state"])
    for state, count in counts.items():
        family.add_metric([state], float(count))
    return family


class NodeMetrics:
    """One node's metrics: its own registry, event-counted series and scrape-time views.

    Args:
        node: the node id (a constant label of nothing: one registry per node).
        sources: the views a scrape reads; None until the node assembled them.
    """

    def __init__(self, node: str, sources: MetricsSources | None = None) -> None:
        self.node = node
        self.sources = sources
        self.registry = CollectorRegistry()
        self._views = _ViewCollector(node)
        self.registry.register(self._views)
        self._lock = trio.Lock()
        self._last_pass_seen: dict[str, object] = {}
        self._exact_passes: set[str] = set()
        self._label_values: dict[str, set[tuple[str, ...]]] = {}
        r = self.registry
        self.process_starts = Counter(
            "corral_process_starts", "App process starts", ["app"], registry=r
        )
        self.process_exits = Counter(
            "corral_process_exits", "App process exits (crashes and stops)", ["app"], registry=r
        )
        self.crash_loops = Counter(
            "corral_process_crash_loops", "Times an app entered a crash loop", ["app"], registry=r
        )
        self.frames_refused = Counter(
            "corral_transport_frames_refused",
            "Frames from a peer the node refused (malformed, unknown kind, too large)",
            ["peer", "code"],
            registry=r,
        )
        self.peers_lost = Counter(
            "corral_transport_peers_lost",
            "Times a peer's connection was lost",
            ["peer"],
            registry=r,
        )
        self.reconcile_actions = Counter(
            "corral_reconcile_actions",
            "Reconciler actions, by kind and whether they succeeded",
            ["action", "ok"],
            registry=r,
        )
        self.pass_duration = Histogram(
            "corral_coordinator_pass_duration_seconds",
            "Coordinator pass duration (each pass a scrape sees, or every pass when the "
            "pass event carries its duration)",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "corral_reconcile_pass_duration_seconds",
            "Reconcile pass duration (every pass that did work, from its reconcile.pass "
            "event; each pass a scrape sees without those events)",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.reconcile_passes = Counter(
            "corral_reconcile_passes",
            "Reconcile passes, full or skipped (nothing changed; counted at the next full pass)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("full", "skipped"):
            self.reconcile_passes.labels(outcome=outcome)
        self.registry_latency = Histogram(
            "corral_registry_operation_seconds",
            "Registry operation latency, by operation and backend",
            ["op", "backend"],
            buckets=REGISTRY_BUCKETS,
            registry=r,
        )
        self.registry_errors = Counter(
            "corral_registry_operation_errors",
            "Registry operations that failed, by operation and backend",
            ["op", "backend"],
            registry=r,
        )

    # ------------------------------------------------------------------ events

    def _bounded(self, series: str, labels: tuple[str, ...]) -> bool:
        seen = self._label_values.setdefault(series, set())
        if labels in seen:
            return True
        if len(seen) >= MAX_LABEL_VALUES:
            return False
        seen.add(labels)
        return True

    def observe_event(self, kind: str, fields: Mapping[str, Any]) -> None:
        """Count one actor-system event."""
        app = fields.get("app")
        if kind in ("process.started", "process.exited", "process.crash-loop"):
            if not isinstance(app, str) or not self._bounded(kind, (app,)):
                return
            counter = {
                "process.started": self.process_starts,
                "process.exited": self.process_exits,
                "process.crash-loop": self.crash_loops,
            }[kind]
            counter.labels(app=app).inc()
        elif kind == "transport.rejected":
            peer, code = str(fields.get("peer") or "?")[:100], str(fields.get("code") or "?")[:50]
            if self._bounded(kind, (peer, code)):
                self.frames_refused.labels(peer=peer, code=code).inc()
        elif kind == "transport.peer-lost":
            peer = str(fields.get("peer") or "?")[:100]
            if self._bounded(kind, (peer,)):
                self.peers_lost.labels(peer=peer).inc()
        elif kind == "reconcile.pass":
            self._reconcile_pass(fields)
        elif kind.startswith("reconcile.") and kind != "reconcile.published":
            failed = kind == "reconcile.failed"
            action = str(fields.get("action") or "?")[:50] if failed else kind[len("reconcile.") :]
            labels = (action[:50], "false" if failed else "true")
            if self._bounded("reconcile", labels):
                self.reconcile_actions.labels(action=labels[0], ok=labels[1]).inc()
        elif kind == "coordinator.pass":
            duration = _number(fields.get("duration"))
            if duration is not None:
                self._exact_passes.add("coordinator")
                self.pass_duration.observe(duration)

    def _reconcile_pass(self, fields: Mapping[str, Any]) -> None:
        duration = _number(fields.get("duration"))
        if duration is not None:
            self._exact_passes.add("reconcile")
            self.reconcile_duration.observe(max(0.0, duration))
            self.reconcile_passes.labels(outcome="full").inc()
        skipped = _number(fields.get("skipped_since"))
        if skipped is not None and 0 < skipped <= 1e9:
            self.reconcile_passes.labels(outcome="skipped").inc(skipped)

    def observe(self, event: Event) -> None:
        """Count one event of the actor system (a listener of the node's event log)."""
        self.observe_event(event.kind, event.fields)

    # ------------------------------------------------------------------ scrape

    def _sample_pass(
        self, which: str, when: object, duration: float | None, histogram: Histogram
    ) -> None:
        if which in self._exact_passes:
            return
        if duration is None or self._last_pass_seen.get(which) == when:
            return
        self._last_pass_seen[which] = when
        histogram.observe(duration)

    async def scrape(self) -> bytes:
        """Read the node's views and render every series in the text format."""
        async with self._lock:
            snap = _Snapshot()
            if self.sources is not None:
                snap.actors = self.sources.actors()
                snap.coordinator = await self.sources.coordinator()
                snap.processes = await self.sources.processes()
                snap.ports = await self.sources.ports()
                snap.reconcile = await self.sources.reconcile()
                if self.sources.transport is not None:
                    snap.transport = self.sources.transport()
                if self.sources.membership is not None:
                    snap.membership = await self.sources.membership()
                if self.sources.routes is not None:
                    snap.routes = await self.sources.routes()
            coordinator = snap.coordinator
            if isinstance(coordinator, CoordinatorState) and coordinator.last_pass is not None:
                last = coordinator.last_pass
                self._sample_pass("coordinator", last.time, last.duration, self.pass_duration)
            reconcile = snap.reconcile
            if isinstance(reconcile, Mapping) and "error" not in reconcile:
                self._sample_pass(
                    "reconcile",
                    reconcile.get("time"),
                    _number(reconcile.get("duration")),
                    self.reconcile_duration,
                )
            self._views.snapshot = snap
            size = sum(1 for _ in _walk(snap.actors)) + (
                len(snap.processes) if isinstance(snap.processes, list) else 0
            )
            if size <= RENDER_INLINE_LIMIT:
                return generate_latest(self.registry)
            return await trio.to_thread.run_sync(generate_latest, self.registry)


async def read_routes(registry: Registry, now: float) -> Any:
    """The routing table's version and each proxy's, as ``GET /v1/routes`` has them.
    Never raises: ``{"error": ...}`` says why."""
    try:
        return await read_routes_answer(registry, now)
    except RegistryError as exc:
        return {"error": f"the registry is unavailable: {exc}"}


# ---------------------------------------------------------------------- registry


class InstrumentedRegistry(Registry):
    """A :class:`Registry` that times every operation of the one it wraps.

    Args:
        inner: the registry doing the work.
        backend: its kind (``sqlite``, ``etcd``, ``memory``), a label of every series.
        observe: called with (operation, backend, seconds, failed) after each operation.
        clock: seconds (Trio's clock by default, so virtual-time tests stay exact).
    """

    def __init__(
        self,
        inner: Registry,
        backend: str,
        observe: Callable[[str, str, float, bool], None],
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.inner = inner
        self.backend = backend
        self._observe = observe
        self._clock = clock

    async def _timed(self, op: str, call: Awaitable[Any]) -> Any:
        started = self._clock()
        failed = True
        try:
            result = await call
            failed = False
            return result
        finally:
            self._observe(op, self.backend, self._clock() - started, failed)

    async def get(self, key: str) -> KeyValue | None:
        result: KeyValue | None = await self._timed("get", self.inner.get(key))
        return result

    async def range(self, prefix: str) -> list[KeyValue]:
        result: list[KeyValue] = await self._timed("range", self.inner.range(prefix))
        return result

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        result: int = await self._timed("put", self.inner.put(key, value, lease))
        return result

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        result: int = await self._timed("delete", self.inner.delete(key, prefix=prefix))
        return result

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        result: TxnResult = await self._timed(
            "txn", self.inner.txn(compares, on_success, on_failure)
        )
        return result

    async def grant(self, ttl: float) -> Lease:
        result: Lease = await self._timed("grant", self.inner.grant(ttl))
        return result

    async def keepalive(self, lease_id: int) -> float:
        result: float = await self._timed("keepalive", self.inner.keepalive(lease_id))
        return result

    async def revoke(self, lease_id: int) -> None:
        await self._timed("revoke", self.inner.revoke(lease_id))

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self.inner.watch(prefix, start_revision)

    async def revision(self) -> int:
        result: int = await self._timed("revision", self.inner.revision())
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def registry_observer(metrics: NodeMetrics) -> Callable[[str, str, float, bool], None]:
    """What :class:`InstrumentedRegistry` calls: latency into the node's histogram."""

    def observe(op: str, backend: str, seconds: float, failed: bool) -> None:
        metrics.registry_latency.labels(op=op, backend=backend).observe(max(0.0, seconds))
        if failed:
            metrics.registry_errors.labels(op=op, backend=backend).inc()

    return observe
