"""``GET /v1/routes`` against the in-memory registry, and deploy carrying ``[health]``."""

from __future__ import annotations

from pathlib import Path

from corral.actors.routing import RouteTable, encode_table_json
from corral.registry import ROUTING_KEY, HealthSpec, ProxyRecord, proxy_key

from .conftest import b64
from .test_api import Fixture


async def test_routes_shows_the_table_and_the_proxies(tmp_path: Path) -> None:
    fx = Fixture(tmp_path)
    async with fx.client(token=None) as client:
        assert (await client.get("/v1/routes")).status_code == 401
    async with fx.client() as client:
        empty = (await client.get("/v1/routes")).json()
        assert empty == {"version": None, "routes": {}, "held_back": [], "proxies": []}
        await fx.registry.put(
            ROUTING_KEY, encode_table_json(RouteTable(3, 5, {"shop.test": ("http://h:1",)}))
        )
        status = ProxyRecord("edge", "haproxy", "127.0.0.1:80", 3, 4, applied_at=1_699_999_990.0)
        await fx.registry.put(proxy_key("edge"), status.encode())
        await fx.registry.put(proxy_key("junk"), b"not json")  # skipped, never a 500
        answer = (await client.get("/v1/routes")).json()
    assert answer["version"] == {"fence": 3, "revision": 5}
    assert answer["routes"] == {"shop.test": ["http://h:1"]}
    (proxy,) = answer["proxies"]
    assert proxy["id"] == "edge"
    assert proxy["applied"] == {"fence": 3, "revision": 4}
    assert proxy["lag_s"] == 10.0  # behind by one table, last applied 10 s ago


async def test_a_deploy_carries_the_health_check_onto_the_deployment(tmp_path: Path) -> None:
    from corral.node.artifacts._artifacts import pack_directory

    app = tmp_path / "app"
    app.mkdir()
    (app / "corral.toml").write_text(
        'command = ["python3", "s.py"]\n[health]\npath = "/healthz"\ninterval_ms = 500\n'
    )
    (app / "s.py").write_text("print('hi')\n")
    fx = Fixture(tmp_path)
    async with fx.client() as client:
        response = await client.post(
            "/v1/apps/api/deploy", json={"artifact": b64(pack_directory(app).data)}
        )
        assert response.status_code == 201, response.text
    record = await fx.app_record("api")
    assert record is not None
    assert record.deployment is not None
    assert record.deployment.health == HealthSpec("/healthz", 500, 1000)
