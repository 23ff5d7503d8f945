"""HAProxy 2.6 and Caddy 2.6, real processes, real backends: what users rely on."""

from __future__ import annotations

import functools
import os
import socket
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio

from corral.actors.routing import RouteTable, encode_table_json
from corral.proxy import ProxyStartFailed, follow_routing, open_proxy, run_proxy
from corral.proxy._status import Verdict
from corral.registry import ROUTING_KEY, MemoryRegistry, open_registry

from .conftest import Backends, free_port

pytestmark = pytest.mark.slow


async def ask(client: httpx.AsyncClient, listen: str, host: str) -> tuple[int, str]:
    response = await client.get(f"http://{listen}/", headers={"Host": host})
    return response.status_code, response.text


async def ask_fresh(listen: str, host: str) -> tuple[int, str]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        return await ask(client, listen, host)


async def answers(client: httpx.AsyncClient, listen: str, host: str, n: int = 12) -> Counter[str]:
    seen: Counter[str] = Counter()
    for _ in range(n):
        status, text = await ask(client, listen, host)
        seen[f"{status} {text}"] += 1
    return seen


def proxy_client(kind: str) -> httpx.AsyncClient:
    """A client for requests through the proxy. Caddy closes idle keep-alive
    connections on every reload (see corral.proxy._caddy), so a connection pooled
    before an apply can be reset by the next request: against Caddy none is kept."""
    keepalive = 0 if kind == "caddy" else None
    return httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=keepalive))


def table(revision: int, fence: int = 1, **domains: list[str]) -> RouteTable:
    return RouteTable(
        fence, revision, {d.replace("_", "."): tuple(sorted(u)) for d, u in domains.items()}
    )


async def test_requests_reach_every_backend_and_an_unknown_host_gets_404(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "a2", "a3")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        urls = [backends.url(n) for n in ("a1", "a2", "a3")]
        assert await engine.offer(table(1, shop_test=urls)) is Verdict.APPLY
        assert engine.status.error is None
        seen = await answers(client, listen, "shop.test")
        assert set(seen) == {"200 a1", "200 a2", "200 a3"}
        # Case and port in the Host header do not matter.
        assert (await ask(client, listen, "SHOP.test:8080"))[0] == 200
        status, _ = await ask(client, listen, "nobody.test")
        assert status == 404


@pytest.mark.parametrize(
    "host", ["shop.test.", "SHOP.test:80", "Shop.Test.:8080", "shop.test.:80", "SHOP.TEST."]
)
async def test_a_host_spelled_as_corral_reads_it_reaches_the_domain(
    kind: str, data_dir: Path, backends: Backends, host: str
) -> None:
    """A Host header is normalised as corral normalises a domain (lowercase, port
    stripped, one trailing dot dropped): each spelling reaches the shop's backend."""
    await backends.start("shop")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        await engine.offer(table(1, shop_test=[backends.url("shop")]))
        assert engine.status.error is None
        assert await ask(client, listen, host) == (200, "shop")
        # Two trailing dots are no spelling of shop.test (corral refuses that domain).
        assert (await ask(client, listen, "shop.test.."))[0] == 404


async def test_removing_a_backend_takes_it_out_and_an_older_table_is_ignored(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "a2", "a3")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        every = [backends.url(n) for n in ("a1", "a2", "a3")]
        await engine.offer(table(1, shop_test=every))
        reloads = engine.driver.reloads
        await engine.offer(table(2, shop_test=every[:2]))
        assert engine.status.applied_revision == 2
        assert set(await answers(client, listen, "shop.test")) == {"200 a1", "200 a2"}
        if kind == "haproxy":  # a server change is a Runtime API update, not a reload
            assert engine.driver.reloads == reloads
        # An older table (revision 1) and a stale fence's (fence 0) are not applied.
        assert await engine.offer(table(1, shop_test=every)) is Verdict.OLDER
        assert await engine.offer(table(9, fence=0, shop_test=every)) is Verdict.OLDER
        assert await engine.offer(table(2, shop_test=every)) is Verdict.ALREADY_APPLIED
        assert set(await answers(client, listen, "shop.test")) == {"200 a1", "200 a2"}
        assert engine.status.applied_revision == 2
        # Putting it back, and removing the whole domain: its host then gets 404.
        await engine.offer(table(3, shop_test=every))
        assert set(await answers(client, listen, "shop.test")) == {"200 a1", "200 a2", "200 a3"}
        await engine.offer(table(4, other_test=every[:1]))
        assert (await ask(client, listen, "shop.test"))[0] == 404
        assert await ask(client, listen, "other.test") == (200, "a1")


async def test_switching_an_alias_domain_changes_who_answers_within_one_apply(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("blue", "green")
    listen = f"127.0.0.1:{free_port()}"
    blue, green = [backends.url("blue")], [backends.url("green")]
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        await engine.offer(table(1, blue_test=blue, green_test=green, shop_test=blue))
        assert set(await answers(client, listen, "shop.test", 4)) == {"200 blue"}
        await engine.offer(table(2, blue_test=blue, green_test=green, shop_test=green))
        assert set(await answers(client, listen, "shop.test", 6)) == {"200 green"}
        await engine.offer(table(3, blue_test=blue, green_test=green, shop_test=blue))
        assert set(await answers(client, listen, "shop.test", 6)) == {"200 blue"}
        if kind == "haproxy":  # only the first table reloaded: the flips were runtime updates
            assert engine.driver.reloads == 1


async def test_a_killed_backend_costs_no_request_thanks_to_retries(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "a2", "a3")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        await engine.offer(table(1, shop_test=[backends.url(n) for n in ("a1", "a2", "a3")]))
        # Least connections breaks ties at random (Caddy): 30 requests reach all three
        # but for a chance of about 3 * (2/3)**30, 2e-5.
        assert len(await answers(client, listen, "shop.test", 30)) == 3
        await backends.kill("a2")  # the table still lists it
        seen = await answers(client, listen, "shop.test", 30)
        assert set(seen) == {"200 a1", "200 a3"}, seen


async def test_a_new_domain_is_served_and_the_process_is_gone_after_the_block(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "b1")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        pid = engine.driver.pid  # type: ignore[attr-defined]
        await engine.offer(table(1, a_test=[backends.url("a1")]))
        await engine.offer(table(2, a_test=[backends.url("a1")], b_test=[backends.url("b1")]))
        assert await ask(client, listen, "b.test") == (200, "b1")
        assert await ask(client, listen, "a.test") == (200, "a1")
        assert engine.status.error is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_the_engine_follows_the_routing_key(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "a2")
    listen = f"127.0.0.1:{free_port()}"
    registry = MemoryRegistry()
    statuses = []

    async def record(status: object) -> None:
        statuses.append(status)

    first = table(1, fence=2, shop_test=[backends.url("a1")])
    await registry.put(ROUTING_KEY, encode_table_json(first))
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir, proxy_id="edge-1") as engine,
        proxy_client(kind) as client,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(functools.partial(follow_routing, on_status=record), registry, engine)
        assert await ask(client, listen, "shop.test") == (200, "a1")
        await registry.put(ROUTING_KEY, b"not json")  # skipped, the table stays served
        await registry.put(
            ROUTING_KEY, encode_table_json(table(2, fence=2, shop_test=[backends.url("a2")]))
        )
        with trio.fail_after(10):
            while engine.status.applied_revision != 2:
                await trio.sleep(0.01)
        assert await ask(client, listen, "shop.test") == (200, "a2")
        nursery.cancel_scope.cancel()
    assert statuses[-1].id == "edge-1"
    assert statuses[-1].applied is not None
    assert (statuses[-1].applied.fence, statuses[-1].applied.revision) == (2, 2)


async def test_a_dead_proxy_process_is_started_again_on_the_next_table(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1")
    listen = f"127.0.0.1:{free_port()}"
    async with (
        open_proxy(kind, listen=listen, data_dir=data_dir) as engine,
        proxy_client(kind) as client,
    ):
        await engine.offer(table(1, a_test=[backends.url("a1")]))
        pid = engine.driver.pid  # type: ignore[attr-defined]
        os.kill(pid, 9)
        with trio.fail_after(5):
            while engine.driver._process.exit_code is None:  # type: ignore[attr-defined]
                await trio.sleep(0.01)
        await engine.offer(table(2, a_test=[backends.url("a1")]))
        assert engine.status.error is None
        assert engine.driver.pid != pid  # type: ignore[attr-defined]
        assert await ask(client, listen, "a.test") == (200, "a1")


async def test_a_taken_listen_port_fails_the_start_naming_the_log(
    kind: str, data_dir: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ProxyStartFailed, match=r"(?s)exited with code .*log"):
            async with open_proxy(kind, listen=f"127.0.0.1:{port}", data_dir=data_dir):
                pass


async def test_a_request_in_flight_to_a_removed_backend_completes(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("old", "new")
    listen = f"127.0.0.1:{free_port()}"
    async with open_proxy(kind, listen=listen, data_dir=data_dir) as engine:
        driver = engine.driver
        slow: list[tuple[int, str]] = []
        async with proxy_client(kind) as client, trio.open_nursery() as nursery:
            await engine.offer(table(1, shop_test=[backends.url("old")]))

            async def slow_request() -> None:
                response = await client.get(f"http://{listen}/slow", headers={"Host": "shop.test"})
                slow.append((response.status_code, response.text))

            nursery.start_soon(slow_request)
            await trio.sleep(0.3)  # the request is now waiting on "old"
            await engine.offer(table(2, shop_test=[backends.url("new")]))
            assert engine.status.error is None
            assert await ask(client, listen, "shop.test") == (200, "new")
            if kind == "haproxy":  # drained, in maintenance, but busy: HAProxy keeps it
                assert driver._running.parked  # type: ignore[attr-defined]
        assert slow == [(200, "old")]
        if kind == "haproxy":  # idle now: a tidy-up deletes it once its idle conns are purged
            with trio.fail_after(10):
                while await driver.tidy():
                    await trio.sleep(0.2)
            assert not driver._running.parked  # type: ignore[attr-defined]
            assert driver.reloads == 1
            assert await ask_fresh(listen, "shop.test") == (200, "new")


async def test_a_closed_proxy_refuses_tables(kind: str, data_dir: Path) -> None:
    async with open_proxy(kind, listen=f"127.0.0.1:{free_port()}", data_dir=data_dir) as engine:
        pass
    await engine.offer(table(1, a_test=["http://127.0.0.1:1"]))
    assert engine.status.error is not None
    assert "closed" in engine.status.error


async def test_run_proxy_serves_the_registry_table_until_cancelled(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1", "a2")
    listen = f"127.0.0.1:{free_port()}"
    url = f"sqlite:///{data_dir}/registry.db"
    async with open_registry(url) as registry:
        await registry.put(ROUTING_KEY, encode_table_json(table(1, shop_test=[backends.url("a1")])))
        async with proxy_client(kind) as client, trio.open_nursery() as nursery:
            engine = await nursery.start(
                functools.partial(
                    run_proxy, kind, listen=listen, registry_url=url, data_dir=data_dir / "p"
                )
            )
            assert await ask(client, listen, "shop.test") == (200, "a1")
            newer = table(2, shop_test=[backends.url("a2")])
            await registry.put(ROUTING_KEY, encode_table_json(newer))
            with trio.fail_after(10):
                while engine.status.applied_revision != 2:
                    await trio.sleep(0.01)
            assert await ask(client, listen, "shop.test") == (200, "a2")
            pid = engine.driver.pid
            nursery.cancel_scope.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
