"""A real HAProxy or Caddy killed under ``corral proxy run``, and a second run on the
same data dir or id (marked slow; skipped without the binary unless
CORRAL_REQUIRE_PROXIES=1)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from corral.actors.routing import RouteTable, encode_table_json, read_routes_answer
from corral.node.cli._format import routes_text
from corral.proxy import ProxyEngine, run_proxy
from corral.proxy._local import LocalProxy
from corral.proxy._status import ProxyStatus
from corral.registry import ROUTING_KEY, open_registry, proxy_key

from .conftest import Backends, free_port, require_binary

pytestmark = pytest.mark.slow


async def ok_through(listen: str, host: str) -> bool:
    try:
        async with httpx.AsyncClient(
            limits=httpx.Limits(max_keepalive_connections=0), timeout=1.0
        ) as client:
            response = await client.get(f"http://{listen}/", headers={"Host": host})
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.text == "a1"


async def test_a_killed_proxy_serves_again_within_2_s_with_no_table_change(
    kind: str, data_dir: Path, backends: Backends
) -> None:
    await backends.start("a1")
    listen = f"127.0.0.1:{free_port()}"
    url = f"sqlite:///{data_dir}/registry.db"
    table = RouteTable(1, 1, {"shop.test": (backends.url("a1"),)})
    async with open_registry(url) as registry:
        await registry.put(ROUTING_KEY, encode_table_json(table))
        routing_before = await registry.get(ROUTING_KEY)
        async with trio.open_nursery() as nursery:
            engine: ProxyEngine = await nursery.start(
                functools.partial(
                    run_proxy,
                    kind,
                    listen=listen,
                    registry_url=url,
                    data_dir=data_dir / "p",
                    proxy_id="edge",
                    report_every=0.5,
                )
            )
            assert await ok_through(listen, "shop.test")
            pid = engine.driver.pid  # type: ignore[attr-defined]
            assert isinstance(pid, int)

            # Steady requests, one every 20 ms, while the proxy binary is killed.
            outcomes: list[tuple[float, bool]] = []

            async def steady() -> None:
                while True:
                    outcomes.append((trio.current_time(), await ok_through(listen, "shop.test")))
                    await trio.sleep(0.02)

            nursery.start_soon(steady)
            await trio.sleep(0.3)
            killed_at = trio.current_time()
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(10):
                while engine.status.restarts < 1:
                    await trio.sleep(0.01)
            await trio.sleep(1.0)
            after = [(t, ok) for t, ok in outcomes if t >= killed_at]
            last_failure = max((t for t, ok in after if not ok), default=killed_at)
            back = min(t for t, ok in after if ok and t > last_failure) - killed_at
            assert back < 2.0, f"served again {back:.2f} s after the kill"
            assert all(ok for t, ok in after if t > last_failure)

            # The dead master was reaped (a zombie would still take signal 0) and the
            # new one is another process; the table did not change.
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
            assert engine.driver.pid not in (None, pid)  # type: ignore[attr-defined]
            assert await registry.get(ROUTING_KEY) == routing_before
            assert engine.status.applied_revision == 1

            with trio.fail_after(10):
                while True:
                    kv = await registry.get(proxy_key("edge"))
                    assert kv is not None
                    record = ProxyStatus.decode(kv.value)
                    if record.restarts == 1 and record.since is not None:
                        break
                    await trio.sleep(0.05)
            assert record.last_error == f"{kind} killed by SIGKILL"
            answer = await read_routes_answer(registry, time.time())
            (row,) = answer["proxies"]
            assert (row["restarts"], row["last_error"], row["not_reporting_s"]) == (
                1,
                f"{kind} killed by SIGKILL",
                None,
            )
            line = next(x for x in routes_text(answer).splitlines() if x.startswith("edge"))
            assert "serving" in line
            assert "killed by SIGKILL" in line
            print(f"{kind}: served again {back:.3f} s after kill -9")
            nursery.cancel_scope.cancel()


def run_second(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(
        [sys.executable, "-m", "corral", "proxy", "run", "--kind", "haproxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def wait_record(url: str, proxy_id: str, pid: int, timeout: float = 30.0) -> ProxyStatus:
    async def read() -> ProxyStatus:
        async with open_registry(url) as registry:
            with trio.fail_after(timeout):
                while True:
                    kv = await registry.get(proxy_key(proxy_id))
                    if kv is not None:
                        record = ProxyStatus.decode(kv.value)
                        if record.pid == pid and record.since is not None:
                            return record
                    await trio.sleep(0.1)

    return trio.run(read)


def test_a_second_run_on_the_same_data_dir_or_id_is_refused_and_the_first_keeps_its_record(
    data_dir: Path,
) -> None:
    require_binary("haproxy")
    url = f"sqlite:///{data_dir}/registry.db"
    first = LocalProxy.start(
        "haproxy", listen=free_port(), registry_url=url, data_dir=data_dir / "p", proxy_id="edge"
    )
    try:
        wait_record(url, "edge", first.process.pid)
        listen = f"127.0.0.1:{first.listen}"
        common = ["--registry", url, "--listen", listen]

        same_dir = run_second(*common, "--data-dir", str(data_dir / "p"), "--id", "edge")
        assert same_dir.returncode == 1, same_dir.stderr
        line = same_dir.stderr.strip()
        assert "\n" not in line, line
        assert f"pid {first.process.pid}" in line
        assert listen in line
        assert "data dir" in line

        same_id = run_second(*common, "--data-dir", str(data_dir / "q"), "--id", "edge")
        assert same_id.returncode == 1, same_id.stderr
        line = same_id.stderr.strip()
        assert "\n" not in line, line
        assert f"pid {first.process.pid}" in line
        assert "proxy id 'edge'" in line

        # The first one's record stays, and it still serves.
        record = wait_record(url, "edge", first.process.pid)
        assert record.listen == listen
        assert first.running()

        # Its proxy killed under it: the command restarts it and records so.
        proxy = first.proxy_pid()
        assert proxy is not None
        os.kill(proxy, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while wait_record(url, "edge", first.process.pid).restarts < 1:
            assert time.monotonic() < deadline, first.log_tail()
            time.sleep(0.1)
    finally:
        assert first.stop() == []
    assert first.process.returncode == 0

    async def gone() -> bool:
        async with open_registry(url) as registry:
            return await registry.get(proxy_key("edge")) is None

    assert trio.run(gone)  # stopped on purpose: its own record goes


def test_a_run_killed_with_sigkill_is_replaced_and_its_leftover_proxy_ended(
    data_dir: Path,
) -> None:
    """Its record (a dead owner) and data dir do not block the next run, and the proxy
    it could not stop, still serving its last table on the address, is ended."""
    require_binary("haproxy")
    url = f"sqlite:///{data_dir}/registry.db"
    port = free_port()
    first = LocalProxy.start(
        "haproxy", listen=port, registry_url=url, data_dir=data_dir / "p", proxy_id="edge"
    )
    second: LocalProxy | None = None
    try:
        wait_record(url, "edge", first.process.pid)
        leftover = first.proxy_pid()
        assert leftover is not None
        first.process.kill()
        first.process.wait(10)
        os.kill(leftover, 0)  # the proxy outlived its command
        second = LocalProxy.start(
            "haproxy", listen=port, registry_url=url, data_dir=data_dir / "p", proxy_id="edge"
        )
        record = wait_record(url, "edge", second.process.pid)
        assert record.listen == f"127.0.0.1:{port}"
        with pytest.raises(ProcessLookupError):
            os.kill(leftover, 0)
        assert second.proxy_pid() not in (None, leftover)
    finally:
        first.stop()
        if second is not None:
            assert second.stop() == []
