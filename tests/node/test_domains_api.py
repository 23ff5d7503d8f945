"""Domains and aliases through the HTTP API (in-memory registry, no sockets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.registry import AliasRecord, DomainClaim, alias_key, decode_record, domain_key

from .conftest import b64, packed_app
from .test_api import Fixture


@pytest.fixture
async def fx(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path)


async def deploy(
    client: httpx.AsyncClient, tmp_path: Path, name: str, domains: list[str] | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"artifact": b64(packed_app(tmp_path, name).data)}
    if domains is not None:
        body["domains"] = domains
    return await client.post(f"/v1/apps/{name}/deploy", json=body)


async def test_deploy_lowers_and_claims_its_domains_and_a_redeploy_keeps_them(
    fx: Fixture, tmp_path: Path
) -> None:
    async with fx.client() as client:
        response = await deploy(client, tmp_path, "shop", ["Shop.Example.", "shop.example"])
        assert response.status_code == 201, response.text
        assert response.json()["app"]["domains"] == ["shop.example"]
        again = await deploy(client, tmp_path, "shop")
        assert again.status_code == 200
        assert again.json()["app"]["domains"] == ["shop.example"]
    record = await fx.app_record("shop")
    assert record is not None
    assert record.domains == ["shop.example"]
    kv = await fx.registry.get(domain_key("shop.example"))
    assert kv is not None
    assert decode_record(kv.key, kv.value) == DomainClaim("shop")


@pytest.mark.parametrize(
    ("domains", "needle"),
    [
        (["bad_domain.example"], "invalid domain 'bad_domain.example'"),
        (["-shop.example"], "invalid domain '-shop.example'"),
        ([("a" * 63 + ".") * 4 + "example"], "253 characters at most"),
        (["shop..example"], "invalid domain"),
        (["127.0.0.1"], "invalid domain '127.0.0.1': it is an IP address"),
        (["localhost"], "invalid domain 'localhost': localhost and its subdomains"),
        (["[::1]"], "invalid domain '[::1]'"),
        ("shop.example", "must be a list of domains"),
        ([7], "7 is not a domain"),
        ([f"d{i}.example" for i in range(65)], "65 domains, more than the 64"),
    ],
)
async def test_a_bad_domain_is_a_400_naming_the_field(
    fx: Fixture, tmp_path: Path, domains: object, needle: str
) -> None:
    async with fx.client() as client:
        body = {"artifact": b64(packed_app(tmp_path).data), "domains": domains}
        response = await client.post("/v1/apps/shop/deploy", json=body)
    assert response.status_code == 400
    assert response.json()["field"] == "domains"
    assert needle in response.json()["error"]
    assert await fx.app_record("shop") is None


async def test_a_claimed_domain_is_a_409_naming_its_owner(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        assert (await deploy(client, tmp_path, "shop", ["shop.example"])).status_code == 201
        taken = await deploy(client, tmp_path, "store", ["shop.example"])
        assert taken.status_code == 409
        assert "domain shop.example already belongs to app shop" in taken.json()["error"]
        assert (await deploy(client, tmp_path, "store")).status_code == 201
        added = await client.post("/v1/apps/store/domains", json={"add": ["SHOP.example"]})
        assert added.status_code == 409
        assert "already belongs to app shop" in added.json()["error"]


async def test_app_domains_add_remove_clear(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        await deploy(client, tmp_path, "shop")
        added = await client.post("/v1/apps/shop/domains", json={"add": ["b.example", "A.example"]})
        assert added.status_code == 200
        assert added.json()["app"]["domains"] == ["a.example", "b.example"]
        removed = await client.post("/v1/apps/shop/domains", json={"remove": ["a.example"]})
        assert removed.json()["app"]["domains"] == ["b.example"]
        unknown = await client.post("/v1/apps/shop/domains", json={"remove": ["z.example"]})
        assert unknown.status_code == 404
        assert (
            "app shop has no domain z.example (its domains: b.example)" in unknown.json()["error"]
        )
        cleared = await client.post("/v1/apps/shop/domains", json={"clear": True})
        assert cleared.json()["app"]["domains"] == []
        assert await fx.registry.get(domain_key("b.example")) is None

        bad = await client.post("/v1/apps/shop/domains", json={"add": ["x y"]})
        assert (bad.status_code, bad.json()["field"]) == (400, "add")
        neither = await client.post("/v1/apps/shop/domains", json={})
        assert neither.status_code == 400
        both = await client.post("/v1/apps/shop/domains", json={"clear": True, "add": ["a.b"]})
        assert both.status_code == 400
        stray = await client.post("/v1/apps/shop/domains", json={"set": ["a.b"]})
        assert (stray.status_code, stray.json()["field"]) == (400, "set")
        missing = await client.post("/v1/apps/ghost/domains", json={"add": ["a.example"]})
        assert missing.status_code == 404


async def test_alias_routes_set_flip_rollback_ls_rm(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        await deploy(client, tmp_path, "blue")
        await deploy(client, tmp_path, "green")
        created = await client.post("/v1/aliases/Shop.Example", json={"app": "blue"})
        assert created.status_code == 201
        alias = created.json()["alias"]
        assert (alias["domain"], alias["app"], alias["previous"]) == ("shop.example", "blue", None)

        again = await client.post("/v1/aliases/shop.example", json={"app": "green"})
        assert again.status_code == 409
        assert "already exists and points at app blue" in again.json()["error"]

        ghost = await client.post("/v1/aliases/shop.example/flip", json={"app": "ghost"})
        assert ghost.status_code == 404
        assert "no app named 'ghost'" in ghost.json()["error"]

        stale = await client.post(
            "/v1/aliases/shop.example/flip", json={"app": "green", "expect": alias["revision"] + 99}
        )
        assert stale.status_code == 409
        assert "it now points at app blue" in stale.json()["error"]

        flipped = await client.post(
            "/v1/aliases/shop.example/flip", json={"app": "green", "expect": alias["revision"]}
        )
        assert flipped.status_code == 200
        assert flipped.json()["flipped"] is True
        assert flipped.json()["alias"]["previous"] == "blue"

        listed = (await client.get("/v1/aliases")).json()
        assert listed["aliases"] == [flipped.json()["alias"]]
        assert listed["undecodable"] == []

        back = await client.post("/v1/aliases/shop.example/rollback")
        assert back.json()["alias"]["app"] == "blue"
        kv = await fx.registry.get(alias_key("shop.example"))
        assert kv is not None
        assert decode_record(kv.key, kv.value) == AliasRecord("blue")

        removed = await client.delete("/v1/aliases/shop.example")
        assert removed.json() == {"removed": "shop.example", "app": "blue"}
        gone = await client.delete("/v1/aliases/shop.example")
        assert gone.status_code == 404
        never = await client.post("/v1/aliases/shop.example/rollback")
        assert never.status_code == 404


async def test_an_alias_domain_and_an_app_domain_exclude_each_other(
    fx: Fixture, tmp_path: Path
) -> None:
    async with fx.client() as client:
        await deploy(client, tmp_path, "shop", ["shop.example"])
        await deploy(client, tmp_path, "blue")
        onto_app = await client.post("/v1/aliases/shop.example", json={"app": "blue"})
        assert onto_app.status_code == 409
        assert "is app shop's own domain" in onto_app.json()["error"]
        await client.post("/v1/aliases/blue.example", json={"app": "blue"})
        onto_alias = await client.post("/v1/apps/shop/domains", json={"add": ["blue.example"]})
        assert onto_alias.status_code == 409
        assert "is an alias pointing at app blue" in onto_alias.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/aliases/bad_domain", {"app": "blue"}, "domain"),
        ("POST", "/v1/aliases/shop.example", {"app": "Blue"}, "app"),
        ("POST", "/v1/aliases/shop.example", {}, "app"),
        ("POST", "/v1/aliases/shop.example", {"app": "blue", "x": 1}, "x"),
        ("POST", "/v1/aliases/shop.example/flip", {"app": "blue", "expect": "7"}, "expect"),
        ("POST", "/v1/aliases/shop.example/flip", {"app": "blue", "expect": True}, "expect"),
        ("POST", "/v1/aliases/shop.example/rollback", {"app": "blue"}, "app"),
        ("DELETE", "/v1/aliases/-x", None, "domain"),
    ],
)
async def test_bad_alias_requests_are_400_naming_the_field(
    fx: Fixture, method: str, path: str, body: object, field: str
) -> None:
    async with fx.client() as client:
        response = await client.request(method, path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field


async def test_alias_routes_need_the_token(fx: Fixture) -> None:
    async with fx.client(token=None) as client:
        for method, path in [
            ("GET", "/v1/aliases"),
            ("POST", "/v1/aliases/shop.example"),
            ("POST", "/v1/aliases/shop.example/flip"),
            ("DELETE", "/v1/aliases/shop.example"),
            ("POST", "/v1/apps/shop/domains"),
        ]:
            assert (await client.request(method, path)).status_code == 401
    async with fx.client(token="wrong") as client:
        assert (await client.get("/v1/aliases")).status_code == 403


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "2130706433"])
async def test_an_address_is_refused_as_an_alias_and_as_an_added_domain(
    fx: Fixture, tmp_path: Path, address: str
) -> None:
    async with fx.client() as client:
        assert (await deploy(client, tmp_path, "shop")).status_code == 201
        alias = await client.post(f"/v1/aliases/{address}", json={"app": "shop"})
        added = await client.post("/v1/apps/shop/domains", json={"add": [address]})
    assert alias.status_code == 400, alias.text
    assert alias.json()["field"] == "domain"
    assert added.status_code == 400, added.text
    assert added.json()["field"] == "add"
    assert "would receive every request made to the proxy" in added.json()["error"]
    record = await fx.app_record("shop")
    assert record is not None
    assert record.domains == []
    assert await fx.registry.get(f"alias/{address}") is None
