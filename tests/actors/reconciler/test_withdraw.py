"""An instance leaves the routing table before its process is stopped (virtual time).

A stop of an app no longer served here (a drain, a move, a delete) first
publishes the instance not ready and waits its app's ``drain_ms``; a node on its
way out sends :class:`Withdraw`, which does the same for everything it serves,
for good.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from corral.actors.process_supervisor._memory import Behaviour
from corral.actors.reconciler import RunPass, Withdraw
from corral.registry import RolloutOptions

from .test_reconciler import NODE, Agent, deploy, place, running_agent, until


async def _ready(agent: Agent) -> dict[str, bool | None]:
    return {app: e.ready for app, e in (await agent.node_record()).serving.items()}


async def test_a_stopped_instance_is_out_of_routing_for_its_drain_time_before_it_ends(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "shop", rollout=RolloutOptions(drain_ms=1500))
        await place(agent.registry, "shop", NODE)
        await agent.settle()
        assert await _ready(agent) == {"shop": True}
        (process,) = agent.launcher.alive()

        await place(agent.registry, "shop", "node-b")  # moved away (a drain, say)
        withdrawn_at: list[float] = []

        async def watch_record() -> None:
            while (await _ready(agent)).get("shop") is not False:
                await trio.sleep(0.001)
            withdrawn_at.append(trio.current_time())
            # Out of the table while the process still runs: in-flight requests finish.
            assert process.alive

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_record)
            await until(lambda: not process.alive, poll=0.001)
        stopped_at = trio.current_time()
        assert stopped_at - withdrawn_at[0] >= 1.5
        assert stopped_at - withdrawn_at[0] < 1.6
        await agent.settle()
        assert await _ready(agent) == {}  # gone from the serving set once stopped
        events = [e for e in agent.system.events() if e.kind == "reconcile.withdrawn"]
        assert [e.fields["apps"] for e in events] == [["shop"]]
        assert events[0].fields["drain"] == 1.5


async def test_a_drain_is_capped_and_an_instance_not_ready_is_stopped_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, max_drain=0.5) as agent:
        await deploy(agent.registry, "slow", rollout=RolloutOptions(drain_ms=60_000))
        await place(agent.registry, "slow", NODE)
        await agent.settle()
        (process,) = agent.launcher.alive()
        t0 = trio.current_time()
        await place(agent.registry, "slow", "node-b")
        await until(lambda: not process.alive, poll=0.001)
        assert trio.current_time() - t0 < 0.5 + 0.2  # the cap, not a minute

        # A stop of an instance no proxy routes to (never ready) waits for nothing.
        agent.launcher.behave("idle", Behaviour(ready_after=None))
        await deploy(agent.registry, "idle")
        await place(agent.registry, "idle", NODE)
        await until(lambda: len(agent.launcher.alive()) == 1, poll=0.001)
        await agent.settle()
        assert (await _ready(agent))["idle"] is False
        (idle,) = agent.launcher.alive()
        t1 = trio.current_time()
        await place(agent.registry, "idle", "node-b")
        await until(lambda: not idle.alive, poll=0.001)
        assert trio.current_time() - t1 < 0.2


async def test_a_withdrawn_node_publishes_every_instance_not_ready_until_it_stops(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        for app in ("blog", "shop"):
            await deploy(agent.registry, app)
            await place(agent.registry, app, NODE)
        await agent.settle()
        assert await _ready(agent) == {"blog": True, "shop": True}
        t0 = trio.current_time()
        withdrawn = await agent.reconciler.ask(Withdraw(max_drain=5.0), 30)
        # The default drain_ms (2000), under the 5 s asked for.
        assert trio.current_time() - t0 == 2.0
        assert withdrawn == ["blog", "shop"]
        assert await _ready(agent) == {"blog": False, "shop": False}
        assert len(agent.launcher.alive()) == 2  # nothing stopped: the node does that
        # A later pass (the timer, a change) does not put them back.
        await agent.reconciler.ask(RunPass(force=True))
        await trio.sleep(6)
        assert await _ready(agent) == {"blog": False, "shop": False}
        # A second withdrawal has nothing left to drain.
        t1 = trio.current_time()
        assert await agent.reconciler.ask(Withdraw(), 30) == []
        assert trio.current_time() == t1
