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

A proxy whose binary is missing is reported as skipped. Render times are CPU seconds of this
process (``time.process_time``), best of a few runs; apply times are wall seconds (the work
happens in the proxy process). Propagation end to end (a change in the registry until the
proxy serves it) needs the node wiring and is not measured here yet.

Run: ``python bench/routing.py`` (well under a minute).
"""

from __future__ import annotations

import json
import os
import shutil
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
    render_routes,
)
from corral.proxy import DEFAULT_CADDY, DEFAULT_HAPROXY, desired_state, open_proxy, plan_update
from corral.proxy._haproxy import RuntimeApi

DOMAINS = 10_000
BACKENDS = 3
NODES = 100
RUNS = 5


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
            domain = next(iter(table.domains))
            changed = dict(table.domains)
            changed[domain] = ("http://10.9.9.9:1", "http://10.9.9.9:2", "http://10.9.9.9:3")
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
            domain = next(iter(table.domains))
            changed = dict(table.domains)
            changed[domain] = ("http://10.9.9.9:1", "http://10.9.9.9:2", "http://10.9.9.9:3")
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


def main() -> None:
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

    trio.run(proxies)
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
