"""A port range with no pair left: the instance is published ``starting`` with the reason
(naming the range), tried again every pass, and starts once ports free up (issue 25,
item 8)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from corral.actors.reconciler import RunPass
from corral.actors.reconciler._plan import BlockedStart, serving_set
from corral.registry import app_key

from .test_reconciler import NODE, R1, deploy, place, running_agent


async def test_an_exhausted_port_range_is_published_with_the_reason_until_ports_free_up(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(
        tmp_path,
        port_range_start=24000,
        port_range_end=24002,
        port_quarantine_ms=30_000,
        interval=5.0,
    ) as agent:
        await deploy(agent.registry, "first")
        await place(agent.registry, "first", NODE)
        await agent.settle()
        await deploy(agent.registry, "second")
        await place(agent.registry, "second", NODE)
        await agent.reconciler.ask(RunPass())
        entry = (await agent.node_record()).serving["second"]
        assert (entry.state, entry.revision, entry.public_port) == ("starting", R1, 0)
        assert not entry.ready
        assert entry.reason.startswith(
            "cannot start: placement-unavailable: port range 24000-24002 has 1 free port(s) "
            "for app 'second', a pair needs 2"
        )
        assert "--port-range-start/--port-range-end" in entry.reason

        # Tried again on the pass timer: still published, no process started.
        await trio.sleep(12)
        assert "second" not in {p.spec.app for p in agent.launcher.alive()}
        assert (await agent.node_record()).serving["second"].reason == entry.reason

        # "first" leaves the node and is deleted; once its ports are out of quarantine
        # (30 s), a timer pass (every 5 s) starts "second".
        await agent.registry.delete(app_key("first"))
        await place(agent.registry, "first")
        gone = trio.current_time()
        while "second" not in {p.spec.app for p in agent.launcher.alive()}:
            await trio.sleep(1)
        assert 30 <= trio.current_time() - gone <= 30 + 5 + 1
        await agent.settle()
        started = (await agent.node_record()).serving["second"]
        assert started.public_port != 0
        assert started.reason == ""


async def test_a_blocked_start_is_forgotten_when_the_app_leaves_the_node(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, port_range_start=24000, port_range_end=24001) as agent:
        await deploy(agent.registry, "first")
        await place(agent.registry, "first", NODE)
        await agent.settle()
        await deploy(agent.registry, "second")
        await place(agent.registry, "second", NODE)
        await agent.reconciler.ask(RunPass())
        assert "second" in (await agent.node_record()).serving
        await place(agent.registry, "second", "node-b")
        await agent.settle()
        assert "second" not in (await agent.node_record()).serving


def test_the_serving_set_shows_a_blocked_start_unless_a_process_runs() -> None:
    blocked = BlockedStart("web", R1, "placement-unavailable: port range 1-2 has 0 free port(s)")
    entry = serving_set([], [], [blocked])["web"]
    assert (entry.state, entry.public_port) == ("starting", 0)
    assert not entry.ready
    assert entry.reason == "cannot start: placement-unavailable: port range 1-2 has 0 free port(s)"
    running = {
        "app": "web",
        "state": "running",
        "revision": R1,
        "public_port": 5,
        "internal_port": 6,
        "ready": True,
    }
    assert serving_set([running], [], [blocked])["web"].state == "running"
