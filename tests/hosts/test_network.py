"""The bed's network: cuts (all, chosen hosts, one way), loss, and its own cleanup.

Listeners are sockets made inside a host by this test process (a socket keeps the
namespace it was made in); the kernel completes a TCP handshake for a listening
socket without an accept, so a connect that opens means the path works both ways.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from corral.testing import HostBed, HostBedError, open_hosts, require_netns
from corral.testing._hosts_net import (
    LOCK_DIR,
    TEST_RANGE,
    SubnetClaim,
    existing_netns,
    remove_namespaces,
)

pytestmark = pytest.mark.slow

PORT = 9000
#: A connect through a cut must not open within this long (it is never refused).
CUT_TIMEOUT = 0.5


@contextmanager
def listeners(bed: HostBed) -> Iterator[None]:
    """A TCP listener on PORT at every host's address, made inside each host."""
    with ExitStack() as stack:
        for host in bed.hosts.values():
            with host.inside():
                server = socket.create_server((host.address, PORT))
            stack.enter_context(server)
        yield


def reach(bed: HostBed) -> set[tuple[str, str]]:
    """Every ordered pair of distinct hosts whose TCP connect opens."""
    return {
        (a, b)
        for a in bed.hosts
        for b in bed.hosts
        if a != b and bed.hosts[a].can_connect(bed.hosts[b].address, PORT, CUT_TIMEOUT)
    }


def datagrams_through(bed: HostBed, sender: str, receiver: str, count: int) -> int:
    """How many of ``count`` UDP datagrams from sender reach receiver."""
    to = bed.hosts[receiver]
    with to.inside():
        inbox = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with bed.hosts[sender].inside():
        outbox = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with inbox, outbox:
        inbox.bind((to.address, 0))
        inbox.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        for index in range(count):
            outbox.sendto(index.to_bytes(4, "big"), inbox.getsockname())
        inbox.settimeout(0.3)
        received = 0
        try:
            while True:
                inbox.recv(16)
                received += 1
        except TimeoutError:
            return received


ALL = {(a, b) for a in ("h1", "h2", "h3") for b in ("h1", "h2", "h3") if a != b}


def test_a_cut_host_reaches_no_one_and_is_reached_by_no_one_until_healed(
    network_bed: HostBed,
) -> None:
    bed = network_bed
    h1, h2 = bed.hosts["h1"], bed.hosts["h2"]
    assert h1.address == str(bed.claim.subnet[1])
    assert bed.claim.subnet.subnet_of(TEST_RANGE)
    with listeners(bed):
        assert reach(bed) == ALL
        bed.cut("h1")
        started = time.monotonic()
        assert not h1.can_connect(h2.address, PORT, CUT_TIMEOUT)
        assert time.monotonic() - started >= CUT_TIMEOUT  # silence, not a refusal
        assert reach(bed) == {("h2", "h3"), ("h3", "h2")}
        # Its own address still works from inside it: local traffic skips the switch.
        assert h1.can_connect(h1.address, PORT, CUT_TIMEOUT)
        bed.heal("h1")
        assert reach(bed) == ALL


def test_a_cut_from_chosen_hosts_leaves_the_others(network_bed: HostBed) -> None:
    bed = network_bed
    with listeners(bed):
        bed.cut("h1", ["h2"])
        assert reach(bed) == ALL - {("h1", "h2"), ("h2", "h1")}
        bed.heal()
        assert reach(bed) == ALL


def test_a_one_way_cut_drops_one_direction_only(network_bed: HostBed) -> None:
    bed = network_bed
    bed.cut("h1", ["h2"], direction="out")  # h1 hears h2, h2 does not hear h1
    assert datagrams_through(bed, "h1", "h2", 20) == 0
    assert datagrams_through(bed, "h2", "h1", 20) == 20
    assert datagrams_through(bed, "h1", "h3", 20) == 20
    with listeners(bed):
        # TCP needs both ways: a one-way cut stalls connections from either side.
        assert reach(bed) == ALL - {("h1", "h2"), ("h2", "h1")}
    bed.heal()
    bed.cut("h1", ["h2"], direction="in")
    assert datagrams_through(bed, "h2", "h1", 20) == 0
    assert datagrams_through(bed, "h1", "h2", 20) == 20


def test_a_lossy_link_drops_about_its_percent(network_bed: HostBed) -> None:
    bed = network_bed
    bed.lossy("h1", 100)
    assert datagrams_through(bed, "h1", "h2", 50) == 0
    assert datagrams_through(bed, "h3", "h1", 50) == 0
    assert datagrams_through(bed, "h2", "h3", 50) == 50
    bed.lossy("h1", 50)
    through = datagrams_through(bed, "h1", "h2", 400)
    # Binomial(400, 0.5): 200 +- 10; outside 120..280 is a broken rule, not chance.
    assert 120 <= through <= 280, through
    bed.lossy("h1", 0)
    assert datagrams_through(bed, "h1", "h2", 50) == 50


def test_beds_side_by_side_take_their_own_subnets_and_leave_nothing_behind() -> None:
    require_netns()
    with pytest.raises(RuntimeError, match="the test failed"):  # noqa: PT012
        with open_hosts(2) as first, open_hosts(["a", "b", "c"]) as second:
            assert first.claim.subnet != second.claim.subnet
            prefixes = (first.claim.prefix, second.claim.prefix)
            ours = [n for n in existing_netns() if n.startswith(prefixes)]
            assert len(ours) == (2 + 1) + (3 + 1)  # the hosts and a switch each
            indices = (first.claim.index, second.claim.index)
            roots = (first.root, second.root)
            raise RuntimeError("the test failed")
    assert not [n for n in existing_netns() if n.startswith(prefixes)]
    for root in roots:  # kept, as after any failure; this one was on purpose
        assert root.is_dir()
        shutil.rmtree(root)
    for index in indices:  # both subnets are free again
        with open(LOCK_DIR / f"{index}.lock", "rb") as lock:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_an_earlier_beds_leftovers_are_removed_with_their_processes() -> None:
    require_netns()
    claim = SubnetClaim.take()
    try:
        stale = claim.prefix + "h1"
        subprocess.run(["ip", "netns", "add", stale], check=True)
        sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "60"])
        time.sleep(0.2)
        killed = remove_namespaces(claim.prefix)
        assert sleeper.wait(5) == -9
        assert sleeper.pid in killed
        assert stale not in existing_netns()
    finally:
        remove_namespaces(claim.prefix)
        claim.release()


def test_unknown_hosts_are_named() -> None:
    require_netns()
    with open_hosts(2) as bed, pytest.raises(HostBedError, match=r"no host 'h9'.*\['h1', 'h2'\]"):
        bed.cut("h1", ["h9"])
