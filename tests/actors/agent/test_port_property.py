"""Property of the whole agent (virtual time, in-memory processes and registry): across
random sequences of assign / unassign / delete / node restart / waiting, no two apps of
the node ever hold one port, and no port moves between apps inside its quarantine."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.actors.process_supervisor import AppPaths, MemoryLauncher
from corral.actors.reconciler import AgentSpec, RunPass
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    NodeRecord,
    app_key,
    node_key,
)
from corral.supervision import ActorSystem, open_actor_system
from corral.testing import write_placement

NODE = "node-a"
APPS = ["a", "b", "c", "d"]
QUARANTINE_S = 100.0

operation = st.one_of(
    st.tuples(st.just("assign"), st.sampled_from(APPS)),
    st.tuples(st.just("unassign"), st.sampled_from(APPS)),
    st.tuples(st.just("delete"), st.sampled_from(APPS)),
    st.tuples(st.just("restart"), st.just("")),
    st.tuples(st.just("wait"), st.sampled_from(["40", "120"])),
)


class Ledger:
    """The test's own record of who got and gave back which port, and when."""

    def __init__(self) -> None:
        self.holder: dict[int, str] = {}
        self.released: dict[int, tuple[str, float]] = {}

    def absorb(self, events: list[Any]) -> None:
        for event in events:
            if event.kind == "ports.released":
                ports = (event.fields["public"], event.fields["internal"])
                for port in ports:
                    self.released[port] = (event.fields["app"], event.time)
                    self.holder.pop(port, None)
            elif event.kind in ("ports.assigned", "ports.replaced"):
                app = event.fields["app"]
                pair = event.fields if event.kind == "ports.assigned" else event.fields["new"]
                if event.kind == "ports.replaced":
                    for port in (event.fields["old"]["public"], event.fields["old"]["internal"]):
                        self.released[port] = (app, event.time)
                        self.holder.pop(port, None)
                for port in (pair["public"], pair["internal"]):
                    other = self.holder.get(port)
                    assert other is None or other == app, f"port {port}: {other} and {app}"
                    gave_back = self.released.get(port)
                    if gave_back is not None and gave_back[0] != app:
                        waited = event.time - gave_back[1]
                        assert waited >= QUARANTINE_S, (port, gave_back, app, waited)
                    self.holder[port] = app


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The move the quarantine exists to prevent: "d" asks for ports while "a"'s are fresh.
@example(
    ops=[
        ("assign", "a"),
        ("assign", "b"),
        ("assign", "c"),
        ("delete", "a"),
        ("wait", "40"),
        ("assign", "d"),
        ("restart", ""),
        ("wait", "120"),
        ("assign", "d"),
    ],
    seed=1,
)
@given(ops=st.lists(operation, min_size=1, max_size=14), seed=st.integers(0, 10_000))
def test_agent_never_shares_a_port_nor_moves_one_inside_quarantine(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str]], seed: int
) -> None:
    data_dir = tmp_path_factory.mktemp("node")
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> None:
        registry = MemoryRegistry()
        launcher = MemoryLauncher()
        ledger = Ledger()
        # Event times are trio's clock; the quarantine's wall clock follows it exactly.
        wall = trio.current_time

        async def materialize(app: str, deployment: Deployment) -> Path:
            path = AppPaths.of(data_dir, app).revision_dir(deployment.revision)
            path.mkdir(parents=True, exist_ok=True)
            return path

        def spec() -> AgentSpec:
            return AgentSpec(
                node_id=NODE,
                data_dir=data_dir,
                registry=registry,
                materialize=materialize,
                launcher=launcher,
                clock=wall,
                random=random.Random(seed),
                probe_host="127.0.0.1",
                port_range_start=24000,
                port_range_end=24005,
                port_quarantine_ms=int(QUARANTINE_S * 1000),
            )

        async def settle(system: ActorSystem) -> None:
            """Until a pass finds nothing to do (or only what keeps failing: an app that
            cannot get ports is retried on every pass)."""
            for _ in range(20):
                summary = await system.ref("/agent/reconciler").ask(RunPass())
                if summary["skipped"] or not any(a["ok"] for a in summary["actions"]):
                    return
            raise AssertionError("the agent never settled")

        def check_running() -> None:
            alive = launcher.alive()
            held = [p for proc in alive for p in (proc.spec.public_port, proc.spec.internal_port)]
            assert len(held) == len(set(held)), held

        await registry.put(node_key(NODE), NodeRecord(NODE).encode())
        pending = list(ops)
        while pending:
            async with open_actor_system(NODE) as system:
                await system.spawn(spec().supervisor_spec())
                await settle(system)
                while pending:
                    kind, arg = pending.pop(0)
                    if kind == "restart":
                        break
                    if kind == "assign":
                        record = AppRecord(arg, deployment=Deployment("1" * 64, ["run"]))
                        await registry.put(app_key(arg), record.encode())
                        await write_placement(registry, arg, [NODE])
                    elif kind == "unassign":
                        await write_placement(registry, arg, [])
                    elif kind == "delete":
                        await write_placement(registry, arg, [])
                        await registry.delete(app_key(arg))
                    else:
                        await trio.sleep(float(arg))
                    await settle(system)
                    check_running()
                ledger.absorb(system.events())
            assert launcher.alive() == []

    trio.run(main, clock=clock)
