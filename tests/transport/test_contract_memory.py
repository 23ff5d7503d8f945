"""MemoryTransport passes the public transport contract; the kernel runs on it (virtual time)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio.testing

from corral.testing import check_transport
from corral.transport import MemoryNetwork, MemoryTransport, Transport

from ._contract import CONTRACT_CHECKS, Check


@asynccontextmanager
async def memory_transports(count: int) -> AsyncIterator[list[Transport]]:
    network = MemoryNetwork()
    transports: list[MemoryTransport] = [network.connect(f"node-{i}") for i in range(count)]
    try:
        yield list(transports)
    finally:
        for transport in transports:
            await transport.aclose()


@asynccontextmanager
async def memory_pair() -> AsyncIterator[tuple[Transport, Transport]]:
    async with memory_transports(2) as (a, b):
        yield a, b


async def test_memory_transport_passes_the_transport_contract(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await check_transport(memory_pair, make_clogged_pair=memory_pair)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
async def test_kernel_contract(check: Check, autojump_clock: trio.testing.MockClock) -> None:
    await check(memory_transports)
