"""A node's identity in the registry: its cluster secret's fingerprint and its node id."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from corral.node import ConfigError
from corral.node._config import NodeConfig, resolve_node_config
from corral.node._identity import process_running, secret_fingerprint
from corral.node.cli._local_cluster import free_port
from corral.node.server._node import (
    NodeRuntime,
    check_cluster_secret,
    check_node_id_free,
    prepare_runtime,
    run_node,
)
from corral.registry import (
    SECRET_FINGERPRINT_KEY,
    MemoryRegistry,
    NodeRecord,
    SecretFingerprint,
    decode_record,
    node_key,
    open_registry,
)


def runtime_of(tmp_path: Path, name: str, secret: str | None, **flags: str) -> NodeRuntime:
    values = {"data-dir": name, "node-id": name, **flags}
    if secret is not None:
        values["secret"] = secret
    return prepare_runtime(resolve_node_config(values, {}, cwd=tmp_path))


# ------------------------------------------------------------------ the cluster secret


@given(st.text(min_size=1), st.text(min_size=1))
def test_fingerprints_tell_secrets_apart_and_hide_them(a: str, b: str) -> None:
    fa = secret_fingerprint(a)
    assert len(fa) == 64
    assert fa == secret_fingerprint(a)
    assert (fa == secret_fingerprint(b)) == (a == b)
    assert a not in fa or len(a) <= 2  # a short secret may appear in hex by chance


async def test_the_first_node_sets_the_fingerprint_and_others_must_match(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    first = runtime_of(tmp_path, "n1", "s3cret-of-the-cluster")
    assert await check_cluster_secret(first, registry, wall_clock=lambda: 1000.0) is True
    kv = await registry.get(SECRET_FINGERPRINT_KEY)
    assert kv is not None
    assert b"s3cret-of-the-cluster" not in kv.value
    assert decode_record(kv.key, kv.value) == SecretFingerprint(
        secret_fingerprint("s3cret-of-the-cluster"), set_by="n1", set_at=1000.0
    )
    same = runtime_of(tmp_path, "n2", "s3cret-of-the-cluster")
    assert await check_cluster_secret(same, registry) is False
    assert await registry.get(SECRET_FINGERPRINT_KEY) == kv  # not written again


async def test_a_node_with_another_secret_refuses_naming_the_fix(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    await check_cluster_secret(runtime_of(tmp_path, "n1", "the-clusters-secret"), registry)
    # No secret given: the node generated its own into <data-dir>/secret.
    stray = runtime_of(tmp_path, "n2", None)
    with pytest.raises(ConfigError) as refused:
        await check_cluster_secret(stray, registry)
    message = str(refused.value)
    assert "\n" not in message
    for part in (
        "cluster secret of node n2",
        f"from {tmp_path / 'n2' / 'secret'}",
        "set by node n1",
        "--secret or CORRAL_SECRET",
    ):
        assert part in message
    assert stray.secret not in message
    assert "the-clusters-secret" not in message
    given_flag = runtime_of(tmp_path, "n3", "wrong")
    with pytest.raises(ConfigError, match="from --secret / CORRAL_SECRET"):
        await check_cluster_secret(given_flag, registry)


async def test_an_unreadable_fingerprint_refuses_instead_of_being_replaced(
    tmp_path: Path,
) -> None:
    registry = MemoryRegistry()
    await registry.put(SECRET_FINGERPRINT_KEY, b'{"v":1,"fingerprint":"zz"}')
    with pytest.raises(ConfigError, match="cannot be read"):
        await check_cluster_secret(runtime_of(tmp_path, "n1", "s"), registry)
    kv = await registry.get(SECRET_FINGERPRINT_KEY)
    assert kv is not None
    assert kv.value == b'{"v":1,"fingerprint":"zz"}'


def node_config_flags(tmp_path: Path, name: str, secret: str) -> dict[str, str]:
    return {
        "data-dir": str(tmp_path / name),
        "node-id": name,
        "secret": secret,
        "registry": f"sqlite://{tmp_path / 'registry.db'}",
        "api": f"127.0.0.1:{free_port()}",
        "listen": f"127.0.0.1:{free_port()}",
        "shutdown-grace-ms": "2000",
    }


@pytest.mark.slow
async def test_two_nodes_on_one_registry_start_only_with_one_secret(tmp_path: Path) -> None:
    """The real start path, in this process, on one SQLite registry."""

    def config(name: str, secret: str) -> NodeConfig:
        return resolve_node_config(node_config_flags(tmp_path, name, secret), {}, cwd=tmp_path)

    with trio.fail_after(30):
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_node(
                config("n1", "one"), stop=stop, task_status=task_status))
            with pytest.raises(ConfigError, match=r"cluster secret of node n2 .* is not the"):
                await run_node(config("n2", "two"), stop=trio.Event())
            assert not (tmp_path / "n2" / "node-id").exists()
            await nursery.start(lambda task_status: run_node(
                config("n3", "one"), stop=stop, task_status=task_status))
            async with open_registry(f"sqlite://{tmp_path / 'registry.db'}") as registry:
                assert await registry.get(node_key("n3")) is not None
                assert await registry.get(node_key("n2")) is None
            stop.set()


# ------------------------------------------------------------------ the node id


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_process_running_tells_live_gone_and_reused_pids() -> None:
    now = time.time()
    assert process_running(os.getpid(), now)
    assert not process_running(os.getpid(), now - 10 * 365 * 86400)  # younger than the record
    assert process_running(os.getpid(), 0.0)  # no start time recorded: it exists
    assert not process_running(dead_pid(), now)
    assert not process_running(0, now)


async def test_a_live_process_holding_the_id_refuses_the_start(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    runtime = runtime_of(tmp_path, "n1", "s")
    me = runtime.identity()
    # This test's own process plays the live holder: same host, its pid running.
    holder = NodeRecord(
        id="n1", instance="f" * 32, pid=os.getpid(), hostname=me.hostname,
        started_at=time.time(), api_address="127.0.0.1:9", peer_address="127.0.0.1:8",
    )
    await registry.put(node_key("n1"), holder.encode())
    with pytest.raises(ConfigError) as refused:
        await check_node_id_free(runtime, registry)
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {me.hostname}" in message
    assert "in use by a live node" in message
    assert "--node-id" in message
    elsewhere = NodeRecord(id="n1", instance="f" * 32, pid=1, hostname=me.hostname + "-other")
    await registry.put(node_key("n1"), elsewhere.encode())
    with pytest.raises(ConfigError, match="on host"):
        await check_node_id_free(runtime, registry)


async def test_a_gone_previous_life_on_this_host_is_taken_over(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    runtime = runtime_of(tmp_path, "n1", "s")
    gone = NodeRecord(
        id="n1", instance="e" * 32, pid=dead_pid(), hostname=runtime.identity().hostname,
        started_at=time.time(),
    )
    await registry.put(node_key("n1"), gone.encode())
    assert await check_node_id_free(runtime, registry) == "e" * 32
    await registry.delete(node_key("n1"))
    assert await check_node_id_free(runtime, registry) == ""


def test_each_start_draws_a_new_instance(tmp_path: Path) -> None:
    a, b = runtime_of(tmp_path, "n1", "s"), runtime_of(tmp_path, "n1", "s")
    assert a.instance != b.instance
    assert len(a.instance) == 32
    assert (a.identity().instance, a.identity().pid) == (a.instance, os.getpid())
