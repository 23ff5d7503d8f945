"""A backend that takes 4 s to answer, behind real HAProxy and Caddy under ``corral proxy
run --response-timeout-ms 10000``: the answer gets through. With the default (3000 ms)
the proxy cuts it (marked slow; skipped without the binary unless
CORRAL_REQUIRE_PROXIES=1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from corral.actors.routing import RouteTable, encode_table_json
from corral.proxy import open_proxy
from corral.registry import ROUTING_KEY, open_registry

from .conftest import Backends, free_port

pytestmark = pytest.mark.slow

ANSWER_AFTER_MS = 4000


async def get(listen: str, path: str, timeout: float) -> httpx.Response | None:
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await client.get(f"http://{listen}{path}", headers={"Host": "slow.test"})
    except httpx.HTTPError:
        return None


async def test_a_4_s_answer_gets_through_with_response_timeout_10000(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a")
    table = RouteTable(1, 1, {"slow.test": (backends.url("a"),)})
    url = f"sqlite:///{data_dir}/registry.db"
    async with open_registry(url) as registry:
        await registry.put(ROUTING_KEY, encode_table_json(table))
    listen = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with (data_dir / "run.log").open("ab") as log:
        run = subprocess.Popen(
            [
                sys.executable, "-m", "corral", "proxy", "run",
                "--kind", kind,
                "--listen", listen,
                "--registry", url,
                "--data-dir", str(data_dir / "p"),
                "--response-timeout-ms", "10000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        with trio.fail_after(30):
            while (quick := await get(listen, "/", 1.0)) is None or quick.status_code != 200:
                assert run.poll() is None, (data_dir / "run.log").read_text()
                await trio.sleep(0.1)
        t0 = time.monotonic()
        slow = await get(listen, f"/wait/{ANSWER_AFTER_MS}", 20.0)
        took = time.monotonic() - t0
        print(f"{kind}: a {ANSWER_AFTER_MS} ms answer came through in {took:.2f} s")
        assert slow is not None
        assert (slow.status_code, slow.text) == (200, "a")
        assert ANSWER_AFTER_MS / 1000 <= took < 6.0  # sent once, not retried
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=20)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    assert run.returncode == 0, (data_dir / "run.log").read_text()


async def test_with_the_default_the_proxy_cuts_a_4_s_answer(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    """What the setting is for: the default bound (3 s) gives 504 (HAProxy) or 502 (Caddy)."""
    await backends.start("a")
    listen = f"127.0.0.1:{free_port()}"
    async with open_proxy(kind, listen=listen, data_dir=data_dir / "p") as engine:
        await engine.offer(RouteTable(1, 1, {"slow.test": (backends.url("a"),)}))
        t0 = time.monotonic()
        cut = await get(listen, f"/wait/{ANSWER_AFTER_MS}", 30.0)
        took = time.monotonic() - t0
    print(f"{kind}: default timeout answered {cut and cut.status_code} after {took:.2f} s")
    assert cut is not None
    assert cut.status_code in (502, 504)
