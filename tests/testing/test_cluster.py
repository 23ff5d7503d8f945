"""The in-process Cluster harness: start, stop, kill, restart, partition, cut off."""

from __future__ import annotations

import pytest
import trio

from corral.actors.node_record import GetRegistration
from corral.supervision import Event
from corral.testing import Cluster, CoordinatorInterval, open_cluster

TTL = 30.0


async def test_nodes_register_with_their_labels(autojump_clock: object) -> None:
    async with open_cluster(["a", "b"], lease_ttl=TTL, labels={"a": {"zone": "x"}}) as cluster:
        assert cluster.running == ["a", "b"]
        record = await cluster.node_record("a")
        assert record is not None
        assert record.labels == {"zone": "x"}
        assert record.capacity is not None
        state = await cluster.node("b").registration.ask(GetRegistration())
        assert state["registered"] is True
    assert cluster.running == []


async def test_stop_hands_back_kill_leaves_leases_to_lapse(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        await cluster.stop("node-1")
        assert await cluster.node_record("node-1") is None  # revoked on the way out
        t0 = trio.current_time()
        await cluster.kill("node-2")
        assert not cluster.node("node-2").running
        assert await cluster.node_record("node-2") is not None  # nothing reached the registry
        await trio.sleep_until(t0 + TTL)
        assert await cluster.node_record("node-2") is None
        assert not cluster.network.reachable("node-3", "node-2")

        await cluster.restart("node-2")
        assert cluster.node("node-2").life == 2
        assert cluster.network.reachable("node-3", "node-2")
        assert await cluster.node_record("node-2") is not None
        # Events of both lives are kept.
        kinds = [e.kind for e in cluster.node("node-2").events()]
        assert kinds.count("node.registered") == 2


async def test_partition_and_registry_cut_are_separate(autojump_clock: object) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        cluster.partition({"node-1"}, {"node-2", "node-3"})
        assert not cluster.network.reachable("node-1", "node-2")
        assert cluster.network.reachable("node-2", "node-3")
        cluster.heal()
        assert cluster.network.reachable("node-1", "node-2")

        cluster.cut_registry("node-3")
        await trio.sleep(TTL + TTL / 3)
        assert await cluster.node_record("node-3") is None  # could not renew
        cluster.restore_registry("node-3")
        await trio.sleep(TTL / 3 + 1)
        assert await cluster.node_record("node-3") is not None

        await cluster.stop("node-3")
        with pytest.raises(RuntimeError, match="not running"):
            cluster.cut_registry("node-3")
        with pytest.raises(KeyError, match="no node"):
            cluster.node("node-9")
        with pytest.raises(ValueError, match="already exists"):
            await cluster.add_node("node-1")


async def test_wait_for_coordinator_times_out(autojump_clock: object) -> None:
    async with open_cluster(1, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        with pytest.raises(TimeoutError, match="no coordinator"):
            await cluster.wait_for_coordinator(exclude={holder}, within=5.0)
        assert await cluster.coordinator_state("node-1") is not None
        await cluster.stop("node-1")
        assert await cluster.coordinator_state("node-1") is None


async def test_assert_single_coordinator_spots_overlaps(autojump_clock: object) -> None:
    async with open_cluster(2, lease_ttl=TTL) as cluster:
        holder = await cluster.wait_for_coordinator()
        other = next(n for n in cluster.running if n != holder)
        (interval,) = cluster.assert_single_coordinator()
        assert interval == CoordinatorInterval(holder, interval.fence, 0.0, float("inf"))
        # Forge a second acquisition on the other node, overlapping the first.
        forged = Event(
            1.0, "coordinator.acquired", "/node/coordinator", {"fence": interval.fence + 1}
        )
        cluster.node(other).history.append(forged)
        with pytest.raises(AssertionError, match="two coordinators at once"):
            cluster.assert_single_coordinator()


async def test_plugin_fixture(corral_cluster: Cluster, autojump_clock: object) -> None:
    assert corral_cluster.running == ["node-1", "node-2", "node-3"]
    assert await corral_cluster.wait_for_coordinator() in corral_cluster.running
