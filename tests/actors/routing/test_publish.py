"""One RoutingRenderer pass against a real registry backend (memory and SQLite)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from corral.actors.routing import decode_table_json, publish_routes
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    ROUTING_KEY,
    AliasRecord,
    AppRecord,
    CoordinatorLease,
    MemoryRegistry,
    NodeRecord,
    NodeRollout,
    PlacementRecord,
    Registry,
    RolloutRecord,
    ServingEntry,
    SQLiteRegistry,
    alias_key,
    alias_previous_key,
    app_key,
    node_key,
    placement_key,
)

REV = "a" * 64


@asynccontextmanager
async def backend(name: str, tmp_path: Path) -> AsyncIterator[Registry]:
    if name == "memory":
        yield MemoryRegistry()
        return
    registry = await SQLiteRegistry.open(tmp_path / "registry.db", clock=trio.current_time)
    try:
        yield registry
    finally:
        await registry.aclose()


async def coordinate(registry: Registry) -> int:
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    kv = await registry.get(COORDINATOR_LEASE_KEY)
    assert kv is not None
    return kv.create_revision


async def seed(registry: Registry) -> None:
    await registry.put(app_key("shop"), AppRecord("shop", domains=["shop.test"]).encode())
    await registry.put(app_key("blog"), AppRecord("blog", domains=["blog.test"]).encode())
    for app in ("shop", "blog"):
        await registry.put(
            placement_key(app), PlacementRecord(["n1", "n2"], decided_at=0.0, fence=1).encode()
        )
    for node, host, state in (("n1", "10.0.0.1", "running"), ("n2", "10.0.0.2", "starting")):
        serving = {
            "shop": ServingEntry(REV, 24001, 24501, state=state),  # type: ignore[arg-type]
            "blog": ServingEntry(REV, 24002, 24502, state="running"),
        }
        record = NodeRecord(id=node, advertise_host=host, serving=serving)
        await registry.put(node_key(node), record.encode())
    await registry.put(alias_key("www.test"), AliasRecord("shop").encode())
    await registry.put(alias_previous_key("www.test"), AliasRecord("blog").encode())


@pytest.mark.parametrize("name", ["memory", "sqlite"])
async def test_a_pass_writes_the_table_once_and_then_only_changes(
    name: str, tmp_path: Path
) -> None:
    async with backend(name, tmp_path) as registry:
        fence = await coordinate(registry)
        await seed(registry)
        first = await publish_routes(registry, fence=fence)
        assert first.written is not None
        assert first.written.domains == {
            "blog.test": ("http://10.0.0.1:24002", "http://10.0.0.2:24002"),
            "shop.test": ("http://10.0.0.1:24001",),
            "www.test": ("http://10.0.0.1:24001",),
        }
        assert [(h.app, h.node) for h in first.written.held_back] == [("shop", "n2")]
        assert first.diff is not None
        assert first.diff.domains_added == ("blog.test", "shop.test", "www.test")
        kv = await registry.get(ROUTING_KEY)
        assert kv is not None
        assert decode_table_json(kv.value) == first.written
        # Unchanged inputs: nothing written.
        again = await publish_routes(registry, fence=fence)
        assert again.written is None
        assert again.why == "unchanged"
        assert (await registry.get(ROUTING_KEY)).mod_revision == kv.mod_revision  # type: ignore[union-attr]
        # An alias flip: one revision more, the diff names it.
        await registry.put(alias_key("www.test"), AliasRecord("blog").encode())
        flipped = await publish_routes(registry, fence=fence)
        assert flipped.written is not None
        assert flipped.written.version.revision == first.written.version.revision + 1
        assert flipped.diff is not None
        assert flipped.diff.backends_removed == {"www.test": ("http://10.0.0.1:24001",)}


@pytest.mark.parametrize("name", ["memory", "sqlite"])
async def test_a_stale_coordinator_writes_nothing(name: str, tmp_path: Path) -> None:
    async with backend(name, tmp_path) as registry:
        fence = await coordinate(registry)
        await seed(registry)
        # A newer coordinator took the lease: our fence no longer matches.
        await registry.delete(COORDINATOR_LEASE_KEY)
        await coordinate(registry)
        stale = await publish_routes(registry, fence=fence)
        assert stale.written is None
        assert "fence" in stale.why
        assert await registry.get(ROUTING_KEY) is None


async def test_garbage_under_routing_is_replaced_with_a_larger_revision() -> None:
    registry = MemoryRegistry()
    fence = await coordinate(registry)
    await seed(registry)
    for _ in range(3):
        await registry.put(ROUTING_KEY, b"garbage")
    published = await publish_routes(registry, fence=fence)
    assert published.written is not None
    assert published.written.revision > 3
    await registry.put(app_key("bad"), b"{not json")
    again = await publish_routes(registry, fence=fence)
    assert again.undecodable == (app_key("bad"),)


async def test_a_node_a_rollout_took_out_is_left_out_of_the_table() -> None:
    registry = MemoryRegistry()
    fence = await coordinate(registry)
    await seed(registry)
    rollout = RolloutRecord(
        REV, {"n1": NodeRollout(REV, "draining", 1.0), "n2": NodeRollout(REV, "done", 1.0)}
    )
    placement = PlacementRecord(["n1", "n2"], decided_at=0.0, fence=fence, rollout=rollout)
    await registry.put(placement_key("blog"), placement.encode())
    published = await publish_routes(registry, fence=fence)
    assert published.written is not None
    # n1's blog is running and ready, but a rollout drains it: only n2 is listed.
    assert published.written.domains["blog.test"] == ("http://10.0.0.2:24002",)
    assert published.written.domains["shop.test"] == ("http://10.0.0.1:24001",)
    held = [h for h in published.written.held_back if h.app == "blog"]
    assert [(h.node, h.why) for h in held] == [("n1", "out of the table for a rolling deploy")]
