"""The HAProxy driver: a ``-W`` master process, generated files, the Runtime API."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

import trio

from corral.actors.routing import RouteTable
from corral.proxy._driver import Applied, ProxyDriver
from corral.proxy._errors import ProxyApplyFailed, ProxyStartFailed
from corral.proxy._haproxy_plan import (
    HaproxyFiles,
    HaproxyState,
    desired_state,
    plan_update,
    render_config,
    render_map,
    tidy_commands,
)
from corral.proxy._process import (
    OWNED_FILE,
    ProxyProcess,
    end_leftover,
    find_binary,
    log_tail,
    wait_for_exit,
)
from corral.proxy._tuning import DEFAULT_TIMEOUTS, ProxyTimeouts

__all__ = ["DEFAULT_HAPROXY", "HaproxyDriver", "RuntimeApi"]

log = logging.getLogger("corral.proxy.haproxy")

DEFAULT_HAPROXY = "/usr/sbin/haproxy"
_PROMPT = b"\n> "
_MAX_REPLY = 16 * 1024 * 1024


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class RuntimeApi:
    """A session on HAProxy's admin socket in prompt mode: one command, one reply."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    @classmethod
    async def connect(cls, path: str) -> RuntimeApi:
        stream = await trio.open_unix_socket(path)
        api = cls(stream)
        try:
            await stream.send_all(b"prompt\n")
            await api._reply()
        except BaseException:
            await stream.aclose()
            raise
        return api

    async def _reply(self) -> str:
        while not self._buffer.endswith(_PROMPT):
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                raise ProxyApplyFailed("haproxy closed its admin socket mid-reply")
            self._buffer += chunk
            if len(self._buffer) > _MAX_REPLY:
                raise ProxyApplyFailed(f"haproxy's reply is over {_MAX_REPLY} bytes")
        reply, self._buffer = self._buffer[: -len(_PROMPT)], b""
        return reply.decode("utf-8", "replace").strip()

    async def command(self, line: str) -> str:
        """Send one command line; return HAProxy's reply ("" for most successes)."""
        if "\n" in line:
            raise ValueError("one Runtime API command per line")
        await self._stream.send_all(line.encode() + b"\n")
        return await self._reply()

    async def aclose(self) -> None:
        await self._stream.aclose()


def _is_success(command: str, reply: str) -> bool:
    if command.startswith("add server"):
        return reply.startswith("New server registered")
    if command.startswith("del server"):
        return reply.startswith("Server deleted")
    if command.startswith("del map"):
        return reply in ("", "Key not found.")
    return reply == ""


def _with_parked(
    after: HaproxyState, parked: frozenset[tuple[str, str]], *, before: HaproxyState | None
) -> HaproxyState:
    """``after``, plus the servers HAProxy refused to delete: still there, in maintenance."""
    if not parked or before is None:
        return after
    backends = {name: dict(servers) for name, servers in after.backends.items()}
    for backend, server in parked:
        backends.setdefault(backend, {})[server] = before.backends[backend][server]
    return HaproxyState(hosts=after.hosts, backends=backends, parked=after.parked | parked)


class HaproxyDriver(ProxyDriver):
    """Runs ``haproxy -W`` with its files under ``data_dir``; see ``_haproxy_plan``.

    Use :func:`corral.proxy.open_proxy` to get one: it starts the process and
    stops it by pid when the block ends.
    """

    kind = "haproxy"

    def __init__(
        self,
        *,
        listen: str,
        data_dir: Path,
        binary: str | None = None,
        start_timeout: float = 30.0,
        timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
    ) -> None:
        self._timeouts = timeouts
        self._binary = find_binary("haproxy", binary, DEFAULT_HAPROXY, "haproxy")
        self._dir = Path(data_dir).resolve()
        self._files = HaproxyFiles(
            config=str(self._dir / "haproxy.cfg"),
            map=str(self._dir / "hosts.map"),
            admin_socket=str(self._dir / "admin.sock"),
            pid_file=str(self._dir / "haproxy.pid"),
            listen=listen,
        )
        self._listen = listen
        self._start_timeout = start_timeout
        self._process: ProxyProcess | None = None
        self._running: HaproxyState | None = None
        #: The state of the table last served (without parked servers): what a restart serves.
        self._served = HaproxyState()
        self._reloads = 0
        self._closed = False
        self._lock = trio.Lock()

    @property
    def listen(self) -> str:
        return self._listen

    @property
    def reloads(self) -> int:
        return self._reloads

    @property
    def files(self) -> HaproxyFiles:
        return self._files

    @property
    def pid(self) -> int | None:
        """The master's pid (None before start)."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Write files for an empty table and start the master; returns once it answers."""
        self._dir.mkdir(parents=True, exist_ok=True)
        await end_leftover("haproxy", self._dir)
        await self._start(HaproxyState())

    async def _start(self, state: HaproxyState) -> None:
        self._write_files(state)
        await self._check_config()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._files.admin_socket)
        self._process = await ProxyProcess.start(
            [self._binary, "-W", "-f", self._files.config],
            log_path=self._dir / "haproxy.log",
            cwd=self._dir,
            env=None,
            owned_file=self._dir / OWNED_FILE,
        )
        await self._wait_worker(old_pid=None, what="start")
        self._running = state
        self._served = state

    async def wait_exit(self) -> int:
        """Return once the master exits (reaped, its workers killed), with its exit code."""
        return await wait_for_exit(self._process)

    async def restart(self) -> Applied | None:
        """Start the master again serving the last table; None if it is running."""
        if self._closed:
            raise ProxyStartFailed("the haproxy driver is closed: its process was stopped")
        async with self._lock:
            if self._process is not None and self._process.exit_code is None:
                return None
            t0 = trio.current_time()
            if self._process is not None:
                await self._process.stop()
            self._reloads += 1
            self._process = None
            await self._start(self._served)
            return Applied("start", trio.current_time() - t0, why="process exited")

    async def aclose(self) -> None:
        """Stop the master (and so its workers) by pid."""
        self._closed = True
        if self._process is not None:
            await self._process.stop()
            self._process = None
        self._running = None

    def _write_files(self, state: HaproxyState) -> None:
        _write_atomically(Path(self._files.map), render_map(state))
        config = render_config(state, self._files, timeouts=self._timeouts)
        _write_atomically(Path(self._files.config), config)

    async def _check_config(self) -> None:
        result = await trio.run_process(
            [self._binary, "-c", "-q", "-f", self._files.config],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if result.returncode != 0:
            text = (result.stderr or result.stdout or b"").decode("utf-8", "replace").strip()
            raise ProxyApplyFailed(
                f"haproxy refuses the generated config {self._files.config} "
                f"(exit {result.returncode}): {text[-2000:]}"
            )

    async def _worker_pid(self) -> int | None:
        try:
            api = await RuntimeApi.connect(self._files.admin_socket)
        except (OSError, trio.BrokenResourceError, ProxyApplyFailed):
            return None  # not listening yet, or a worker going away
        try:
            info = await api.command("show info")
        except (OSError, trio.BrokenResourceError, ProxyApplyFailed):
            return None
        finally:
            await api.aclose()
        for line in info.splitlines():
            if line.startswith("Pid:"):
                return int(line.split(":", 1)[1])
        return None

    async def _wait_worker(self, *, old_pid: int | None, what: str) -> int:
        assert self._process is not None
        with trio.move_on_after(self._start_timeout):
            while True:
                if self._process.exit_code is not None:
                    raise ProxyStartFailed(
                        f"haproxy exited with code {self._process.exit_code} during {what}; "
                        f"its log {self._process.log_path} ends with:\n"
                        f"{log_tail(self._process.log_path)}"
                    )
                pid = await self._worker_pid()
                if pid is not None and pid != old_pid:
                    return pid
                await trio.sleep(0.02)
        raise ProxyStartFailed(
            f"haproxy gave no new worker within {self._start_timeout} s of its {what}; its log "
            f"{self._dir / 'haproxy.log'} ends with:\n{log_tail(self._dir / 'haproxy.log')}"
        )

    async def apply(self, table: RouteTable) -> Applied:
        if self._closed:
            raise ProxyApplyFailed("the haproxy driver is closed: its process was stopped")
        async with self._lock:
            return await self._apply(table)

    async def _apply(self, table: RouteTable) -> Applied:
        t0 = trio.current_time()
        desired = desired_state(table)
        if self._process is None or self._process.exit_code is not None:
            code = None if self._process is None else self._process.exit_code
            if self._process is not None:
                await self._process.stop()
                log.warning("haproxy master exited (code %s); starting it again", code)
                self._reloads += 1
            await self._start(desired)
            return Applied("start", trio.current_time() - t0, why="process not running")
        plan = plan_update(self._running, desired, self._files.map)
        if plan.reload is None:
            try:
                parked = await self._run_commands(plan.commands)
            except ProxyApplyFailed as exc:
                log.warning("runtime update failed (%s); reloading from the files", exc)
                return await self._reload(desired, t0, why=f"runtime update failed: {exc}")
            self._running = _with_parked(plan.after, parked, before=self._running)
            self._served = desired
            served = trio.current_time() - t0
            # The files follow once the change is served, so a later reload or restart
            # serves this table too.
            self._write_files(desired)
            return Applied("runtime", served, commands=len(plan.commands))
        return await self._reload(desired, t0, why=plan.reload)

    async def tidy(self) -> int:
        """Retry deleting parked servers; return how many are still parked."""
        if self._closed:
            return 0
        async with self._lock:
            running = self._running
            if running is None or not running.parked or self._process is None:
                return 0
            try:
                still = await self._run_commands(tidy_commands(running))
            except ProxyApplyFailed as exc:
                log.info("tidy-up of parked servers failed: %s", exc)
                return len(running.parked)
            backends = {name: dict(servers) for name, servers in running.backends.items()}
            for backend, server in running.parked - still:
                backends[backend].pop(server, None)
            self._running = HaproxyState(hosts=running.hosts, backends=backends, parked=still)
            return len(still)

    async def _reload(self, desired: HaproxyState, t0: float, *, why: str) -> Applied:
        assert self._process is not None
        self._write_files(desired)
        await self._check_config()
        old = await self._worker_pid()
        self._process.send_signal(signal.SIGUSR2)
        await self._wait_worker(old_pid=old, what="reload")
        self._running = desired
        self._served = desired
        self._reloads += 1
        return Applied("reload", trio.current_time() - t0, why=why)

    async def _run_commands(self, commands: tuple[str, ...]) -> frozenset[tuple[str, str]]:
        """Send the commands; return servers left parked (a refused ``del server``)."""
        if not commands:
            return frozenset()
        parked: set[tuple[str, str]] = set()
        try:
            api = await RuntimeApi.connect(self._files.admin_socket)
        except (OSError, trio.BrokenResourceError) as exc:
            raise ProxyApplyFailed(f"cannot reach haproxy's admin socket: {exc}") from exc
        try:
            for line in commands:
                reply = await api.command(line)
                if _is_success(line, reply):
                    continue
                if line.startswith("del server"):
                    backend, server = line.split()[2].split("/", 1)
                    parked.add((backend, server))
                    log.info("haproxy keeps %s/%s parked: %s", backend, server, reply)
                    continue
                raise ProxyApplyFailed(f"haproxy answered {line!r} with {reply!r}")
        except (OSError, trio.BrokenResourceError) as exc:
            raise ProxyApplyFailed(f"haproxy's admin socket failed: {exc}") from exc
        finally:
            await api.aclose()
        return frozenset(parked)
