"""Testing corral in-process: the Cluster harness and registry test doubles.

Embed corral in your own test suite the way its own tests do::

    from corral.testing import open_cluster

    async def test_failover(autojump_clock):
        async with open_cluster(3) as cluster:
            holder = await cluster.wait_for_coordinator()
            await cluster.kill(holder)
            assert await cluster.wait_for_coordinator(exclude={holder}) != holder
            cluster.assert_single_coordinator()

Load through a proxy, as its users see it: :class:`TrafficGenerator` sends
requests to a loopback address at a fixed rate (open loop, a new connection
per request, each with a timeout), tags each with the phase current when it
was sent, and reports failures by kind and p50/p99 per phase
(:class:`TrafficReport`); ``bench/traffic.py`` and the rolling-deploy end-to-end
test use it.

A pytest plugin with a ``corral_cluster`` fixture lives in
``corral.testing.pytest_plugin`` (``pytest_plugins = ["corral.testing.pytest_plugin"]``).

Writing your own transport or registry backend? Run the conformance suites the
built-in ones pass, as trio's ``check_two_way_stream`` is run on every stream:
:func:`check_transport` (give it a factory of connected transport pairs) and
:func:`check_registry` (a factory of :class:`RegistryHarness` objects, each a
fresh registry and a way to let lease time pass). See the README's "Your own
backend" section.

Waiting for something in a test: :func:`until` polls a predicate (plain or
async) under trio's clock, so with the ``autojump_clock`` fixture it waits in
virtual time, and returns the time it held; ``within`` bounds it with a
``trio.TooSlowError`` naming what was awaited::

    from corral.testing import until

    held_at = await until(lambda: node.state == "up", within=5.0, poll=0.1)
"""

from corral.testing._check_registry import (
    ManualClock,
    RegistryHarness,
    check_registry,
    take_events,
)
from corral.testing._check_transport import TransportPair, check_transport
from corral.testing._checks import CheckFailed
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
from corral.testing._etcd import (
    SECURE_PREFIX,
    SecureEtcd,
    etcd_endpoint_from_env,
    open_test_etcd_registry,
    run_secure_etcd,
)
from corral.testing._fleet import (
    Fault,
    FaultKind,
    Fleet,
    InvariantChecker,
    Violation,
    open_fleet,
    random_faults,
)
from corral.testing._hosts import Host, HostBed, HostEtcdMember, HostNode, open_hosts
from corral.testing._hosts_faults import LinkFaults
from corral.testing._hosts_net import HostBedError, require_netns
from corral.testing._placements import sync_app_specs, write_placement
from corral.testing._registry import CountingRegistry, GateMode, RegistryGate
from corral.testing._traffic import (
    PhaseSummary,
    RequestOutcome,
    TrafficGenerator,
    TrafficReport,
    percentile,
    summarize,
)
from corral.testing._until import until

__all__ = [
    "DEFAULT_TEST_CAPACITY",
    "SECURE_PREFIX",
    "VIRTUAL_EPOCH",
    "CheckFailed",
    "Cluster",
    "ClusterNode",
    "CoordinatorInterval",
    "CountingRegistry",
    "Fault",
    "FaultKind",
    "Fleet",
    "GateMode",
    "Host",
    "HostBed",
    "HostBedError",
    "HostEtcdMember",
    "HostNode",
    "InvariantChecker",
    "LinkFaults",
    "ManualClock",
    "NodeContext",
    "PhaseSummary",
    "RegistryGate",
    "RegistryHarness",
    "RequestOutcome",
    "SecureEtcd",
    "TrafficGenerator",
    "TrafficReport",
    "TransportPair",
    "Violation",
    "agent_node_children",
    "check_registry",
    "check_transport",
    "default_node_children",
    "etcd_endpoint_from_env",
    "open_cluster",
    "open_fleet",
    "open_hosts",
    "open_test_etcd_registry",
    "percentile",
    "random_faults",
    "require_netns",
    "run_secure_etcd",
    "summarize",
    "sync_app_specs",
    "take_events",
    "until",
    "virtual_wall_clock",
    "write_placement",
]
