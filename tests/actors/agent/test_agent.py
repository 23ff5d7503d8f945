"""The node agent with real processes: the hello example app, real ports, psutil checks.

Every test is bounded with ``trio.fail_after`` and leaves no process behind.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio

from corral.actors.port_allocator import ListPorts
from corral.actors.process_supervisor import AppPaths, ListProcesses, RestartPolicy
from corral.actors.reconciler import AgentSpec, RunPass
from corral.actors.reconciler._plan import STOP_NOT_SERVED
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    NodeRecord,
    Registry,
    app_key,
    decode_record,
    node_key,
)
from corral.supervision import ActorRef, ActorSystem, open_actor_system
from corral.testing import until, write_placement

pytestmark = pytest.mark.slow

NODE = "node-a"
HELLO = Path(__file__).parents[3] / "examples" / "apps" / "hello"
R1 = "1" * 64


class FakeWallClock:
    """The quarantine's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class Agent:
    system: ActorSystem
    registry: Registry

    @property
    def reconciler(self) -> ActorRef:
        return self.system.ref("/agent/reconciler")

    async def rows(self) -> dict[str, dict[str, Any]]:
        processes = self.system.ref("/agent/process_supervisor")
        return {row["app"]: row for row in await processes.ask(ListProcesses())}

    async def serving(self) -> dict[str, Any]:
        kv = await self.registry.get(node_key(NODE))
        assert kv is not None
        record = decode_record(kv.key, kv.value)
        assert isinstance(record, NodeRecord)
        return record.serving

    async def wait_running(self, app: str) -> Any:
        while (entry := (await self.serving()).get(app)) is None or entry.state != "running":
            await trio.sleep(0.05)
        return entry


async def copy_hello(app: str, deployment: Deployment, data_dir: Path) -> Path:
    target = AppPaths.of(data_dir, app).revision_dir(deployment.revision)
    if not target.exists():
        shutil.copytree(HELLO, target)
    await trio.lowlevel.checkpoint()
    return target


@asynccontextmanager
async def agent_on(data_dir: Path, registry: Registry, **options: Any) -> AsyncIterator[Agent]:
    # A new life of the node registers afresh: it serves nothing yet.
    await registry.put(node_key(NODE), NodeRecord(NODE).encode())

    async def materialize(app: str, deployment: Deployment) -> Path:
        return await copy_hello(app, deployment, data_dir)

    spec = AgentSpec(
        node_id=NODE,
        data_dir=data_dir,
        registry=registry,
        materialize=materialize,
        interval=1.0,
        grace=5.0,
        **options,
    )
    async with open_actor_system(NODE) as system:
        await system.spawn(spec.supervisor_spec())
        yield Agent(system, registry)


async def deploy(registry: Registry, app: str, command: list[str] | None = None) -> None:
    deployment = Deployment(R1, command or [sys.executable, "server.py"])
    await registry.put(app_key(app), AppRecord(app, deployment=deployment).encode())


async def place(registry: Registry, app: str, *nodes: str) -> None:
    """Place ``app`` as the coordinator does: with the index of its nodes."""
    await write_placement(registry, app, nodes)


async def get_hello(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def test_assigned_app_runs_and_answers_then_unassigned_stops_keeping_its_state(
    tmp_path: Path,
) -> None:
    registry = MemoryRegistry()
    with trio.fail_after(30):
        async with agent_on(tmp_path, registry) as agent:
            await deploy(registry, "hello")
            await place(registry, "hello", NODE)
            entry = await agent.wait_running("hello")
            assert await get_hello(entry.public_port) == {
                "app": "hello",
                "node": NODE,
                "port": entry.public_port,
            }
            pid = (await agent.rows())["hello"]["pid"]
            assert psutil.Process(pid).cwd() == str(AppPaths.of(tmp_path, "hello").revision_dir(R1))

            await place(registry, "hello", "node-b")
            await until(lambda: gone(pid))
            # The node record drops it and the supervisor's row leaves "stopping" in
            # either order.
            while "hello" in await agent.serving() or (
                (await agent.rows())["hello"]["state"] == "stopping"
            ):
                await trio.sleep(0.05)
            row = (await agent.rows())["hello"]
            assert (row["state"], row["stop_reason"]) == ("stopped", STOP_NOT_SERVED)
            paths = AppPaths.of(tmp_path, "hello")
            assert json.loads(paths.ports_file.read_text())["public"] == entry.public_port
            assert "listening on" in paths.stdout_log.read_text()
            assert paths.revision_dir(R1).is_dir()


async def test_deleted_app_is_cleaned_and_its_ports_quarantined(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), FakeWallClock()
    options = {
        "port_range_start": 24990,
        "port_range_end": 24993,
        "port_quarantine_ms": 600_000,
        "clock": clock,
    }
    with trio.fail_after(40):
        async with agent_on(tmp_path, registry, **options) as agent:
            for app in ("old", "other"):
                await deploy(registry, app)
                await place(registry, app, NODE)
            old = await agent.wait_running("old")
            await agent.wait_running("other")
            old_pid = (await agent.rows())["old"]["pid"]

            await registry.delete(app_key("old"))
            await place(registry, "old")  # the coordinator deletes its placement
            await until(lambda: not AppPaths.of(tmp_path, "old").root.exists())
            assert gone(old_pid)
            ports = await agent.system.ref("/agent/port_allocator").ask(ListPorts())
            assert {int(p) for p in ports["quarantine"]} == {old.public_port, old.internal_port}

            await deploy(registry, "newcomer")
            await place(registry, "newcomer", NODE)
            summary = await agent.reconciler.ask(RunPass())
            assert "placement-unavailable" in summary["actions"][0]["error"]
            clock.now += 600.0
            await agent.reconciler.ask(RunPass())
            newcomer = await agent.wait_running("newcomer")
            assert {newcomer.public_port, newcomer.internal_port} == {
                old.public_port,
                old.internal_port,
            }
            assert (await get_hello(newcomer.public_port))["app"] == "newcomer"


async def test_a_restarted_node_reuses_its_ports_or_moves_off_a_taken_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = MemoryRegistry()
    with trio.fail_after(60):
        async with agent_on(tmp_path, registry) as agent:
            await deploy(registry, "hello")
            await place(registry, "hello", NODE)
            first = await agent.wait_running("hello")
            first_pid = (await agent.rows())["hello"]["pid"]
        assert gone(first_pid)

        async with agent_on(tmp_path, registry) as agent:
            second = await agent.wait_running("hello")
            assert (second.public_port, second.internal_port) == (
                first.public_port,
                first.internal_port,
            )
            assert (await get_hello(second.public_port))["port"] == first.public_port

        with socket.socket() as foreign:
            foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            foreign.bind(("127.0.0.1", first.public_port))
            foreign.listen()
            with caplog.at_level(logging.WARNING, logger="corral.actors.port_allocator"):
                async with agent_on(tmp_path, registry) as agent:
                    third = await agent.wait_running("hello")
                    assert third.public_port != first.public_port
                    assert (await get_hello(third.public_port))["port"] == third.public_port
                    events = [e for e in agent.system.events() if e.kind == "ports.replaced"]
                    assert events[0].fields["old"]["public"] == first.public_port
    moved = [r.getMessage() for r in caplog.records if "found taken" in r.getMessage()]
    assert len(moved) == 1
    assert "hello" in moved[0]
    assert f"{first.public_port}/{first.internal_port}" in moved[0]
    assert f"{third.public_port}/{third.internal_port}" in moved[0]


async def test_a_crash_loop_backs_off_and_is_reported(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    policy = RestartPolicy(initial_backoff=0.05, max_backoff=3.0, crash_loop_crashes=3)
    with trio.fail_after(30):
        async with agent_on(tmp_path, registry, restart_policy=policy) as agent:
            await deploy(registry, "crasher", [sys.executable, "-c", "import sys; sys.exit(4)"])
            await place(registry, "crasher", NODE)
            while (entry := (await agent.serving()).get("crasher")) is None or (
                entry.state != "crash-loop"
            ):
                await trio.sleep(0.05)
            row = (await agent.rows())["crasher"]
            assert (row["crash_loop"], row["last_exit_code"]) == (True, 4)
            loops = [e for e in agent.system.events() if e.kind == "process.crash-loop"]
            assert [e.fields["app"] for e in loops] == ["crasher"]
            starts = sum(1 for e in agent.system.events() if e.kind == "process.started")
            await trio.sleep(1.0)
            assert sum(1 for e in agent.system.events() if e.kind == "process.started") == starts


async def test_shutdown_with_50_running_apps_leaves_no_process(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    apps = [f"app-{i:02d}" for i in range(50)]
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with agent_on(tmp_path, registry, ready_timeout=1.0) as agent:
                for app in apps:
                    await deploy(registry, app, ["sleep", "600"])
                    await place(registry, app, NODE)
                while True:
                    rows = await agent.rows()
                    if len(rows) == 50 and all(row["pid"] for row in rows.values()):
                        break
                    await trio.sleep(0.1)
                pids = [row["pid"] for row in rows.values()]
                assert len(set(pids)) == 50
                assert not any(gone(pid) for pid in pids)
        assert [pid for pid in pids if not gone(pid)] == []
    finally:
        for pid in pids:
            if not gone(pid):
                psutil.Process(pid).kill()


async def test_processes_left_by_a_killed_node_are_ended_before_anything_starts(
    tmp_path: Path,
) -> None:
    script = Path(__file__).with_name("_first_life.py")
    first_life = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE
    )
    left: list[int] = []
    try:
        with trio.fail_after(30):
            assert first_life.stdout is not None
            line = await trio.to_thread.run_sync(first_life.stdout.readline)
            left = json.loads(line)
            first_life.kill()  # no cleanup at all: a crash
            await trio.to_thread.run_sync(first_life.wait)
            assert len(left) == 2
            assert not any(gone(pid) for pid in left)

            registry = MemoryRegistry()
            async with agent_on(tmp_path, registry) as agent:
                assert all(gone(pid) for pid in left)
                events = agent.system.events()
                ended = [e.fields for e in events if e.kind == "process.leftover-ended"]
                assert sorted(e["pid"] for e in ended) == sorted(left)
                assert sorted(e["app"] for e in ended) == ["one", "two"]
    finally:
        if first_life.poll() is None:
            first_life.kill()
        first_life.wait()
        if first_life.stdout is not None:
            first_life.stdout.close()
        for pid in left:
            if not gone(pid):
                psutil.Process(pid).kill()
