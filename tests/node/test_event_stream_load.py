"""A real node with its most event streams open still answers ``GET /v1/ps`` within
100 ms, and refuses one stream more with 429 (marked slow: a node process)."""

from __future__ import annotations

import socket
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from corral.node.cli._local_cluster import LocalCluster, LocalNode
from corral.node.server._api import MAX_EVENT_STREAMS

pytestmark = pytest.mark.slow

#: GET /v1/ps latency the API keeps with MAX_EVENT_STREAMS streams open (median).
PS_BUDGET_S = 0.100
SAMPLES = 30


def open_stream(node: LocalNode, stack: ExitStack) -> bytes:
    """Open ``GET /v1/events?follow=1`` on a socket kept open (not read past the status
    line: a follower that reads slowly costs the node the most) and return its status
    line."""
    sock = stack.enter_context(socket.create_connection(("127.0.0.1", node.api_port), timeout=10))
    sock.sendall(
        b"GET /v1/events?follow=1 HTTP/1.1\r\nHost: node\r\n"
        + f"Authorization: Bearer {node.token()}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the node closed the stream"
        head += chunk
    return head.split(b"\r\n", 1)[0]


def ps_latencies(node: LocalNode) -> list[float]:
    times = []
    with httpx.Client(
        base_url=node.api_url, headers={"Authorization": f"Bearer {node.token()}"}, timeout=30
    ) as client:
        for _ in range(SAMPLES):
            started = time.perf_counter()
            assert client.get("/v1/ps").status_code == 200
            times.append(time.perf_counter() - started)
            time.sleep(0.02)
    return times


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalNode]:
    with LocalCluster(tmp_path) as cluster:
        solo = cluster.add_node(f"streams-{uuid.uuid4().hex[:6]}")
        cluster.start(solo)
        cluster.wait_ready(solo)
        yield solo


def test_ps_stays_fast_with_the_most_event_streams_open_and_one_more_is_a_429(
    node: LocalNode,
) -> None:
    alone = ps_latencies(node)
    with ExitStack() as stack:
        statuses = [open_stream(node, stack) for _ in range(MAX_EVENT_STREAMS)]
        assert all(b" 200 " in line for line in statuses), statuses
        refused = open_stream(node, stack)
        loaded = ps_latencies(node)
    print(
        f"GET /v1/ps alone: median {statistics.median(alone) * 1000:.1f} ms, max "
        f"{max(alone) * 1000:.1f} ms; with {MAX_EVENT_STREAMS} event streams open: median "
        f"{statistics.median(loaded) * 1000:.1f} ms, max {max(loaded) * 1000:.1f} ms"
    )
    assert b" 429 " in refused
    assert statistics.median(loaded) < PS_BUDGET_S
