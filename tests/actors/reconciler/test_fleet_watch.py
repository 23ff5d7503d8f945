"""What a deploy costs the nodes' watches as the fleet grows: nothing per node that
the deploy does not concern (each reconciler watches only its assignment index)."""

from __future__ import annotations

from collections import Counter

import trio
import trio.testing

from corral.registry import AppRecord, Deployment, MemoryRegistry
from corral.testing import CountingRegistry, open_fleet

R1 = "1" * 64
DEPLOYED = 12


class DeliveryCount(CountingRegistry):
    """Counts the events every watch delivers, by the prefix it was opened on."""

    def __init__(self) -> None:
        super().__init__(MemoryRegistry())


def app(name: str) -> AppRecord:
    return AppRecord(name, replicas=2, deployment=Deployment(R1, ["python3", "app.py"]))


async def reconciler_deliveries_per_app(nodes: int) -> tuple[float, Counter[str]]:
    """Watch events delivered to reconcilers per app deployed on a settled fleet."""
    registry = DeliveryCount()
    async with open_fleet(nodes, registry=registry) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("first"))
        await trio.sleep(30)
        registry.delivered.clear()
        for i in range(DEPLOYED):
            await fleet.put_app(app(f"app-{i}"))
        await trio.sleep(30)
        assert not fleet.checker.check_converged()
        # The reconcilers' watches: today assign/<node>; before, placement/ and apps/
        # (the coordinator and the checker watch those too, one watch each).
        own = Counter({p: n for p, n in registry.delivered.items() if p.startswith("assign/")})
        shared = registry.delivered["placement/"] + registry.delivered["apps/"]
        return (sum(own.values()) + shared) / DEPLOYED, registry.delivered


async def test_watch_deliveries_per_deployed_app_stay_flat_as_the_fleet_grows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    small, small_seen = await reconciler_deliveries_per_app(3)
    large, large_seen = await reconciler_deliveries_per_app(9)
    # Each app's two instances move two nodes' indexes, whatever the fleet's size;
    # a watch over every placement grows with the number of nodes (3x here).
    assert large <= 1.3 * small, (small, large, small_seen, large_seen)
