"""``corral proxy run --response-timeout-ms`` (or ``CORRAL_RESPONSE_TIMEOUT_MS``): read,
validated and refused naming where the bad value came from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.node._errors import ConfigError
from corral.node.cli._proxy_command import proxy_timeouts
from corral.proxy import ProxyTimeouts

ENV = "CORRAL_RESPONSE_TIMEOUT_MS"


def test_the_flag_beats_the_environment_which_beats_the_default() -> None:
    assert proxy_timeouts(None, {}) == ProxyTimeouts(response_ms=3000)
    assert proxy_timeouts(None, {ENV: ""}) == ProxyTimeouts(response_ms=3000)
    assert proxy_timeouts(None, {ENV: "7000"}) == ProxyTimeouts(response_ms=7000)
    assert proxy_timeouts("10000", {ENV: "7000"}) == ProxyTimeouts(response_ms=10_000)
    assert proxy_timeouts(" 100 ", {}) == ProxyTimeouts(response_ms=100)


@pytest.mark.parametrize("bad", ["10s", "-1", "0", "99", "86400001", "1e4", ""])
def test_a_bad_value_is_refused_naming_the_flag_or_the_variable(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--response-timeout-ms: .*from 100 to 86400000"):
        proxy_timeouts(bad, {})
    if bad:
        with pytest.raises(ConfigError, match=f"^{ENV}: "):
            proxy_timeouts(None, {ENV: bad})


def test_proxy_run_refuses_a_bad_timeout_with_exit_2_before_starting_anything(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    run = subprocess.run(
        [
            sys.executable, "-m", "corral", "proxy", "run",
            "--kind", "haproxy",
            "--listen", "127.0.0.1:1",
            "--data-dir", str(tmp_path / "p"),
            "--registry", f"sqlite:///{tmp_path}/r.db",
            "--response-timeout-ms", "10s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "--response-timeout-ms: '10s' is not a whole number" in run.stderr
    assert not (tmp_path / "p").exists()  # nothing was started or written
