"""Hostile input at the HTTP API, rebuilt as the attacks were found.

Deep JSON, bodies past the cap (chunked or declared), a route that raises, a NUL
in an environment value, control characters in labels and selectors, and a
registry record carrying a terminal escape that the CLI must print escaped.
Most run the ASGI app in memory; two run it under a real Hypercorn server on a
loopback port.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hypercorn.trio import serve

from corral.node import ConfigError
from corral.node._config import Address, resolve_node_config
from corral.node.artifacts._artifact_store import ArtifactStore
from corral.node.cli._cli import main
from corral.node.cli._format import nodes_table, printable, printable_tree, ps_table, state_summary
from corral.node.server._api import ApiServices, build_api
from corral.node.server._server import hypercorn_config
from corral.registry import (
    MemoryRegistry,
    Undecodable,
    decode_record,
    node_key,
    read_records,
)

from .conftest import b64, make_app_dir, packed_app

TOKEN = "sekrit-token"
LIMIT = 1024 * 1024  # the body cap these tests configure
CHUNK = 64 * 1024
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def build(
    tmp_path: Path,
    *,
    state: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    registry: MemoryRegistry | None = None,
) -> tuple[Any, MemoryRegistry]:
    registry = registry or MemoryRegistry()

    async def default_state() -> dict[str, Any]:
        return {"node": {"id": "n1"}}

    services = ApiServices(
        token=TOKEN,
        secret="cluster-secret",
        node_id="n1",
        registry=registry,
        artifacts=ArtifactStore(
            registry, tmp_path / "artifacts", node_id="n1", secret="cluster-secret"
        ),
        state=state or default_state,
        actors=lambda: {"path": "/", "children": []},
        events=lambda: [],
        wall_clock=lambda: 1_700_000_000.0,
        max_body_bytes=LIMIT,
    )
    return build_api(services), registry


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node", headers=AUTH
    )


class CountingBody(httpx.AsyncByteStream):
    """A chunked request body of ``total`` bytes that counts what was pulled from it.

    An iterator rather than an async generator: the server stops pulling early,
    and an abandoned generator would be finalized late, with a ResourceWarning.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.pulled = 0
        self._chunk = b"x" * CHUNK

    def __aiter__(self) -> CountingBody:  # type: ignore[override]
        return self

    async def __anext__(self) -> bytes:
        if self.pulled >= self.total:
            raise StopAsyncIteration
        self.pulled += CHUNK
        return self._chunk


async def post_streaming(
    http: httpx.AsyncClient, path: str, body: CountingBody, headers: dict[str, str] | None = None
) -> httpx.Response:
    """POST ``body`` as it is (chunked unless ``headers`` declare a length)."""
    request = http.build_request("POST", path, headers=headers)
    request.stream = body
    if headers is None or "Content-Length" not in headers:
        del request.headers["Content-Length"]
        request.headers["Transfer-Encoding"] = "chunked"
    return await http.send(request)


# --------------------------------------------------------------------------- JSON depth


@pytest.mark.parametrize("path", ["/v1/apps/shop/deploy", "/v1/apps/shop/selector"])
async def test_json_nested_100k_deep_is_a_json_400(tmp_path: Path, path: str) -> None:
    app, registry = build(tmp_path)
    before = await registry.revision()
    async with client(app) as http:
        response = await http.post(path, content=b'{"selector": ' + b"[" * 100_000)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["field"] == "body"
    assert "more than the 1024 allowed" in response.json()["error"]
    async with client(app) as http:
        deep = b'{"selector": ' + b"[" * 65 + b"]" * 65 + b"}"
        response = await http.post(path, content=deep)
    assert (response.status_code, response.json()["field"]) == (400, "body")
    assert "deeper than the 64 levels" in response.json()["error"]
    assert await registry.revision() == before


# --------------------------------------------------------------------------- body size


async def test_a_chunked_body_past_the_cap_is_413_and_not_read_further(tmp_path: Path) -> None:
    app, registry = build(tmp_path)
    before = await registry.revision()
    body = CountingBody(300 * 1024 * 1024)
    async with client(app) as http:
        response = await post_streaming(http, "/v1/apps/shop/deploy", body)
    assert response.status_code == 413
    assert response.json()["field"] == "body"
    assert f"passed the {LIMIT} bytes (1.0 MiB)" in response.json()["error"]
    assert response.headers["connection"] == "close"
    # The handler stopped at the first chunk past the cap: 1 MiB of 300 was pulled.
    assert LIMIT < body.pulled <= LIMIT + CHUNK
    assert await registry.revision() == before


async def test_a_declared_length_past_the_cap_is_413_before_any_byte_is_read(
    tmp_path: Path,
) -> None:
    app, _ = build(tmp_path)
    body = CountingBody(2 * LIMIT)
    async with client(app) as http:
        response = await post_streaming(
            http, "/v1/apps/shop/deploy", body, headers={"Content-Length": str(2 * LIMIT)}
        )
    assert response.status_code == 413
    assert "declares 2097152 bytes" in response.json()["error"]
    assert body.pulled == 0


async def test_a_body_just_under_the_cap_is_read_and_judged(tmp_path: Path) -> None:
    app, _ = build(tmp_path)
    packed = packed_app(tmp_path)
    text = json.dumps({"artifact": b64(packed.data), "env": {"PAD": "p" * 1000}})
    async with client(app) as http:
        response = await http.post("/v1/apps/shop/deploy", content=text.encode())
    assert response.status_code == 201, response.text


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, list[Any]]]:
    """The API under a real Hypercorn server on a loopback port (stopped after)."""
    calls: list[Any] = []

    async def state() -> dict[str, Any]:
        calls.append("state")
        raise RuntimeError("a bug deep inside, with private detail")

    app, _ = build(tmp_path, state=state)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(
                app,
                hypercorn_config(Address("127.0.0.1", 0)),
                shutdown_trigger=shutdown.wait,
                task_status=task_status,
            )
        )
        yield binds[0], calls
        shutdown.set()


async def test_a_real_server_answers_413_to_a_300_mib_chunked_body_without_taking_it(
    served: tuple[str, list[Any]],
) -> None:
    url, _ = served
    body = CountingBody(300 * 1024 * 1024)
    with trio.fail_after(30):
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            response = await post_streaming(http, "/v1/apps/shop/deploy", body)
    assert response.status_code == 413
    assert response.json()["field"] == "body"
    # The cap plus what the socket buffers held when the server hung up.
    assert body.pulled < 32 * 1024 * 1024, body.pulled


async def test_a_real_server_answers_a_bare_exception_with_a_json_500(
    served: tuple[str, list[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    url, calls = served
    async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        response = await http.get("/v1/state")
    assert calls == ["state"]
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    error_id = response.json()["id"]
    assert error_id in response.json()["error"]
    assert "private detail" not in response.text
    assert "Traceback" not in response.text
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None


# --------------------------------------------------------------------------- unhandled


async def test_a_route_raising_a_bare_exception_is_a_json_500_with_a_logged_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="corral.node.api")

    async def state() -> dict[str, Any]:
        raise KeyError("secret internals")

    app, _ = build(tmp_path, state=state)
    async with client(app) as http:
        first = await http.get("/v1/state")
        second = await http.get("/v1/state")
    assert (first.status_code, second.status_code) == (500, 500)
    ids = [first.json()["id"], second.json()["id"]]
    assert ids[0] != ids[1]
    assert "KeyError" in first.json()["error"]
    assert "secret internals" not in first.text
    for error_id in ids:
        (record,) = [r for r in caplog.records if error_id in r.getMessage()]
        assert record.levelno == logging.ERROR
        assert "GET /v1/state" in record.getMessage()
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], KeyError)


# --------------------------------------------------------------------------- env


@pytest.mark.parametrize(
    ("env", "field", "needle"),
    [
        ({"GREETING": "hi\u0000there"}, "env.GREETING", "NUL byte (at offset 2)"),
        ({"GREETING": "\ud800"}, "env.GREETING", "lone surrogate"),
        ({"BIG": "x" * (32 * 1024 + 1)}, "env.BIG", "32769 bytes, more than the 32768"),
        ({f"V{i}": "x" for i in range(257)}, "env", "257 variables, more than the 256"),
        ({f"V{i}": "x" * 30_000 for i in range(10)}, "env", "more than the 262144 allowed"),
        ({"A=B": "x"}, "env", "without '='"),
        ({"A\u0000": "x"}, "env", "not an environment variable name"),
        ({"ÉTÉ": "x"}, "env", "not an environment variable name"),
    ],
)
async def test_an_env_exec_cannot_pass_is_a_400_naming_the_field(
    tmp_path: Path, env: dict[str, str], field: str, needle: str
) -> None:
    app, registry = build(tmp_path)
    before = await registry.revision()
    body = json.dumps({"artifact": b64(packed_app(tmp_path).data), "env": env})
    async with client(app) as http:
        response = await http.post("/v1/apps/shop/deploy", content=body.encode())
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field
    assert needle in response.json()["error"]
    assert await registry.revision() == before


def test_a_nul_in_cli_env_exits_2_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    make_app_dir(tmp_path / "APP")
    argv = ["deploy", "APP", "--name", "shop", "--env", "MY_GREETING=a\u0000b"]
    code = main([*argv, "--api", "http://127.0.0.1:9", "--token", "t"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("corral: error: env.MY_GREETING: the value holds a NUL byte")


# --------------------------------------------------------------------------- labels


@pytest.mark.parametrize(
    ("selector", "needle"),
    [
        ({"zone\u001b[31m": "a"}, r"selector key 'zone\x1b[31m' is invalid"),
        ({"zone": "a\nFAKE"}, r"selector 'zone' has an invalid value 'a\nFAKE'"),
        ({"zone": "a b"}, "has an invalid value"),
        ({"-zone": "a"}, "is invalid"),
        ({"Example.com/zone": "a"}, "is invalid"),
        ({f"k{i}": "v" for i in range(65)}, "65 selector pairs, more than the 64"),
    ],
)
async def test_a_selector_outside_the_label_syntax_is_a_400_naming_the_key(
    tmp_path: Path, selector: dict[str, str], needle: str
) -> None:
    app, registry = build(tmp_path)
    before = await registry.revision()
    async with client(app) as http:
        deploy = await http.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(packed_app(tmp_path).data), "selector": selector},
        )
        set_selector = await http.post("/v1/apps/shop/selector", json={"selector": selector})
    for response in (deploy, set_selector):
        assert response.status_code == 400, response.text
        assert response.json()["field"] == "selector"
        assert needle in response.json()["error"]
        assert "\u001b" not in response.json()["error"]
    assert await registry.revision() == before


async def test_label_syntax_lets_through_what_kubernetes_allows(tmp_path: Path) -> None:
    app, _ = build(tmp_path)
    selector = {"example.com/zone": "eu-1", "tier": "", "A.b_c-9": "Z_z.9"}
    async with client(app) as http:
        response = await http.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(packed_app(tmp_path).data), "selector": selector},
        )
    assert response.status_code == 201, response.text
    assert response.json()["app"]["selector"] == selector


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        ({"label": ["zone=a\u001b[2J"]}, {}, r"--label: label 'zone' has an invalid value"),
        ({}, {"CORRAL_LABELS": "zo\nne=a"}, r"CORRAL_LABELS: label key 'zo\nne' is invalid"),
    ],
)
def test_a_node_label_outside_the_syntax_stops_the_node_naming_it(
    tmp_path: Path, flags: dict[str, Any], env: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_node_config(flags, env, cwd=tmp_path)
    assert needle in str(caught.value)


def test_a_node_label_outside_the_syntax_in_the_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="label key 'a b' is invalid"):
        resolve_node_config({}, {}, {"label": {"a b": "x"}}, cwd=tmp_path)


def test_a_record_with_an_escape_in_a_label_is_undecodable() -> None:
    value = json.dumps(
        {"v": 1, "id": "n2", "state": "alive", "labels": {"zone": "\u001b]0;owned\u0007"}}
    ).encode()
    decoded = decode_record(node_key("n2"), value)
    assert isinstance(decoded, Undecodable)
    assert r"label 'zone' has an invalid value '\x1b]0;owned\x07'" in decoded.reason
    deep = b'{"v": 1, "id": "n2", "labels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert isinstance(decode_record(node_key("n2"), deep), Undecodable)


# --------------------------------------------------------------------------- escaping


def controls(text: str) -> set[str]:
    """The control characters in ``text`` other than newlines."""
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}


def assert_one_line_per_row(text: str, lines: int) -> None:
    assert controls(text) == set()
    assert len(text.splitlines()) == lines


async def test_an_escape_written_into_the_registry_is_printed_escaped(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    hostile = {
        "v": 1,
        "id": "n2",
        "state": "alive",
        "rack": "r1\u001b]0;owned\u0007",
        "datacenter": "dc\nn9  alive  0  -  -  -",
        "api_address": "\u001b[2J127.0.0.1:7400",
    }
    await registry.put(node_key("n2"), json.dumps(hostile).encode())
    records, undecodable = await read_records(registry, "nodes/")
    assert undecodable == []  # no label: it decodes
    assert list(records) == ["nodes/n2"]
    app, _ = build(tmp_path, registry=registry)
    async with client(app) as http:
        answer = (await http.get("/v1/nodes")).json()
    text = nodes_table(answer)
    # header, n2, the coordinator footer, and where the states came from
    assert_one_line_per_row(text, 4)
    assert r"r1\x1b]0;owned\x07" in text
    assert r"\x1b[2J127.0.0.1:7400" in text
    node = {**hostile, "labels": {"zone\u001b[31m": "a\nb"}}
    summary = state_summary({"node_id": "n2", "node": node, "lease": {}}, now=0.0)
    assert controls(summary) == set()
    assert r"labels      zone\x1b[31m=a\nb" in summary
    assert r"location    rack r1\x1b]0;owned\x07, datacenter dc\nn9  alive" in summary


def test_ps_and_state_escape_control_characters_in_every_cell() -> None:
    row = {
        "app": "web\u001b[31m",
        "node": "n1\nn2",
        "state": "running\u202e",
        "public_port": 1,
        "internal_port": 2,
        "restarts": 0,
        "reloc": "no",
    }
    text = ps_table([row], {"error": "holder n9 said \u001b[5mhi"})
    assert_one_line_per_row(text, 3)
    assert r"web\x1b[31m  n1\nn2  running\u202e" in text
    assert text.endswith(r"said \x1b[5mhi")
    process = {"app": "web", "state": "backoff", "last_error": "exec failed:\r\u001b[2K ok"}
    summary = state_summary({"node_id": "n1", "processes": [process]}, now=0.0)
    assert r"exec failed:\r\x1b[2K ok" in summary
    assert controls(summary) == set()


def test_printable_escapes_controls_as_python_spells_them() -> None:
    assert printable("plain é ü 中") == "plain é ü 中"
    assert printable("a\x1b[31mb\n\r\t\x00\x7f\x9b\u202e\u2028") == (
        r"a\x1b[31mb\n\r\t\x00\x7f\x9b\u202e\u2028"
    )
    assert printable_tree({"k\n": ["v\x07", 3, None]}) == {r"k\n": [r"v\x07", 3, None]}
