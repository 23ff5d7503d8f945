"""HAProxy's retries, real process, real sockets: a GET an instance dropped is answered
by another one, a POST is never sent twice."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pytest
import trio

from corral.actors.routing import RouteTable
from corral.proxy import open_proxy
from corral.proxy._haproxy_plan import L7_RETRY_RULE

from .conftest import free_port, require_binary

pytestmark = pytest.mark.slow


async def _serve(nursery: trio.Nursery, answer: bool, seen: list[str]) -> str:
    """A loopback HTTP server that records each request line; it answers 200 when
    ``answer``, else closes the connection without a word (an instance that died
    mid-request). HAProxy's health checks (``HEAD /``) are answered and not recorded:
    the instance stays in the pool, so the test sees what its retries do. Returns its
    URL."""

    async def one(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                data += chunk
            line = data.split(b"\r\n", 1)[0].decode()
            if not line.startswith("HEAD "):
                seen.append(line)
            if answer or line.startswith("HEAD "):
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                )

    serve = functools.partial(trio.serve_tcp, one, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def _post(url: str) -> int | str:
    """POST on a connection of its own: the status, or ``dropped`` when the proxy
    closed it without an answer."""
    async with httpx.AsyncClient() as client:
        try:
            response = await client.post(url, headers={"Host": "shop.test"}, content=b"x")
        except httpx.RemoteProtocolError:
            return "dropped"
        return response.status_code


async def test_a_dropped_get_is_retried_elsewhere_and_a_post_is_not_replayed(
    data_dir: Path,
) -> None:
    require_binary("haproxy")
    listen = f"127.0.0.1:{free_port()}"
    dropped: list[str] = []
    served: list[str] = []
    async with trio.open_nursery() as nursery:
        bad = await _serve(nursery, False, dropped)
        good = await _serve(nursery, True, served)
        async with (
            open_proxy("haproxy", listen=listen, data_dir=data_dir) as engine,
            httpx.AsyncClient() as client,
        ):
            await engine.offer(RouteTable(1, 1, {"shop.test": tuple(sorted((bad, good)))}))
            assert engine.status.error is None
            assert L7_RETRY_RULE in (data_dir / "haproxy.cfg").read_text()
            url = f"http://{listen}/"
            gets = [
                (await client.get(url, headers={"Host": "shop.test"})).status_code for _ in range(6)
            ]
            posts = [await _post(url) for _ in range(6)]
        nursery.cancel_scope.cancel()
    # Round robin sends some of each to the instance that drops them.
    assert any(line.startswith("GET") for line in dropped)
    assert any(line.startswith("POST") for line in dropped)
    # Every GET it dropped was answered by the other one.
    assert gets == [200] * 6
    # A POST it dropped is the client's to retry: HAProxy answers 502 and never
    # replays it (each POST reached one server, once).
    post_lines = [line for line in dropped + served if line.startswith("POST")]
    assert len(post_lines) == 6
    assert posts.count(502) == sum(line.startswith("POST") for line in dropped), posts
    assert posts.count(200) == sum(line.startswith("POST") for line in served), posts


async def test_caddy_never_replays_a_post_an_instance_dropped(data_dir: Path) -> None:
    """Caddy replays only GET, HEAD and OPTIONS on another backend once one took the
    request (``retry_match``); a dropped POST gets 502, sent once."""
    require_binary("caddy")
    listen = f"127.0.0.1:{free_port()}"
    dropped: list[str] = []
    served: list[str] = []
    async with trio.open_nursery() as nursery:
        bad = await _serve(nursery, False, dropped)
        good = await _serve(nursery, True, served)
        async with open_proxy("caddy", listen=listen, data_dir=data_dir) as engine:
            await engine.offer(RouteTable(1, 1, {"shop.test": tuple(sorted((bad, good)))}))
            assert engine.status.error is None
            posts: list[int | str] = []
            # Least connections picks at random between two idle backends: POST until
            # the dropping one got one (it is then kept out for a while).
            while not dropped and len(posts) < 40:
                posts.append(await _post(f"http://{listen}/"))
        nursery.cancel_scope.cancel()
    assert dropped == ["POST / HTTP/1.1"], (dropped, posts)
    assert len(served) == len(posts) - 1  # no POST reached a backend twice
    assert posts.count(502) == 1, posts
    assert posts.count(200) == len(posts) - 1, posts
