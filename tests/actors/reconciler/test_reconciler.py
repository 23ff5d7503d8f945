"""The agent (Reconciler, PortAllocator, ProcessSupervisor) in virtual time, with the
in-memory launcher and registry."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from corral.actors.port_allocator import ListPorts
from corral.actors.process_supervisor import (
    AppPaths,
    ListProcesses,
    MemoryLauncher,
    RestartPolicy,
    StartProcess,
)
from corral.actors.process_supervisor._memory import Behaviour
from corral.actors.reconciler import AgentSpec, LastPass, RunPass
from corral.actors.reconciler._actor import Materialize
from corral.actors.reconciler._plan import STOP_NOT_SERVED, STOP_TEARDOWN
from corral.node._requests import DeployRequest
from corral.node.artifacts import Manifest
from corral.node.server._operations import deploy as deploy_app
from corral.registry import (
    AppRecord,
    DecodedRecords,
    Deployment,
    KeyValue,
    MeasuredCapacity,
    MemoryRegistry,
    NodeRecord,
    NodeRollout,
    PortClaim,
    RolloutRecord,
    WatchEvent,
    app_key,
    decode_record,
    node_key,
)
from corral.supervision import ActorCrashed, ActorRef, ActorSystem, open_actor_system
from corral.testing import CountingRegistry, sync_app_specs, until, write_placement

R1, R2 = "1" * 64, "2" * 64
NODE = "node-a"


class WallClock:
    def __init__(self) -> None:
        self.offset = 1_700_000_000.0

    def __call__(self) -> float:
        return self.offset + trio.current_time()


@dataclass
class Agent:
    system: ActorSystem
    registry: CountingRegistry
    launcher: MemoryLauncher
    data_dir: Path
    clock: WallClock

    @property
    def reconciler(self) -> ActorRef:
        return self.system.ref("/agent/reconciler")

    @property
    def ports(self) -> ActorRef:
        return self.system.ref("/agent/port_allocator")

    @property
    def processes(self) -> ActorRef:
        return self.system.ref("/agent/process_supervisor")

    async def settle(self) -> dict[str, Any]:
        """Run passes until one finds nothing moved."""
        for _ in range(30):
            summary: dict[str, Any] = await self.reconciler.ask(RunPass())
            if summary["skipped"]:
                return summary
            await trio.sleep(0.1)
        raise AssertionError("the agent never settled")

    async def node_record(self) -> NodeRecord:
        kv = await self.registry.get(node_key(NODE))
        assert kv is not None
        record = decode_record(kv.key, kv.value)
        assert isinstance(record, NodeRecord)
        return record

    async def rows(self) -> dict[str, dict[str, Any]]:
        return {row["app"]: row for row in await self.processes.ask(ListProcesses())}

    async def claims(self) -> dict[int, str]:
        found = {}
        for kv in await self.registry.range(f"ports/{NODE}/"):
            claim = decode_record(kv.key, kv.value)
            assert isinstance(claim, PortClaim)
            found[claim.port] = claim.app
        return found


async def deploy(
    registry: CountingRegistry, app: str, revision: str | None = R1, **flags: Any
) -> None:
    deployment = None if revision is None else Deployment(revision, ["python3", "server.py"])
    await registry.put(app_key(app), AppRecord(app, deployment=deployment, **flags).encode())
    await sync_app_specs(registry)  # what the coordinator writes for the changed app


async def place(registry: CountingRegistry, app: str, *nodes: str) -> None:
    """Place ``app`` as the coordinator does: with the index of its nodes."""
    await write_placement(registry, app, nodes)


@asynccontextmanager
async def running_agent(
    data_dir: Path,
    *,
    registry: CountingRegistry | None = None,
    launcher: MemoryLauncher | None = None,
    node_record: bool = True,
    failures: dict[str, int] | None = None,
    materialize: Materialize | None = None,
    **options: Any,
) -> AsyncIterator[Agent]:
    registry = registry or CountingRegistry(MemoryRegistry())
    launcher = launcher or MemoryLauncher()
    clock = WallClock()
    if node_record:
        lease = await registry.grant(10**7)
        await registry.put(node_key(NODE), NodeRecord(NODE).encode(), lease=lease.id)

    async def fake_materialize(app: str, deployment: Deployment) -> Path:
        if failures and failures.get(app, 0) > 0:
            failures[app] -= 1
            raise OSError(f"artifact of {app} not reachable")
        directory = AppPaths.of(data_dir, app).revision_dir(deployment.digest)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    spec = AgentSpec(
        node_id=NODE,
        data_dir=data_dir,
        registry=registry,
        materialize=materialize or fake_materialize,
        launcher=launcher,
        clock=clock,
        random=random.Random(7),
        probe_host="127.0.0.1",
        restart_policy=RestartPolicy(initial_backoff=0.5, max_backoff=30, crash_loop_crashes=3),
        **options,
    )
    async with open_actor_system(NODE) as system:
        await system.spawn(spec.supervisor_spec())
        yield Agent(system, registry, launcher, data_dir, clock)


async def test_an_assigned_app_starts_on_its_ports_and_is_published(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        lease = await agent.registry.get(node_key(NODE))
        assert lease is not None
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE, "node-b")
        await agent.settle()
        (process,) = agent.launcher.alive()
        pair = (await agent.ports.ask(ListPorts()))["holdings"]["hello"]
        assert process.spec.public_port == pair["public"]
        assert process.spec.env["CORRAL_INTERNAL_PORT"] == str(pair["internal"])
        assert process.spec.cwd == tmp_path / "apps" / "hello" / "revisions" / R1
        record = await agent.node_record()
        entry = record.serving["hello"]
        assert (entry.revision, entry.public_port, entry.internal_port, entry.state) == (
            R1,
            pair["public"],
            pair["internal"],
            "running",
        )
        assert record.change_token >= 1
        kv = await agent.registry.get(node_key(NODE))
        assert kv is not None
        assert kv.lease == lease.lease  # the node's lease is kept
        assert await agent.claims() == {pair["public"]: "hello", pair["internal"]: "hello"}
        last = await agent.reconciler.ask(LastPass())
        assert last["skipped"]


async def test_a_new_placement_is_acted_on_within_a_pass_not_on_the_timer(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, interval=5.0) as agent:
        await deploy(agent.registry, "hello")
        await agent.settle()
        t0 = trio.current_time()
        await place(agent.registry, "hello", NODE)
        await until(lambda: agent.launcher.alive(), poll=0.01)
        assert trio.current_time() - t0 < 0.5


async def test_an_idle_pass_reads_only_the_change_token(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        for i in range(5):
            await deploy(agent.registry, f"app-{i}")
            await place(agent.registry, f"app-{i}", NODE)
        await agent.settle()
        agent.registry.reset()
        for _ in range(3):
            summary = await agent.reconciler.ask(RunPass())
            assert summary["skipped"]
            assert summary["actions"] == []
        assert dict(agent.registry.calls) == {"txn": 3}  # assignment index + own record
        # a forced pass reads everything and, with nothing to do, writes nothing
        summary = await agent.reconciler.ask(RunPass(force=True))
        assert not summary["skipped"]
        assert summary["actions"] == []
        assert agent.registry.writes == 0


async def test_another_nodes_capacity_write_costs_this_nodes_pass_one_read(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        for i in range(5):
            await deploy(agent.registry, f"app-{i}")
            await place(agent.registry, f"app-{i}", NODE)
        await deploy(agent.registry, "elsewhere")
        await place(agent.registry, "elsewhere", "node-b")
        await agent.settle()
        agent.registry.reset()
        # Another node refreshes its capacity, other apps deploy and move: the global
        # revision moves, this node's assignment does not.
        other = NodeRecord("node-b", capacity=MeasuredCapacity(8192, 4000, 100_000, 50_000))
        await agent.registry.put(node_key("node-b"), other.encode())
        await deploy(agent.registry, "elsewhere", revision=R2)
        await place(agent.registry, "elsewhere", "node-b", "node-c")
        await trio.sleep(1.0)
        agent.registry.reset()
        summary = await agent.reconciler.ask(RunPass())
        assert summary["skipped"]
        assert dict(agent.registry.calls) == {"txn": 1}


async def test_a_re_created_node_record_gets_its_serving_set_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The record lapsed (the node was paused past its TTL) and registration wrote it
    # anew, without the serving set; nothing else changed.
    async with running_agent(tmp_path, interval=5.0) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        kv = await agent.registry.get(node_key(NODE))
        assert kv is not None
        await agent.registry.put(node_key(NODE), NodeRecord(NODE).encode(), lease=kv.lease)
        assert (await agent.node_record()).serving == {}
        await trio.sleep(6.0)  # one timer pass
        assert set((await agent.node_record()).serving) == {"hello"}


async def test_a_change_reads_only_the_apps_it_names(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    registry = RangeLog(MemoryRegistry())
    async with running_agent(tmp_path, registry=registry) as agent:
        for i in range(40):
            await deploy(agent.registry, f"app-{i}")
            await place(agent.registry, f"app-{i}", NODE if i < 5 else "node-b")
        await agent.settle()
        await deploy(agent.registry, "app-1", revision=R2)
        registry.prefixes.clear()  # the test's own coordinator writes read everything
        await until(lambda: any(p.spec.revision == R2 for p in agent.launcher.alive()))
        await agent.settle()
        # Nothing ranges over every app or placement, nor over this node's own port
        # claims (read again with the periodic re-read only).
        assert registry.prefixes == []
        await trio.sleep(61)
        assert set(registry.prefixes) == {f"ports/{NODE}/"}


async def test_a_restarted_nodes_first_pass_reads_only_the_apps_that_concern_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # A fleet restarting at once must not have every node read every app: a node's
    # first pass reads its index, then by name what it is assigned or keeps state for.
    registry = RangeLog(MemoryRegistry())
    launcher = MemoryLauncher()
    async with running_agent(tmp_path, registry=registry, launcher=launcher) as agent:
        for app in ("kept", "moved", "deleted"):
            await deploy(registry, app)
            await place(registry, app, NODE)
        for i in range(30):
            await deploy(registry, f"other-{i}")
            await place(registry, f"other-{i}", "node-b")
        await agent.settle()
    # While the node is away: one app moves elsewhere, one is deleted.
    await place(registry, "moved", "node-b")
    await place(registry, "deleted")
    await registry.delete(app_key("deleted"))
    registry.prefixes.clear()
    async with running_agent(
        tmp_path, registry=registry, launcher=launcher, node_record=False
    ) as agent:
        await agent.settle()
        assert {p.spec.app for p in launcher.alive()} == {"kept"}
        assert not (set(registry.prefixes) & {"apps/", "placement/"})
        # The moved app keeps its directory and ports; the deleted one's are gone.
        assert AppPaths.of(tmp_path, "moved").ports_file.exists()
        assert not AppPaths.of(tmp_path, "deleted").root.exists()
        assert set((await agent.claims()).values()) == {"kept", "moved"}


class RangeLog(CountingRegistry):
    """A CountingRegistry that also remembers the prefix of every range read."""

    def __init__(self, inner: MemoryRegistry) -> None:
        super().__init__(inner)
        self.prefixes: list[str] = []

    async def range(self, prefix: str) -> list[KeyValue]:
        self.prefixes.append(prefix)
        return await super().range(prefix)


async def test_an_unassigned_app_is_stopped_and_keeps_its_directory_and_ports(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        claims = await agent.claims()
        await place(agent.registry, "hello", "node-b")
        await until(lambda: not agent.launcher.alive())
        await agent.settle()
        rows = await agent.rows()
        assert rows["hello"]["state"] == "stopped"
        assert rows["hello"]["stop_reason"] == STOP_NOT_SERVED
        assert AppPaths.of(tmp_path, "hello").ports_file.exists()
        assert AppPaths.of(tmp_path, "hello").revisions.exists()
        assert await agent.claims() == claims
        assert "hello" not in (await agent.node_record()).serving
        # assigned again: the same ports
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        (process,) = agent.launcher.alive()
        assert {process.spec.public_port, process.spec.internal_port} == set(claims)


async def test_teardown_pending_stops_with_its_reason(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        await deploy(agent.registry, "hello", teardown_pending=True)
        await until(lambda: not agent.launcher.alive())
        await agent.settle()
        assert (await agent.rows())["hello"]["stop_reason"] == STOP_TEARDOWN


async def test_never_deployed_does_nothing_and_a_new_revision_restarts(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "hello", revision=None)
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        assert agent.launcher.spawned == []
        await deploy(agent.registry, "hello", revision=R1)
        await agent.settle()
        await deploy(agent.registry, "hello", revision=R2)
        await agent.settle()
        first, second = agent.launcher.spawned
        assert (first.spec.revision, first.alive) == (R1, False)
        assert (second.spec.revision, second.alive) == (R2, True)
        assert second.spec.public_port == first.spec.public_port
        assert (await agent.node_record()).serving["hello"].revision == R2


async def test_a_deleted_app_is_cleaned_and_its_ports_wait_out_the_quarantine(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(
        tmp_path, port_range_start=24000, port_range_end=24003, port_quarantine_ms=60_000
    ) as agent:
        for app in ("old", "other"):
            await deploy(agent.registry, app)
            await place(agent.registry, app, NODE)
        await agent.settle()
        old_ports = {p for p, app in (await agent.claims()).items() if app == "old"}
        await agent.registry.delete(app_key("old"))
        await place(agent.registry, "old")  # the coordinator deletes its placement
        await until(lambda: not AppPaths.of(tmp_path, "old").root.exists())
        await agent.settle()
        assert "old" not in await agent.rows()
        assert set(await agent.claims()) == {24000, 24001, 24002, 24003} - old_ports
        quarantine = (await agent.ports.ask(ListPorts()))["quarantine"]
        assert {int(p) for p in quarantine} == old_ports
        assert {q["app"] for q in quarantine.values()} == {"old"}

        # another app may not have those ports before the quarantine ends
        await deploy(agent.registry, "newcomer")
        await place(agent.registry, "newcomer", NODE)
        summary = await agent.reconciler.ask(RunPass())
        (action,) = summary["actions"]
        assert not action["ok"]
        assert "placement-unavailable" in action["error"]
        assert "24000-24003" in action["error"]
        assert "for app 'newcomer'" in action["error"]
        last = await agent.reconciler.ask(LastPass())
        assert last["errors"] == [action["error"]]
        events = agent.system.events()
        failed = [e.fields for e in events if e.kind == "reconcile.failed"]
        assert failed[-1] == {"app": "newcomer", "action": "start", "error": action["error"]}
        unavailable = [e.fields for e in events if e.kind == "placement.unavailable"]
        assert unavailable[-1]["app"] == "newcomer"
        assert "24000-24003" in unavailable[-1]["message"]
        assert "newcomer" not in {p.spec.app for p in agent.launcher.alive()}
        await trio.sleep(61)  # the wall clock of the quarantine follows virtual time here
        await agent.settle()
        (newcomer,) = [p for p in agent.launcher.alive() if p.spec.app == "newcomer"]
        assert {newcomer.spec.public_port, newcomer.spec.internal_port} == old_ports


async def test_the_serving_set_waits_for_the_node_record(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, node_record=False) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        summary = await agent.reconciler.ask(RunPass())
        assert any("does not exist yet" in e for e in summary["errors"])
        assert agent.launcher.alive()
        await agent.registry.put(node_key(NODE), NodeRecord(NODE, labels={"k": "v"}).encode())
        await agent.settle()
        record = await agent.node_record()
        assert "hello" in record.serving
        assert record.labels == {"k": "v"}


async def test_a_record_another_process_took_over_is_not_published_onto(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, node_record=False, instance="mine") as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.registry.put(node_key(NODE), NodeRecord(NODE, instance="theirs").encode())
        summary = await agent.reconciler.ask(RunPass())
        assert any("held by another process" in e for e in summary["errors"])
        assert (await agent.node_record()).serving == {}
        await agent.registry.put(node_key(NODE), NodeRecord(NODE, instance="mine").encode())
        await agent.settle()
        assert "hello" in (await agent.node_record()).serving


async def test_a_crash_loop_is_published_and_reported(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    launcher = MemoryLauncher()
    launcher.behave("hello", Behaviour(exit_after=0.2, exit_code=2))
    async with running_agent(tmp_path, launcher=launcher) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        t0 = trio.current_time()
        while (entry := (await agent.node_record()).serving.get("hello")) is None or (
            entry.state != "crash-loop"
        ):
            await trio.sleep(0.1)
        assert entry.restarts == 2
        assert trio.current_time() - t0 < 5
        events = [e for e in agent.system.events() if e.kind == "process.crash-loop"]
        assert [e.fields["app"] for e in events] == ["hello"]
        row = (await agent.rows())["hello"]
        assert row["crash_loop"]
        assert row["last_exit_code"] == 2
        # backing off (30 s), not spinning
        spawned = len(launcher.spawned)
        await trio.sleep(20)
        assert len(launcher.spawned) == spawned


async def test_a_restarted_agent_reuses_its_ports_and_ends_with_no_process(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    registry = CountingRegistry(MemoryRegistry())
    launcher = MemoryLauncher()
    async with running_agent(tmp_path, registry=registry, launcher=launcher) as agent:
        await deploy(registry, "hello")
        await place(registry, "hello", NODE)
        await agent.settle()
        (first,) = launcher.alive()
    assert launcher.alive() == []
    async with running_agent(
        tmp_path, registry=registry, launcher=launcher, node_record=False
    ) as agent:
        await agent.settle()
        (second,) = launcher.alive()
    assert (second.spec.public_port, second.spec.internal_port) == (
        first.spec.public_port,
        first.spec.internal_port,
    )
    assert launcher.alive() == []


async def test_a_crashed_process_supervisor_gets_its_processes_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        (first,) = agent.launcher.alive()
        broken = StartProcess("hello", R1, ("x",), "/", 1, 2, env=None)  # type: ignore[arg-type]
        with pytest.raises(ActorCrashed):
            await agent.processes.ask(broken)
        await until(lambda: len(agent.launcher.spawned) == 2)
        await agent.settle()
        assert not first.alive
        assert first.signals == ["SIGTERM"]
        (second,) = agent.launcher.alive()
        assert second.spec.public_port == first.spec.public_port
        assert (await agent.node_record()).serving["hello"].state == "running"


async def test_a_revision_that_cannot_be_materialized_is_retried_after_its_backoff(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, failures={"hello": 1}) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        first = await agent.reconciler.ask(RunPass())
        (action,) = first["actions"]
        assert not action["ok"]
        assert "not reachable" in action["error"]
        assert first["errors"] == [action["error"]]
        (failed,) = [e.fields for e in agent.system.events() if e.kind == "reconcile.failed"]
        assert failed == {"app": "hello", "action": "start", "error": action["error"]}
        assert agent.launcher.spawned == []
        # a pass right after it holds the start back: no tight retry loop
        second = await agent.reconciler.ask(RunPass())
        (held,) = second["actions"]
        assert held["deferred"]
        assert "next try in 4.95 s" in held["error"]  # 5 s after the failure, 0.05 s ago
        assert second["errors"] == []
        # nothing moved in the registry, yet the failed start is retried once due
        await trio.sleep(5.1)
        await agent.settle()
        assert len(agent.launcher.alive()) == 1
        assert (await agent.reconciler.ask(LastPass()))["failed"] == []


# --------------------------------------------------------------------------- what a revision is


class _Artifacts:
    """The deploy operation's artifact hooks, in memory: each artifact's bytes name
    its manifest's command (``b"python3 server.py"``)."""

    async def store(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    async def inspect(self, data: bytes) -> Manifest:
        return Manifest(command=tuple(data.decode().split()), env={"FROM_MANIFEST": "1"})


async def _redeploy(agent: Agent, artifact: bytes = b"python3 server.py", **fields: Any) -> str:
    """Deploy ``hello`` through the operator operation; returns the revision written."""
    artifacts = _Artifacts()
    request = DeployRequest(name="hello", artifact=artifact, **fields)
    result = await deploy_app(
        agent.registry, request, artifacts.store, agent.clock(), inspect=artifacts.inspect
    )
    assert result.app.deployment is not None
    revision = result.app.deployment.revision
    # What the coordinator's rollout does next: tell the node to switch (a redeploy
    # reaches a node running the previous revision only through a rollout).
    rollout = RolloutRecord(revision, {NODE: NodeRollout(revision, "restarting", 0.0)})
    await write_placement(agent.registry, "hello", [NODE], rollout=rollout)
    return revision


async def test_an_env_only_redeploy_restarts_with_the_new_env_on_the_same_ports(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await place(agent.registry, "hello", NODE)
        first_revision = await _redeploy(agent, env={"GREETING": "hello"})
        await agent.settle()
        second_revision = await _redeploy(agent, env={"GREETING": "hi"})
        await agent.settle()
        assert second_revision != first_revision
        first, second = agent.launcher.spawned
        assert (first.spec.revision, first.alive) == (first_revision, False)
        assert (second.spec.revision, second.alive) == (second_revision, True)
        assert first.spec.env["GREETING"] == "hello"
        assert second.spec.env["GREETING"] == "hi"
        assert second.spec.env["FROM_MANIFEST"] == "1"
        assert (second.spec.public_port, second.spec.internal_port) == (
            first.spec.public_port,
            first.spec.internal_port,
        )
        # the same artifact: the unpacked directory (named by the digest) is reused
        assert second.spec.cwd == first.spec.cwd
        assert (await agent.node_record()).serving["hello"].revision == second_revision


async def test_a_command_or_resources_only_redeploy_restarts_too(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await place(agent.registry, "hello", NODE)
        revisions = [await _redeploy(agent)]
        await agent.settle()
        revisions.append(await _redeploy(agent, artifact=b"python3 other.py"))
        await agent.settle()
        revisions.append(await _redeploy(agent, artifact=b"python3 other.py", memory_mb=64))
        await agent.settle()
        assert len(set(revisions)) == 3
        assert [p.spec.revision for p in agent.launcher.spawned] == revisions
        assert [p.alive for p in agent.launcher.spawned] == [False, False, True]
        assert agent.launcher.spawned[-1].spec.command == ("python3", "other.py")


async def test_a_redeploy_with_identical_inputs_restarts_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await place(agent.registry, "hello", NODE)
        first = await _redeploy(agent, env={"A": "1", "B": "2"}, memory_mb=32)
        await agent.settle()
        # the same env in another order, the resources left as they are
        again = await _redeploy(agent, env={"B": "2", "A": "1"})
        await agent.settle()
        assert again == first
        (process,) = agent.launcher.spawned
        assert process.alive


# --------------------------------------------------------------------------- what it watches


class WatchLog(CountingRegistry):
    """A CountingRegistry that counts the events each watch delivers, by the prefix it
    was opened on, and (``only_assign``) delivers none to a watch outside ``assign/``:
    what a reconciler sees with nothing but its assignment index to go by."""

    def __init__(self, inner: MemoryRegistry, *, only_assign: bool = False) -> None:
        super().__init__(inner)
        self.only_assign = only_assign

    def delivers(self, prefix: str, event: WatchEvent) -> bool:
        return not self.only_assign or prefix.startswith("assign/")


async def test_placement_writes_for_other_nodes_deliver_nothing_to_this_nodes_watch(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    registry = WatchLog(MemoryRegistry())
    async with running_agent(tmp_path, registry=registry) as agent:
        await deploy(agent.registry, "mine")
        await place(agent.registry, "mine", NODE)
        await agent.settle()
        registry.delivered.clear()
        # Twenty apps placed, moved and redeployed on other nodes.
        for i in range(20):
            await deploy(agent.registry, f"app-{i}")
            await place(agent.registry, f"app-{i}", "node-b")
            await place(agent.registry, f"app-{i}", "node-b", "node-c")
            await deploy(agent.registry, f"app-{i}", revision=R2)
        await trio.sleep(1.0)
        assert sum(registry.delivered.values()) == 0
        # ...while a change that names this node is delivered (once: its index).
        await deploy(agent.registry, "also-mine")
        await place(agent.registry, "also-mine", NODE)
        await trio.sleep(1.0)
        assert dict(registry.delivered) == {f"assign/{NODE}": 1}


async def test_a_rollout_switch_and_an_app_change_reach_the_node_through_its_index_alone(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # Only the assignment index is delivered: no placement or app watch to fall back
    # on, and the periodic re-read far away.
    registry = WatchLog(MemoryRegistry(), only_assign=True)
    async with running_agent(
        tmp_path, registry=registry, interval=5.0, full_pass_every=3600.0
    ) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE, "node-b")
        with trio.fail_after(0.5):
            await until(lambda: agent.launcher.alive(), poll=0.01)
        # A new revision: the node keeps the one it runs until its rollout names the
        # new one for it (a step taken for node-b first changes nothing here).
        record = AppRecord(
            "hello",
            deployment=Deployment(R2, ["python3", "server.py"]),
            previous_deployment=Deployment(R1, ["python3", "server.py"]),
        )
        await agent.registry.put(app_key("hello"), record.encode())
        await sync_app_specs(agent.registry)
        pending = {
            NODE: NodeRollout(R1, "pending", 0.0),
            "node-b": NodeRollout(R2, "restarting", 0.0),
        }
        await write_placement(
            agent.registry, "hello", [NODE, "node-b"], rollout=RolloutRecord(R2, pending)
        )
        await trio.sleep(1.0)
        assert [p.spec.revision for p in agent.launcher.alive()] == [R1]
        switch = {**pending, NODE: NodeRollout(R2, "restarting", 0.0)}
        await write_placement(
            agent.registry, "hello", [NODE, "node-b"], rollout=RolloutRecord(R2, switch)
        )
        with trio.fail_after(0.5):  # within a pass, not on a timer
            await until(lambda: [p.spec.revision for p in agent.launcher.alive()] == [R2])
        # The app is torn down: a flag in its record alone, no placement change.
        torn = dataclasses.replace(record, teardown_pending=True)
        await agent.registry.put(app_key("hello"), torn.encode())
        await sync_app_specs(agent.registry)
        drain = record.rollout.drain_ms / 1000  # out of routing first, then the stop
        with trio.fail_after(drain + 0.5):
            await until(lambda: not agent.launcher.alive(), poll=0.01)
        stops = [e.fields for e in agent.system.events() if e.kind == "reconcile.stop"]
        assert stops[-1] == {"app": "hello", "reason": STOP_TEARDOWN}


async def test_the_periodic_refresh_decodes_a_port_claim_only_when_it_changed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every node reads its port claims again once a minute; decoding them all each
    # time was about half of an idle node's refresh.

    decoded: list[str] = []

    def counting(key: str, value: bytes) -> Any:
        if key.startswith("ports/"):
            decoded.append(key)
        return decode_record(key, value)

    monkeypatch.setattr(DecodedRecords, "decode_value", staticmethod(counting))
    async with running_agent(tmp_path) as agent:
        for app in ("one", "two"):
            await deploy(agent.registry, app)
            await place(agent.registry, app, NODE)
        await agent.settle()
        await trio.sleep(61)  # a refresh reads (and decodes) the four claims
        await agent.settle()
        assert len(await agent.claims()) == 4
        decoded.clear()
        await trio.sleep(61)  # another: nothing changed, nothing decoded
        await agent.settle()
        assert decoded == []
        # A claim this node's previous life left for an app it no longer knows: the
        # next refresh decodes that one alone, and releases it.
        ghost = PortClaim(NODE, 24990, "ghost", 0.0)
        await agent.registry.put(f"ports/{NODE}/24990", ghost.encode())
        await trio.sleep(61)
        await agent.settle()
        assert decoded == [f"ports/{NODE}/24990"]
        assert set((await agent.claims()).values()) == {"one", "two"}


async def test_timer_passes_come_every_interval(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The timer is a Tick put in the mailbox by the run's timer wheel (no task of its
    # own): one message per pass, every interval exactly.
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await agent.settle()
        tree = agent.system.tree().find("/agent/reconciler")
        assert tree is not None
        handled = tree.messages_handled
        times = []
        for _ in range(6):
            await trio.sleep(5.0)
            last = await agent.reconciler.ask(LastPass())
            assert last["reasons"] == ["timer"]
            assert last["skipped"]
            times.append(last["time"])
        assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [5.0] * 5
        tree = agent.system.tree().find("/agent/reconciler")
        assert tree is not None
        assert tree.messages_handled == handled + 12  # six ticks and six LastPass asks
