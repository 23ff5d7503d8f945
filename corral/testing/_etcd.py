"""Testing against a real etcd: where it is, and a registry in a namespace of its own.

* :func:`etcd_endpoint_from_env` — the etcd to test against, from
  ``CORRAL_TEST_ETCD=host:port``; skips the test when there is none, and fails it
  when ``CORRAL_REQUIRE_ETCD=1`` (CI), so a missing etcd never passes silently
  (needs pytest).
* :func:`open_test_etcd_registry` — an :class:`~corral.registry.EtcdRegistry` in a
  fresh namespace, emptied on exit, so tests sharing one etcd never see each
  other's keys.
* :func:`run_secure_etcd` — starts a private etcd on free loopback ports with
  TLS (certificates from ``trustme``, made on the spot, client certificates
  required) and user/password auth on, and stops it by pid on exit.
* :func:`run_etcd_cluster` — starts a private N-member etcd cluster on free
  loopback ports (plain HTTP), whose members a test may freeze, resume or kill
  by pid; all are stopped by pid on exit.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from corral.registry import EtcdRegistry, RegistryOptions
from corral.registry._logic import prefix_end

__all__ = [
    "SECURE_PREFIX",
    "SecureEtcd",
    "etcd_endpoint_from_env",
    "open_test_etcd_registry",
    "run_secure_etcd",
]

ETCD_ENV = "CORRAL_TEST_ETCD"
REQUIRE_ETCD_ENV = "CORRAL_REQUIRE_ETCD"


def _missing(reason: str) -> None:
    import pytest  # only tests call this; corral itself does not need pytest

    if os.environ.get(REQUIRE_ETCD_ENV) == "1":
        pytest.fail(f"{reason}, but {REQUIRE_ETCD_ENV}=1 requires the etcd tests to run")
    pytest.skip(f"{reason}; set {ETCD_ENV}=host:port to run the etcd tests")


def etcd_endpoint_from_env(*, check: bool = True) -> str:
    """The ``host:port`` of the etcd to test against.

    Skips the calling test when ``CORRAL_TEST_ETCD`` is unset or unreachable;
    fails it instead when ``CORRAL_REQUIRE_ETCD=1``.
    """
    endpoint = os.environ.get(ETCD_ENV, "").strip()
    if not endpoint:
        _missing(f"no etcd to test against ({ETCD_ENV} is not set)")
    if check:
        for member in endpoint.split(","):
            url = member if "://" in member else f"http://{member}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    response.read()
            except (urllib.error.URLError, OSError) as exc:
                _missing(f"etcd at {member} ({ETCD_ENV}) is not reachable: {exc}")
    return endpoint


@asynccontextmanager
async def open_test_etcd_registry(
    endpoint: str | None = None,
    *,
    namespace: str | None = None,
    secure: SecureEtcd | None = None,
) -> AsyncIterator[EtcdRegistry]:
    """An :class:`EtcdRegistry` under a fresh namespace, whose keys are deleted on exit.

    Args:
        endpoint: ``host:port[,host:port]``; default :func:`etcd_endpoint_from_env`
            (or ``secure``'s endpoint).
        namespace: the key prefix; default ``corral-test/<random>/``.
        secure: an etcd from :func:`run_secure_etcd`: connect with TLS, its
            client certificate and its corral user.
    """
    prefix = namespace or f"corral-test/{uuid.uuid4().hex}/"
    if secure is not None:
        options = secure.options()
        registry = EtcdRegistry(
            [endpoint or secure.endpoint],
            prefix=prefix,
            tls=options.ssl_context(),
            user=options.user,
            password=options.load_password(),
        )
    else:
        if endpoint is None:
            endpoint = etcd_endpoint_from_env()
        registry = EtcdRegistry(endpoint.split(","), prefix=prefix)
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await registry.delete("", prefix=True)
            finally:
                await registry.aclose()


# ---------------------------------------------------------------- a TLS + auth etcd

SECURE_PREFIX = "corral-test/"
"""The key prefix the corral user of :func:`run_secure_etcd` may read and write."""


@dataclass(frozen=True)
class SecureEtcd:
    """A running etcd with TLS and auth (see :func:`run_secure_etcd`)."""

    endpoint: str  # host:port, served over TLS
    ca_file: str
    cert_file: str  # a client certificate the CA signed
    key_file: str
    user: str
    password: str = field(repr=False)
    root_password: str = field(repr=False)
    pid: int = 0

    @property
    def url(self) -> str:
        return f"etcds://{self.endpoint}"

    def options(self, **changes: Any) -> RegistryOptions:
        """The :class:`RegistryOptions` that reach it as the corral user."""
        values: dict[str, Any] = {
            "ca_file": self.ca_file,
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "user": self.user,
            "password": self.password,
        }
        values.update(changes)
        return RegistryOptions(**values)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _gateway(
    base: str, path: str, body: dict[str, Any], context: ssl.SSLContext, token: str = ""
) -> dict[str, Any]:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": token} if token else {})},
    )
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        reply: dict[str, Any] = json.loads(response.read() or b"{}")
        return reply


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextmanager
def run_secure_etcd(directory: Path, *, token_ttl: int = 1) -> Iterator[SecureEtcd]:
    """Start a private etcd on free loopback ports, serving clients over TLS only
    (client certificates required) with auth enabled: a ``root`` user and a
    ``corral`` user whose role may read and write :data:`SECURE_PREFIX`.
    Skips the calling test (fails it under ``CORRAL_REQUIRE_ETCD=1``) without
    an ``etcd`` binary or ``trustme``. The process is stopped by pid on exit.

    Args:
        directory: where the certificates, data and log go.
        token_ttl: seconds an unused auth token lives (short, so tests see
            tokens expire and the client authenticate again).
    """
    binary = shutil.which("etcd")
    if binary is None:
        _missing("no etcd binary on PATH (Debian: apt-get install etcd-server)")
    try:
        import trustme
    except ImportError:
        _missing("trustme is not installed (pip install -e '.[test]')")
    assert binary is not None
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    # No Common Name: with auth on, etcd 3.4's gateway refuses certificates with one.
    client = ca.issue_cert("corral-client.test")
    files = {
        "ca": directory / "ca.pem",
        "server-cert": directory / "server.pem",
        "server-key": directory / "server-key.pem",
        "client-cert": directory / "client.pem",
        "client-key": directory / "client-key.pem",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["server-cert"]))
    server.private_key_pem.write_to_path(str(files["server-key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client-cert"]))
    client.private_key_pem.write_to_path(str(files["client-key"]))
    client_port, peer_port = _free_port(), _free_port()
    data_dir = directory / "etcd-data"
    log = open(directory / "etcd.log", "wb")  # closed below, once the process is gone
    process = subprocess.Popen(
        [
            binary,
            "--name=secure",
            f"--data-dir={data_dir}",
            f"--listen-client-urls=https://127.0.0.1:{client_port}",
            f"--advertise-client-urls=https://127.0.0.1:{client_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=secure=http://127.0.0.1:{peer_port}",
            f"--cert-file={files['server-cert']}",
            f"--key-file={files['server-key']}",
            f"--trusted-ca-file={files['ca']}",
            "--client-cert-auth",
            f"--auth-token-ttl={token_ttl}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        context = ssl.create_default_context(cafile=str(files["ca"]))
        context.load_cert_chain(str(files["client-cert"]), str(files["client-key"]))
        base = f"https://127.0.0.1:{client_port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=1, context=context):
                    break
            except (urllib.error.URLError, OSError) as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    tail = (directory / "etcd.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the TLS etcd did not come up ({exc}):\n{tail}") from exc
                time.sleep(0.05)
        root_password, password = uuid.uuid4().hex, uuid.uuid4().hex
        prefix = SECURE_PREFIX.encode()
        for path, body in (
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/add", {"name": "root", "password": root_password}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/role/add", {"name": "corral"}),
            (
                "/v3/auth/role/grant",
                {
                    "name": "corral",
                    "perm": {
                        "permType": "READWRITE",
                        "key": _b64(prefix),
                        "range_end": _b64(prefix_end(prefix)),
                    },
                },
            ),
            ("/v3/auth/user/add", {"name": "corral", "password": password}),
            ("/v3/auth/user/grant", {"user": "corral", "role": "corral"}),
            ("/v3/auth/enable", {}),
        ):
            _gateway(base, path, body, context)
        yield SecureEtcd(
            endpoint=f"127.0.0.1:{client_port}",
            ca_file=str(files["ca"]),
            cert_file=str(files["client-cert"]),
            key_file=str(files["client-key"]),
            user="corral",
            password=password,
            root_password=root_password,
            pid=process.pid,
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


# ---------------------------------------------------------------- an N-member cluster


@dataclass
class EtcdMember:
    """One member of a :func:`run_etcd_cluster` cluster."""

    name: str
    endpoint: str  # host:port of its client URL
    peer_port: int
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def freeze(self) -> None:
        """SIGSTOP: connections still open into its backlog, but nothing answers."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)  # a frozen process cannot be reaped promptly
            self.process.kill()
        self.process.wait(timeout=10)


@dataclass
class EtcdCluster:
    """A running private cluster (see :func:`run_etcd_cluster`)."""

    members: list[EtcdMember]

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints)

    def leader(self) -> EtcdMember:
        """The member that is the raft leader now (asked of the live members).

        Raises:
            RuntimeError: no live member names a leader.
        """
        for member in self.members:
            if member.process.poll() is not None:
                continue
            try:
                status = _plain_gateway(member.endpoint, "/v3/maintenance/status", {})
            except (urllib.error.URLError, OSError):
                continue
            leader = int(status.get("leader") or 0)
            member_id = int(status.get("header", {}).get("member_id") or 0)
            if leader and leader == member_id:
                return member
            for other in self.members:
                if other is member or other.process.poll() is not None:
                    continue
                try:
                    other_status = _plain_gateway(other.endpoint, "/v3/maintenance/status", {})
                except (urllib.error.URLError, OSError):
                    continue
                if int(other_status.get("header", {}).get("member_id") or 0) == leader:
                    return other
        raise RuntimeError("no live etcd member names a leader")

    def hand_leadership_to(self, member: EtcdMember, *, timeout: float = 20.0) -> None:
        """Make ``member`` the raft leader (etcd's leader transfer), and wait until it is.

        Raises:
            RuntimeError: it did not become the leader within ``timeout`` seconds.
        """
        target = _member_id(member)
        deadline = time.monotonic() + timeout
        while True:
            try:
                leader = self.leader()
                if leader is member:
                    return
                _plain_gateway(
                    leader.endpoint, "/v3/maintenance/transfer-leadership", {"targetID": target}
                )
            except (RuntimeError, urllib.error.URLError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{member.name} did not become the leader: {exc}") from exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"{member.name} did not become the leader")
            time.sleep(0.1)


def _member_id(member: EtcdMember) -> str:
    status = _plain_gateway(member.endpoint, "/v3/maintenance/status", {})
    return str(status["header"]["member_id"])


def _plain_gateway(endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{endpoint}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=2) as response:
        reply: dict[str, Any] = json.loads(response.read() or b"{}")
        return reply


@contextmanager
def run_etcd_cluster(directory: Path, *, size: int = 3) -> Iterator[EtcdCluster]:
    """Start a private ``size``-member etcd cluster on free loopback ports and wait
    until it has a leader; every member is stopped by pid on exit (resumed first
    if frozen). Skips the calling test (fails it under ``CORRAL_REQUIRE_ETCD=1``)
    without an ``etcd`` binary. Never touches the etcd of ``CORRAL_TEST_ETCD``.

    Args:
        directory: where each member's data dir and log go.
        size: how many members.
    """
    binary = shutil.which("etcd")
    if binary is None:
        _missing("no etcd binary on PATH (Debian: apt-get install etcd-server)")
    assert binary is not None
    ports = [(_free_port(), _free_port()) for _ in range(size)]
    names = [f"m{i}" for i in range(size)]
    initial = ",".join(
        f"{name}=http://127.0.0.1:{peer}" for name, (_, peer) in zip(names, ports, strict=True)
    )
    token = f"corral-test-{uuid.uuid4().hex[:12]}"
    members: list[EtcdMember] = []
    logs = []
    try:
        for name, (client_port, peer_port) in zip(names, ports, strict=True):
            log = open(directory / f"etcd-{name}.log", "wb")  # closed below
            logs.append(log)
            process = subprocess.Popen(
                [
                    binary,
                    f"--name={name}",
                    f"--data-dir={directory / f'etcd-{name}'}",
                    f"--listen-client-urls=http://127.0.0.1:{client_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{client_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster={initial}",
                    f"--initial-cluster-token={token}",
                    "--initial-cluster-state=new",
                    # Elections within ~1 s on a busy machine, as with etcd's defaults.
                    "--heartbeat-interval=100",
                    "--election-timeout=1000",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            members.append(EtcdMember(name, f"127.0.0.1:{client_port}", peer_port, process))
        cluster = EtcdCluster(members)
        deadline = time.monotonic() + 30
        while True:
            try:
                cluster.leader()
                # Every member serves linearizable reads (it has caught up).
                for member in members:
                    _plain_gateway(member.endpoint, "/v3/kv/range", {"key": _b64(b"\0")})
                break
            except (RuntimeError, urllib.error.URLError, OSError) as exc:
                dead = [m.name for m in members if m.process.poll() is not None]
                if dead or time.monotonic() > deadline:
                    tail = "".join(
                        (directory / f"etcd-{m.name}.log").read_text(errors="replace")[-1500:]
                        for m in members
                    )
                    raise RuntimeError(
                        f"the etcd cluster did not come up ({exc}; exited: {dead}):\n{tail}"
                    ) from exc
                time.sleep(0.1)
        yield cluster
    finally:
        for member in members:
            if member.process.poll() is None:
                os.kill(member.pid, signal.SIGCONT)
                member.process.terminate()
        for member in members:
            try:
                member.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()
        for log in logs:
            log.close()
