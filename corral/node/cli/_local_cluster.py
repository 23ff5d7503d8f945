"""Several ``corral node run`` processes on this machine's loopback.

Used by ``corral demo`` and the end-to-end tests. Every node is an OS process
in its own session (so a signal to it never reaches the caller), with its own
data directory, peer and API ports, and app port range; they share one registry
and one cluster secret. The cluster ends only the processes it started: the
node processes by pid, and, when asked, the app processes it saw them start.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil

from corral.node._errors import ApiError, NodeError
from corral.node._identity import TOKEN_FILE, read_secret_file
from corral.node.cli._client import NodeClient

T = TypeVar("T")


class ClusterTimeout(NodeError):
    """Something the local cluster waited for did not happen in time."""


#: Ports handed out by :func:`free_port` in this process (never handed out twice).
_given: set[int] = set()
#: How many ports below the kernel's ephemeral range :func:`free_port` picks from.
_WINDOW = 2500


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port nothing listens on right now, chosen just below the
    kernel's ephemeral range.

    A port from the ephemeral range (what binding port 0 gives) can be taken as the
    source port of any outgoing connection before the node that is to listen on it
    starts (a node dialling a peer not up yet did, once, and the next node failed
    with "Address already in use"). Below that range the kernel never hands a port
    out by itself, so only another listener can take it.
    """
    high = _ephemeral_low()
    low = max(1024, high - _WINDOW)
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as sock:  # the window is full: any free port will do
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
) -> T:
    """Call ``probe`` until it returns something other than None (or False).

    Raises:
        ClusterTimeout: naming ``what`` and the last error the probe raised.
    """
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = probe()
        except (ApiError, OSError) as exc:
            result = None
            last_error = f" (last error: {exc})"
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise ClusterTimeout(f"timed out after {timeout:.0f} s waiting for {what}{last_error}")
        time.sleep(interval)


@dataclass
class LocalNode:
    """One node process and how to reach it."""

    node_id: str
    data_dir: Path
    api_port: int
    peer_port: int
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    #: pid -> create time of every process seen below this node (pids are reused).
    seen_descendants: dict[int, float] = field(default_factory=dict)
    #: pid -> create time of the node's direct children seen: the app processes it
    #: started (their own helpers, e.g. a version manager's shim, are descendants only).
    seen_children: dict[int, float] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "node.log"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The argv that runs this node."""
        return [sys.executable, "-m", "corral", "node", "run", *self.args]

    def token(self) -> str:
        token = read_secret_file(self.data_dir / TOKEN_FILE)
        if token is None:
            raise ApiError(f"node {self.node_id} has not written its token yet")
        return token

    def client(self, timeout: float = 10.0) -> NodeClient:
        return NodeClient(self.api_url, self.token(), timeout=timeout)

    def note_descendants(self) -> set[int]:
        """Remember (and return) the pids of every process below this node right now."""
        if self.running():
            assert self.process is not None
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                try:
                    created = child.create_time()
                    self.seen_descendants[child.pid] = created
                    if child.ppid() == self.process.pid:
                        self.seen_children[child.pid] = created
                except psutil.Error:
                    continue
        return set(self.seen_descendants)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class LocalCluster:
    """Start, stop and query a few node processes sharing one registry.

    Args:
        root: a directory for the nodes' data directories (and the SQLite registry).
        registry_url: default ``sqlite:///<root>/registry.db``.
        secret: the cluster secret every node is given.
        lease_ttl_ms / node_ttl_ms: short TTLs so failures are noticed quickly.
        extra_env: added to each node's environment.
    """

    def __init__(
        self,
        root: Path,
        *,
        registry_url: str | None = None,
        secret: str = "corral-local-cluster-secret",
        lease_ttl_ms: int = 3000,
        node_ttl_ms: int = 3000,
        shutdown_grace_ms: int = 5000,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.registry_url = registry_url or f"sqlite://{root / 'registry.db'}"
        self.secret = secret
        self.lease_ttl_ms = lease_ttl_ms
        self.node_ttl_ms = node_ttl_ms
        self.shutdown_grace_ms = shutdown_grace_ms
        self.extra_env = dict(extra_env or {})
        self.nodes: dict[str, LocalNode] = {}

    def add_node(
        self,
        node_id: str,
        *,
        labels: Mapping[str, str] | None = None,
        port_range: tuple[int, int] | None = None,
        extra_args: Sequence[str] = (),
    ) -> LocalNode:
        """Describe a node (not started yet); give each a port range of its own."""
        data_dir = self.root / node_id
        data_dir.mkdir(parents=True, exist_ok=True)
        api_port, peer_port = free_port(), free_port()
        args = [
            "--data-dir", str(data_dir),
            "--registry", self.registry_url,
            "--node-id", node_id,
            "--listen", f"127.0.0.1:{peer_port}",
            "--api", f"127.0.0.1:{api_port}",
            "--lease-ttl-ms", str(self.lease_ttl_ms),
            "--node-ttl-ms", str(self.node_ttl_ms),
            "--shutdown-grace-ms", str(self.shutdown_grace_ms),
        ]  # fmt: skip
        for key, value in sorted((labels or {}).items()):
            args += ["--label", f"{key}={value}"]
        if port_range is not None:
            args += ["--port-range-start", str(port_range[0])]
            args += ["--port-range-end", str(port_range[1])]
        node = LocalNode(node_id, data_dir, api_port, peer_port, [*args, *extra_args])
        self.nodes[node_id] = node
        return node

    def start(self, node: LocalNode) -> None:
        """Start the node's process (in a session of its own), logging to its data dir."""
        env = {**os.environ, **self.extra_env, "CORRAL_SECRET": self.secret}
        for name in ("CORRAL_TOKEN", "CORRAL_API", "CORRAL_DATA_DIR", "CORRAL_CONFIG"):
            env.pop(name, None)
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                node.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def wait_ready(self, node: LocalNode, timeout: float = 30.0) -> None:
        """Wait until the node's API answers ``GET /v1/state`` with its own record."""

        def probe() -> bool:
            if not node.running():
                raise ClusterTimeout(
                    f"node {node.node_id} exited with status "
                    f"{node.process.returncode if node.process else '?'}; its log ends:\n"
                    + node.log_tail()
                )
            with node.client(timeout=2.0) as client:
                state = client.state()
            return bool(state.get("node"))

        wait_for(f"node {node.node_id} to answer on {node.api_url}", probe, timeout=timeout)

    def start_all(self, timeout: float = 40.0) -> None:
        for node in self.nodes.values():
            self.start(node)
        for node in self.nodes.values():
            self.wait_ready(node, timeout)

    def running_nodes(self) -> list[LocalNode]:
        return [node for node in self.nodes.values() if node.running()]

    def any_client(self) -> NodeClient:
        """A client of some running node."""
        for node in self.running_nodes():
            return node.client()
        raise ApiError("no node of the local cluster is running")

    def note_descendants(self) -> set[int]:
        pids: set[int] = set()
        for node in self.nodes.values():
            pids |= node.note_descendants()
        return pids

    def signal(self, node: LocalNode, signum: int) -> None:
        if node.running():
            assert node.process is not None
            node.note_descendants()
            node.process.send_signal(signum)

    def stop(self, node: LocalNode, *, timeout: float = 20.0) -> int | None:
        """SIGTERM the node and wait for it; SIGKILL it if it overstays ``timeout``."""
        if node.process is None:
            return None
        self.signal(node, signal.SIGTERM)
        try:
            return node.process.wait(timeout)
        except subprocess.TimeoutExpired:
            node.process.kill()
            return node.process.wait(5)

    def kill(self, node: LocalNode) -> None:
        """SIGKILL the node process alone (its apps are left, as after a crash)."""
        if node.process is not None and node.running():
            node.note_descendants()
            node.process.kill()
            node.process.wait(5)

    def stop_all(self, *, timeout: float = 20.0) -> None:
        for node in self.running_nodes():
            self.signal(node, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            if node.process is None:
                continue
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(5)

    def leftovers(self) -> list[int]:
        """Pids of processes the nodes started that are still alive (zombies aside)."""
        self.note_descendants()
        return [process.pid for process in self._alive_seen()]

    def _alive_seen(self) -> Iterable[psutil.Process]:
        for node in self.nodes.values():
            for pid, created in sorted(node.seen_descendants.items()):
                try:
                    process = psutil.Process(pid)
                    if process.create_time() == created and process.status() != (
                        psutil.STATUS_ZOMBIE
                    ):
                        yield process
                except psutil.Error:
                    continue

    def kill_leftovers(self) -> list[int]:
        """SIGKILL processes the nodes started that outlived them; return their pids."""
        killed = []
        for process in list(self._alive_seen()):
            try:
                process.kill()
                killed.append(process.pid)
            except psutil.Error:
                continue
        return killed

    def close(self) -> None:
        """Stop every node and end anything left behind (idempotent)."""
        self.stop_all()
        self.kill_leftovers()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
