"""The open-loop load generator: its statistics (pure) and its behaviour on real
loopback sockets against small servers written here."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from corral.testing import RequestOutcome, TrafficGenerator, percentile, summarize

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


# --------------------------------------------------------------------------- pure


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200),
    st.floats(min_value=0.01, max_value=100),
)
def test_percentile_is_the_nearest_rank(values: list[float], q: float) -> None:
    result = percentile(values, q)
    assert result in values
    rank = max(1, math.ceil(q / 100 * len(values)))
    assert sum(v <= result for v in values) >= rank
    assert sum(v < result for v in values) < rank


def test_percentile_of_nothing_is_none_and_q_is_checked() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 100) == 5.0
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0], 0)


def test_a_summary_counts_failures_by_kind_and_takes_latency_of_successes_only() -> None:
    rows = [
        RequestOutcome(0.00, "p", 0.010, 200),
        RequestOutcome(0.01, "p", 0.020, 204),
        RequestOutcome(0.02, "p", 1.000, 503),
        RequestOutcome(0.03, "p", 0.001, None, "refused"),
        RequestOutcome(0.50, "p", 0.001, None, "refused"),
        RequestOutcome(0.60, "p", 0.030, 200),
    ]
    summary = summarize("p", rows)
    assert (summary.sent, summary.failed) == (6, 3)
    assert summary.failures == {"http-503": 1, "refused": 2}
    assert summary.p50 == 0.020
    assert summary.p99 == 0.030
    assert summary.failure_window == pytest.approx(0.48)
    assert summary.to_dict()["p99_ms"] == 30.0


# --------------------------------------------------------------------------- real sockets


async def _serve(nursery: trio.Nursery, handler: Handler) -> tuple[int, list[int]]:
    """A loopback server running ``handler(stream, n)`` for its n-th connection; returns
    the port and the list the connection numbers go into."""
    seen: list[int] = []

    async def one(stream: trio.SocketStream) -> None:
        seen.append(len(seen))
        async with stream:
            await handler(stream, seen[-1])

    listeners = await nursery.start(functools.partial(trio.serve_tcp, one, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1]), seen


async def _read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data


def _answer(status: int, body: bytes = b"ok") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def test_every_request_gets_a_connection_of_its_own_and_its_phase() -> None:
    requests: list[bytes] = []

    async def handler(stream: trio.SocketStream, n: int) -> None:
        requests.append(await _read_request(stream))
        if n % 5 == 4:
            await stream.send_all(_answer(503))
        elif n == 7:
            return  # closes without a word
        else:
            await stream.send_all(_answer(200))

    async with trio.open_nursery() as nursery:
        port, seen = await _serve(nursery, handler)
        traffic = TrafficGenerator(
            ("127.0.0.1", port), host="shop.test", rate=400, max_requests=20, phase="before"
        )
        async with trio.open_nursery() as inner:
            await inner.start(traffic.run)
            await trio.sleep(0.02)
            traffic.mark("during")
        nursery.cancel_scope.cancel()

    report = traffic.report()
    assert len(seen) == 20  # no keep-alive: one connection per request
    assert all(r.startswith(b"GET / HTTP/1.1\r\nHost: shop.test\r\n") for r in requests)
    assert all(b"Connection: close" in r for r in requests)
    total = report.total()
    assert total.sent == 20
    assert total.failures == {"http-503": 4, "empty-response": 1}
    assert report.phases == ("before", "during")
    before, during = report.phase("before"), report.phase("during")
    assert before.sent + during.sent == 20
    assert before.sent >= 1
    assert during.sent >= 1
    # Due times follow the rate exactly: 400/s is one every 2.5 ms.
    dues = [row.due for row in report.outcomes]
    assert dues == pytest.approx([i / 400 for i in range(20)])
    with pytest.raises(KeyError, match="no phase 'after'"):
        report.phase("after")


async def test_refused_connections_and_timeouts_are_failures_of_their_kind() -> None:
    # A port nothing listens on: bind one, close it.
    probe = trio.socket.socket()
    await probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    refused = TrafficGenerator(("127.0.0.1", closed_port), rate=500, max_requests=5)
    await refused.run()
    assert refused.report().total().failures == {"refused": 5}

    async def silent(stream: trio.SocketStream, n: int) -> None:
        await _read_request(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port, _ = await _serve(nursery, silent)
        stalled = TrafficGenerator(("127.0.0.1", port), rate=100, timeout=0.2, max_requests=3)
        await stalled.run()
        nursery.cancel_scope.cancel()
    rows = stalled.report().outcomes
    assert [row.error for row in rows] == ["timeout"] * 3
    assert all(row.latency >= 0.2 for row in rows)


async def test_the_load_is_open_loop_a_slow_service_does_not_slow_the_sending() -> None:
    async def slow(stream: trio.SocketStream, n: int) -> None:
        await _read_request(stream)
        await trio.sleep(0.3)
        await stream.send_all(_answer(200))

    async with trio.open_nursery() as nursery:
        port, _seen = await _serve(nursery, slow)
        traffic = TrafficGenerator(("127.0.0.1", port), rate=100, max_requests=20)
        started = trio.current_time()
        await traffic.run()
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    # Closed loop would take 20 x 0.3 s; open loop sends all 20 within 0.2 s.
    assert took < 1.5
    summary = traffic.report().total()
    assert (summary.sent, summary.failed) == (20, 0)
    assert summary.p50 is not None
    assert summary.p50 >= 0.3


async def test_a_duration_bound_and_stop_both_end_a_run() -> None:
    async def ok(stream: trio.SocketStream, n: int) -> None:
        await _read_request(stream)
        await stream.send_all(_answer(200))

    async with trio.open_nursery() as nursery:
        port, _ = await _serve(nursery, ok)
        bounded = TrafficGenerator(("127.0.0.1", port), rate=200, max_seconds=0.1)
        await bounded.run()
        assert bounded.report().total().sent == 20
        stopped = TrafficGenerator(("127.0.0.1", port), rate=200)
        async with trio.open_nursery() as inner:
            await inner.start(stopped.run)
            await trio.sleep(0.05)
            stopped.stop()
        assert 1 <= stopped.report().total().sent <= 40
        with pytest.raises(RuntimeError, match="runs once"):
            await stopped.run()
        nursery.cancel_scope.cancel()


def test_only_loopback_targets_and_sane_settings_are_accepted() -> None:
    with pytest.raises(ValueError, match="not a loopback"):
        TrafficGenerator(("10.0.0.1", 80))
    with pytest.raises(ValueError, match="not an IP address"):
        TrafficGenerator(("example.com", 80))
    with pytest.raises(ValueError, match="rate"):
        TrafficGenerator(("127.0.0.1", 80), rate=0)
    with pytest.raises(ValueError, match="timeout"):
        TrafficGenerator(("127.0.0.1", 80), timeout=math.inf)
    with pytest.raises(ValueError, match="path"):
        TrafficGenerator(("127.0.0.1", 80), path="/a b")
    with pytest.raises(ValueError, match="Host"):
        TrafficGenerator(("127.0.0.1", 80), host="a\r\nb")
    assert TrafficGenerator(("::1", 80)).rate == 200.0
