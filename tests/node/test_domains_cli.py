"""``corral deploy --domain``, ``corral app domains`` and ``corral alias``, from the
command line through the real API and operations to the in-memory registry (each
request the CLI sends is answered by the ASGI app in its own Trio run)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from corral.node.cli import _client as client_module
from corral.node.cli._cli import main
from corral.registry import AppRecord, app_key, decode_record

from .conftest import make_app_dir
from .test_api import TOKEN, Fixture

AUTH = ["--api", "http://127.0.0.1:9", "--token", TOKEN]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, *AUTH])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fixture:
    """A node API the CLI's requests reach (no socket), with apps blue and green."""
    fixture = Fixture(tmp_path)

    def handler(request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=fixture.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
                answer = await client.request(
                    request.method,
                    request.url.path,
                    content=request.read(),
                    headers={
                        "authorization": request.headers["authorization"],
                        "content-type": request.headers.get("content-type", "application/json"),
                    },
                )
            return httpx.Response(
                answer.status_code,
                content=answer.content,
                headers={"content-type": answer.headers["content-type"]},
            )

        return trio.run(call)

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(handler))
    monkeypatch.chdir(tmp_path)
    make_app_dir(tmp_path / "APP")
    return fixture


def app_record(fx: Fixture, name: str) -> AppRecord:
    async def read() -> AppRecord:
        kv = await fx.registry.get(app_key(name))
        assert kv is not None
        record = decode_record(kv.key, kv.value)
        assert isinstance(record, AppRecord)
        return record

    return trio.run(read)


def test_deploy_with_domains_and_a_redeploy_that_keeps_them(
    fx: Fixture, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        ["deploy", "APP", "--name", "shop", "--domain", "Shop.Example", "--domain", "b.example"],
        capsys,
    )
    assert (code, err) == (0, "")
    assert out.rstrip().endswith("; domains b.example, shop.example")
    code, out, _ = run(["deploy", "APP", "--name", "shop"], capsys)
    assert code == 0
    assert out.startswith("updated shop")
    assert "domains b.example, shop.example" in out
    assert app_record(fx, "shop").domains == ["b.example", "shop.example"]

    code, _, err = run(["deploy", "APP", "--name", "store", "--domain", "shop.example"], capsys)
    assert code == 1
    assert err.strip() == (
        "corral: error: domain shop.example already belongs to app shop; remove it there "
        "first (corral app domains --name shop --remove shop.example)"
    )


def test_app_domains_add_remove_clear(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["deploy", "APP", "--name", "shop"], capsys)[0] == 0
    code, out, _ = run(
        ["app", "domains", "--name", "shop", "--add", "A.example", "--add", "b.example"], capsys
    )
    assert (code, out) == (0, "shop: domains a.example, b.example\n")
    code, out, _ = run(["app", "domains", "--name", "shop", "--remove", "a.example"], capsys)
    assert (code, out) == (0, "shop: domains b.example\n")
    code, _, err = run(["app", "domains", "--name", "shop", "--remove", "z.example"], capsys)
    assert code == 1
    assert "app shop has no domain z.example" in err
    code, out, _ = run(["app", "domains", "--name", "shop", "--clear", "--json"], capsys)
    assert code == 0
    assert json.loads(out)["app"]["domains"] == []
    assert app_record(fx, "shop").domains == []


def test_alias_set_flip_rollback_ls_rm(fx: Fixture, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("blue", "green"):
        assert run(["deploy", "APP", "--name", name], capsys)[0] == 0
    code, out, _ = run(["alias", "ls"], capsys)
    assert out == "no aliases; create one with: corral alias set DOMAIN APP\n"

    code, out, _ = run(["alias", "set", "Shop.Example", "blue"], capsys)
    assert (code, out) == (0, "shop.example -> blue: alias created\n")
    code, _, err = run(["alias", "set", "shop.example", "green"], capsys)
    assert code == 1
    assert "alias shop.example already exists and points at app blue" in err
    code, _, err = run(["alias", "flip", "shop.example", "ghost"], capsys)
    assert code == 1
    assert "no app named 'ghost'" in err

    code, out, _ = run(["alias", "flip", "shop.example", "green"], capsys)
    assert code == 0
    assert out.startswith("shop.example -> green: flipped from blue (revision ")
    code, out, _ = run(["alias", "ls", "--json"], capsys)
    listed = json.loads(out)["aliases"]
    assert [(a["domain"], a["app"], a["previous"]) for a in listed] == [
        ("shop.example", "green", "blue")
    ]
    revision = listed[0]["revision"]
    code, out, _ = run(["alias", "ls"], capsys)
    assert out.splitlines() == [
        "DOMAIN        APP    PREVIOUS  REVISION",
        f"shop.example  green  blue      {revision}",
    ]
    code, _, err = run(["alias", "rollback", "shop.example", "--expect", str(revision - 1)], capsys)
    assert code == 1
    assert "it now points at app green" in err
    code, out, _ = run(["alias", "rollback", "shop.example", "--expect", str(revision)], capsys)
    assert code == 0
    assert out.startswith("shop.example -> blue: flipped from green")
    code, out, _ = run(["alias", "flip", "shop.example", "blue"], capsys)
    assert out == "shop.example -> blue: already points there; nothing changed\n"
    code, out, _ = run(["alias", "rm", "shop.example"], capsys)
    assert (code, out) == (0, "shop.example: alias removed (it pointed at blue)\n")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["deploy", "APP", "--name", "shop", "--domain", "bad_name"], "domain: invalid domain"),
        (["app", "domains", "--name", "shop", "--add", "a..b"], "add: invalid domain 'a..b'"),
        (["alias", "set", "bad_x.example", "blue"], "domain: invalid domain 'bad_x.example'"),
        (["alias", "flip", "shop.example", "Blue"], "app: invalid app name 'Blue'"),
    ],
)
def test_bad_domains_and_names_exit_2_before_any_request(
    argv: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(refuse))
    monkeypatch.chdir(tmp_path)
    make_app_dir(tmp_path / "APP")
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert needle in err
    assert err.count("\n") == 1


def test_alias_ls_escapes_what_it_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = {
        "aliases": [{"domain": "a.example", "app": "x\x1b[31m", "previous": None, "revision": 3}],
        "undecodable": [{"key": "alias/b.example", "reason": "not UTF-8 JSON\n\x07"}],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(handler))
    code, out, _ = run(["alias", "ls"], capsys)
    assert code == 0
    assert "\x1b" not in out
    assert "\x07" not in out
    assert out.splitlines() == [
        "DOMAIN     APP        PREVIOUS  REVISION",
        "a.example  x\\x1b[31m  -         3",
        "unreadable: alias/b.example (not UTF-8 JSON\\n\\x07); remove it with corral alias rm",
    ]
