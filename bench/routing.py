"""Benchmark: the routing table at 10,000 domains x 3 backends, and applying it to real proxies.

Measures, in one run:

* ``baseline``: the bare work of the table, as a plain dict comprehension over the same
  flat data (each domain's three ``http://host:port`` strings, sorted), nothing checked.
* ``render``: :func:`render_routes` from the same inputs as the registry gives them
  (apps with domains, placements, node records with running/ready instances), with every
  rule applied (target: at most 100 ms).
* ``unchanged``: :func:`next_table` on a second render over unchanged inputs (writes nothing),
  and the JSON encoding of the table for the registry.
* ``haproxy``: HAProxy 2.6 started under a temporary directory: the first apply of the whole
  table (a structural change: config check and reload), then a runtime apply (one domain's
  backend replaced: Runtime API commands only), against the baseline of the same change's
  Runtime API commands sent raw over the admin socket.
* ``caddy``: Caddy 2.6: the driver's apply of the whole table with one domain's backends
  swapped (document built and ``POST /load``-ed), against the baseline of a raw
  ``POST /load`` of the same documents, prebuilt (each differs from the last: Caddy skips
  an unchanged one).

* ``flip``: with each proxy, fed by ``follow_routing`` from a SQLite registry: an alias
  flip (``alias/shop.test`` rewritten, then :func:`publish_routes`) until a request through
  the proxy is answered by the other app, against the baseline of one registry watch
  notification plus the proxy's raw apply of that flip (Runtime API lines; a ``POST
  /load``): ``propagation_ratio``.

* ``e2e``: the whole path, with three real ``corral node run`` processes (SQLite registry)
  and a real ``corral proxy run`` per proxy kind: an **alias flip** (the ``alias/`` write
  until the proxy answers with the other app: the node's RoutingRenderer renders it, the
  proxy applies it); an **instance lost** (SIGKILL of one app process until the proxy has
  applied a table without it, as its ``proxies/<id>`` record says); an **instance ready**
  (its node record saying ready until the proxy's answers come from it). Each against the
  same baseline as ``flip`` (one watch notification plus the proxy's raw apply):
  ``e2e_<kind>_<change>_ratio``. The path crosses processes twice (writer -> node ->
  proxy); with SQLite each hop waits for the watcher's poll (50 ms), so set
  ``CORRAL_BENCH_ETCD=host:port`` to run this part on etcd, whose watches push.

A proxy whose binary is missing is reported as skipped. Render times are CPU seconds of this
process (``time.process_time``), best of a few runs; apply times are wall seconds (the work
happens in the proxy process).

Run: ``python bench/routing.py`` (about a minute); ``--quick`` renders 1,000 domains and
repeats each timing twice (one instance lost), the same paths at smaller sizes.

Figures (the last line, one JSON object): ``domains``, ``backends_per_domain``,
``baseline_ms``, ``render_ms``, ``render_ratio``, ``render_within_target``,
``unchanged_ms``, ``encode_ms``, ``table_bytes``; ``haproxy_reload_apply_ms``,
``haproxy_runtime_apply_ms``, ``haproxy_runtime_offer_ms``, ``haproxy_raw_commands_ms``,
``haproxy_runtime_ratio``; ``caddy_first_apply_ms``, ``caddy_apply_ms``,
``caddy_raw_load_ms``, ``caddy_apply_ratio``; per proxy kind (haproxy, caddy)
``<kind>_flip_ms``, ``<kind>_flip_baseline_ms``, ``<kind>_propagation_ratio``,
``<kind>_request_ms``, and for each change (flip, lost, ready)
``e2e_<kind>_<change>_ms``, ``e2e_<kind>_<change>_median_ms``,
``e2e_<kind>_<change>_ratio``; and ``e2e_registry``. A proxy that is not installed
leaves its figures out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import trio

from corral.actors.routing import (
    Instance,
    NodeRoutes,
    RouteTable,
    RoutingInputs,
    encode_table_json,
    next_table,
    publish_routes,
    render_routes,
)
from corral.proxy import (
    DEFAULT_CADDY,
    DEFAULT_HAPROXY,
    HaproxyState,
    ProxyEngine,
    desired_state,
    follow_routing,
    open_proxy,
    plan_update,
)
from corral.proxy._haproxy import RuntimeApi
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AliasRecord,
    AppRecord,
    CoordinatorLease,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    alias_key,
    app_key,
    node_key,
    open_registry,
    placement_key,
)

DOMAINS = 10_000
BACKENDS = 3
NODES = 100
RUNS = 5
#: Alias flips, and instances lost (each then ready again), in the end-to-end part.
E2E_RUNS = 5
E2E_LOSSES = 3


def build_inputs() -> RoutingInputs:
    nodes: dict[str, dict[str, Instance]] = {f"node-{n:03d}": {} for n in range(NODES)}
    app_domains: dict[str, list[str]] = {}
    placements: dict[str, list[str]] = {}
    for i in range(DOMAINS):
        app = f"app-{i:05d}"
        app_domains[app] = [f"{app}.example.test"]
        chosen = [f"node-{(i * 7 + k * 31) % NODES:03d}" for k in range(BACKENDS)]
        placements[app] = chosen
        for k, node in enumerate(chosen):
            nodes[node][app] = Instance(20000 + (i % 400) * 3 + k, running=True, ready=True)
    return RoutingInputs(
        app_domains=app_domains,
        aliases={},
        placements=placements,
        nodes={
            n: NodeRoutes(f"10.0.{int(n[5:]) // 250}.{int(n[5:]) % 250 + 1}", apps)
            for n, apps in nodes.items()
        },
    )


def baseline(inputs: RoutingInputs) -> dict[str, list[str]]:
    flat = {
        app: [
            (inputs.nodes[n].advertise_host, inputs.nodes[n].instances[app].public_port)
            for n in inputs.placements[app]
        ]
        for app in inputs.app_domains
    }
    return {
        inputs.app_domains[app][0]: sorted(f"http://{h}:{p}" for h, p in pairs)
        for app, pairs in flat.items()
    }


def best_of(fn: Callable[[], object], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_domain_swapped(table: RouteTable) -> dict[str, tuple[str, ...]]:
    """The table's domains with the first domain's three backends replaced."""
    domains = dict(table.domains)
    domains[next(iter(domains))] = tuple(f"http://10.9.9.9:{port}" for port in (1, 2, 3))
    return domains


async def bench_haproxy(table: RouteTable, figures: dict[str, object]) -> None:
    if not os.access(DEFAULT_HAPROXY, os.X_OK):
        print(f"haproxy     skipped: {DEFAULT_HAPROXY} is not installed")
        return
    data = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp"))
    try:
        async with open_proxy("haproxy", listen=f"127.0.0.1:{free_port()}", data_dir=data) as e:
            t0 = time.perf_counter()
            await e.offer(table)
            first = time.perf_counter() - t0
            assert e.status.error is None, e.status.error
            changed = one_domain_swapped(table)
            flips = [
                RouteTable(
                    table.fence, table.revision + 1 + i, changed if i % 2 == 0 else table.domains
                )
                for i in range(RUNS)
            ]
            runtime = offer = float("inf")
            for flip in flips:  # each flip swaps one domain's three servers
                t0 = time.perf_counter()
                await e.offer(flip)
                offer = min(offer, time.perf_counter() - t0)
                assert e.status.error is None, e.status.error
                assert e.status.apply_s is not None
                runtime = min(runtime, e.status.apply_s)  # until served (files follow)
            assert e.driver.reloads == 1, "a server swap must not reload"
            # Baseline: the same change's Runtime API commands, sent raw, back and forth.
            states = [desired_state(flips[-1]), desired_state(flips[-2])]
            raw = float("inf")
            api = await RuntimeApi.connect(str(data / "admin.sock"))
            for i in range(RUNS):
                plan = plan_update(states[i % 2], states[(i + 1) % 2], str(data / "hosts.map"))
                assert plan.reload is None
                t0 = time.perf_counter()
                for line in plan.commands:
                    await api.command(line)
                raw = min(raw, time.perf_counter() - t0)
            await api.aclose()
            commands = len(plan.commands)
        print(f"haproxy     first apply (reload) {first * 1000:9.1f} ms")
        print(f"haproxy     runtime apply        {runtime * 1000:9.1f} ms (one domain's 3 servers)")
        print(f"haproxy     ... with file writes {offer * 1000:9.1f} ms")
        print(f"haproxy     raw runtime commands {raw * 1000:9.2f} ms ({commands} lines)")
        figures.update(
            haproxy_reload_apply_ms=round(first * 1000, 1),
            haproxy_runtime_apply_ms=round(runtime * 1000, 2),
            haproxy_runtime_offer_ms=round(offer * 1000, 2),
            haproxy_raw_commands_ms=round(raw * 1000, 3),
            haproxy_runtime_ratio=round(runtime / raw, 1),
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)


async def bench_caddy(table: RouteTable, figures: dict[str, object]) -> None:
    if not os.access(DEFAULT_CADDY, os.X_OK):
        print(f"caddy       skipped: {DEFAULT_CADDY} is not installed")
        return
    data = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp"))
    try:
        async with open_proxy("caddy", listen=f"127.0.0.1:{free_port()}", data_dir=data) as e:
            t0 = time.perf_counter()
            await e.offer(table)
            first = time.perf_counter() - t0
            assert e.status.error is None, e.status.error
            changed = one_domain_swapped(table)
            variants = [changed, table.domains]  # Caddy skips a load of an unchanged config
            bodies = [
                e.driver._document(RouteTable(1, 1, v))  # type: ignore[attr-defined]
                for v in variants
            ]
            admin = e.driver.admin  # type: ignore[attr-defined]
            again = raw = float("inf")
            # Interleaved, so both see the same machine: the driver loads variants[0], the
            # raw post variants[1], each differing from the config loaded before it.
            async with httpx.AsyncClient(timeout=60) as client:
                for i in range(RUNS):
                    t0 = time.perf_counter()
                    await e.offer(RouteTable(table.fence, table.revision + 1 + i, variants[0]))
                    again = min(again, time.perf_counter() - t0)
                    assert e.status.error is None, e.status.error
                    t0 = time.perf_counter()
                    response = await client.post(
                        f"http://{admin}/load",
                        content=bodies[1],
                        headers={"Content-Type": "application/json"},
                    )
                    raw = min(raw, time.perf_counter() - t0)
                    assert response.status_code == 200, response.text
            body = bodies[0]
        print(f"caddy       first apply (load)   {first * 1000:9.1f} ms")
        print(f"caddy       next apply (load)    {again * 1000:9.1f} ms")
        print(f"caddy       raw POST /load       {raw * 1000:9.1f} ms ({len(body)} bytes)")
        figures.update(
            caddy_apply_ms=round(again * 1000, 1),
            caddy_first_apply_ms=round(first * 1000, 1),
            caddy_raw_load_ms=round(raw * 1000, 1),
            caddy_apply_ratio=round(again / raw, 2),
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)


_BACKEND = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
name = sys.argv[1].encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):  # one write: headers and body in one segment (no Nagle stall)
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(name)
        self.wfile.write(head + name)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


async def _wait_answer(client: httpx.AsyncClient, listen: str, host: str, want: str) -> None:
    with trio.fail_after(30):
        while True:
            try:
                response = await client.get(f"http://{listen}/", headers={"Host": host})
                if response.text == want:
                    return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.001)


async def bench_flip(kind: str, figures: dict[str, object]) -> None:
    """An alias flip written to the registry until the proxy answers with the new app."""
    binary = DEFAULT_HAPROXY if kind == "haproxy" else DEFAULT_CADDY
    if not os.access(binary, os.X_OK):
        print(f"{kind:<11} flip skipped: {binary} is not installed")
        return
    data = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp"))
    procs: list[trio.Process] = []
    try:
        ports = {"blue": free_port(), "green": free_port()}
        for name, port in ports.items():
            procs.append(
                await trio.lowlevel.open_process(
                    [sys.executable, "-c", _BACKEND, name, str(port)],
                    start_new_session=True,
                    stderr=subprocess.DEVNULL,
                )
            )
        async with open_registry(f"sqlite:///{data}/registry.db") as registry:
            await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
            lease = await registry.get(COORDINATOR_LEASE_KEY)
            assert lease is not None
            fence = lease.create_revision
            serving = {}
            for name, port in ports.items():
                await registry.put(
                    app_key(name), AppRecord(name, domains=[f"{name}.test"]).encode()
                )
                placed = PlacementRecord(["n1"], decided_at=0.0, fence=fence)
                await registry.put(placement_key(name), placed.encode())
                serving[name] = ServingEntry("0" * 64, port, port + 1, state="running")
            record = NodeRecord(id="n1", advertise_host="127.0.0.1", serving=serving)
            await registry.put(node_key("n1"), record.encode())
            await registry.put(alias_key("shop.test"), AliasRecord("blue").encode())
            await publish_routes(registry, fence=fence)
            listen = f"127.0.0.1:{free_port()}"
            async with (
                open_proxy(kind, listen=listen, data_dir=data / "proxy") as engine,
                httpx.AsyncClient() as client,
                trio.open_nursery() as nursery,
            ):
                await nursery.start(follow_routing, registry, engine)
                await _wait_answer(client, listen, "shop.test", "blue")
                flip = float("inf")
                for i in range(RUNS):
                    target = "green" if i % 2 == 0 else "blue"
                    t0 = time.perf_counter()
                    await registry.put(alias_key("shop.test"), AliasRecord(target).encode())
                    await publish_routes(registry, fence=fence)
                    await _wait_answer(client, listen, "shop.test", target)
                    t2 = time.perf_counter()
                    flip = min(flip, t2 - t0)
                # Baseline: one watch notification plus the proxy's raw apply of the flip.
                notify = float("inf")
                async with registry.watch(alias_key("probe.test")) as events:
                    for _ in range(RUNS):
                        t0 = time.perf_counter()
                        await registry.put(alias_key("probe.test"), AliasRecord("blue").encode())
                        await events.__anext__()
                        notify = min(notify, time.perf_counter() - t0)
                raw = await _raw_flip(kind, engine, data / "proxy")
                request = float("inf")  # for scale: one request through the proxy
                for _ in range(RUNS):
                    t0 = time.perf_counter()
                    await client.get(f"http://{listen}/", headers={"Host": "blue.test"})
                    request = min(request, time.perf_counter() - t0)
                nursery.cancel_scope.cancel()
        ratio = flip / (notify + raw)
        print(f"{kind:<11} alias flip served    {flip * 1000:9.2f} ms (registry write -> answer)")
        print(
            f"{kind:<11} baseline             {(notify + raw) * 1000:9.2f} ms "
            f"(watch {notify * 1000:.2f} + raw apply {raw * 1000:.2f}); ratio {ratio:.2f}"
        )
        print(f"{kind:<11} one request          {request * 1000:9.2f} ms (through the proxy)")
        figures[f"{kind}_flip_ms"] = round(flip * 1000, 2)
        figures[f"{kind}_request_ms"] = round(request * 1000, 2)
        figures[f"{kind}_flip_baseline_ms"] = round((notify + raw) * 1000, 2)
        figures[f"{kind}_propagation_ratio"] = round(ratio, 2)
    finally:
        for proc in procs:
            proc.kill()
            await proc.wait()
        shutil.rmtree(data, ignore_errors=True)


async def _raw_flip(kind: str, engine: ProxyEngine, data: Path) -> float:
    """The proxy's own apply of a flip, sent raw: Runtime API lines, or one POST /load."""
    served = engine.driver._running if kind == "haproxy" else None  # type: ignore[attr-defined]
    best = float("inf")
    if kind == "haproxy":
        assert served is not None
        other = dict(served.backends)
        blue, green = other["d_blue.test"], other["d_green.test"]
        states = [
            HaproxyState(served.hosts, {**other, "d_shop.test": green}),
            HaproxyState(served.hosts, {**other, "d_shop.test": blue}),
        ]
        api = await RuntimeApi.connect(str(data / "admin.sock"))
        if served.backends["d_shop.test"] == green:
            states.reverse()  # each flip must change something
        current = served
        for i in range(RUNS):
            plan = plan_update(current, states[i % 2], str(data / "hosts.map"))
            assert plan.commands
            assert plan.reload is None
            t0 = time.perf_counter()
            for line in plan.commands:
                await api.command(line)
            best = min(best, time.perf_counter() - t0)
            current = plan.after
        await api.aclose()
        return best
    driver = engine.driver
    tables = [
        RouteTable(9, i, {"shop.test": (f"http://127.0.0.1:{1000 + i % 2}",)}) for i in (0, 1)
    ]
    bodies = [driver._document(t) for t in tables]  # type: ignore[attr-defined]
    async with httpx.AsyncClient() as client:
        for i in range(RUNS):
            t0 = time.perf_counter()
            response = await client.post(
                f"http://{driver.admin}/load",  # type: ignore[attr-defined]
                content=bodies[i % 2],
                headers={"Content-Type": "application/json"},
            )
            best = min(best, time.perf_counter() - t0)
            assert response.status_code == 200, response.text
    return best


# --------------------------------------------------------------------------- end to end


async def _greeted(client: httpx.AsyncClient, listen: str, host: str) -> dict[str, str] | None:
    try:
        response = await client.get(f"http://{listen}/", headers={"Host": host}, timeout=5.0)
        body: dict[str, str] = response.json()
        return body if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _until(what: str, probe: Callable[[], object], limit: float = 60.0) -> float:
    """Poll the async ``probe`` every millisecond until it is truthy; the seconds taken."""
    t0 = time.perf_counter()
    with trio.fail_after(limit):
        while not await probe():  # type: ignore[misc]
            await trio.sleep(0.001)
    return time.perf_counter() - t0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def bench_e2e(kind: str, figures: dict[str, object]) -> None:
    """Three real nodes and ``corral proxy run --kind KIND``: flip, lost, ready."""
    from corral.actors.routing import decode_table_json
    from corral.node.artifacts._artifacts import pack_directory
    from corral.node.cli._local_cluster import LocalCluster
    from corral.registry import ROUTING_KEY, ProxyRecord, decode_record, proxy_key

    binary = DEFAULT_HAPROXY if kind == "haproxy" else DEFAULT_CADDY
    if not os.access(binary, os.X_OK):
        print(f"{kind:<11} e2e skipped: {binary} is not installed")
        return
    greeter = Path(__file__).resolve().parents[1] / "examples" / "apps" / "greeter"
    root = Path(tempfile.mkdtemp(prefix="corral-bench-e2e-", dir="/tmp"))
    etcd = os.environ.get("CORRAL_BENCH_ETCD")
    etcd_url = None if not etcd else f"etcd://{etcd}/?prefix=corral-bench/{os.urandom(4).hex()}/"
    cluster = LocalCluster(
        root, registry_url=etcd_url, lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=3000
    )
    tag = os.urandom(3).hex()
    for index in range(3):
        start = 27000 + 200 * index
        cluster.add_node(f"b{tag}-{index + 1}", port_range=(start, start + 199))
    proxy: subprocess.Popen[bytes] | None = None
    listen = f"127.0.0.1:{free_port()}"
    proxy_id = f"bench-{kind}"
    try:
        await trio.to_thread.run_sync(cluster.start_all)

        def deploy() -> None:
            with cluster.any_client() as client:
                for name in ("blue", "green"):
                    packed = pack_directory(greeter)
                    client.deploy(
                        name,
                        packed,
                        replicas="all",
                        env={"GREETING": name},
                        domains=[f"{name}.test"],
                    )

        await trio.to_thread.run_sync(deploy)
        async with open_registry(cluster.registry_url) as registry:
            await registry.put(alias_key("shop.test"), AliasRecord("blue").encode())
            with (root / "proxy.log").open("ab") as log:
                proxy = subprocess.Popen(
                    [
                        sys.executable, "-m", "corral", "proxy", "run", "--kind", kind,
                        "--listen", listen, "--registry", cluster.registry_url,
                        "--data-dir", str(root / "proxy"), "--id", proxy_id,
                    ],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            async with httpx.AsyncClient() as client:

                async def serves(host: str, says: str) -> bool:
                    body = await _greeted(client, listen, host)
                    return body is not None and body.get("says") == f"{says}!"

                await _until("the proxy to serve blue", lambda: serves("shop.test", "blue"), 90)

                async def nodes_answering(host: str, tries: int = 9) -> set[str]:
                    seen = set()
                    for _ in range(tries):
                        body = await _greeted(client, listen, host)
                        if body is not None:
                            seen.add(body["node"])
                    return seen

                async def all_three() -> bool:
                    return len(await nodes_answering("blue.test")) == 3

                await _until("blue on three nodes through the proxy", all_three, 60)

                # Alias flips.
                flips = []
                for i in range(E2E_RUNS):
                    target = "green" if i % 2 == 0 else "blue"
                    t0 = time.perf_counter()
                    await registry.put(alias_key("shop.test"), AliasRecord(target).encode())
                    while not await serves("shop.test", target):
                        await trio.sleep(0.001)
                    flips.append(time.perf_counter() - t0)

                # Instance lost, then ready again (its node restarts it).
                victim = list(cluster.nodes.values())[1]
                lost, ready = [], []
                for _ in range(E2E_LOSSES):

                    def victim_row() -> dict[str, object] | None:
                        with victim.client() as node_client:
                            rows = node_client.state()["processes"]
                        for row in rows:
                            if row["app"] == "blue" and row["pid"] and row["ready"]:
                                return dict(row)
                        return None

                    row = None
                    with trio.fail_after(60):
                        while row is None:
                            row = await trio.to_thread.run_sync(victim_row)
                            await trio.sleep(0.05)
                    await _until("it to answer", lambda: all_three(), 60)
                    url = f"http://127.0.0.1:{row['public_port']}"

                    async def table_without(url: str = url) -> int | None:
                        kv = await registry.get(ROUTING_KEY)
                        if kv is None:
                            return None
                        table = decode_table_json(kv.value)
                        return None if url in table.domains.get("blue.test", ()) else table.revision

                    async def proxy_applied(revision: int) -> bool:
                        kv = await registry.get(proxy_key(proxy_id))
                        record = None if kv is None else decode_record(kv.key, kv.value)
                        return (
                            isinstance(record, ProxyRecord)
                            and (record.applied_revision or 0) >= revision
                        )

                    t0 = time.perf_counter()
                    os.kill(int(str(row["pid"])), 9)
                    revision = None
                    while revision is None:
                        revision = await table_without()
                        await trio.sleep(0.001)
                    while not await proxy_applied(revision):
                        await trio.sleep(0.001)
                    lost.append(time.perf_counter() - t0)

                    async def published_ready() -> bool:
                        kv = await registry.get(node_key(victim.node_id))
                        record = None if kv is None else decode_record(kv.key, kv.value)
                        entry = (
                            None
                            if not isinstance(record, NodeRecord)
                            else (record.serving.get("blue"))
                        )
                        return bool(entry and entry.ready and entry.public_port)

                    await _until("the restart to be published ready", published_ready, 60)
                    t1 = time.perf_counter()
                    while victim.node_id not in await nodes_answering("blue.test", 3):
                        await trio.sleep(0.001)
                    ready.append(time.perf_counter() - t1)
    finally:
        if proxy is not None:
            proxy.terminate()
            try:
                proxy.wait(20)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait(5)
        await trio.to_thread.run_sync(cluster.close)
        shutil.rmtree(root, ignore_errors=True)
        if etcd_url is not None:
            async with open_registry(etcd_url) as registry:
                await registry.delete("", prefix=True)
    figures["e2e_registry"] = "etcd" if etcd_url else "sqlite"
    baseline = float(str(figures.get(f"{kind}_flip_baseline_ms", "nan"))) / 1000
    for change, values in (("flip", flips), ("lost", lost), ("ready", ready)):
        best, middle = min(values), _median(values)
        ratio = best / baseline if baseline == baseline else float("nan")
        print(
            f"{kind:<11} e2e {change:<6} best {best * 1000:8.1f} ms, median "
            f"{middle * 1000:8.1f} ms over {len(values)}; vs baseline {baseline * 1000:.1f} ms: "
            f"ratio {ratio:.2f}"
        )
        figures[f"e2e_{kind}_{change}_ms"] = round(best * 1000, 1)
        figures[f"e2e_{kind}_{change}_median_ms"] = round(middle * 1000, 1)
        figures[f"e2e_{kind}_{change}_ratio"] = round(ratio, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1,000 domains, two runs of each timing"
    )
    if parser.parse_args().quick:
        global DOMAINS, RUNS, E2E_RUNS, E2E_LOSSES
        DOMAINS, RUNS, E2E_RUNS, E2E_LOSSES = 1_000, 2, 2, 1
    inputs = build_inputs()
    base = best_of(lambda: baseline(inputs))
    rendered = render_routes(inputs)
    assert len(rendered.domains) == DOMAINS
    assert all(len(u) == BACKENDS for u in rendered.domains.values())
    assert {d: list(u) for d, u in rendered.domains.items()} == baseline(inputs)
    render = best_of(lambda: render_routes(inputs))
    table = next_table(None, rendered, fence=1)
    assert table is not None
    unchanged = best_of(lambda: next_table(table, render_routes(inputs), fence=1))
    encode = best_of(lambda: encode_table_json(table))
    size = len(encode_table_json(table))
    print(f"routing table: {DOMAINS} domains x {BACKENDS} backends over {NODES} nodes")
    print(f"baseline    dict comprehension   {base * 1000:9.1f} ms")
    print(f"render      render_routes        {render * 1000:9.1f} ms (target <= 100 ms)")
    print(f"unchanged   render + next_table  {unchanged * 1000:9.1f} ms (writes nothing)")
    print(f"encode      JSON for registry    {encode * 1000:9.1f} ms ({size} bytes)")
    figures: dict[str, object] = {
        "domains": DOMAINS,
        "backends_per_domain": BACKENDS,
        "render_ms": round(render * 1000, 1),
        "baseline_ms": round(base * 1000, 1),
        "render_ratio": round(render / base, 2),
        "unchanged_ms": round(unchanged * 1000, 1),
        "encode_ms": round(encode * 1000, 1),
        "table_bytes": size,
        "render_within_target": render <= 0.100,
    }

    async def proxies() -> None:
        await bench_haproxy(table, figures)
        await bench_caddy(table, figures)
        await bench_flip("haproxy", figures)
        await bench_flip("caddy", figures)

    trio.run(proxies)
    for kind in ("haproxy", "caddy"):
        trio.run(bench_e2e, kind, figures)
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
