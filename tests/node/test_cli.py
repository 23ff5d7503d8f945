"""The command line's checks and error lines that need no running node."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest

from corral.node._cli import main
from corral.node._client import resolve_api_url, resolve_token
from corral.node._errors import ApiError, NodeError

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
        (["deploy", "EMPTY", "--name", "shop"], "command: the app directory names no command"),
        (["deploy", "APP", "--name", "shop", "--env", "CORRAL_SURELY_UNSET_1"], "env:"),
        (["app", "replicas", "--name", "shop", "--count", "0"], "count: 0 is refused"),
        (["node", "cordon", "Bad_Node"], "node: invalid node name"),
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
    from corral.node import _demo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(corral, "__file__", str(tmp_path / "site" / "corral" / "__init__.py"))
    with pytest.raises(NodeError, match="pip install -e"):
        _demo.demo_command(io.StringIO())
    code, _, err = run(["demo"], capsys)
    assert code == 1
    assert err.startswith("corral: error: the demo's example apps")
