"""Every pass that did work emits ``reconcile.pass`` with its duration and the skipped
passes since: what makes ``/metrics``'s reconcile pass histogram exact."""

from __future__ import annotations

from pathlib import Path

import trio.testing

from corral.actors.reconciler import RunPass

from .test_reconciler import NODE, deploy, place, running_agent


async def test_a_pass_event_per_full_pass_counting_the_skipped_ones_between(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(tmp_path) as agent:
        await deploy(agent.registry, "web")
        await place(agent.registry, "web", NODE)
        await agent.settle()
        before = len([e for e in agent.system.events() if e.kind == "reconcile.pass"])
        assert before >= 1
        for _ in range(3):
            assert (await agent.reconciler.ask(RunPass()))["skipped"]
        summary = await agent.reconciler.ask(RunPass(force=True))
        passes = [e.fields for e in agent.system.events() if e.kind == "reconcile.pass"]
    assert len(passes) == before + 1
    last = passes[-1]
    assert last["duration"] == summary["duration"]
    # settle() ended on one skipped pass, then three more were skipped
    assert last["skipped_since"] == 4
    assert last["errors"] == 0
