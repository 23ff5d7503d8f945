"""``--proxy caddy=URL`` (node run), ``corral proxy run`` flags, ``corral routes`` text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.node import ConfigError
from corral.node._config import resolve_node_config
from corral.node.cli._format import routes_text


def test_push_targets_come_from_flags_env_or_file(tmp_path: Path) -> None:
    flags = {"proxy": ["caddy=http://127.0.0.1:2019", "caddy=http://10.0.0.5:2019/"]}
    config = resolve_node_config(flags, {}, cwd=tmp_path)
    assert config.proxies == ("http://127.0.0.1:2019", "http://10.0.0.5:2019")
    env = {"CORRAL_PROXY": "caddy=http://127.0.0.1:2019,caddy=http://127.0.0.1:2019"}
    assert resolve_node_config({}, env, cwd=tmp_path).proxies == ("http://127.0.0.1:2019",)
    filed = resolve_node_config({}, {}, {"proxy": ["caddy=http://h:1"]}, cwd=tmp_path)
    assert filed.proxies == ("http://h:1",)
    assert resolve_node_config({}, {}, cwd=tmp_path).proxies == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("haproxy=http://127.0.0.1:1", "corral proxy run --kind haproxy"),
        ("http://127.0.0.1:2019", "caddy=http://HOST:PORT"),
        ("caddy=127.0.0.1", "not an address"),
        ("caddy=https://127.0.0.1:2019", "http://HOST:PORT"),
    ],
)
def test_a_bad_push_target_is_refused_naming_the_flag(value: str, words: str) -> None:
    with pytest.raises(ConfigError, match="--proxy") as caught:
        resolve_node_config({"proxy": [value]}, {}, cwd=Path("/"))
    assert words in str(caught.value)


def test_routes_text_lists_domains_held_back_and_proxies() -> None:
    text = routes_text(
        {
            "version": {"fence": 3, "revision": 7},
            "routes": {"shop.test": ["http://h:1", "http://h:2"]},
            "held_back": [{"app": "shop", "node": "n3", "why": "running but not ready"}],
            "proxies": [
                {
                    "id": "edge\x1b[31m",
                    "kind": "haproxy",
                    "listen": "127.0.0.1:80",
                    "applied": {"fence": 3, "revision": 7},
                    "lag_s": 0.0,
                    "error": None,
                }
            ],
        }
    )
    assert "fence 3 revision 7" in text
    assert "shop.test  http://h:2" in text
    assert "shop on n3: running but not ready" in text
    assert "3/7" in text
    assert "0s" in text
    assert "\x1b" not in text  # hostile text is escaped
    assert "no routing table yet" in routes_text({"version": None})


def test_proxy_run_needs_a_registry_and_a_known_kind(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "corral", "proxy", "run", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )

    base = ["--listen", "127.0.0.1:1", "--data-dir", str(tmp_path)]
    missing = run("--kind", "haproxy", *base)
    assert missing.returncode == 2
    assert "--registry" in missing.stderr
    unknown = run("--kind", "nginx", *base, "--registry", f"sqlite://{tmp_path}/r.db")
    assert unknown.returncode == 2
    assert "haproxy" in unknown.stderr
    bad_id = run(
        "--kind", "haproxy", *base, "--registry", f"sqlite://{tmp_path}/r.db", "--id", "Bad_Id"
    )
    assert bad_id.returncode == 2
    assert "--id" in bad_id.stderr
