"""The engine over an in-memory driver: version order, failures kept and retried, events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from corral.actors.routing import RouteTable, encode_table_json
from corral.proxy import (
    InvalidProxySetup,
    ProxyApplyFailed,
    ProxyEngine,
    follow_routing,
    open_proxy,
)
from corral.proxy._driver import Applied, ProxyDriver
from corral.proxy._status import Verdict
from corral.registry import ROUTING_KEY, MemoryRegistry, RegistryUnavailable


class MemoryDriver(ProxyDriver):
    kind = "memory"

    def __init__(self) -> None:
        self.served: RouteTable | None = None
        self.refuse = False
        self.calls = 0

    @property
    def listen(self) -> str:
        return "127.0.0.1:1"

    @property
    def reloads(self) -> int:
        return 0

    async def apply(self, table: RouteTable) -> Applied:
        self.calls += 1
        if self.refuse:
            raise ProxyApplyFailed("refused on purpose")
        self.served = table
        return Applied("memory", 0.001)


def t(fence: int, revision: int) -> RouteTable:
    return RouteTable(fence, revision, {"a.test": (f"http://127.0.0.1:{1000 + revision}",)})


async def test_tables_apply_in_version_order_only() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    driver = MemoryDriver()
    engine = ProxyEngine(
        driver, proxy_id="p1", wall_clock=lambda: 42.0, emit=lambda k, **f: events.append((k, f))
    )
    assert await engine.offer(t(2, 5)) is Verdict.APPLY
    assert await engine.offer(t(2, 4)) is Verdict.OLDER
    assert await engine.offer(t(1, 9)) is Verdict.OLDER
    assert await engine.offer(t(2, 5)) is Verdict.ALREADY_APPLIED
    assert await engine.offer(t(3, 1), min_fence=4) is Verdict.STALE_FENCE
    assert driver.calls == 1
    assert driver.served == t(2, 5)
    status = engine.status
    assert (status.applied_fence, status.applied_revision, status.applied_at) == (2, 5, 42.0)
    assert (status.seen_fence, status.seen_revision) == (3, 1)
    assert [k for k, _ in events] == ["proxy.applied"]
    assert events[0][1] == {
        "proxy": "p1",
        "fence": 2,
        "revision": 5,
        "how": "memory",
        "seconds": 0.001,
    }


async def test_a_refused_table_is_recorded_and_retried_when_offered_again() -> None:
    events: list[str] = []
    driver = MemoryDriver()
    engine = ProxyEngine(driver, proxy_id="p1", emit=lambda k, **f: events.append(k))
    await engine.offer(t(1, 1))
    driver.refuse = True
    assert await engine.offer(t(1, 2)) is Verdict.APPLY
    assert engine.status.error == "refused on purpose"
    assert engine.status.applied_revision == 1  # the old table is still what it serves
    driver.refuse = False
    await engine.offer(t(1, 2))
    assert engine.status.error is None
    assert engine.status.applied_revision == 2
    assert events == ["proxy.applied", "proxy.failed", "proxy.applied"]


@pytest.mark.parametrize("bad", [b"{", b'{"v":1,"fence":1,"revision":1,"domains":{"a.test":[]}}'])
async def test_follow_routing_skips_a_bad_value(bad: bytes) -> None:
    registry = MemoryRegistry()
    driver = MemoryDriver()
    engine = ProxyEngine(driver, proxy_id="p1")
    async with trio.open_nursery() as nursery:
        await nursery.start(follow_routing, registry, engine)
        await registry.put(ROUTING_KEY, bad)
        await registry.put(ROUTING_KEY, encode_table_json(t(1, 3)))
        with trio.fail_after(5):
            while engine.status.applied_revision != 3:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert driver.calls == 1


async def test_a_malformed_table_never_reaches_the_driver() -> None:
    driver = MemoryDriver()
    engine = ProxyEngine(driver, proxy_id="p1")
    bad = RouteTable(1, 1, {"Bad_Domain\nbackend x": ("http://127.0.0.1:1",)})
    await engine.offer(bad)
    assert driver.calls == 0
    assert engine.status.error is not None
    assert "invalid domain" in engine.status.error
    await engine.offer(RouteTable(1, 2, {"a.test": ("http://127.0.0.1:1/x",)}))
    assert driver.calls == 0
    assert "more than http://host:port" in (engine.status.error or "")


@pytest.mark.parametrize("listen", ["8080", "127.0.0.1", "127.0.0.1:0", "a b:80", "h:99999"])
async def test_bad_listen_addresses_are_refused(listen: str) -> None:
    with pytest.raises(InvalidProxySetup, match="HOST:PORT"):
        async with open_proxy("haproxy", listen=listen, data_dir=Path("/tmp/unused")):
            pass


async def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InvalidProxySetup, match="use haproxy or caddy"):
        async with open_proxy("nginx", listen="127.0.0.1:1", data_dir=Path("/tmp/unused")):
            pass


class FlakyRegistry(MemoryRegistry):
    """Fails its first ``revision()`` read, as an unreachable etcd would."""

    failures = 1

    async def revision(self) -> int:
        if self.failures:
            self.failures -= 1
            raise RegistryUnavailable("etcd at 127.0.0.1:2379 is unreachable (test)")
        return await super().revision()


async def test_follow_routing_reads_again_after_the_registry_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = FlakyRegistry()
    await registry.put(ROUTING_KEY, encode_table_json(t(1, 1)))
    driver = MemoryDriver()
    engine = ProxyEngine(driver, proxy_id="p1")
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(follow_routing, registry, engine)
        assert trio.current_time() - t0 == 1.0  # one retry_interval
        assert engine.status.applied_revision == 1
        nursery.cancel_scope.cancel()
