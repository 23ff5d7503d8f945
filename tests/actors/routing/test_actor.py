"""The RoutingRenderer actor on the in-memory registry, in virtual time."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from corral.actors.routing import (
    GetRoutingState,
    RouteTable,
    RoutingState,
    TableVersion,
    decode_table_json,
    routing_renderer_child_spec,
)
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    ROUTING_KEY,
    AliasRecord,
    AppRecord,
    CoordinatorLease,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    alias_key,
    app_key,
    node_key,
    placement_key,
)
from corral.supervision import ActorSystem, open_actor_system
from corral.testing import until

REV = "a" * 64


async def seed(registry: MemoryRegistry, *, ready: dict[str, bool | None]) -> None:
    await registry.put(app_key("shop"), AppRecord("shop", domains=["shop.test"]).encode())
    await registry.put(app_key("blog"), AppRecord("blog", domains=["blog.test"]).encode())
    for app in ("shop", "blog"):
        await registry.put(
            placement_key(app), PlacementRecord(["n1", "n2"], decided_at=0.0, fence=1).encode()
        )
    for index, node in enumerate(("n1", "n2"), start=1):
        await put_node(registry, node, f"10.0.0.{index}", ready=ready.get(node))


async def put_node(
    registry: MemoryRegistry, node: str, host: str, *, ready: bool | None, state: str = "running"
) -> None:
    serving = {
        "shop": ServingEntry(REV, 24001, 24501, state=state, ready=ready),  # type: ignore[arg-type]
        "blog": ServingEntry(REV, 24002, 24502, state="running", ready=True),
    }
    await registry.put(
        node_key(node), NodeRecord(node, advertise_host=host, serving=serving).encode()
    )


async def table(registry: MemoryRegistry) -> RouteTable | None:
    kv = await registry.get(ROUTING_KEY)
    return None if kv is None else decode_table_json(kv.value)


async def state(system: ActorSystem) -> RoutingState:
    answer = await system.ref("/routing").ask(GetRoutingState())
    assert isinstance(answer, RoutingState)
    return answer


async def test_only_the_lease_holder_writes_and_readiness_decides_the_backends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": False})
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry, resync=5.0))
        await trio.sleep(30)
        assert await table(registry) is None  # nobody holds the lease: nothing written
        assert (await state(system)).fence is None

        await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
        lease = await registry.get(COORDINATOR_LEASE_KEY)
        assert lease is not None
        t0 = trio.current_time()
        while await table(registry) is None:
            await trio.sleep(0.01)
        assert trio.current_time() - t0 < 1.0  # the lease watch, not the resync, woke it
        first = await table(registry)
        assert first is not None
        assert first.fence == lease.create_revision
        # n2's shop instance runs but is not ready: held back, never listed.
        assert first.domains["shop.test"] == ("http://10.0.0.1:24001",)
        assert first.domains["blog.test"] == ("http://10.0.0.1:24002", "http://10.0.0.2:24002")
        assert any(h.node == "n2" and "not ready" in h.why for h in first.held_back)

        # n2 turns ready: one new table with it, a routing.changed naming it.
        await put_node(registry, "n2", "10.0.0.2", ready=True)
        await until(
            lambda: any(
                e.kind == "routing.changed" and e.fields["revision"] == 2 for e in system.events()
            ),
            within=60.0,
            poll=0.01,
        )
        second = await table(registry)
        assert second is not None
        assert second.revision == first.revision + 1
        assert second.domains["shop.test"] == ("http://10.0.0.1:24001", "http://10.0.0.2:24001")
        event = [e for e in system.events() if e.kind == "routing.changed"][-1]
        assert event.fields["backends_added"] == {"shop.test": ["http://10.0.0.2:24001"]}

        # Nothing changes: passes go on, no write.
        writes = (await state(system)).writes
        await trio.sleep(60)
        after = await state(system)
        assert after.writes == writes
        assert after.passes > writes
        assert after.version == TableVersion(first.fence, second.revision)


async def test_an_alias_flip_and_a_lost_instance_each_make_one_table(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    await registry.put(alias_key("www.test"), AliasRecord("shop").encode())
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry))
        await until(
            lambda: any(e.kind == "routing.changed" for e in system.events()),
            within=60.0,
            poll=0.01,
        )
        first = await table(registry)
        assert first is not None
        assert first.domains["www.test"] == first.domains["shop.test"]

        await registry.put(alias_key("www.test"), AliasRecord("blog").encode())
        await until(
            lambda: len([e for e in system.events() if e.kind == "routing.changed"]) == 2,
            within=60.0,
            poll=0.01,
        )
        flipped = await table(registry)
        assert flipped is not None
        assert flipped.revision == first.revision + 1
        assert flipped.domains["www.test"] == flipped.domains["blog.test"]

        await put_node(registry, "n2", "10.0.0.2", ready=None, state="crash-loop")
        await until(
            lambda: len([e for e in system.events() if e.kind == "routing.changed"]) == 3,
            within=60.0,
            poll=0.01,
        )
        lost = await table(registry)
        assert lost is not None
        assert lost.domains["shop.test"] == ("http://10.0.0.1:24001",)


async def test_a_node_that_does_not_hold_the_lease_never_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n2", 0.0).encode())
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry, resync=1.0))
        await trio.sleep(20)
        assert await table(registry) is None
        assert (await state(system)).fence is None


async def test_pushes_go_to_every_target_and_a_failing_one_is_retried_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    got: list[TableVersion] = []
    attempts = 0

    async def good(table: RouteTable) -> None:
        got.append(table.version)

    async def flaky(table: RouteTable) -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ConnectionRefusedError("caddy is not up yet")

    pushers = {"caddy=http://127.0.0.1:1": good, "caddy=http://127.0.0.1:2": flaky}
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry, pushers=pushers))
        await until(lambda: attempts >= 3, within=60.0, poll=0.01)
        await trio.sleep(5)
        current = await table(registry)
        assert current is not None
        assert got == [current.version]  # once: the good target is not pushed twice
        final = await state(system)
        assert final.pushed == {name: current.version for name in pushers}
        assert final.push_errors == {}
        kinds = [e.kind for e in system.events()]
        assert kinds.count("proxy.failed") == 2
        assert kinds.count("proxy.applied") == 2


@pytest.mark.parametrize("ready", [None, True])
def test_records_without_readiness_count_running_as_ready(ready: bool | None) -> None:
    from corral.actors.routing._render import node_routes_from_record

    record = NodeRecord(
        "n1",
        advertise_host="h",
        serving={"a": ServingEntry(REV, 24001, 24501, state="running", ready=ready)},
    )
    decoded = NodeRecord.from_json(__import__("json").loads(record.encode()))
    assert decoded.serving["a"].ready is ready
    assert node_routes_from_record(decoded).instances["a"].ready
    not_ready = NodeRecord(
        "n1",
        advertise_host="h",
        serving={"a": ServingEntry(REV, 24001, 24501, state="running", ready=False)},
    )
    assert not node_routes_from_record(not_ready).instances["a"].ready


async def test_the_first_change_renders_at_once_and_a_burst_is_rendered_in_few_passes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    await registry.put(alias_key("www.test"), AliasRecord("shop").encode())
    async with open_actor_system("n1") as system:
        await system.spawn(routing_renderer_child_spec("n1", registry, debounce=0.05))
        await until(
            lambda: any(e.kind == "routing.changed" for e in system.events()),
            within=60.0,
            poll=0.01,
        )
        await trio.sleep(1)
        passes = (await state(system)).passes
        t0 = trio.current_time()
        await registry.put(alias_key("www.test"), AliasRecord("blog").encode())
        while (current := await table(registry)) is None or (
            current.domains["www.test"] != current.domains["blog.test"]
        ):
            await trio.sleep(0.001)
        assert trio.current_time() - t0 < 0.01  # no waiting for calm first
        # 100 flips within a second: at most one pass per 50 ms, and the last one wins.
        t1 = trio.current_time()
        for i in range(100):
            target = "shop" if i % 2 == 0 else "blog"
            await registry.put(alias_key("www.test"), AliasRecord(target).encode())
            await trio.sleep(0.01)
        await trio.sleep(1)
        done = await state(system)
        elapsed = trio.current_time() - t1
        assert done.passes - passes <= elapsed / 0.05 + 2
        final = await table(registry)
        assert final is not None
        assert final.domains["www.test"] == final.domains["blog.test"]


async def test_a_node_that_loses_the_lease_stops_writing_and_the_new_holder_takes_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    async with open_actor_system("n1") as one, open_actor_system("n2") as two:
        await one.spawn(routing_renderer_child_spec("n1", registry))
        await two.spawn(routing_renderer_child_spec("n2", registry))
        await until(
            lambda: any(e.kind == "routing.changed" for e in one.events()), within=60.0, poll=0.01
        )
        first = await table(registry)
        assert first is not None
        # The lease moves to n2 (a new key: a new, larger fence).
        await registry.delete(COORDINATOR_LEASE_KEY)
        await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n2", 0.0).encode())
        lease = await registry.get(COORDINATOR_LEASE_KEY)
        assert lease is not None
        await registry.put(alias_key("www.test"), AliasRecord("blog").encode())
        await until(
            lambda: any(e.kind == "routing.changed" for e in two.events()), within=60.0, poll=0.01
        )
        after = await table(registry)
        assert after is not None
        assert after.fence == lease.create_revision > first.fence
        assert after.domains["www.test"] == after.domains["blog.test"]
        assert (await state(one)).fence is None
        assert (await state(two)).fence == lease.create_revision
        assert len([e for e in one.events() if e.kind == "routing.changed"]) == 1


async def test_a_hanging_push_target_never_holds_a_render_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await seed(registry, ready={"n1": True, "n2": True})
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    await registry.put(alias_key("www.test"), AliasRecord("shop").encode())

    async def hangs(table: RouteTable) -> None:
        await trio.sleep_forever()

    async with open_actor_system("n1") as system:
        await system.spawn(
            routing_renderer_child_spec("n1", registry, pushers={"caddy=http://h:1": hangs})
        )
        await until(
            lambda: any(e.kind == "routing.changed" for e in system.events()),
            within=60.0,
            poll=0.01,
        )
        t0 = trio.current_time()
        await registry.put(alias_key("www.test"), AliasRecord("blog").encode())
        while (current := await table(registry)) is None or (
            current.domains["www.test"] != current.domains["blog.test"]
        ):
            await trio.sleep(0.001)
        assert trio.current_time() - t0 < 0.1  # the push of the first table still hangs
        await trio.sleep(30)
        final = await state(system)
        assert "TooSlowError" in final.push_errors["caddy=http://h:1"]
        assert final.pushed["caddy=http://h:1"] is None
