"""The command line's checks and error lines that need no running node."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.node import ApiError, ConfigError, NodeError
from corral.node.cli import _client as client_module
from corral.node.cli._cli import main
from corral.node.cli._client import resolve_api_url, resolve_token

from .conftest import make_app_dir


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


AUTH = ["--api", "http://127.0.0.1:9", "--token", "t"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["deploy", "APP", "--name", "Shop"], "name: invalid app name 'Shop'"),
        (["deploy", "APP", "--name", "shop", "--replicas", "0"], "replicas: 0 is refused"),
        (["deploy", "APP", "--name", "shop", "--node-selector", "x"], "node-selector"),
        (["deploy", "EMPTY", "--name", "shop"], "command: EMPTY: no corral.toml or Procfile"),
        (["deploy", "APP", "--name", "shop", "--memory-mb", "-1"], "memory-mb: -1 is not"),
        (["deploy", "APP", "--name", "shop", "--max-parallel", "0"], "max-parallel: 0 is not"),
        (["deploy", "APP", "--name", "shop", "--drain-ms", "-5"], "drain-ms: -5 is not"),
        (
            ["deploy", "APP", "--name", "shop", "--ready-timeout-ms", "0"],
            "ready-timeout-ms: 0 is not",
        ),
        (["deploy", "APP", "--name", "shop", "--env", "1X=y"], "env: '1X' is not"),
        (["deploy", "APP", "--name", "shop", "--env", "CORRAL_SURELY_UNSET_1"], "env:"),
        (["app", "replicas", "--name", "shop", "--count", "0"], "count: 0 is refused"),
        (["node", "cordon", "Bad_Node"], "node: invalid node name"),
        (
            ["app", "domains", "--name", "shop", "--add", "127.0.0.1"],
            "add: invalid domain '127.0.0.1': it is an IP address",
        ),
        (["alias", "set", "localhost", "shop"], "domain: invalid domain 'localhost'"),
    ],
)
def test_bad_requests_exit_2_before_any_network(
    argv: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    make_app_dir(tmp_path / "APP")
    (tmp_path / "EMPTY").mkdir()
    code, out, err = run([*argv, *AUTH], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("corral: error: ")
    assert needle in err
    assert err.count("\n") == 1


def test_unreachable_node_names_the_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{closed_port()}"
    code, _, err = run(["ps", "--api", url, "--token", "t"], capsys)
    assert code == 1
    assert f"cannot reach the corral node at {url}" in err
    assert "--api" in err


def test_missing_token_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.delenv("CORRAL_DATA_DIR", raising=False)
    code, _, err = run(["state", "--api", "http://127.0.0.1:9"], capsys)
    assert code == 1
    assert str(tmp_path / ".corral" / "token") in err


def test_api_and_token_resolution(tmp_path: Path) -> None:
    assert resolve_api_url(None, {}) == "http://127.0.0.1:7400"
    assert resolve_api_url(None, {"CORRAL_API": "127.0.0.1:7500"}) == "http://127.0.0.1:7500"
    assert resolve_api_url("http://h:1/", {"CORRAL_API": "x"}) == "http://h:1"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "token").write_text("from-file\n")
    assert resolve_token(None, {}, "d", tmp_path) == "from-file"
    assert resolve_token(None, {"CORRAL_TOKEN": "env"}, "d", tmp_path) == "env"
    assert resolve_token("flag", {"CORRAL_TOKEN": "env"}, "d", tmp_path) == "flag"
    with pytest.raises(ApiError, match="no API token"):
        resolve_token(None, {}, "nowhere", tmp_path)


def test_usage_errors_are_one_line_pointing_at_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["deploy", "somewhere"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "corral deploy: error: the following arguments are required: --name "
        "(see corral deploy --help)\n"
    )


def test_demo_explains_missing_examples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import corral
    from corral.node.cli import _demo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corral, "__file__", str(tmp_path / "site" / "corral" / "__init__.py"))
    with pytest.raises(NodeError, match="pip install -e"):
        _demo.demo_command(io.StringIO())
    code, _, err = run(["demo"], capsys)
    assert code == 1
    assert err.startswith("corral: error: the demo's example apps")


def answering(status: int, body: object = None, text: str = "") -> Any:
    """A transport where every request gets ``status`` with ``body`` (JSON) or ``text``."""

    def handler(request: httpx.Request) -> httpx.Response:
        if body is not None:
            return httpx.Response(status, json=body)
        return httpx.Response(status, text=text)

    return httpx.MockTransport(handler)


def test_a_refused_token_names_the_address_and_where_the_token_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    (tmp_path / "n2").mkdir()
    (tmp_path / "n2" / "token").write_text("other-node-token\n")
    transport = answering(403, {"error": "wrong bearer token"})
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, out, err = run(["ps", "--api", "127.0.0.1:7410", "--data-dir", "n2"], capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert "the node at http://127.0.0.1:7410 refused the token from " in err
    assert str(tmp_path / "n2" / "token") in err
    code, _, err = run(["ps", "--api", "127.0.0.1:7410", "--token", "t"], capsys)
    assert "refused the token from --token (403" in err


@pytest.mark.parametrize(
    ("status", "body", "text"),
    [(400, None, ""), (200, None, "<html>hi</html>"), (404, {"detail": "nope"}, "")],
)
def test_an_answer_that_is_not_a_corral_api_says_check_api(
    status: int,
    body: object,
    text: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport = answering(status, body, text)
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, _, err = run(["state", "--api", "127.0.0.1:7401", "--token", "t"], capsys)
    # Not "the request is wrong" (2): the address is.
    assert code == 1
    assert f"http://127.0.0.1:7401 answered {status}" in err
    assert "not a corral node's API; check --api" in err
    assert err.count("\n") == 1


def test_a_corral_400_exits_2_and_a_409_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = answering(400, {"error": "count: nope", "field": "count"})
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, _, err = run(["app", "retire", "--name", "web", *AUTH], capsys)
    assert (code, err) == (2, "corral: error: count: nope\n")
    transport = answering(409, {"error": "drain of n2 refused: it runs pinned app(s) db"})
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, _, err = run(["node", "drain", "n2", *AUTH], capsys)
    assert (code, err) == (1, "corral: error: drain of n2 refused: it runs pinned app(s) db\n")


@pytest.mark.parametrize(
    ("flag", "env", "where"),
    [("not a url", None, "--api"), ("h:1/v1", None, "--api"), (None, ":::", "CORRAL_API")],
)
def test_a_malformed_api_address_is_a_usage_error(
    flag: str | None,
    env: str | None,
    where: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORRAL_API", raising=False)
    if env is not None:
        monkeypatch.setenv("CORRAL_API", env)
    argv = ["ps", "--token", "t"] + (["--api", flag] if flag else [])
    code, _, err = run(argv, capsys)
    assert code == 2
    assert err.startswith(f"corral: error: {where} ")
    assert "write host:port or http://host:port" in err
    with pytest.raises(ConfigError):
        resolve_api_url(flag, {"CORRAL_API": env} if env else {})


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["ps", "--bogus"], "corral ps"),
        (["node", "drain", "n1", "--bogus"], "corral node drain"),
        (["app", "replicas", "--name", "a", "--count", "1", "x"], "corral app replicas"),
        (["inspect", "--interval", "0"], "corral inspect"),
        (["inspect", "--interval", "nan"], "corral inspect"),
    ],
)
def test_usage_errors_point_at_the_sub_commands_help(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ")
    assert err.endswith(f"(see {prog} --help)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["deploy", "--help"], "Deploy an app directory"),
        (["app", "selector", "--help"], "replaces the whole selector"),
        (["node", "ls", "--help"], "List the nodes"),
        (["node", "drain", "--help"], "pinned apps run there: they are stopped, not moved"),
        (["plan", "--help"], "The smallest document"),
        (["plan", "--help"], '"drain": "forced" (a drain forced with --force'),
        (["plan", "--help"], 'placed_at and "stopped" (nodes where a forced drain stopped'),
        (["plan", "--help"], 'paused and "stopped" (per pinned app'),
        (["--help"], "corral COMMAND --help"),
    ],
)
def test_help_texts_describe_the_command(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 0
    assert needle in " ".join(capsys.readouterr().out.split())


def test_node_ls_and_inspect_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = {
        "/v1/nodes": {
            "nodes": [
                {
                    "node": "n1",
                    "state": "alive",
                    "serving": 2,
                    "labels": {"zone": "a"},
                    "rack": None,
                    "datacenter": None,
                    "api_address": "127.0.0.1:7400",
                    "coordinator": True,
                    "allocatable": {"memory_mb": 7680, "disk_mb": 80000},
                },
                {
                    "node": "n2",
                    "state": "cordoned",
                    "serving": 0,
                    "labels": {},
                    "rack": "r2",
                    "datacenter": None,
                    "api_address": "127.0.0.1:7410",
                    "coordinator": False,
                    "incarnation": 3,
                    "since": 1000.0,
                },
                {
                    "node": "n3",
                    "state": "down",
                    "serving": 0,
                    "labels": {},
                    "rack": None,
                    "datacenter": None,
                    "api_address": None,
                    "coordinator": False,
                    "since": 1060.0,
                    "down_since": 1060.0,
                    "grace_until": 1360.0,
                },
            ],
            "coordinator": "n1",
            "fence": 7,
            "states": {"source": "coordinator", "holder": "n1"},
            "now": 1090.0,
        },
        "/v1/actors": {"name": "n1", "path": "/", "children": []},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers[request.url.path])

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(handler))
    code, out, _ = run(["node", "ls", *AUTH], capsys)
    assert code == 0
    assert out.splitlines() == [
        "NODE  STATE                   FOR     INC  APPS  LABELS  RACK  API             "
        "ALLOC MEM/DISK",
        "n1 *  alive                   -       -    2     zone=a  -     127.0.0.1:7400  "
        "7680/80000 MiB",
        "n2    cordoned                1m 30s  3    0     -       r2    127.0.0.1:7410  -",
        "n3    down (moves in 4m 30s)  30s     -    0     -       -     -               -",
        "* coordinator (fence 7)",
    ]
    code, out, _ = run(["node", "ls", "--json", *AUTH], capsys)
    assert code == 0
    down = json.loads(out)["nodes"][2]
    assert (down["state"], down["since"], down["down_since"]) == ("down", 1060.0, 1060.0)
    # Without the coordinator's states, the table says where they came from.
    answers["/v1/nodes"]["states"] = {"source": "records", "holder": "n1", "error": "timed out"}
    code, out, _ = run(["node", "ls", *AUTH], capsys)
    assert out.splitlines()[-1] == (
        "states from the node records: the coordinator could not be asked (timed out)"
    )
    code, out, _ = run(["inspect", "--json", *AUTH], capsys)
    assert code == 0
    assert json.loads(out) == answers["/v1/actors"]
    # Not a terminal (a pipe, a script): the tree once, as plain text, not the TUI.
    code, out, _ = run(["inspect", *AUTH], capsys)
    assert code == 0
    assert out.splitlines()[0].startswith("ACTOR")
    assert out.splitlines()[1].startswith("n1")
    assert "\x1b" not in out


def test_forced_drain_names_the_pinned_apps_it_stops_and_ps_says_why_reloc_cannot_tell(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bytes]] = []
    row = {
        "app": "db",
        "node": "n2",
        "state": "stopped",
        "public_port": None,
        "internal_port": None,
        "restarts": 0,
        "revision": None,
        "reloc": "no (forced drain of n2; pinned, not started elsewhere)",
        "reason": "forced drain of n2; pinned, not started elsewhere",
    }
    why = "cannot ask coordinator n1: peer 'n1' is unreachable"
    answers: dict[str, Any] = {
        "/v1/nodes/n2/drain": {"node": "n2", "intent": {}, "interrupted": ["db", "queue"]},
        "/v1/ps": {"rows": [row], "coordinator": {"holder": "n1", "error": why}},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.content))
        return httpx.Response(200, json=answers[request.url.path])

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(handler))
    code, out, _ = run(["node", "drain", "n2", "--force", *AUTH], capsys)
    assert code == 0
    assert json.loads(seen[-1][1]) == {"force": True}
    assert out.strip() == (
        "n2: draining (forced); its unpinned work moves to other nodes; pinned app(s) db, "
        "queue are stopped there and not started elsewhere (`corral node uncordon n2` starts "
        "them there again)"
    )
    code, out, _ = run(["ps", *AUTH], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["db", "n2", "stopped"]
    assert lines[1].endswith("no (forced drain of n2; pinned, not started elsewhere)")
    assert lines[-1] == f"RELOC cannot tell cooldowns: {why}"
    code, out, _ = run(["ps", "--json", *AUTH], capsys)
    assert json.loads(out) == [row]  # --json keeps printing the rows


def test_rollback_says_which_revision_it_rolls_back_to(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = {
        "name": "web",
        "deployment": {"revision": "a" * 64},
        "previous_deployment": {"revision": "b" * 64},
    }
    transport = answering(200, {"app": app})
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, out, _ = run(["rollback", "web", *AUTH], capsys)
    assert code == 0
    assert out == (
        f"web: rolling back to revision {'a' * 12} (from {'b' * 12}); "
        "`corral ps` shows the progress\n"
    )
    refused = "app web has no previous revision to roll back to: it was deployed once"
    transport = answering(409, {"error": refused})
    monkeypatch.setattr(client_module, "client_transport", lambda: transport)
    code, _, err = run(["rollback", "web", *AUTH], capsys)
    assert (code, err) == (1, f"corral: error: {refused}\n")
