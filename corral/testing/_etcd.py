"""Testing against a real etcd: where it is, and a registry in a namespace of its own.

* :func:`etcd_endpoint_from_env` — the etcd to test against, from
  ``CORRAL_TEST_ETCD=host:port``; skips the test when there is none, and fails it
  when ``CORRAL_REQUIRE_ETCD=1`` (CI), so a missing etcd never passes silently
  (needs pytest).
* :func:`open_test_etcd_registry` — an :class:`~corral.registry.EtcdRegistry` in a
  fresh namespace, emptied on exit, so tests sharing one etcd never see each
  other's keys.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from corral.registry import EtcdRegistry

__all__ = ["etcd_endpoint_from_env", "open_test_etcd_registry"]

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
