"""The Caddy driver: ``caddy run`` with a loopback admin API, each table ``POST /load``-ed.

Caddy applies every config change by reloading the whole config: the new servers
take over the listeners and the old ones shut down gracefully, which closes their
*idle* keep-alive connections at once. A client that sends a request on such a
connection at that moment sees it reset (seen here with an httpx client reusing
its connection right after an alias flip). Requests in flight finish. So
with Caddy each table change can cost a client that reuses connections one retry;
HAProxy, updated through its Runtime API, has no such window, which is why it is
the primary proxy.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import httpx
import trio

from corral.actors.routing import RouteTable
from corral.proxy._caddy_plan import caddy_config_bytes
from corral.proxy._driver import Applied, ProxyDriver
from corral.proxy._errors import InvalidProxySetup, ProxyApplyFailed, ProxyStartFailed
from corral.proxy._process import (
    OWNED_FILE,
    ProxyProcess,
    end_leftover,
    find_binary,
    log_tail,
    wait_for_exit,
)
from corral.proxy._tuning import DEFAULT_TIMEOUTS, ProxyTimeouts

__all__ = ["DEFAULT_CADDY", "CaddyDriver"]

log = logging.getLogger("corral.proxy.caddy")

DEFAULT_CADDY = "/usr/bin/caddy"


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CaddyDriver(ProxyDriver):
    """Runs ``caddy run`` with its files under ``data_dir``; see ``_caddy_plan``.

    Args:
        listen: ``host:port`` to serve HTTP on.
        data_dir: where the config, storage and log live.
        admin: ``127.0.0.1:PORT`` for the admin API (default: a free loopback port).
        binary: the caddy executable (default ``/usr/bin/caddy``).
    """

    kind = "caddy"

    def __init__(
        self,
        *,
        listen: str,
        data_dir: Path,
        admin: str | None = None,
        binary: str | None = None,
        start_timeout: float = 30.0,
        timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
    ) -> None:
        self._timeouts = timeouts
        self._binary = find_binary("caddy", binary, DEFAULT_CADDY, "caddy")
        self._dir = Path(data_dir).resolve()
        self._listen = listen
        self._admin = admin or f"127.0.0.1:{_free_loopback_port()}"
        host = self._admin.rsplit(":", 1)[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            raise InvalidProxySetup(
                f"caddy admin address {self._admin!r} is not loopback; its API takes whole "
                "configs unauthenticated, so keep it on 127.0.0.1"
            )
        self._start_timeout = start_timeout
        self._process: ProxyProcess | None = None
        self._client: httpx.AsyncClient | None = None
        self._reloads = 0
        self._closed = False
        self._lock = trio.Lock()
        self._current = RouteTable(0, 0)

    @property
    def listen(self) -> str:
        return self._listen

    @property
    def admin(self) -> str:
        """``host:port`` of the admin API (what ``--proxy caddy=http://...`` names)."""
        return self._admin

    @property
    def reloads(self) -> int:
        return self._reloads

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _document(self, table: RouteTable) -> bytes:
        return caddy_config_bytes(
            table,
            listen=self._listen,
            admin=self._admin,
            storage=str(self._dir / "storage"),
            timeouts=self._timeouts,
        )

    async def start(self) -> None:
        """Start caddy serving an empty table; returns once its admin API answers."""
        self._dir.mkdir(parents=True, exist_ok=True)
        await end_leftover("caddy", self._dir)
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=f"http://{self._admin}", timeout=30.0)
        await self._start(RouteTable(0, 0))

    async def _start(self, table: RouteTable) -> None:
        config = self._dir / "caddy.json"
        tmp = config.with_name(".caddy.json.tmp")
        tmp.write_bytes(self._document(table))
        os.replace(tmp, config)
        home = self._dir / "home"
        env = {
            **os.environ,
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_HOME": str(home / "config"),
        }
        self._process = await ProxyProcess.start(
            [self._binary, "run", "--config", str(config)],
            log_path=self._dir / "caddy.log",
            cwd=self._dir,
            env=env,
            owned_file=self._dir / OWNED_FILE,
        )
        await self._wait_admin()
        self._current = table

    async def _wait_admin(self) -> None:
        assert self._process is not None
        assert self._client is not None
        with trio.move_on_after(self._start_timeout):
            while True:
                if self._process.exit_code is not None:
                    raise ProxyStartFailed(
                        f"caddy exited with code {self._process.exit_code}; its log "
                        f"{self._process.log_path} ends with:\n{log_tail(self._process.log_path)}"
                    )
                try:
                    response = await self._client.get("/config/")
                    if response.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.02)
        raise ProxyStartFailed(
            f"caddy's admin API {self._admin} did not answer within {self._start_timeout} s; "
            f"its log ends with:\n{log_tail(self._dir / 'caddy.log')}"
        )

    async def wait_exit(self) -> int:
        """Return once caddy exits (reaped), with its exit code."""
        return await wait_for_exit(self._process)

    async def restart(self) -> Applied | None:
        """Start caddy again serving the last table; None if it is running."""
        if self._closed:
            raise ProxyStartFailed("the caddy driver is closed: its process was stopped")
        assert self._client is not None, "start() first (open_proxy does)"
        async with self._lock:
            if self._process is not None and self._process.exit_code is None:
                return None
            t0 = trio.current_time()
            if self._process is not None:
                await self._process.stop()
            self._reloads += 1
            self._process = None
            await self._start(self._current)
            return Applied("start", trio.current_time() - t0, why="process exited")

    async def aclose(self) -> None:
        """Stop caddy by pid and close the admin client."""
        self._closed = True
        if self._process is not None:
            await self._process.stop()
            self._process = None
        if self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    async def apply(self, table: RouteTable) -> Applied:
        if self._closed:
            raise ProxyApplyFailed("the caddy driver is closed: its process was stopped")
        async with self._lock:
            return await self._apply(table)

    async def _apply(self, table: RouteTable) -> Applied:
        assert self._client is not None, "start() first (open_proxy does)"
        t0 = trio.current_time()
        if self._process is None or self._process.exit_code is not None:
            if self._process is not None:
                log.warning("caddy exited (code %s); starting it again", self._process.exit_code)
                await self._process.stop()
                self._reloads += 1
            await self._start(table)
            return Applied("start", trio.current_time() - t0, why="process not running")
        body = self._document(table)
        try:
            response = await self._client.post(
                "/load", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as exc:
            raise ProxyApplyFailed(f"caddy's admin API {self._admin} failed: {exc}") from exc
        if response.status_code != 200:
            raise ProxyApplyFailed(
                f"caddy refused the config (HTTP {response.status_code}): {response.text[:2000]}"
            )
        self._current = table
        return Applied("load", trio.current_time() - t0, commands=1)
