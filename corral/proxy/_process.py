"""The proxy's OS process: started in its own session, logged to a file, stopped by pid."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil
import trio

from corral.proxy._errors import ProxyNotInstalled

__all__ = [
    "OWNED_FILE",
    "ProxyProcess",
    "end_leftover",
    "end_leftover_sync",
    "exit_cause",
    "find_binary",
    "log_tail",
]

log = logging.getLogger("corral.proxy")


def find_binary(kind: str, given: str | None, default: str, package: str) -> str:
    """The proxy binary to run: ``given``, else ``default`` when it exists, else on PATH.

    Raises:
        ProxyNotInstalled: naming the package to install.
    """
    for candidate in (given, default, shutil.which(Path(default).name)):
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
        if given:
            break
    where = given or default
    raise ProxyNotInstalled(
        f"{kind} is not installed ({where} not found or not executable); install Debian's "
        f"{package!r} package (apt-get install {package}) or pass the binary's path"
    )


def exit_cause(code: int) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code}"


def log_tail(path: Path, lines: int = 12) -> str:
    """The last lines of a log file, for error messages ("" when unreadable)."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - 8192))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


#: In a data directory: the pid and create time of the proxy process started there.
OWNED_FILE = "proxy-process.pid"


async def end_leftover(kind: str, data_dir: Path) -> int | None:
    """End the proxy process a previous start on ``data_dir`` left running (see
    :func:`end_leftover_sync`); returns its pid, or None when there was none."""
    pid = await trio.to_thread.run_sync(end_leftover_sync, data_dir / OWNED_FILE)
    if pid is not None:
        log.warning("ended %s pid %d, left running in %s by a killed run", kind, pid, data_dir)
    return pid


def end_leftover_sync(owned_file: Path, timeout: float = 5.0) -> int | None:
    """End the proxy process a previous start on this data directory left running.

    A ``corral proxy run`` killed with SIGKILL cannot stop its proxy, which keeps
    serving its last table on the same address beside the next one's. The process
    named in ``owned_file`` (pid and create time, written by :meth:`ProxyProcess.start`)
    is killed with its whole group only while that very process still runs: a pid
    reused by a stranger has another create time and is left alone.

    Returns:
        The pid ended, or None when there was none.
    """
    try:
        pid_text, created_text = owned_file.read_text(encoding="utf-8").split()
        pid, created = int(pid_text), float(created_text)
    except (OSError, ValueError):
        return None
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - created) > 0.05 or os.getpgid(pid) != pid:
            return None
        os.killpg(pid, signal.SIGKILL)
        process.wait(timeout)
    except (psutil.Error, ProcessLookupError, PermissionError):
        return None
    owned_file.unlink(missing_ok=True)
    return pid


class ProxyProcess:
    """One running proxy process (the HAProxy master, or Caddy).

    It runs in its own session, so its process group id is its pid: stopping it
    signals that group while the leader is not yet reaped, which keeps the id
    from being reused by a stranger.
    """

    def __init__(self, process: trio.Process, log_path: Path) -> None:
        self._process = process
        self.log_path = log_path

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path,
        env: Mapping[str, str] | None,
        owned_file: Path | None = None,
    ) -> ProxyProcess:
        """Spawn ``argv`` with its output appended to ``log_path``.

        With ``owned_file``, the process's pid and create time are written there, so
        a later start on the same data directory can end it should it outlive its
        ``corral proxy run`` (see :func:`end_leftover`).
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Opening a local log file for append does not block for long.
        with open(log_path, "ab") as log:  # noqa: ASYNC230
            process = await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=str(cwd),
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        if owned_file is not None:
            try:
                created = psutil.Process(process.pid).create_time()
            except psutil.Error:  # already gone: nothing to end later
                created = 0.0
            # A few bytes to a local file, like the log opened above.
            owned_file.write_text(f"{process.pid} {created!r}\n", encoding="utf-8")  # noqa: ASYNC240
        return cls(process, log_path)

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    @property
    def exit_code(self) -> int | None:
        """None while it runs."""
        return self._process.poll()

    async def wait(self) -> int:
        """Return once the process has exited, with its exit code; it is reaped
        (no zombie is left) and the rest of its group killed (HAProxy's workers
        whose master died must not keep the listening socket)."""
        await self._wait_exited_unreaped()
        # The leader is a zombie until reaped below, so its pid, the group's id,
        # cannot be taken by another process: this signal reaches only ours.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        return int(await self._process.wait())

    async def _wait_exited_unreaped(self) -> None:
        if self._process.returncode is not None:
            return
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # already reaped, or no pidfd here
            return
        try:
            # A pidfd turns readable when the process exits; waiting on it reaps nothing.
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)

    def send_signal(self, sig: signal.Signals) -> None:
        if self._process.poll() is None:
            self._process.send_signal(sig)

    async def stop(self, grace: float = 5.0) -> int:
        """SIGTERM, ``grace`` seconds, then SIGKILL of its whole group; returns the exit code.

        Shielded: it finishes even when the caller is being cancelled.
        """
        with trio.CancelScope(shield=True):
            if self._process.poll() is None:
                self._signal_group(signal.SIGTERM)
                with trio.move_on_after(grace):
                    await self._process.wait()
            if self._process.poll() is None:
                self._signal_group(signal.SIGKILL)
            code = await self._process.wait()
        return int(code)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._process.poll() is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            self._process.send_signal(sig)


async def wait_for_exit(process: ProxyProcess | None) -> int:
    """Return once ``process`` exits (reaped), with its exit code; never while there is
    none (a driver not started, or one between a death and its restart)."""
    if process is None:
        await trio.sleep_forever()
    assert process is not None
    return await process.wait()
