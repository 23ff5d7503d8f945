"""Settings shared by the whole suite, and the turns tests take on the shared etcd.

The suite runs on several pytest-xdist workers (see ``addopts`` in pyproject.toml).
Tests marked ``etcd`` share the one etcd that ``CORRAL_TEST_ETCD`` names, each in a
key namespace of its own; that is enough for most. A test marked ``etcd_alone`` needs
more: exact revision arithmetic (an etcd's revision counts every namespace's writes)
or a compaction (which cuts every namespace's history). It waits until no other test
uses that etcd, and none starts until it is done: a readers-writer lock held in files
named after the endpoint, so it holds across workers and across pytest runs that
share the etcd. Those few tests come first in the run, before the workers reach the
long end-to-end tests that share the etcd, so they seldom wait.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that need the shared etcd alone run first (see the module's doc)."""
    items.sort(key=lambda item: item.get_closest_marker("etcd_alone") is None)
