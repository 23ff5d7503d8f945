"""Testing corral in-process: the Cluster harness and registry test doubles.

Embed corral in your own test suite the way its own tests do::

    from corral.testing import open_cluster

    async def test_failover(autojump_clock):
        async with open_cluster(3) as cluster:
            holder = await cluster.wait_for_coordinator()
            await cluster.kill(holder)
            assert await cluster.wait_for_coordinator(exclude={holder}) != holder
            cluster.assert_single_coordinator()

A pytest plugin with a ``corral_cluster`` fixture lives in
``corral.testing.pytest_plugin`` (``pytest_plugins = ["corral.testing.pytest_plugin"]``).
"""

from corral.testing._cluster import (
    DEFAULT_TEST_CAPACITY,
    VIRTUAL_EPOCH,
    Cluster,
    ClusterNode,
    CoordinatorInterval,
    NodeContext,
    agent_node_children,
    default_node_children,
    open_cluster,
    virtual_wall_clock,
)
from corral.testing._registry import CountingRegistry, GateMode, RegistryGate

__all__ = [
    "DEFAULT_TEST_CAPACITY",
    "VIRTUAL_EPOCH",
    "Cluster",
    "ClusterNode",
    "CoordinatorInterval",
    "CountingRegistry",
    "GateMode",
    "NodeContext",
    "RegistryGate",
    "agent_node_children",
    "default_node_children",
    "open_cluster",
    "virtual_wall_clock",
]
