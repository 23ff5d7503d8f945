"""The transport contract suite on MemoryTransport (virtual time)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio.testing

from corral.supervision import ActorSystem, open_actor_system
from corral.transport import CodecLimits, MemoryNetwork

from ._contract import CONTRACT_CHECKS, Check


@asynccontextmanager
async def memory_systems(count: int, limits: CodecLimits) -> AsyncIterator[list[ActorSystem]]:
    network = MemoryNetwork()
    async with AsyncExitStack() as stack:
        systems = [
            await stack.enter_async_context(
                open_actor_system(f"node-{i}", network.connect(f"node-{i}"), limits)
            )
            for i in range(count)
        ]
        yield systems


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
async def test_contract(check: Check, autojump_clock: trio.testing.MockClock) -> None:
    await check(memory_systems)
