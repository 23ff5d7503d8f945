"""The seed's push: a table PATCHed straight into a running Caddy's admin API."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral.actors.routing import RouteTable
from corral.proxy import InvalidProxySetup, ProxyApplyFailed, caddy_pusher, open_proxy
from corral.proxy._push import check_admin_url

from .conftest import Backends, free_port, require_binary


@pytest.mark.slow
async def test_a_pushed_table_is_served_by_caddy(data_dir: Path, backends: Backends) -> None:
    require_binary("caddy")
    await backends.start("a1", "b1")
    listen = f"127.0.0.1:{free_port()}"
    admin = f"127.0.0.1:{free_port()}"
    async with open_proxy("caddy", listen=listen, data_dir=data_dir, admin=admin) as engine:
        await engine.offer(RouteTable(1, 1, {"a.test": (backends.url("a1"),)}))
        push = caddy_pusher(f"http://{admin}")
        await push(RouteTable(1, 2, {"b.test": (backends.url("b1"),)}))
        async with httpx.AsyncClient() as client:
            got = await client.get(f"http://{listen}/", headers={"Host": "b.test"})
            assert (got.status_code, got.text) == (200, "b1")
            gone = await client.get(f"http://{listen}/", headers={"Host": "a.test"})
            assert gone.status_code == 404  # the pushed table replaced the routes whole


async def test_a_push_to_nothing_fails_naming_the_endpoint() -> None:
    push = caddy_pusher(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ProxyApplyFailed, match="unreachable"):
        await push(RouteTable(1, 1, {}))


@pytest.mark.parametrize(
    "url", ["127.0.0.1:2019", "https://127.0.0.1:2019", "http://h", "http://h:1/x", "http://:9"]
)
def test_admin_urls_are_checked(url: str) -> None:
    with pytest.raises(InvalidProxySetup, match="http://HOST:PORT"):
        check_admin_url(url)
    assert check_admin_url("http://127.0.0.1:2019/") == "http://127.0.0.1:2019"
