"""The many-hosts test bed's network: namespaces, a switch, and a /24 of 10.231.0.0/16.

A bed claims one subnet ``10.231.K.0/24`` for its life by holding an exclusive
``flock`` on ``/run/corral-hosts/K.lock`` (so beds in parallel pytest workers, or
parallel runs, never share one; a crashed bed's lock goes with its process). Its
namespaces are all named ``corral231-K-<name>``: one per host, with the host's
address ``10.231.K.<i>`` on ``eth0``, and ``corral231-K-switch`` holding the bridge
every host's veth is plugged into. Nothing is created in the root namespace and
nothing is routed out of the bed: the hosts have no default route.

Before building, a bed removes whatever an earlier bed of the same K left behind
(a test process killed before its cleanup): it SIGKILLs the processes inside those
namespaces (started by that bed) and deletes them.

A thread of the test process can work inside a host (:func:`inside_netns`): a socket
made there stays in that namespace, so a client reaches the host's address without
any route from the root namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from corral._errors import CorralError

__all__ = [
    "REQUIRE_NETNS_ENV",
    "TEST_RANGE",
    "HostBedError",
    "NetnsTransport",
    "SubnetClaim",
    "inside_netns",
    "netns_missing_reason",
    "require_netns",
]

#: The only addresses a bed ever uses (and sends to).
TEST_RANGE = ipaddress.IPv4Network("10.231.0.0/16")
REQUIRE_NETNS_ENV = "CORRAL_REQUIRE_NETNS"
NETNS_PREFIX = "corral231-"
LOCK_DIR = Path("/run/corral-hosts")
SWITCH = "switch"
BRIDGE = "br0"
_CLONE_NEWNET = 0x40000000


class HostBedError(CorralError):
    """The test bed could not build, change or reach its network or processes."""


def netns_missing_reason() -> str | None:
    """Why this machine cannot build a bed (None: it can): not root, or no ``ip``/``nft``."""
    if os.geteuid() != 0:
        return "the many-hosts test bed needs root (it creates network namespaces)"
    for binary, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(binary) is None:
            return f"no {binary} on PATH (Debian: apt-get install {package})"
    if not Path("/proc/thread-self/ns/net").exists():
        return "this kernel has no network namespaces (/proc/thread-self/ns/net is missing)"
    return None


def require_netns() -> None:
    """Skip the calling test when the bed cannot be built here, saying why; fail it
    instead under ``CORRAL_REQUIRE_NETNS=1`` (CI), so it never passes silently."""
    reason = netns_missing_reason()
    if reason is None:
        return
    import pytest  # only tests call this; corral itself does not need pytest

    if os.environ.get(REQUIRE_NETNS_ENV) == "1":
        pytest.fail(f"{reason}, but {REQUIRE_NETNS_ENV}=1 requires the many-hosts tests to run")
    pytest.skip(reason)


def run_ip(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 15.0) -> str:
    """Run ``ip``/``nft`` (or anything) and return its output.

    Raises:
        HostBedError: it failed, with the command and what it printed.
    """
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostBedError(f"{' '.join(argv)} failed: {exc}") from exc
    if done.returncode != 0:
        raise HostBedError(
            f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip() or done.stdout}"
        )
    return done.stdout


def netns_pids(netns: str) -> list[int]:
    """Pids of every process in the namespace (none when it is gone)."""
    try:
        text = run_ip(["ip", "netns", "pids", netns])
    except HostBedError:
        return []
    return [int(word) for word in text.split()]


def kill_netns_processes(netns: str) -> list[int]:
    """SIGKILL every process in the namespace; return their pids."""
    pids = netns_pids(netns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return pids


def existing_netns() -> list[str]:
    names = run_ip(["ip", "netns", "list"]).splitlines()
    return [line.split()[0] for line in names if line.strip()]


class SubnetClaim:
    """One ``10.231.K.0/24`` held for a bed's life (an exclusive flock on its file)."""

    def __init__(self, index: int, fd: int) -> None:
        self.index = index
        self._fd = fd

    @classmethod
    def take(cls, lock_dir: Path = LOCK_DIR) -> SubnetClaim:
        """The first free K in 1..254, starting at one drawn from this pid.

        Raises:
            HostBedError: all 254 are held.
        """
        lock_dir.mkdir(parents=True, exist_ok=True)
        start = os.getpid() % 254
        for offset in range(254):
            index = (start + offset) % 254 + 1
            fd = os.open(lock_dir / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(index, fd)
        raise HostBedError(
            f"all 254 test subnets of {TEST_RANGE} are held by running beds (locks in "
            f"{lock_dir}); wait for them to finish"
        )

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.231.{self.index}.0/24")

    @property
    def prefix(self) -> str:
        """The name prefix of every namespace of this bed."""
        return f"{NETNS_PREFIX}{self.index}-"

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def remove_namespaces(prefix: str) -> list[int]:
    """Kill the processes in, and delete, every namespace named ``prefix*``; return the
    pids killed."""
    killed: list[int] = []
    for name in existing_netns():
        if name.startswith(prefix):
            killed += kill_netns_processes(name)
    for name in existing_netns():
        if name.startswith(prefix):
            run_ip(["ip", "netns", "delete", name])
    return killed


def build_switch(prefix: str, hosts: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Create the switch namespace and one namespace per ``(name, address)`` host,
    plugged into it; return host name -> namespace name."""
    switch = prefix + SWITCH
    run_ip(["ip", "netns", "add", switch])
    run_ip(["ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge"])
    run_ip(["ip", "-n", switch, "link", "set", BRIDGE, "up"])
    spaces: dict[str, str] = {}
    for number, (name, address) in enumerate(hosts, start=1):
        netns = prefix + name
        port = f"p{number}"
        run_ip(["ip", "netns", "add", netns])
        # Both ends are made straight in their namespaces: no name in the root one.
        run_ip(
            ["ip", "link", "add", "eth0", "netns", netns, "type", "veth",
             "peer", "name", port, "netns", switch]
        )  # fmt: skip
        run_ip(["ip", "-n", switch, "link", "set", port, "master", BRIDGE, "up"])
        run_ip(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0"])
        run_ip(["ip", "-n", netns, "link", "set", "eth0", "up"])
        run_ip(["ip", "-n", netns, "link", "set", "lo", "up"])
        spaces[name] = netns
    return spaces


def load_ruleset(prefix: str, ruleset: str) -> None:
    """Load an nftables ruleset into the switch (one transaction)."""
    run_ip(["ip", "netns", "exec", prefix + SWITCH, "nft", "-f", "-"], stdin=ruleset)


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise HostBedError(f"setns into a network namespace failed: {os.strerror(errno)}")


@contextmanager
def inside_netns(netns: str) -> Iterator[None]:
    """Run the block with the calling thread in namespace ``netns`` (back after).

    Sockets made in the block stay in that namespace for their life; other threads
    are not moved.
    """
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    except OSError as exc:
        os.close(original)
        raise HostBedError(f"no network namespace {netns!r}: {exc}") from exc
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(target)
        os.close(original)


class NetnsTransport(httpx.HTTPTransport):
    """An httpx transport whose connections are made inside a network namespace."""

    def __init__(self, netns: str) -> None:
        super().__init__()
        self.netns = netns

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with inside_netns(self.netns):
            return super().handle_request(request)
