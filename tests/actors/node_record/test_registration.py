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
    Compare,
    MeasuredCapacity,
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
CAPACITY = MeasuredCapacity(memory_mb=1024, memory_free_mb=512, disk_mb=10_000, disk_free_mb=5_000)


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

    def probe() -> MeasuredCapacity:
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


# ---------------------------------------------------------------- one process per node id

OTHER = "b" * 32


def newcomer_record(change_token: int = 7) -> NodeRecord:
    return NodeRecord(
        id="n1", peer_address="127.0.0.1:7100", api_address="127.0.0.1:7101",
        instance=OTHER, pid=4242, hostname="elsewhere", change_token=change_token,
    )


async def test_a_node_cut_off_past_its_ttl_stops_when_a_newcomer_took_its_id(
    autojump_clock: object,
) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry, name="n1")
    taken: list[str] = []
    spec = node_registration_child_spec(
        IDENTITY, gate, capacity_probe=lambda: CAPACITY, lease_ttl=30.0,
        on_taken=lambda held: taken.append(held.taken_message()),
    )
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        mine = (await ref.ask(GetRegistration()))["instance"]
        assert len(mine) == 32
        gate.fail()  # as good as paused: nothing it sends reaches the registry
        await trio.sleep(31)  # past the TTL: the lease lapses and the record with it
        assert await read_node(registry) is None
        # A second process starts with the same node id and registers.
        lease = await registry.grant(30.0)
        await registry.put(node_key("n1"), newcomer_record().encode(), lease=lease.id)
        before = await registry.get(node_key("n1"))
        gate.restore()  # the first one resumes
        t0 = trio.current_time()
        while not taken:
            await trio.sleep(0.5)
        assert trio.current_time() - t0 <= 10.0 + 0.5  # by its next keepalive
        assert taken == [
            "node n1: another corral process (instance bbbbbbbbbbbb…, pid 4242 on host "
            "elsewhere, peer 127.0.0.1:7100, api 127.0.0.1:7101) now holds nodes/n1; this "
            "process stops. Give each node its own --node-id, or stop the other one."
        ]
        state = await ref.ask(GetRegistration())
        assert (state["registered"], state["instance"]) == (False, mine)
        assert state["taken_by"].startswith("instance bbbbbbbbbbbb…")
        async with trio.open_nursery() as newcomer:

            async def keep_alive() -> None:
                while True:
                    await registry.keepalive(lease.id)
                    await trio.sleep(10)

            newcomer.start_soon(keep_alive)
            await trio.sleep(120)  # it writes nothing more: no keepalive, no refresh, no retake
            assert len(taken) == 1
            assert await registry.get(node_key("n1")) == before
            await system.stop(ref)
            assert await registry.get(node_key("n1")) == before  # the newcomer's record stays
            newcomer.cancel_scope.cancel()


async def test_a_record_absent_after_a_pause_is_simply_written_again(
    autojump_clock: object,
) -> None:
    registry = MemoryRegistry()
    gate = RegistryGate(registry, name="n1")
    taken: list[object] = []
    spec = node_registration_child_spec(
        IDENTITY, gate, capacity_probe=lambda: CAPACITY, lease_ttl=30.0, on_taken=taken.append
    )
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        gate.fail()
        await trio.sleep(31)
        assert await read_node(registry) is None
        gate.restore()
        await trio.sleep(10.5)
        record = await read_node(registry)
        assert record is not None
        assert record.instance == (await ref.ask(GetRegistration()))["instance"]
        assert taken == []


async def test_the_first_write_refuses_a_live_record_of_another_instance(
    autojump_clock: object,
) -> None:
    """Two processes raced past the start check; the one that wrote second stops."""
    registry = MemoryRegistry()
    lease = await registry.grant(30.0)
    await registry.put(node_key("n1"), newcomer_record().encode(), lease=lease.id)
    taken: list[str] = []
    spec = node_registration_child_spec(
        IDENTITY, registry, capacity_probe=lambda: CAPACITY, lease_ttl=30.0,
        on_taken=lambda held: taken.append(held.instance),
    )
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        assert taken == [OTHER]
        record = await read_node(registry)
        assert record is not None
        assert record.instance == OTHER
        assert (await ref.ask(GetRegistration()))["registered"] is False


async def test_a_gone_previous_life_is_replaced_when_the_start_allowed_it(
    autojump_clock: object,
) -> None:
    registry = MemoryRegistry()
    lease = await registry.grant(30.0)
    await registry.put(node_key("n1"), newcomer_record(change_token=7).encode(), lease=lease.id)
    taken: list[object] = []
    spec = node_registration_child_spec(
        IDENTITY, registry, capacity_probe=lambda: CAPACITY, lease_ttl=30.0,
        on_taken=taken.append, replaces=OTHER,
    )
    async with open_actor_system("n1") as system:
        ref = await system.spawn(spec)
        record = await read_node(registry)
        assert record is not None
        assert record.instance == (await ref.ask(GetRegistration()))["instance"]
        assert (record.change_token, record.serving, taken) == (8, {}, [])


async def test_a_restarted_registration_writes_as_the_same_process(autojump_clock: object) -> None:
    registry = MemoryRegistry()
    taken: list[object] = []
    spec = node_registration_child_spec(
        IDENTITY, registry, capacity_probe=lambda: CAPACITY, lease_ttl=30.0, on_taken=taken.append
    )
    async with open_actor_system("n1") as system:
        first = await system.spawn(spec)
        instance = (await first.ask(GetRegistration()))["instance"]
        kv = await registry.get(node_key("n1"))
        assert kv is not None
        assert kv.lease is not None
        # The actor dies without its cleanup (its lease and record stay), and the spec
        # builds it again, as its supervisor would.
        await registry.put(node_key("n1"), kv.value)  # detach: the record outlives the lease
        await system.stop(first)
        second = await system.spawn(spec)
        assert (await second.ask(GetRegistration()))["instance"] == instance
        record = await read_node(registry)
        assert record is not None
        assert (record.instance, taken) == (instance, [])
