"""A revision no holder can give: the instance stays ``starting`` with the reason (and the
holders tried), retried on the backoff, rather than ``failed``."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from corral.actors.reconciler._backoff import record_failure
from corral.actors.reconciler._plan import serving_set
from corral.node import ArtifactNotFound
from corral.registry import Deployment

from .test_reconciler import NODE, R1, deploy, place, running_agent

WHY = f"artifact {R1} is neither on this node, in the registry, nor on any peer (tried 2: ...)"


async def unreachable(app: str, deployment: Deployment) -> Path:
    raise ArtifactNotFound(WHY)


async def test_an_unreachable_revision_leaves_the_instance_starting(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_agent(
        tmp_path, materialize=unreachable, interval=10_000.0, full_pass_every=100_000.0
    ) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await trio.sleep(30)
        entry = (await agent.node_record()).serving["hello"]
        assert (entry.state, entry.revision, entry.public_port) == ("starting", R1, 0)
        assert entry.reason == f"cannot get revision {R1[:12]} onto disk: {WHY}"
        failures = [e for e in agent.system.events() if e.kind == "reconcile.unpack_failed"]
        assert len(failures) >= 3  # tried again on the backoff
        assert agent.launcher.spawned == []


def test_the_serving_set_shows_an_unreachable_revision_starting() -> None:
    failure = record_failure(None, "web", R1, "no holder", 0.0, starting=True)
    assert serving_set([], [failure])["web"].state == "starting"
    assert serving_set([], [record_failure(None, "web", R1, "bad", 0.0)])["web"].state == ("failed")
