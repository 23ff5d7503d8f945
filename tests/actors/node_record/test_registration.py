"""The NodeRegistration actor against the memory registry, in virtual time."""

from __future__ import annotations

import dataclasses

import trio

from corral.actors.node_record import (
    GetRegistration,
    NodeIdentity,
    node_registration_child_spec,
)
from corral.registry import (
    Capacity,
    Compare,
    MemoryRegistry,
    NodeRecord,
    Put,
    ServingEntry,
    decode_record,
    node_key,
)
from corral.supervision import open_actor_system
from corral.testing import RegistryGate

IDENTITY = NodeIdentity("n1", labels={"zone": "a"}, peer_address="127.0.0.1:7000")
CAPACITY = Capacity(memory_mb=1024, memory_free_mb=512, disk_mb=10_000, disk_free_mb=5_000)


async def read_node(registry: MemoryRegistry) -> NodeRecord | None:
    kv = await registry.get(node_key("n1"))
    if kv is None:
        return None
    record = decode_record(kv.key, kv.value)
    assert isinstance(record, NodeRecord)
    return record


async def test_registers_keeps_alive_and_hands_back_on_stop(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    spec = node_registration_child_spec(
        IDENTITY, registry, capacity_probe=lambda: CAPACITY, wall_clock=lambda: 1000.0,
        lease_ttl=30.0,
    )
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        record = await read_node(registry)
        assert record is not None
        assert (record.state, record.labels, record.capacity, record.started_at) == (
            "alive", {"zone": "a"}, CAPACITY, 1000.0,
        )
        await trio.sleep(300)  # ten TTLs: only the keepalive keeps it there
        assert await read_node(registry) is not None
        state = await ref.ask(GetRegistration())
        assert state["registered"] is True
        assert state["registrations"] == 1
        t0 = trio.current_time()
        await system.stop(ref)
        assert trio.current_time() - t0 < 1.0
        assert await read_node(registry) is None


async def test_capacity_refresh_preserves_the_reconcilers_fields(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    free = [512]

    def probe() -> Capacity:
        return dataclasses.replace(CAPACITY, memory_free_mb=free[0])

    spec = node_registration_child_spec(
        IDENTITY, registry, capacity_probe=probe, lease_ttl=30.0, capacity_interval=10.0
    )
    async with open_actor_system("n1") as system:
        await system.spawn(spec)
        # The reconciler publishes its serving set (read-modify-write, same lease).
        kv = await registry.get(node_key("n1"))
        assert kv is not None
        stored = await read_node(registry)
        assert stored is not None
        serving = {"web": ServingEntry("b" * 64, 24000, 24001, "running")}
        published = dataclasses.replace(stored, serving=serving, change_token=5)
        result = await registry.txn(
            [Compare.mod_revision_is(kv.key, kv.mod_revision)],
            [Put(kv.key, published.encode(), lease=kv.lease)],
        )
        assert result.succeeded
        writes_before = await registry.revision()
        await trio.sleep(25)  # two refreshes, nothing changed: nothing written
        assert await registry.revision() == writes_before
        free[0] = 100
        await trio.sleep(10)
        record = await read_node(registry)
        assert record is not None
        assert record.capacity is not None
        assert record.capacity.memory_free_mb == 100
        assert (record.serving, record.change_token) == (serving, 5)


async def test_lost_lease_is_granted_again_and_the_record_rewritten(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    spec = node_registration_child_spec(IDENTITY, registry, capacity_probe=lambda: CAPACITY,
                                        lease_ttl=30.0)
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        kv = await registry.get(node_key("n1"))
        assert kv is not None
        assert kv.lease is not None
        await registry.revoke(kv.lease)  # the lease is gone (an expiry would do the same)
        assert await read_node(registry) is None
        await trio.sleep(10.5)  # the next keepalive, at a third of the TTL
        again = await registry.get(node_key("n1"))
        assert again is not None
        assert again.lease not in (None, kv.lease)
        record = await read_node(registry)
        assert record is not None
        assert record.change_token == 1
        state = await ref.ask(GetRegistration())
        assert (state["registrations"], state["lease_losses"]) == (2, 1)


async def test_cut_off_node_record_expires_after_the_ttl(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry, name="n1")
    spec = node_registration_child_spec(IDENTITY, gate, capacity_probe=lambda: CAPACITY,
                                        lease_ttl=30.0)
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        t0 = trio.current_time()
        gate.kill()
        await system.stop(ref)  # the revoke cannot reach the registry
        assert await read_node(registry) is not None
        await trio.sleep_until(t0 + 30.0)
        assert await read_node(registry) is None


async def test_registers_once_the_registry_comes_back(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry, name="n1")
    gate.fail()
    spec = node_registration_child_spec(IDENTITY, gate, capacity_probe=lambda: None,
                                        lease_ttl=30.0)
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        state = await ref.ask(GetRegistration())
        assert state["registered"] is False
        assert "registry cut off" in state["last_error"]
        gate.restore()
        await trio.sleep(10.5)
        assert await read_node(registry) is not None
        assert (await ref.ask(GetRegistration()))["registered"] is True
