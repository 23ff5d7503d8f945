"""The public conformance suites catch broken implementations, and name the check that failed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from corral.registry import MemoryRegistry
from corral.testing import (
    CheckFailed,
    ManualClock,
    RegistryHarness,
    check_registry,
    check_transport,
)
from corral.transport import Frame, MemoryNetwork, MemoryTransport, Transport


class IgnoresClose(Transport):
    """A transport that keeps sending after aclose: what the suite must catch."""

    def __init__(self, inner: MemoryTransport) -> None:
        self._inner = inner
        self._closed = False

    @property
    def node_id(self) -> str:
        return self._inner.node_id

    async def send(self, peer: str, data: bytes) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return  # the bug: should raise trio.ClosedResourceError
        await self._inner.send(peer, data)

    async def receive(self) -> Frame:
        return await self._inner.receive()

    async def aclose(self) -> None:
        self._closed = True
        await self._inner.aclose()


@asynccontextmanager
async def sloppy_pair() -> AsyncIterator[tuple[Transport, Transport]]:
    network = MemoryNetwork()
    a, b = IgnoresClose(network.connect("a")), IgnoresClose(network.connect("b"))
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_check_transport_names_the_broken_promise(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(
        CheckFailed,
        match=r"check_transport: every call after aclose .*expected ClosedResourceError",
    ):
        await check_transport(sloppy_pair)


class NoRevisions(MemoryRegistry):
    """A registry whose change token never moves: what the suite must catch."""

    async def revision(self) -> int:
        await super().revision()
        return 0


@asynccontextmanager
async def broken_registry() -> AsyncIterator[RegistryHarness]:
    clock = ManualClock()
    registry = NoRevisions(clock)
    try:
        yield RegistryHarness("broken", registry, clock)
    finally:
        await registry.aclose()


@asynccontextmanager
async def memory_registry() -> AsyncIterator[RegistryHarness]:
    clock = ManualClock()
    registry = MemoryRegistry(clock)
    try:
        yield RegistryHarness("memory", registry, clock)
    finally:
        await registry.aclose()


async def test_check_registry_names_the_broken_promise() -> None:
    with pytest.raises(CheckFailed, match="check_registry: put get range carry revisions"):
        await check_registry(broken_registry)


async def test_the_documented_example_passes() -> None:
    await check_registry(memory_registry)
