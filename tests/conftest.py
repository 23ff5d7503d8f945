"""Settings shared by the whole suite, and the turns tests take on the shared etcd.

The suite runs on several pytest-xdist workers (see ``addopts`` in pyproject.toml).
Tests marked ``etcd`` share the one etcd that ``CORRAL_TEST_ETCD`` names, each in a
key namespace of its own; that is enough for most. A test marked ``etcd_alone`` needs
more: exact revision arithmetic (an etcd's revision counts every namespace's writes)
or a compaction (which cuts every namespace's history). It waits until no other test
uses that etcd, and none starts until it is done: a readers-writer lock held in files
named after the endpoint, so it holds across workers and across pytest runs that
share the etcd. Those few tests come first in the run, and the long tests on the
shared etcd come after the other long ones, so they seldom wait.

The order of the collection starts each worker on its share of the slow tests (see
:func:`deal_tests`), so that the run does not end waiting on a long test that one worker
reached last.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Two shared cores make per-example timings meaningless, so no deadlines anywhere.
settings.register_profile("dev", deadline=None)
# In CI the examples are derived from each test, not drawn at random: a run is
# reproducible, and a failure there is one a developer can replay exactly.
# Local runs keep exploring new examples.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@dataclass(frozen=True)
class SmallDisk:
    """A small tmpfs mounted for one test (see :func:`small_tmpfs`)."""

    path: Path

    def free(self) -> int:
        """Bytes free on it now."""
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, name: str = "filler", leave: int = 0) -> Path:
        """Write the file ``name`` until at most ``leave`` bytes are free (to the last
        block when ``leave`` is 0); returns its path."""
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1024 * 1024, 64 * 1024, 4096, 512):
                while self.free() - size >= leave or (leave == 0 and size <= 4096):
                    try:
                        os.write(fd, b"\xa5" * size)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return path


def _skip_unless_required(reason: str) -> None:
    """Skip a test that needs root here; fail it under ``CORRAL_REQUIRE_ROOT=1`` (CI,
    which runs as root), so a full-disk test never passes there by not running."""
    if os.environ.get("CORRAL_REQUIRE_ROOT") == "1":
        pytest.fail(f"CORRAL_REQUIRE_ROOT=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def small_tmpfs() -> Iterator[Callable[[int], SmallDisk]]:
    """``mount(size_mib) -> SmallDisk``: a fresh tmpfs of that size, for tests of a
    full disk; unmounted at the end. Skips the test when it cannot be mounted (it
    needs root, as in CI)."""
    mounted: list[Path] = []

    def mount(size_mib: int) -> SmallDisk:
        if os.geteuid() != 0:
            _skip_unless_required("mounting a small tmpfs needs root (CI runs the tests as root)")
        path = Path(tempfile.mkdtemp(prefix="corral-tmpfs-", dir="/tmp"))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            path.rmdir()
            _skip_unless_required(
                f"cannot mount a tmpfs at {path}: {done.stderr.strip() or done.returncode}"
            )
        mounted.append(path)
        return SmallDisk(path)

    yield mount
    for path in mounted:
        # Lazily when busy: a process the test started may still be exiting.
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


#: Where the lock files are: one place for every worker and every run on this machine.
LOCK_DIR = Path(tempfile.gettempdir())


@contextmanager
def shared_etcd_turn(endpoint: str, *, alone: bool, directory: Path = LOCK_DIR) -> Iterator[None]:
    """Hold a turn on the etcd at ``endpoint``: shared with other sharers, or ``alone``.

    Two lock files: the lock proper (shared or exclusive) and a turnstile. A test that
    wants the etcd alone holds the turnstile while it waits and works, and each sharer
    passes through the turnstile before it takes its shared lock, so sharers arriving
    meanwhile queue behind it instead of keeping it out forever.
    """
    name = re.sub(r"[^A-Za-z0-9.-]", "_", endpoint)
    stem = directory / f"corral-test-etcd-{name}"
    with (
        open(f"{stem}.turnstile", "a") as turnstile,
        open(f"{stem}.lock", "a") as lock,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _etcd_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around every test marked ``etcd`` (before its other fixtures start nodes on the
    etcd, after they stop them): its turn on ``CORRAL_TEST_ETCD``, if one is named."""
    endpoint = os.environ.get("CORRAL_TEST_ETCD")
    if not endpoint or request.node.get_closest_marker("etcd") is None:
        yield
        return
    alone = request.node.get_closest_marker("etcd_alone") is not None
    with shared_etcd_turn(endpoint, alone=alone):
        yield


def _marked(item: pytest.Item, name: str) -> bool:
    return item.get_closest_marker(name) is not None


def worker_chunks(total: int, workers: int) -> list[int]:
    """How many of ``total`` tests each of ``workers`` is first given: pytest-xdist's
    worksteal scheduler deals the collection out in contiguous chunks, in order, each
    ``remaining // workers left`` long (idle workers then steal from busy ones' tails)."""
    sizes = []
    for left in range(workers, 0, -1):
        sizes.append((total - sum(sizes)) // left)
    return sizes


def deal_tests(
    alone: list[pytest.Item], slow: list[pytest.Item], rest: list[pytest.Item], workers: int
) -> list[pytest.Item]:
    """The collection in the order that starts every worker on long tests.

    Each worker's first chunk (see :func:`worker_chunks`) begins with its share of the
    ``slow`` tests, dealt round the workers, and is filled up with ``rest``; the first
    begins with the ``alone`` ones. A worker then ends on short tests, which idle
    workers can steal, instead of on a long one started late. The order is the same
    on every worker (xdist requires it); without xdist it is alone, slow, rest."""
    chunks: list[list[pytest.Item]] = [list(alone)] + [[] for _ in range(workers - 1)]
    for index, item in enumerate(slow):
        chunks[index % workers].append(item)
    sizes = worker_chunks(len(alone) + len(slow) + len(rest), workers)
    if any(len(chunk) > size for chunk, size in zip(chunks, sizes, strict=True)):
        return [*alone, *slow, *rest]
    remaining = iter(rest)
    for chunk, size in zip(chunks, sizes, strict=True):
        chunk.extend(next(remaining) for _ in range(size - len(chunk)))
    return [item for chunk in chunks for item in chunk]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that need the shared etcd alone first (see the module's doc), and every
    worker's share of the slow ones at the start of its chunk (see :func:`deal_tests`):
    those on the shared etcd last among them, so the first ones seldom wait for a turn.
    """
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    alone = [item for item in items if _marked(item, "etcd_alone")]
    others = [item for item in items if not _marked(item, "etcd_alone")]
    slow = sorted((i for i in others if _marked(i, "slow")), key=lambda i: _marked(i, "etcd"))
    rest = [item for item in others if not _marked(item, "slow")]
    items[:] = deal_tests(alone, slow, rest, workers)
