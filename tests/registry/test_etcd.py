"""etcd backend specifics: the gateway's JSON quirks, failures and retries (with a
mock transport), and namespaces, several endpoints and compaction (real etcd)."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable

import httpx
import pytest
import trio

from corral.registry import (
    Compare,
    EtcdRegistry,
    Get,
    LeaseNotFound,
    Put,
    RegistryUnavailable,
    RevisionCompacted,
)
from corral.testing import open_test_etcd_registry, take_events


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def mock(
    handler: Callable[[httpx.Request], httpx.Response], *endpoints: str
) -> EtcdRegistry:
    return EtcdRegistry(
        list(endpoints) or ["e1:2379"],
        transport=httpx.MockTransport(handler),
        backoff=0.0,
        retry_rounds=2,
    )


def header(revision: int) -> dict[str, object]:
    return {"header": {"revision": str(revision)}}


async def test_omitted_fields_read_as_false_and_zero() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v3/kv/txn":
            # A failed compare: no "succeeded"; the failure Get found nothing: no "kvs".
            return httpx.Response(
                200, json={**header(7), "responses": [{"response_range": {**header(7)}}]}
            )
        assert request.url.path == "/v3/kv/range"
        kv = {"key": b64("apps/a"), "create_revision": "3", "mod_revision": "3"}
        return httpx.Response(200, json={**header(7), "kvs": [kv], "count": "1"})

    registry = mock(handler)
    try:
        result = await registry.txn([Compare.absent("apps/b")], [], [Get("apps/b")])
        assert not result.succeeded
        assert result.revision == 7
        assert result.responses == ([],)
        kv = await registry.get("apps/a")
        assert kv is not None
        assert (kv.value, kv.version, kv.lease) == (b"", 0, None)  # omitted = empty / zero
    finally:
        await registry.aclose()


async def test_a_connection_refused_moves_to_the_next_endpoint_even_for_writes() -> None:
    tried: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tried.append(request.url.host)
        if request.url.host == "dead":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=header(5))

    registry = mock(handler, "dead:2379", "alive:2379")
    try:
        assert await registry.put("apps/a", b"1") == 5
        assert tried == ["dead", "alive"]
        assert await registry.revision() == 5
        assert tried == ["dead", "alive", "alive"]  # it stays on the member that answered
    finally:
        await registry.aclose()


async def test_a_write_lost_in_flight_is_not_retried_but_a_read_is() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ReadError("connection reset", request=request)

    registry = mock(handler, "e1:2379", "e2:2379")
    try:
        with pytest.raises(RegistryUnavailable, match="may or may not have applied"):
            await registry.txn([], [Put("apps/a", b"1")])
        assert calls == ["/v3/kv/txn"]
        calls.clear()
        with pytest.raises(RegistryUnavailable, match="e1:2379, http://e2:2379"):
            await registry.get("apps/a")
        assert calls == ["/v3/kv/range"] * 4  # two rounds over two endpoints
    finally:
        await registry.aclose()


async def test_gateway_errors_become_typed_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v3/lease/keepalive":
            return httpx.Response(200, text=json.dumps({"result": {**header(3), "ID": "42"}}))
        if request.url.path == "/v3/lease/revoke":
            return httpx.Response(
                404, json={"error": "etcdserver: requested lease not found", "code": 5}
            )
        return httpx.Response(
            503, json={"error": "etcdserver: no leader", "message": "no leader", "code": 14}
        )

    registry = mock(handler)
    try:
        with pytest.raises(LeaseNotFound) as caught:
            await registry.keepalive(42)  # the gateway answers TTL 0 (omitted)
        assert caught.value.lease_id == 42
        await registry.revoke(42)  # idempotent
        with pytest.raises(RegistryUnavailable, match="no leader"):
            await registry.put("apps/a", b"1")
    finally:
        await registry.aclose()


async def test_no_reachable_endpoint_is_unavailable_and_named() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once closed
    registry = EtcdRegistry([f"127.0.0.1:{port}"], backoff=0.0, retry_rounds=2)
    try:
        with trio.fail_after(10), pytest.raises(RegistryUnavailable, match=f"127.0.0.1:{port}"):
            await registry.get("apps/a")
    finally:
        await registry.aclose()


# ---------------------------------------------------------------------- real etcd


@pytest.mark.etcd
async def test_namespaces_keep_registries_apart(etcd_endpoint: str) -> None:
    async with (
        open_test_etcd_registry(etcd_endpoint) as a,
        open_test_etcd_registry(etcd_endpoint) as b,
    ):
        await a.put("apps/web", b"a")
        assert await b.get("apps/web") is None
        assert await b.range("") == []
        kv = await a.get("apps/web")
        assert kv is not None
        assert kv.key == "apps/web"  # callers never see the namespace


@pytest.mark.etcd
async def test_a_dead_member_is_skipped(etcd_endpoint: str) -> None:
    endpoint = etcd_endpoint
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    async with open_test_etcd_registry(f"{dead},{endpoint}") as registry:
        lease = await registry.grant(5)
        revision = await registry.put("nodes/n1", b"x", lease=lease.id)
        assert await registry.keepalive(lease.id) == 5
        async with registry.watch("nodes/", revision) as events:
            (event,) = await take_events(events, 1)
        assert event.kv.key == "nodes/n1"
        await registry.revoke(lease.id)


@pytest.mark.etcd
@pytest.mark.etcd_alone  # the compaction cuts every namespace's history
async def test_a_watch_from_compacted_history_is_refused(etcd_endpoint: str) -> None:
    async with open_test_etcd_registry(etcd_endpoint) as registry:
        first = await registry.put("apps/a", b"1")
        current = await registry.put("apps/a", b"2")
        # Compact this etcd up to now. Harmless to tests that watch from a revision
        # they read themselves; a test watching from revision 1 would be refused.
        async with httpx.AsyncClient() as client:
            response = await client.post(
                registry.endpoints[0] + "/v3/kv/compaction", json={"revision": str(current)}
            )
            assert response.status_code == 200
        with pytest.raises(RevisionCompacted):
            async with registry.watch("apps/", first) as events:
                await take_events(events, 1)
