"""GET /metrics: scraped and parsed with prometheus-client's own text parser."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from corral.actors.coordinator import CoordinatorState, NodeStatus
from corral.actors.coordinator._state import CoordinatorPass, PassCounts
from corral.actors.membership._actor import MemberInfo, MembershipView
from corral.actors.planner import Deferred, Policy, Unplaced
from corral.actors.routing import RouteTable, encode_table_json
from corral.node.artifacts._artifact_store import ArtifactStore
from corral.node.server._api import ApiServices, build_api, build_metrics_app
from corral.node.server._metrics import (
    MAX_LABEL_VALUES,
    InstrumentedRegistry,
    MetricsSources,
    NodeMetrics,
    free_ports,
    read_routes,
    registry_observer,
)
from corral.registry import ROUTING_KEY, MemoryRegistry, ProxyRecord
from corral.transport import FrameCounts, MemoryNetwork

TREE: dict[str, Any] = {
    "path": "/",
    "kind": "supervisor",
    "mailbox_depth": 0,
    "messages_handled": 4,
    "restarts": 0,
    "children": [
        {"path": "/coordinator", "mailbox_depth": 2, "messages_handled": 40, "restarts": 1},
        {"path": "/agent/reconciler", "mailbox_depth": "junk", "restarts": 3},
    ],
}
COORDINATOR = CoordinatorState(
    node="n1",
    coordinating=True,
    holder="n1",
    fence=7,
    lease_ttl=45.0,
    policy=Policy(),
    passes=PassCounts(skipped=12, applied=3, acquired=1),
    last_pass=CoordinatorPass(
        time=10.0, duration=0.04, wall_time=1000.0, trigger="tick", outcome="applied",
        skipped=False,
    ),
    unplaced=(Unplaced("db", "placement-unavailable", "no node"),),
    deferred=(Deferred("a", "n1", "cooldown"), Deferred("b", "n1", "cooldown")),
)
PROCESSES = [
    {"app": "web", "state": "running", "restarts": 2, "crash_loop": False},
    {"app": "boom", "state": "backoff", "restarts": 5, "crash_loop": True},
    "junk",
]
PORTS = {
    "range": {"start": 24000, "end": 24009},
    "holdings": {"web": {"public": 24001, "internal": 24002}},
    "quarantine": {"24005": {"app": "old", "until": 99.0}},
}
RECONCILE = {
    "time": 5.0,
    "duration": 0.003,
    "serving": 1,
    "actions": [{"action": "start", "ok": True}, {"action": "stop", "ok": False}],
}


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by (name, sorted labels)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def sources(**overrides: Any) -> MetricsSources:
    views: dict[str, Any] = {
        "coordinator": COORDINATOR,
        "processes": PROCESSES,
        "ports": PORTS,
        "reconcile": RECONCILE,
        **overrides,
    }

    def answer(name: str) -> Any:
        async def read() -> Any:
            return views[name]

        return read

    return MetricsSources(
        actors=lambda: views.get("actors", TREE),
        coordinator=answer("coordinator"),
        processes=answer("processes"),
        ports=answer("ports"),
        reconcile=answer("reconcile"),
        transport=views.get("transport"),
        membership=views.get("membership"),
        routes=views.get("routes"),
    )


async def test_a_scrape_reads_the_nodes_views() -> None:
    metrics = NodeMetrics("n1", sources())
    got = samples(await metrics.scrape())
    assert got[("corral_actor_mailbox_depth", (("path", "/coordinator"),))] == 2
    assert got[("corral_actor_messages_handled_total", (("path", "/coordinator"),))] == 40
    assert got[("corral_actor_restarts_total", (("path", "/agent/reconciler"),))] == 3
    # A field of the wrong type is left out, never a failed scrape.
    assert ("corral_actor_mailbox_depth", (("path", "/agent/reconciler"),)) not in got
    passes = {k[1][0][1]: v for k, v in got.items() if k[0] == "corral_coordinator_passes_total"}
    assert passes == {"applied": 3, "paused": 0, "refused": 0, "skipped": 12}
    lease = (("change", "acquired"),)
    assert got[("corral_coordinator_lease_changes_total", lease)] == 1
    assert got[("corral_coordinator_lease_changes_total", (("change", "lost"),))] == 0
    assert got[("corral_coordinator_coordinating", ())] == 1
    assert got[("corral_coordinator_fence", ())] == 7
    assert got[("corral_coordinator_unplaced", ())] == 1
    assert got[("corral_coordinator_deferred", ())] == 2
    assert got[("corral_coordinator_stranded", ())] == 0
    assert got[("corral_process_restarts_total", (("app", "boom"),))] == 5
    assert got[("corral_process_crash_loop", (("app", "boom"),))] == 1
    assert got[("corral_process_running", (("app", "web"),))] == 1
    assert got[("corral_ports_free", ())] == 7  # 10 in the range, 2 held, 1 resting
    assert got[("corral_ports_held", ())] == 2
    assert got[("corral_ports_quarantined", ())] == 1
    assert got[("corral_reconcile_serving", ())] == 1
    assert got[("corral_coordinator_pass_duration_seconds_count", ())] == 1
    assert got[("corral_coordinator_pass_duration_seconds_bucket", (("le", "0.05"),))] == 1
    assert got[("corral_coordinator_pass_duration_seconds_bucket", (("le", "0.025"),))] == 0
    assert got[("corral_reconcile_pass_duration_seconds_count", ())] == 1
    # The same last pass seen by a second scrape is not counted twice.
    again = samples(await metrics.scrape())
    assert again[("corral_coordinator_pass_duration_seconds_count", ())] == 1


async def test_unavailable_views_leave_their_series_out() -> None:
    busy = {"error": "no reply from /coordinator within 2.0 s"}
    metrics = NodeMetrics(
        "n1", sources(coordinator=busy, processes=busy, ports=busy, reconcile=busy)
    )
    got = samples(await metrics.scrape())
    assert not [k for k in got if k[0].startswith(("corral_coordinator_c", "corral_ports"))]
    assert got[("corral_actor_mailbox_depth", (("path", "/coordinator"),))] == 2


async def test_events_count_starts_exits_loops_and_refused_frames() -> None:
    metrics = NodeMetrics("n1", sources())
    for _ in range(3):
        metrics.observe_event("process.started", {"app": "web", "pid": 1})
    metrics.observe_event("process.exited", {"app": "web", "code": 1})
    metrics.observe_event("process.crash-loop", {"app": "web"})
    metrics.observe_event("transport.rejected", {"peer": "n2", "code": "too-large"})
    metrics.observe_event("transport.peer-lost", {"peer": "n2"})
    metrics.observe_event("process.started", {"app": None})  # malformed: ignored
    metrics.observe_event("reconcile.start", {"app": "web"})
    metrics.observe_event("reconcile.failed", {"app": "db", "action": "start", "error": "x"})
    metrics.observe_event("reconcile.published", {"serving": 1})
    got = samples(await metrics.scrape())
    assert got[("corral_process_starts_total", (("app", "web"),))] == 3
    assert got[("corral_process_exits_total", (("app", "web"),))] == 1
    assert got[("corral_process_crash_loops_total", (("app", "web"),))] == 1
    refused = (("code", "too-large"), ("peer", "n2"))
    assert got[("corral_transport_frames_refused_total", refused)] == 1
    assert got[("corral_transport_peers_lost_total", (("peer", "n2"),))] == 1
    start = ("corral_reconcile_actions_total", (("action", "start"), ("ok", "true")))
    failed = ("corral_reconcile_actions_total", (("action", "start"), ("ok", "false")))
    assert got[start] == 1
    assert got[failed] == 1
    assert not [
        k
        for k in got
        if k[0] == "corral_reconcile_actions_total" and ("action", "published") in k[1]
    ]


async def test_a_pass_event_with_its_duration_is_counted_exactly() -> None:
    metrics = NodeMetrics("n1", sources())
    for duration in (0.002, 0.2, 3.0):
        metrics.observe_event("coordinator.pass", {"outcome": "applied", "duration": duration})
    got = samples(await metrics.scrape())
    # Exact from events: the scrape's sample of the last pass is not added on top.
    assert got[("corral_coordinator_pass_duration_seconds_count", ())] == 3
    assert got[("corral_coordinator_pass_duration_seconds_bucket", (("le", "0.25"),))] == 2


async def test_label_values_from_events_are_bounded() -> None:
    metrics = NodeMetrics("n1", sources())
    for index in range(MAX_LABEL_VALUES + 50):
        metrics.observe_event("transport.peer-lost", {"peer": f"p{index}"})
    got = samples(await metrics.scrape())
    lost = [k for k in got if k[0] == "corral_transport_peers_lost_total"]
    assert len(lost) == MAX_LABEL_VALUES


async def test_registry_operations_are_timed_by_op_and_backend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = NodeMetrics("n1", sources())
    inner = MemoryRegistry()

    registry = InstrumentedRegistry(inner, "memory", registry_observer(metrics))

    async def slow_get(key: str) -> Any:
        await trio.sleep(0.02)
        return None

    await registry.put("apps/web", b"{}")
    await registry.put("apps/db", b"{}")
    inner.get = slow_get  # type: ignore[method-assign]
    assert await registry.get("apps/web") is None
    assert [kv.key for kv in await registry.range("apps/")] == ["apps/db", "apps/web"]
    got = samples(await metrics.scrape())
    put = (("backend", "memory"), ("op", "put"))
    get = (("backend", "memory"), ("op", "get"))
    assert got[("corral_registry_operation_seconds_count", put)] == 2
    assert got[("corral_registry_operation_seconds_sum", get)] == 0.02  # virtual time, exact
    bucket = "corral_registry_operation_seconds_bucket"
    assert got[(bucket, (("backend", "memory"), ("le", "0.01"), ("op", "get")))] == 0
    assert got[(bucket, (("backend", "memory"), ("le", "0.025"), ("op", "get")))] == 1


def test_free_ports_from_a_ledger() -> None:
    assert free_ports(PORTS) == (7, 2, 1)
    assert free_ports({}) is None
    assert free_ports({"range": {"start": "x"}}) is None


async def test_metrics_route_takes_the_token_and_the_loopback_listener_none(
    tmp_path: Path,
) -> None:
    metrics = NodeMetrics("n1", sources())
    registry = MemoryRegistry()

    async def state() -> dict[str, Any]:
        return {}

    api = build_api(
        ApiServices(
            token="tok",
            secret="s",
            node_id="n1",
            registry=registry,
            artifacts=ArtifactStore(registry, tmp_path, node_id="n1", secret="s"),
            state=state,
            actors=lambda: TREE,
            events=list,
            wall_clock=lambda: 0.0,
            metrics=metrics.scrape,
        )
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://n") as c:
        assert (await c.get("/metrics")).status_code == 401
        answer = await c.get("/metrics", headers={"Authorization": "Bearer tok"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert ("corral_ports_free", ()) in samples(answer.content)
    bare = build_metrics_app(metrics.scrape)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bare), base_url="http://n") as c:
        answer = await c.get("/metrics")
        assert (await c.get("/v1/state")).status_code == 404  # nothing else is served there
    assert answer.status_code == 200
    assert ("corral_coordinator_unplaced", ()) in samples(answer.content)


async def test_frames_sent_and_received_by_peer_come_from_the_transport() -> None:
    network = MemoryNetwork()
    a, b = network.connect("n1"), network.connect("n2")
    for _ in range(3):
        await a.send("n2", b"x")
    for _ in range(3):
        await b.receive()
    await b.send("n1", b"y")
    await a.receive()
    metrics = NodeMetrics("n1", sources(transport=a.stats))
    got = samples(await metrics.scrape())
    assert got[("corral_transport_frames_sent_total", (("peer", "n2"),))] == 3
    assert got[("corral_transport_frames_received_total", (("peer", "n2"),))] == 1
    # Many peers: at most MAX_LABEL_VALUES of them, and a malformed entry is left out.
    crowd = {f"p{i:04}": FrameCounts(i, 0) for i in range(MAX_LABEL_VALUES + 20)}
    got = samples(await NodeMetrics("n1", sources(transport=lambda: crowd)).scrape())
    sent = [k for k in got if k[0] == "corral_transport_frames_sent_total"]
    assert len(sent) == MAX_LABEL_VALUES
    junk = {"n2": "many"}
    got = samples(await NodeMetrics("n1", sources(transport=lambda: junk)).scrape())
    assert not [k for k in got if k[0] == "corral_transport_frames_sent_total"]
    await a.aclose()
    await b.aclose()


def member(node: str, state: Any) -> MemberInfo:
    return MemberInfo(node=node, state=state, incarnation=1, since=0.0, reporter="n1")


async def test_members_per_swim_state_and_the_lease_holders_node_states() -> None:
    view = MembershipView(
        node="n1",
        incarnation=3,
        health=0,
        members=(member("n1", "alive"), member("n2", "alive"), member("n3", "suspect")),
    )
    coordinator = replace(
        COORDINATOR,
        node_states=tuple(
            NodeStatus(node, state, None, None, None, None, record=True, reason="")
            for node, state in (("n1", "alive"), ("n2", "down"), ("n3", "cordoned"))
        ),
    )
    metrics = NodeMetrics("n1", sources(membership=answer_with(view), coordinator=coordinator))
    got = samples(await metrics.scrape())
    members = {k[1][0][1]: v for k, v in got.items() if k[0] == "corral_membership_members"}
    assert members == {"alive": 2, "suspect": 1, "dead": 0, "left": 0}
    nodes = {k[1][0][1]: v for k, v in got.items() if k[0] == "corral_coordinator_node_states"}
    assert nodes == {"alive": 1, "suspect": 0, "down": 1, "cordoned": 1, "left": 0}
    # Not the lease holder (or no view yet): neither series, never a failed scrape.
    idle = replace(coordinator, coordinating=False)
    busy = answer_with({"error": "no reply from /membership within 2.0 s"})
    got = samples(await NodeMetrics("n1", sources(membership=busy, coordinator=idle)).scrape())
    assert not [k for k in got if k[0].endswith(("_members", "_node_states"))]


def answer_with(value: Any) -> Any:
    async def read() -> Any:
        return value

    return read


async def test_routing_version_and_each_proxys_applied_version_and_lag() -> None:
    registry = MemoryRegistry()
    await registry.put(ROUTING_KEY, encode_table_json(RouteTable(9, 40)))
    current = ProxyRecord("edge", "caddy", "127.0.0.1:80", 9, 40, applied_at=100.0)
    behind = ProxyRecord("old", "haproxy", "127.0.0.1:81", 9, 31, applied_at=90.0)
    fresh = ProxyRecord("new", "caddy", "127.0.0.1:82")
    for proxy in (current, behind, fresh):
        await registry.put(proxy.key, proxy.encode())
    await registry.put("proxies/bad", b"not json")
    metrics = NodeMetrics("n1", sources(routes=lambda: read_routes(registry, 105.0)))
    got = samples(await metrics.scrape())
    assert got[("corral_routing_table_fence", ())] == 9
    assert got[("corral_routing_table_revision", ())] == 40
    assert got[("corral_proxy_applied_revision", (("proxy", "old"),))] == 31
    assert got[("corral_proxy_applied_fence", (("proxy", "edge"),))] == 9
    assert got[("corral_proxy_lag_seconds", (("proxy", "edge"),))] == 0
    assert got[("corral_proxy_lag_seconds", (("proxy", "old"),))] == 15
    # A proxy that never applied a table has no applied version and no lag yet.
    assert not [k for k in got if ("proxy", "new") in k[1]]
    await registry.delete(ROUTING_KEY)
    got = samples(await metrics.scrape())
    assert ("corral_routing_table_fence", ()) not in got
    assert got[("corral_proxy_lag_seconds", (("proxy", "old"),))] == 0


async def test_reconcile_pass_events_make_the_histogram_exact() -> None:
    metrics = NodeMetrics("n1", sources())
    metrics.observe_event("reconcile.pass", {"duration": 0.02, "skipped_since": 0, "errors": 0})
    metrics.observe_event("reconcile.pass", {"duration": 0.3, "skipped_since": 4, "errors": 1})
    metrics.observe_event("reconcile.pass", {"duration": "junk", "skipped_since": -2})
    got = samples(await metrics.scrape())
    # Exact from events: the scrape's sample of the last pass (RECONCILE) is not added.
    assert got[("corral_reconcile_pass_duration_seconds_count", ())] == 2
    assert got[("corral_reconcile_pass_duration_seconds_bucket", (("le", "0.025"),))] == 1
    assert got[("corral_reconcile_passes_total", (("outcome", "full"),))] == 2
    assert got[("corral_reconcile_passes_total", (("outcome", "skipped"),))] == 4
    # A pass is not a reconciler action.
    assert not [k for k in got if k[0] == "corral_reconcile_actions_total"]
