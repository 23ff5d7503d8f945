"""A change of the declared memory alone is a new revision: every node restarts the app's
process with the new limit, and the invariant checker finds that restart justified."""

from __future__ import annotations

import trio

from corral.actors.process_supervisor._launcher import LaunchSpec
from corral.node._requests import DeployRequest
from corral.node.server._operations import apply_deploy
from corral.registry import AppRecord, Deployment
from corral.testing import Fleet, open_fleet

DIGEST = "3" * 64


def alive(fleet: Fleet) -> dict[tuple[str, int], LaunchSpec]:
    """(node, pid) -> spec of every live process of the fleet."""
    return {
        (node_id, p.pid): p.spec
        for node_id, node in fleet.cluster.nodes.items()
        for p in node.launcher.alive()
    }


async def test_a_memory_only_redeploy_restarts_the_process_with_the_new_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    artifact = Deployment.of(DIGEST, ["python3", "app.py"], {})
    async with open_fleet(3) as fleet:
        await fleet.cluster.wait_for_coordinator()
        first = apply_deploy(None, DeployRequest("web", b"", replicas=2), artifact)
        await fleet.put_app(first)
        await trio.sleep(30)
        before = alive(fleet)
        assert len(before) == 2
        assert {spec.memory_mb for spec in before.values()} == {0}

        # Only --memory-mb changes: same artifact, command and env.
        second = apply_deploy(first, DeployRequest("web", b"", memory_mb=256), artifact)
        assert isinstance(second, AppRecord)
        assert second.deployment is not None
        assert first.deployment is not None
        assert second.deployment.revision != first.deployment.revision
        await fleet.put_app(second)
        await trio.sleep(60)
        after = alive(fleet)
        assert len(after) == 2
        assert not set(after) & set(before)  # every process is a new one
        assert {spec.memory_mb for spec in after.values()} == {256}
        assert {spec.revision for spec in after.values()} == {second.deployment.revision}
        assert fleet.violations == []
