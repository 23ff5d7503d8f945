"""A backend that stalls (SIGSTOP: the kernel still accepts its connections, nobody
answers) behind real HAProxy and Caddy: the proxy finds it out by itself and no
request waits on it (issue 25 item 9)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from corral.actors.routing import RouteTable
from corral.proxy import open_proxy
from corral.testing import TrafficGenerator, summarize

from .conftest import Backends, free_port

pytestmark = pytest.mark.slow

#: Requests per second through the proxy, and as many straight to the healthy backends.
RATE = 100.0
#: Seconds of traffic before the stall, and during it.
WARM_S = 2.0
STALL_S = 10.0
#: What a user calls a hung request (the issue's figure).
CLIENT_TIMEOUT = 5.0


async def test_a_stalled_backend_costs_no_request_and_little_latency(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    """3 backends, one SIGSTOPped under 100 req/s: nothing fails, and the p99 through the
    proxy stays within 3x the p99 of requests sent straight to the healthy backends in the
    same seconds (what the machine itself costs)."""
    await backends.start("a", "b", "c")
    listen = f"127.0.0.1:{free_port()}"
    seconds = WARM_S + STALL_S
    through = TrafficGenerator(
        ("127.0.0.1", int(listen.rsplit(":", 1)[1])),
        host="shop.test",
        rate=RATE,
        timeout=CLIENT_TIMEOUT,
        max_seconds=seconds,
        phase="warm",
    )
    direct = [
        TrafficGenerator(
            ("127.0.0.1", backends.ports[name]),
            rate=RATE / 2,
            timeout=CLIENT_TIMEOUT,
            max_seconds=seconds,
            phase="warm",
        )
        for name in ("a", "b")
    ]
    stalled = backends.procs["c"]
    async with open_proxy(kind, listen=listen, data_dir=data_dir) as engine:
        urls = tuple(sorted(backends.url(n) for n in ("a", "b", "c")))
        await engine.offer(RouteTable(1, 1, {"shop.test": urls}))
        assert engine.status.error is None
        try:
            async with trio.open_nursery() as nursery:
                for traffic in (through, *direct):
                    await nursery.start(traffic.run)
                await trio.sleep(WARM_S)
                stalled.send_signal(signal.SIGSTOP)
                for traffic in (through, *direct):
                    traffic.mark("stall")
        finally:
            if stalled.poll() is None:
                stalled.send_signal(signal.SIGCONT)
    proxied = through.report().total()
    straight = summarize("direct", (row for t in direct for row in t.report().outcomes))
    slow = [round(r.due, 2) for r in through.report().outcomes if r.latency > 1.0]
    print(kind, "through", proxied.to_dict(), "direct", straight.to_dict(), "slow", slow)
    stall = through.report().phase("stall")
    assert stall.sent >= RATE * STALL_S * 0.9
    assert proxied.failed == 0, proxied.failures
    assert straight.failed == 0, straight.failures
    assert proxied.p99 is not None
    assert straight.p99 is not None
    assert proxied.p99 <= 3 * straight.p99, (proxied.to_dict(), straight.to_dict())
