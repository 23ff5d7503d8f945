"""Two real ``corral node`` processes given one node id: exactly one stays.

The attack: the first node is paused (SIGSTOP) past its node TTL, so its
record lapses; a second process starts with the same ``--node-id`` and
registers; then the first resumes. Before the fix both ran on, each with its
own copy of the apps, ``nodes/<id>`` flipping between them. Now the resumed
one finds its record held by another instance, stops its apps and exits
non-zero with one line saying why.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio

from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for
from corral.registry import NodeRecord, decode_record, node_key, open_registry

pytestmark = pytest.mark.slow

NODE_TTL_MS = 1500


def read_record(url: str) -> NodeRecord | None:
    async def read() -> NodeRecord | None:
        async with open_registry(url) as registry:
            kv = await registry.get(node_key("n1"))
        record = None if kv is None else decode_record(kv.key, kv.value)
        return record if isinstance(record, NodeRecord) else None

    return trio.run(read)


def same_id_as(node: LocalNode, node_id: str) -> LocalNode:
    at = node.args.index("--node-id")
    node.args[at + 1] = node_id
    return node


def test_a_paused_node_resumed_after_a_newcomer_took_its_id_stops(tmp_path: Path) -> None:
    started = time.monotonic()
    cluster = LocalCluster(
        tmp_path, lease_ttl_ms=NODE_TTL_MS, node_ttl_ms=NODE_TTL_MS, shutdown_grace_ms=2000
    )
    first = cluster.add_node("n1")
    second = same_id_as(cluster.add_node("n1-again"), "n1")
    paused = False
    try:
        cluster.start(first)
        cluster.wait_ready(first, timeout=10)
        before = read_record(cluster.registry_url)
        assert before is not None
        assert (before.pid, before.api_address) == (first.pid, f"127.0.0.1:{first.api_port}")

        assert first.pid is not None
        os.kill(first.pid, signal.SIGSTOP)
        paused = True
        # Past its TTL its record lapses (any reader of the SQLite file expires it).
        wait_for("the paused node's record to lapse",
                 lambda: read_record(cluster.registry_url) is None, timeout=5, interval=0.1)

        cluster.start(second)
        cluster.wait_ready(second, timeout=10)
        taken = read_record(cluster.registry_url)
        assert taken is not None
        assert taken.pid == second.pid
        assert taken.instance != before.instance

        os.kill(first.pid, signal.SIGCONT)
        paused = False
        assert first.process is not None
        status = first.process.wait(timeout=8)
        assert status != 0
        lines = [line for line in first.log_path.read_text().splitlines() if "now holds" in line]
        assert len(lines) == 1, first.log_tail()
        assert (
            f"node n1: another corral process (instance {taken.instance[:12]}…, "
            f"pid {second.pid} on host "
        ) in lines[0]
        assert "this process stops. Give each node its own --node-id" in lines[0]

        # The newcomer is the one left, and it still holds the record.
        time.sleep(NODE_TTL_MS / 1000)
        assert second.running(), second.log_tail()
        after = read_record(cluster.registry_url)
        assert after is not None
        assert (after.instance, after.pid) == (taken.instance, second.pid)
        assert time.monotonic() - started < 20
    finally:
        if paused and first.pid is not None and first.running():
            os.kill(first.pid, signal.SIGCONT)
        cluster.close()


def test_a_newcomer_refuses_while_the_first_node_is_alive(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, node_ttl_ms=3000, shutdown_grace_ms=2000)
    first = cluster.add_node("n1")
    second = same_id_as(cluster.add_node("n1-again"), "n1")
    try:
        cluster.start(first)
        cluster.wait_ready(first, timeout=10)
        cluster.start(second)
        assert second.process is not None
        assert second.process.wait(timeout=10) == 2
        text = second.log_path.read_text()
        assert "node id 'n1' is in use by a live node (instance" in text
        assert f"pid {first.pid} on host" in text
        assert first.running()
        record = read_record(cluster.registry_url)
        assert record is not None
        assert record.pid == first.pid
    finally:
        cluster.close()
