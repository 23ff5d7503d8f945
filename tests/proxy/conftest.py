"""Real proxies and real backends on loopback (marked slow).

Each test gets its proxy's data directory under a short temporary path (a unix
socket path has a length limit), backends started as OS processes, and every
process stopped by pid when the test ends. Without the proxy binary the test is
skipped, unless CORRAL_REQUIRE_PROXIES=1 (CI), where it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from corral.node.cli._local_cluster import free_port
from corral.proxy import DEFAULT_CADDY, DEFAULT_HAPROXY

BACKEND = Path(__file__).with_name("_backend.py")
BINARIES = {"haproxy": DEFAULT_HAPROXY, "caddy": DEFAULT_CADDY}


def require_binary(kind: str) -> None:
    path = BINARIES[kind]
    if os.access(path, os.X_OK):
        return
    reason = f"{kind} is not installed at {path} (apt-get install {kind})"
    if os.environ.get("CORRAL_REQUIRE_PROXIES") == "1":
        pytest.fail(f"CORRAL_REQUIRE_PROXIES=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(params=["haproxy", "caddy"])
def kind(request: pytest.FixtureRequest) -> str:
    require_binary(request.param)
    return str(request.param)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="corral-px-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Backends:
    """Backend processes by name; each answers its name on its port."""

    procs: dict[str, trio.Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def start(self, *names: str) -> None:
        for name in names:
            port = free_port()
            self.procs[name] = await trio.lowlevel.open_process(
                [sys.executable, str(BACKEND), name, str(port)],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.ports[name] = port
        for name in names:
            await wait_listening(self.ports[name])

    async def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()

    async def stop_all(self) -> None:
        with trio.CancelScope(shield=True):
            for name in list(self.procs):
                await self.kill(name)


async def wait_listening(port: int, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.02)
                continue
            await stream.aclose()
            return


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    group = Backends()
    try:
        yield group
    finally:
        await group.stop_all()
