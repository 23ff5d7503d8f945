"""A ``corral proxy run`` process on this machine's loopback, for tests and benchmarks.

The companion of :class:`corral.node.cli._local_cluster.LocalCluster`: it starts the
command in a session of its own (a signal to it never reaches the caller), logs
to a file in its data directory, and is stopped by pid. The real proxy below it
(HAProxy's master and workers, or Caddy) is remembered by pid and create time,
so whatever outlives the command is found and ended too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["LocalProxy"]


@dataclass
class LocalProxy:
    """One ``corral proxy run --kind KIND`` process serving ``127.0.0.1:listen``."""

    kind: str
    listen: int
    data_dir: Path
    process: subprocess.Popen[bytes]
    #: pid -> create time of every process seen below the command.
    seen: dict[int, float] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        kind: str,
        *,
        listen: int,
        registry_url: str,
        data_dir: Path,
        proxy_id: str | None = None,
    ) -> LocalProxy:
        """Start ``corral proxy run`` (it returns at once; the proxy comes up soon after).

        ``data_dir`` should be short: HAProxy's admin socket lives in it, and a unix
        socket path is bounded (about 100 bytes).
        """
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        with (data_dir / "run.log").open("ab") as out:
            process = subprocess.Popen(
                [
                    sys.executable, "-m", "corral", "proxy", "run",
                    "--kind", kind,
                    "--listen", f"127.0.0.1:{listen}",
                    "--registry", registry_url,
                    "--data-dir", str(data_dir),
                    "--id", proxy_id or f"local-{kind}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )  # fmt: skip
        return cls(kind, listen, data_dir, process)

    @property
    def log_path(self) -> Path:
        return self.data_dir / "run.log"

    def running(self) -> bool:
        return self.process.poll() is None

    def note_descendants(self) -> None:
        """Remember every process below the command right now (the real proxy)."""
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self.seen[child.pid] = child.create_time()
        except psutil.Error:
            pass

    def proxy_pid(self) -> int | None:
        """The pid of the real proxy (HAProxy's master, or Caddy) the command runs now;
        None while there is none (starting, or between a death and its restart)."""
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return None
        for child in children:
            try:
                argv = child.cmdline()
                status = child.status()
            except psutil.Error:
                continue
            serving = "-W" in argv if self.kind == "haproxy" else "run" in argv
            if serving and status != psutil.STATUS_ZOMBIE:
                self.seen[child.pid] = child.create_time()
                return int(child.pid)
        return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> list[int]:
        """SIGTERM the command (it stops its proxy by pid) and wait; SIGKILL it if it
        overstays ``timeout``. Returns the pids of proxy processes that outlived the
        command (killed here; none when all went well)."""
        self.note_descendants()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        leftovers = []
        for pid, created in sorted(self.seen.items()):
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    proc.kill()
                    leftovers.append(pid)
            except psutil.Error:
                continue
        return leftovers
