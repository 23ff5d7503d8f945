"""Many hosts on one machine: corral nodes, etcd members and proxies in network namespaces.

Each host of a :class:`HostBed` is a Linux network namespace with its own address
(``10.231.K.<i>``, on a switch of its own, see :mod:`corral.testing._hosts_net`).
The bed runs real ``corral node run`` processes, real etcd members (one per host,
forming one cluster) and real ``corral proxy run`` processes inside the hosts, and
their apps run where their node does. A test then breaks the network or the
processes one host at a time::

    with open_hosts(3) as bed:
        bed.start_etcd()
        bed.start_nodes()
        bed.cut("h1")                    # h1 neither reaches nor is reached
        bed.cut("h2", ["h3"], direction="out")
        bed.lossy("h3", 5)               # 5 % of h3's packets dropped
        bed.heal()
        bed.freeze("h2"); bed.thaw("h2")  # SIGSTOP / SIGCONT of its node
        bed.kill("h3"); bed.restart("h3") # SIGKILL of all in it; same data dirs

Every process is stopped by pid (everything left in a host is SIGKILLed when the
bed closes) and every namespace deleted, also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from corral.node.cli._client import NodeClient
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for
from corral.proxy._local import LocalProxy
from corral.testing._hosts_faults import Direction, LinkFaults, render_ruleset
from corral.testing._hosts_net import (
    HostBedError,
    NetnsTransport,
    SubnetClaim,
    build_switch,
    inside_netns,
    kill_netns_processes,
    load_ruleset,
    netns_pids,
    remove_namespaces,
)

__all__ = ["Host", "HostBed", "HostEtcdMember", "HostNode", "open_hosts"]

NODE_API_PORT = 7400
NODE_PEER_PORT = 7401
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
PROXY_PORT = 8080


@dataclass
class Host:
    """One namespace of the bed: a name, an address, and the processes started in it."""

    name: str
    address: str
    netns: str
    data_dir: Path

    def popen(
        self, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside this host, in a session of its own, logging to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to its end; its output is returned, not checked."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )

    def inside(self) -> AbstractContextManager[None]:
        """The calling thread works inside this host for the block (its sockets stay)."""
        return inside_netns(self.netns)

    def http_transport(self) -> NetnsTransport:
        """An httpx transport connecting from inside this host."""
        return NetnsTransport(self.netns)

    def pids(self) -> list[int]:
        """Every process in this host right now."""
        return netns_pids(self.netns)

    def can_connect(self, address: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from this host to ``address:port`` opens in time."""
        with self.inside():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            sock.settimeout(timeout)
            try:
                sock.connect((address, port))
            except OSError:
                return False
            return True


@dataclass
class HostNode(LocalNode):
    """A ``corral node run`` inside a host, listening and advertising on its address."""

    host: Host = field(kw_only=True)

    @property
    def api_url(self) -> str:
        return f"http://{self.host.address}:{self.api_port}"

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.host.netns, *super().command()]

    def client(self, timeout: float = 10.0) -> NodeClient:
        """A client of this node's API, connecting from inside its host."""
        return NodeClient(
            self.api_url, self.token(), timeout=timeout, transport=self.host.http_transport()
        )


@dataclass
class HostEtcdMember:
    """One member of the bed's etcd cluster, inside its host."""

    name: str
    host: Host
    initial_cluster: str
    cluster_token: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host.address}:{ETCD_CLIENT_PORT}"

    @property
    def data_dir(self) -> Path:
        return self.host.data_dir / "etcd"

    @property
    def log_path(self) -> Path:
        return self.host.data_dir / "etcd.log"

    def command(self) -> list[str]:
        address = self.host.address
        client = f"http://{address}:{ETCD_CLIENT_PORT}"
        peer = f"http://{address}:{ETCD_PEER_PORT}"
        return [
            shutil.which("etcd") or "etcd",
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster}",
            f"--initial-cluster-token={self.cluster_token}",
            "--initial-cluster-state=new",  # ignored on a restart: the data dir says
            "--logger=zap",
        ]

    def start(self) -> None:
        self.process = self.host.popen(self.command(), log=self.log_path)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self, timeout: float = 1.0) -> bool:
        """Whether the member answers ``/health`` with true (it sees a leader)."""
        url = f"http://{self.endpoint}/health"
        try:
            with self.host.inside():
                response = urllib.request.urlopen(url, timeout=timeout)
            with response:
                return b'"true"' in response.read()
        except (urllib.error.URLError, OSError):
            return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class HostBed:
    """Hosts on one switch, and the etcd members, nodes and proxies run in them.

    Made by :func:`open_hosts`, which also tears it down. Host names are the keys of
    :attr:`hosts`; every method taking a host takes its name.
    """

    def __init__(
        self,
        claim: SubnetClaim,
        names: Sequence[str],
        root: Path,
        *,
        etcd_hosts: Sequence[str],
        lease_ttl_ms: int,
        node_ttl_ms: int,
        extra_env: Mapping[str, str] | None,
    ) -> None:
        self.claim = claim
        self.root = root
        subnet = claim.subnet
        self.hosts: dict[str, Host] = {
            name: Host(name, str(subnet[number]), claim.prefix + name, root / name)
            for number, name in enumerate(names, start=1)
        }
        self.faults = LinkFaults()
        initial = ",".join(
            f"e-{name}=http://{self.hosts[name].address}:{ETCD_PEER_PORT}" for name in etcd_hosts
        )
        self.etcd: dict[str, HostEtcdMember] = {
            name: HostEtcdMember(f"e-{name}", self.hosts[name], initial, f"bed-{claim.index}")
            for name in etcd_hosts
        }
        self.cluster = LocalCluster(
            root,
            registry_url=self.registry_url,
            lease_ttl_ms=lease_ttl_ms,
            node_ttl_ms=node_ttl_ms,
            extra_env=extra_env,
        )
        #: Keep the data directories (logs) when the bed closes; set it when a test
        #: failed in a way the bed cannot see (a pytest fixture's test, for one).
        self.keep = False
        self.nodes: dict[str, HostNode] = {}  # by host name
        self.proxies: dict[str, LocalProxy] = {}  # by host name
        self._proxy_hosts: dict[str, str | None] = {}  # their listen_host, for restart

    @property
    def registry_url(self) -> str:
        """``etcd://`` with every member's endpoint (the nodes and proxies use it)."""
        return "etcd://" + ",".join(member.endpoint for member in self.etcd.values())

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            known = sorted(self.hosts)
            raise HostBedError(f"no host {name!r} in this bed; its hosts: {known}") from None

    # ---------------------------------------------------------------- the network

    def _apply(self, faults: LinkFaults) -> None:
        addresses = {name: host.address for name, host in self.hosts.items()}
        load_ruleset(self.claim.prefix, render_ruleset(faults, addresses))
        self.faults = faults

    def cut(
        self, name: str, others: Sequence[str] | None = None, *, direction: Direction = "both"
    ) -> None:
        """Cut host ``name`` from ``others`` (default: every other host), both ways or
        one way (``"out"``: it is not heard; ``"in"``: it hears nothing)."""
        self.host(name)
        peers = [other for other in self.hosts if other != name] if others is None else others
        for other in peers:
            self.host(other)
        self._apply(self.faults.cut(name, peers, direction))

    def heal(self, name: str | None = None) -> None:
        """Undo the cuts touching ``name`` (every cut when None); losses stay."""
        self._apply(self.faults.heal(name))

    def lossy(self, name: str, percent: int) -> None:
        """Drop ``percent`` of the packets on host ``name``'s link (0: clean again)."""
        self.host(name)
        self._apply(self.faults.lossy(name, percent))

    # ---------------------------------------------------------------- etcd

    def start_etcd(self, timeout: float = 30.0) -> None:
        """Start every etcd member and wait until each answers healthy."""
        for member in self.etcd.values():
            member.start()
        for member in self.etcd.values():
            self.wait_etcd(member.host.name, timeout=timeout)

    def wait_etcd(self, name: str, timeout: float = 30.0) -> None:
        member = self.etcd[name]

        def probe() -> bool:
            if not member.running():
                raise HostBedError(
                    f"etcd member {member.name} exited; its log ends:\n{_tail(member.log_path)}"
                )
            return member.healthy()

        wait_for(f"etcd member {member.name} healthy", probe, timeout=timeout, interval=0.2)

    # ---------------------------------------------------------------- nodes

    def add_node(
        self,
        name: str,
        *,
        node_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> HostNode:
        """Describe host ``name``'s node (started by :meth:`start_nodes`). Its id is
        ``<host>-<K>`` unless given: parallel beds never share node ids."""
        host = self.host(name)
        node_id = node_id or f"{name}-{self.claim.index}"
        data_dir = host.data_dir / "node"
        data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "--data-dir", str(data_dir),
            "--registry", self.registry_url,
            "--node-id", node_id,
            "--listen", f"{host.address}:{NODE_PEER_PORT}",
            "--api", f"{host.address}:{NODE_API_PORT}",
            "--advertise", host.address,
            "--lease-ttl-ms", str(self.cluster.lease_ttl_ms),
            "--node-ttl-ms", str(self.cluster.node_ttl_ms),
            "--shutdown-grace-ms", str(self.cluster.shutdown_grace_ms),
        ]  # fmt: skip
        for key, value in sorted((labels or {}).items()):
            args += ["--label", f"{key}={value}"]
        node = HostNode(
            node_id, data_dir, NODE_API_PORT, NODE_PEER_PORT, [*args, *extra_args], host=host
        )
        self.cluster.nodes[node_id] = node
        self.nodes[name] = node
        return node

    def start_nodes(self, names: Sequence[str] | None = None, timeout: float = 40.0) -> None:
        """Start the nodes of ``names`` (default: every host), adding those not yet
        described, and wait until each answers."""
        chosen = list(self.hosts) if names is None else list(names)
        for name in chosen:
            if name not in self.nodes:
                self.add_node(name)
            self.cluster.start(self.nodes[name])
        for name in chosen:
            self.cluster.wait_ready(self.nodes[name], timeout)

    def node(self, name: str) -> HostNode:
        """Host ``name``'s node."""
        self.host(name)
        try:
            return self.nodes[name]
        except KeyError:
            raise HostBedError(f"host {name!r} runs no node; add one with add_node") from None

    def corral(
        self, name: str, *args: str, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the ``corral`` CLI inside host ``name`` against its node's API."""
        node = self.node(name)
        env = {**os.environ, "CORRAL_API": node.api_url, "CORRAL_TOKEN": node.token()}
        return node.host.run([sys.executable, "-m", "corral", *args], timeout=timeout, env=env)

    # ---------------------------------------------------------------- proxies

    def start_proxy(
        self,
        name: str,
        kind: str = "haproxy",
        port: int = PROXY_PORT,
        *,
        listen_host: str | None = None,
    ) -> LocalProxy:
        """Start ``corral proxy run`` in host ``name``, serving ``<address>:port``
        (``listen_host``: another address of the host, e.g. its own 127.0.0.1 for a
        load generator running inside it)."""
        host = self.host(name)
        data_dir = host.data_dir / kind
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        process = host.popen(
            [
                sys.executable, "-m", "corral", "proxy", "run",
                "--kind", kind,
                "--listen", f"{listen_host or host.address}:{port}",
                "--registry", self.registry_url,
                "--data-dir", str(data_dir),
                "--id", f"{kind}-{name}-{self.claim.index}",
            ],
            log=data_dir / "run.log",
            env=env,
        )  # fmt: skip
        proxy = LocalProxy(kind, port, data_dir, process)
        self.proxies[name] = proxy
        self._proxy_hosts[name] = listen_host
        return proxy

    # ---------------------------------------------------------------- processes

    def freeze(self, name: str) -> None:
        """SIGSTOP host ``name``'s node (its apps, etcd member and proxy run on)."""
        self.cluster.signal(self.node(name), signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        """SIGCONT host ``name``'s node."""
        self.cluster.signal(self.node(name), signal.SIGCONT)

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process in host ``name`` (node, apps, etcd member, proxy), as a
        power cut would; return their pids."""
        host = self.host(name)
        node = self.nodes.get(name)
        if node is not None:
            node.note_descendants()
        killed = kill_netns_processes(host.netns)
        for process in self._own_processes(name):
            process.wait(10)
        return killed

    def _own_processes(self, name: str) -> list[subprocess.Popen[bytes]]:
        owned = []
        if name in self.nodes and self.nodes[name].process is not None:
            owned.append(self.nodes[name].process)
        if name in self.etcd and self.etcd[name].process is not None:
            owned.append(self.etcd[name].process)
        if name in self.proxies:
            owned.append(self.proxies[name].process)
        return [process for process in owned if process is not None]

    def restart(self, name: str, timeout: float = 40.0) -> None:
        """Start again what ran in host ``name`` (etcd member, node, proxy), on the same
        data directories, and wait for the member and the node to answer."""
        if name in self.etcd and not self.etcd[name].running():
            self.etcd[name].start()
            self.wait_etcd(name, timeout)
        node = self.nodes.get(name)
        if node is not None and not node.running():
            self.cluster.start(node)
            self.cluster.wait_ready(node, timeout)
        proxy = self.proxies.get(name)
        if proxy is not None and not proxy.running():
            self.start_proxy(
                name, proxy.kind, proxy.listen, listen_host=self._proxy_hosts.get(name)
            )

    def log_tails(self, lines: int = 15) -> str:
        """The end of every log of the bed, for a failing test's report."""
        parts = []
        for name, node in self.nodes.items():
            parts.append(f"--- node {node.node_id} in {name}\n{node.log_tail(lines)}")
        for name, member in self.etcd.items():
            parts.append(f"--- etcd {member.name} in {name}\n{_tail(member.log_path, lines)}")
        for name, proxy in self.proxies.items():
            parts.append(f"--- {proxy.kind} in {name}\n{proxy.log_tail(lines)}")
        return "\n".join(parts)

    def close(self) -> None:
        """Heal the network, stop the nodes, proxies and members, SIGKILL whatever is
        left in any host, and delete the namespaces (idempotent)."""
        try:
            try:
                self._apply(LinkFaults())
            except HostBedError:
                pass  # the switch is already gone
            for name in list(self.nodes):
                self.cluster.signal(self.nodes[name], signal.SIGCONT)
            self.cluster.stop_all(timeout=15)
            self.cluster.kill_leftovers()
            for proxy in self.proxies.values():
                proxy.stop(timeout=10)
            for member in self.etcd.values():
                if member.process is not None and member.running():
                    member.process.terminate()
            deadline = time.monotonic() + 10
            for member in self.etcd.values():
                if member.process is not None:
                    try:
                        member.process.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        member.process.kill()
                        member.process.wait(5)
        finally:
            remove_namespaces(self.claim.prefix)
            self.claim.release()


@contextmanager
def open_hosts(
    hosts: int | Sequence[str] = 3,
    *,
    etcd_hosts: Sequence[str] | None = None,
    lease_ttl_ms: int = 4000,
    node_ttl_ms: int = 4000,
    extra_env: Mapping[str, str] | None = None,
    keep: bool = False,
) -> Iterator[HostBed]:
    """A bed of hosts on one switch, built on entry and removed on exit.

    Nothing runs in it yet: start etcd (:meth:`HostBed.start_etcd`), then the nodes
    (:meth:`HostBed.start_nodes`) and any proxies.

    Args:
        hosts: how many hosts (named ``h1``, ``h2``...), or their names.
        etcd_hosts: the hosts that run an etcd member; default the first three.
        lease_ttl_ms / node_ttl_ms: the nodes' lease TTLs (short, for tests).
        extra_env: added to each node's environment.
        keep: keep the data directories (logs) after the bed is gone; they are
            always kept, and their path printed, when the block raised.

    Raises:
        HostBedError: the namespaces or switch could not be made (not root? see
            :func:`require_netns`).
    """
    names = [f"h{i}" for i in range(1, hosts + 1)] if isinstance(hosts, int) else list(hosts)
    if not names or len(set(names)) != len(names) or len(names) > 250:
        raise HostBedError(f"a bed needs 1 to 250 distinct host names, not {names!r}")
    if any(len(name) > 20 or not name.replace("-", "").isalnum() for name in names):
        raise HostBedError(f"host names are letters, digits and '-', up to 20: {names!r}")
    members = list(names[:3] if etcd_hosts is None else etcd_hosts)
    claim = SubnetClaim.take()
    root = Path(tempfile.mkdtemp(prefix=f"c231-{claim.index}-", dir="/tmp"))
    failed = False
    bed: HostBed | None = None
    try:
        remove_namespaces(claim.prefix)  # an earlier bed's, killed before it cleaned up
        bed = HostBed(
            claim,
            names,
            root,
            etcd_hosts=members,
            lease_ttl_ms=lease_ttl_ms,
            node_ttl_ms=node_ttl_ms,
            extra_env=extra_env,
        )
        build_switch(claim.prefix, [(name, host.address) for name, host in bed.hosts.items()])
        yield bed
    except BaseException:
        failed = True
        if bed is not None:
            print(f"test bed 10.231.{claim.index}.0/24 logs:\n{bed.log_tails()}", file=sys.stderr)
        raise
    finally:
        if bed is not None:
            bed.close()
        else:
            remove_namespaces(claim.prefix)
            claim.release()
        if failed or keep or (bed is not None and bed.keep):
            print(f"test bed files kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
