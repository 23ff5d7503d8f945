"""Test helpers for code that needs a registry (imported by tests only; needs pytest).

* :func:`etcd_endpoint_from_env` — the etcd to test against, from
  ``CORRAL_TEST_ETCD=host:port``; skips the test when there is none, and fails it
  when ``CORRAL_REQUIRE_ETCD=1`` (CI), so a missing etcd never passes silently.
* :func:`open_test_etcd_registry` — an :class:`EtcdRegistry` in a fresh namespace,
  emptied on exit, so tests sharing one etcd never see each other's keys.
* :class:`ManualClock` — a lease clock a test moves by hand.
* :class:`RegistryHarness` and :func:`take_events` — what the contract suite
  (``tests/registry``) drives every backend with.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from corral.registry._base import Registry, WatchEvent
from corral.registry._etcd import EtcdRegistry

ETCD_ENV = "CORRAL_TEST_ETCD"
REQUIRE_ETCD_ENV = "CORRAL_REQUIRE_ETCD"


class ManualClock:
    """A clock that moves only when told: ``clock.advance(45)``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds


def _missing(reason: str) -> None:
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
    endpoint: str | None = None, *, namespace: str | None = None
) -> AsyncIterator[EtcdRegistry]:
    """An :class:`EtcdRegistry` under a fresh namespace, whose keys are deleted on exit.

    Args:
        endpoint: ``host:port[,host:port]``; default :func:`etcd_endpoint_from_env`.
        namespace: the key prefix; default ``corral-test/<random>/``.
    """
    if endpoint is None:
        endpoint = etcd_endpoint_from_env()
    prefix = namespace or f"corral-test/{uuid.uuid4().hex}/"
    registry = EtcdRegistry(endpoint.split(","), prefix=prefix)
    try:
        yield registry
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await registry.delete("", prefix=True)
            finally:
                await registry.aclose()


@dataclass
class RegistryHarness:
    """A registry under test plus how to let lease time pass on it."""

    name: str
    registry: Registry
    clock: ManualClock | None  # None: the server keeps time (etcd)

    def ttl(self, wanted: float) -> float:
        """A TTL the backend honours (etcd's minimum is 2 s)."""
        return wanted if self.clock is not None else max(wanted, 2.0)

    async def elapse(self, seconds: float) -> None:
        """Let ``seconds`` of lease time pass (real time on etcd)."""
        if self.clock is not None:
            self.clock.advance(seconds)
            await self.registry.revision()  # any access enforces expiry
        else:
            await trio.sleep(seconds)

    async def until_gone(self, key: str, *, within: float = 5.0) -> None:
        """Wait (bounded) until ``key`` is absent; immediate on a manual clock."""
        if self.clock is not None:
            assert await self.registry.get(key) is None, f"{key} outlived its lease"
            return
        with trio.fail_after(within):
            for _ in range(int(within / 0.05) + 1):
                if await self.registry.get(key) is None:
                    return
                await trio.sleep(0.05)
        raise AssertionError(f"{key} outlived its lease")


async def take_events(
    events: AsyncIterator[WatchEvent], n: int, *, within: float = 10.0
) -> list[WatchEvent]:
    """The next ``n`` events of a watch; fails after ``within`` seconds."""
    got: list[WatchEvent] = []
    with trio.fail_after(within):
        async for event in events:
            got.append(event)
            if len(got) == n:
                break
    return got
