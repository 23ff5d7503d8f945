"""A three-member etcd cluster with a silent first endpoint, then a dead leader
(issue 26): the client keeps answering within bounds sized from the lease TTL,
keeps a 4 s lease alive, keeps a watch delivering, and loses no acknowledged write.

Each test starts its own cluster on free loopback ports (never the etcd of
CORRAL_TEST_ETCD) and stops it by pid.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
import trio

from corral.registry import Compare, EtcdRegistry, Put, WatchEvent
from corral.testing._etcd import EtcdCluster, run_etcd_cluster

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

LEASE_TTL = 4.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with run_etcd_cluster(tmp_path) as running:
        yield running


def client(cluster: EtcdCluster) -> EtcdRegistry:
    return EtcdRegistry(
        cluster.endpoints, prefix=f"corral-test/{uuid.uuid4().hex}/", lease_ttl=LEASE_TTL
    )


async def timed(call: Awaitable[object]) -> float:
    started = trio.current_time()
    await call
    return trio.current_time() - started


@pytest.mark.parametrize(
    ("frozen_role", "first_bound"),
    [
        # A silent follower: one 0.5 s attempt, then the next endpoint answers.
        ("follower", 1.5),
        # A silent leader: the others answer once they elected a new one (their
        # election timeout here is 1 to 2 s, randomized).
        ("leader", 4.0),
    ],
)
async def test_a_frozen_first_endpoint_costs_one_short_attempt(
    cluster: EtcdCluster, frozen_role: str, first_bound: float
) -> None:
    first_member = cluster.members[0]
    leader = first_member if frozen_role == "leader" else cluster.members[1]
    await trio.to_thread.run_sync(cluster.hand_leadership_to, leader)
    registry = client(cluster)
    try:
        assert registry.request_timeout == LEASE_TTL / 8
        await registry.put("apps/a", b"1")
        lease = await registry.grant(LEASE_TTL)
        await registry.put("nodes/n1", b"up", lease=lease.id)
        received: list[WatchEvent] = []
        lapsed = False

        async def keep_alive() -> None:
            nonlocal lapsed
            while True:
                await trio.sleep(LEASE_TTL / 3)
                try:
                    await registry.keepalive(lease.id)
                except Exception:  # the assertion below says what went wrong
                    lapsed = True
                    raise

        async with registry.watch("apps/") as events, trio.open_nursery() as nursery:

            async def collect() -> None:
                async for event in events:
                    received.append(event)

            nursery.start_soon(collect)
            nursery.start_soon(keep_alive)
            cluster.members[0].freeze()
            try:
                first = await timed(registry.get("apps/a"))
                later = [await timed(registry.get("apps/a")) for _ in range(5)]
                put = await timed(registry.put("apps/b", b"2"))
                kv = await registry.get("apps/b")
                assert kv is not None
                txn = await timed(
                    registry.txn(
                        [Compare.mod_revision_is("apps/b", kv.mod_revision)],
                        [Put("apps/b", b"3")],
                    )
                )
                with trio.fail_after(8):
                    while [e.kv.key for e in received].count("apps/b") < 2:
                        await trio.sleep(0.05)
                # Through the freeze for two more TTLs: the lease must hold.
                await trio.sleep(2 * LEASE_TTL)
                assert not lapsed
                assert await registry.get("nodes/n1") is not None, "the 4 s lease lapsed"
                await registry.put("apps/c", b"4")
                with trio.fail_after(4):
                    while "apps/c" not in {e.kv.key for e in received}:
                        await trio.sleep(0.05)
            finally:
                cluster.members[0].resume()
            nursery.cancel_scope.cancel()
        print(
            f"first get {first:.3f} s, later gets up to {max(later):.3f} s, put {put:.3f} s, "
            f"txn {txn:.3f} s"
        )
        assert first < first_bound, f"first get after the freeze took {first:.2f} s"
        assert max(later) < 0.3, f"later gets took up to {max(later):.2f} s"
        assert put < 1.5, f"a put took {put:.2f} s"
        assert txn < 1.5, f"a guarded txn took {txn:.2f} s"
        assert [e.kv.value for e in received if e.kv.key == "apps/b"] == [b"2", b"3"]
    finally:
        await registry.delete("", prefix=True)
        await registry.aclose()


async def test_a_killed_leader_loses_no_acknowledged_write(cluster: EtcdCluster) -> None:
    registry = client(cluster)
    acknowledged: dict[str, bytes] = {}
    renewal_failures: list[BaseException] = []
    try:
        lease = await registry.grant(LEASE_TTL)

        async def keep_alive() -> None:
            while True:
                await trio.sleep(LEASE_TTL / 3)
                try:
                    await registry.keepalive(lease.id)
                except Exception as exc:  # asserted on below
                    renewal_failures.append(exc)

        async def write(count: int) -> None:
            for n in range(count):
                key = f"apps/k{len(acknowledged)}-{n}"
                value = uuid.uuid4().bytes
                try:
                    await registry.put(key, value)
                except Exception:  # not acknowledged: not counted
                    continue
                acknowledged[key] = value

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_alive)
            await write(20)
            cluster.leader().kill()
            killed_at = trio.current_time()
            # No help from the test: the next calls find the survivors themselves.
            with trio.fail_after(20):
                await write(50)
            recovered = trio.current_time() - killed_at
            nursery.cancel_scope.cancel()
        print(f"50 writes after the leader was killed took {recovered:.2f} s")
        assert renewal_failures == [], "the 4 s lease was not kept alive through the election"
        assert len(acknowledged) >= 60
        kvs = {kv.key: kv.value for kv in await registry.range("apps/")}
        missing = [key for key, value in acknowledged.items() if kvs.get(key) != value]
        assert missing == [], f"{len(missing)} acknowledged writes lost"
    finally:
        await registry.delete("", prefix=True)
        await registry.aclose()
