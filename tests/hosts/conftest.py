"""The many-hosts tier: real namespaces, etcd members, nodes and proxies (marked slow).

A test here needs root, ``ip`` and ``nft`` (:func:`corral.testing.require_netns`
skips it without them, and fails it under ``CORRAL_REQUIRE_NETNS=1``, as CI sets),
and for a cluster the ``etcd`` binary (required under ``CORRAL_REQUIRE_ETCD=1``).
Each test builds its own bed: its own 10.231.K.0/24, namespaces, processes and data
directories, all removed when it ends.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.proxy import DEFAULT_HAPROXY
from corral.testing import HostBed, open_hosts, require_netns
from corral.testing._etcd import _missing as etcd_missing

#: Long: SWIM, not a record's lapse, must find a frozen or killed node (a lapsed
#: record drops the node from ``node ls`` instead of showing it down).
NODE_TTL_MS = 12_000
#: Short SWIM times: a frozen or killed host is found down within a few seconds.
SWIM_ENV = {
    "CORRAL_PROBE_INTERVAL_MS": "200",
    "CORRAL_PROBE_TIMEOUT_MS": "100",
    # Long: nothing in these tests may move because a host was down for a while.
    "CORRAL_GRACE_PERIOD_MS": "120000",
}


def require_etcd_binary() -> None:
    if shutil.which("etcd") is None:
        etcd_missing("no etcd binary on PATH (Debian: apt-get install etcd-server)")


def require_haproxy() -> None:
    if os.access(DEFAULT_HAPROXY, os.X_OK):
        return
    reason = f"haproxy is not installed at {DEFAULT_HAPROXY} (apt-get install haproxy)"
    if os.environ.get("CORRAL_REQUIRE_PROXIES") == "1":
        pytest.fail(f"CORRAL_REQUIRE_PROXIES=1 but {reason}")
    pytest.skip(reason)


#: How many many-hosts tests run at once across the pytest-xdist workers. Each bed is
#: three etcd members, three nodes, a proxy and their apps: four at once on two cores
#: starved them (leases moved, a stopped process was seen twice) and the tests beside
#: them; two at once keep the suite's wall time and leave the beds their timing.
BED_SLOTS = 2


@pytest.fixture(autouse=True)
def _bed_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around every slow test here: one of :data:`BED_SLOTS` slots, held by flock on a
    file per slot (so it holds across workers), waited for in turn."""
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    directory = Path(tempfile.gettempdir())
    while True:
        for index in range(BED_SLOTS):
            handle = open(directory / f"corral-test-bed-slot-{index}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(0.2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[FAILED] = report.failed


FAILED = pytest.StashKey[bool]()


def keep_logs_on_failure(request: pytest.FixtureRequest, bed: HostBed) -> None:
    """After a failed test, print the bed's log tails and keep its files."""
    if request.node.stash.get(FAILED, False):
        bed.keep = True
        print(f"test bed logs:\n{bed.log_tails()}")


@pytest.fixture
def network_bed() -> Iterator[HostBed]:
    """Three hosts on a switch, nothing running in them."""
    require_netns()
    with open_hosts(3) as bed:
        yield bed


@pytest.fixture
def cluster_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    """Three hosts, each with an etcd member and a corral node (given all three
    endpoints, advertising its host's address), all answering."""
    require_netns()
    require_etcd_binary()
    with open_hosts(3, node_ttl_ms=NODE_TTL_MS, extra_env=SWIM_ENV) as bed:
        bed.start_etcd()
        bed.start_nodes()
        yield bed
        keep_logs_on_failure(request, bed)
