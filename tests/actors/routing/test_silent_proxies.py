"""The lease holder tells a proxy that stopped reporting as one ``proxy.failed``
(in virtual time, on the in-memory registry)."""

from __future__ import annotations

import trio
import trio.testing

from corral.actors.routing import routing_renderer_child_spec
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    CoordinatorLease,
    MemoryRegistry,
    ProxyRecord,
    proxy_key,
)
from corral.supervision import open_actor_system


def record(
    reported_at: float, restarts: int = 0, *, down: bool = False, died: bool = False
) -> ProxyRecord:
    return ProxyRecord(
        "edge",
        "haproxy",
        "127.0.0.1:8080",
        pid=4242,
        host="h1",
        reported_at=reported_at,
        report_every=5.0,
        restarts=restarts,
        last_error="haproxy killed by SIGKILL" if died else None,
        since=None if down else 1.0,
    )


async def test_a_proxy_that_stops_reporting_is_told_once_by_the_lease_holder_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease("n1", 0.0).encode())
    await registry.put(proxy_key("edge"), record(reported_at=0.0).encode())
    wall = trio.current_time
    async with open_actor_system("n1") as holder, open_actor_system("n2") as other:
        await holder.spawn(routing_renderer_child_spec("n1", registry, wall_clock=wall))
        await other.spawn(routing_renderer_child_spec("n2", registry, wall_clock=wall))
        await trio.sleep(60)

        def failed(system: object) -> list[dict[str, object]]:
            events = system.events()  # type: ignore[attr-defined]
            return [e.fields for e in events if e.kind == "proxy.failed"]

        told = failed(holder)
        assert len(told) == 1  # once, though it stays silent for many checks
        assert told[0]["proxy"] == "edge"
        assert "not reporting for" in str(told[0]["error"])
        assert "pid 4242" in str(told[0]["error"])
        assert failed(other) == []  # not the lease holder: says nothing

        # It reports again, then its proxy process dies and is restarted: every node
        # tells the outage and the restart; silent again later, the holder tells that.
        await registry.put(proxy_key("edge"), record(trio.current_time()).encode())
        await trio.sleep(1)
        now = trio.current_time()
        await registry.put(proxy_key("edge"), record(now, down=True, died=True).encode())
        await trio.sleep(1)
        assert [f["error"] for f in failed(other)] == ["haproxy killed by SIGKILL"]
        now = trio.current_time()
        await registry.put(proxy_key("edge"), record(now, restarts=1, died=True).encode())
        await trio.sleep(1)
        (restarted,) = [e.fields for e in other.events() if e.kind == "proxy.restarted"]
        assert restarted["restarts"] == 1
        assert restarted["error"] == "haproxy killed by SIGKILL"
        assert len(failed(other)) == 1  # the restart itself is no new failure
        await trio.sleep(60)
        assert len(failed(holder)) == 3  # silent, the outage, silent again
