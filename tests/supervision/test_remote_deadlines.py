"""Remote asks keep their deadlines: one timer for every pending ask, on virtual time."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from corral.supervision import Actor, ActorSystem, AskTimeout, ChildSpec, open_actor_system
from corral.transport import (
    MemoryNetwork,
    PeerState,
    PeerUnavailable,
    ReconnectPolicy,
    WebSocketConfig,
    message,
    open_websocket_transport,
)
from corral.transport._ws_net import MemoryStreamNetwork


@message("test.deadlines.ping")
@dataclass(frozen=True)
class Ping:
    n: int = 0


@message("test.deadlines.hold")
@dataclass(frozen=True)
class Hold:
    seconds: float


class Holder(Actor):
    async def handle(self, msg: object) -> object:
        match msg:
            case Ping(n=n):
                return n
            case Hold(seconds=seconds):
                await trio.sleep(seconds)
                return "held"
        return None


@asynccontextmanager
async def memory_pair(network: MemoryNetwork) -> AsyncIterator[tuple[ActorSystem, ActorSystem]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_actor_system("a", network.connect("a")))
        b = await stack.enter_async_context(open_actor_system("b", network.connect("b")))
        await b.spawn(ChildSpec("holder", Holder, mailbox_size=64))
        yield a, b


async def test_concurrent_asks_each_time_out_at_their_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with memory_pair(network) as (a, _):
        network.set_drop_rate(1.0)  # nothing arrives: every ask runs into its deadline
        ref = a.ref("b/holder")
        t0 = trio.current_time()
        ended: dict[float, float] = {}

        async def ask(timeout: float, after: float) -> None:
            await trio.sleep(after)
            with pytest.raises(AskTimeout, match=rf"b/holder within {timeout} s"):
                await ref.ask(Ping(1), timeout=timeout)
            ended[timeout] = trio.current_time() - t0

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, 3.0, 0.0)
            nursery.start_soon(ask, 1.0, 0.0)
            nursery.start_soon(ask, 2.0, 0.0)
            # asked while the timer sleeps towards t0 + 1: the timer must wake earlier
            nursery.start_soon(ask, 0.25, 0.5)
        assert ended == {
            3.0: pytest.approx(3.0),
            1.0: pytest.approx(1.0),
            2.0: pytest.approx(2.0),
            0.25: pytest.approx(0.75),
        }


async def test_answered_asks_leave_later_deadlines_intact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    async with memory_pair(network) as (a, _):
        ref = a.ref("b/holder")
        for n in range(500):  # answered at once; their deadlines are left behind
            assert await ref.ask(Ping(n), timeout=1.0 + n % 7) == n
        t0 = trio.current_time()
        with pytest.raises(AskTimeout):
            await ref.ask(Hold(60.0), timeout=4.0)
        assert trio.current_time() - t0 == pytest.approx(4.0)
        await trio.sleep(60.0)  # the holder is done with the first Hold
        t0 = trio.current_time()
        assert await ref.ask(Hold(1.0), timeout=2.0) == "held"
        assert trio.current_time() - t0 == pytest.approx(1.0)


async def test_an_ask_from_outside_fails_when_its_system_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The asker does not wait out its deadline for a reply that can no longer come."""
    network = MemoryNetwork()
    ended: list[tuple[type[BaseException], float]] = []
    async with (
        open_actor_system("b", network.connect("b")) as b,
        trio.open_nursery() as outside,
    ):
        await b.spawn(ChildSpec("holder", Holder))
        network.set_drop_rate(1.0)  # b hears nothing, and stays up
        async with open_actor_system("a", network.connect("a")) as a:
            ref = a.ref("b/holder")

            async def ask_and_record() -> None:
                try:
                    await ref.ask(Hold(100.0), timeout=50.0)
                except Exception as exc:
                    ended.append((type(exc), trio.current_time()))

            outside.start_soon(ask_and_record)
            await trio.sleep(1.0)
            stopped_at = trio.current_time()
    assert ended == [(PeerUnavailable, pytest.approx(stopped_at, abs=1.0))]


async def test_an_ask_while_the_peer_is_being_redialed_times_out_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The send of an ask to a peer lost since it last answered is bounded by the ask's
    deadline, not by the transport's connect timeout (a dial to a silent host)."""
    network = MemoryStreamNetwork()
    config = WebSocketConfig(
        heartbeat_interval=1.0,
        heartbeat_timeout=2.0,
        connect_timeout=30.0,
        close_timeout=1.0,
        reconnect=ReconnectPolicy(initial=0.5, factor=2.0, maximum=4.0, jitter=0.0),
    )
    async with AsyncExitStack() as stack:
        transports = [
            await stack.enter_async_context(
                open_websocket_transport(
                    name,
                    ("10.0.0.1", 0),
                    secret=b"deadline-secret",
                    config=config,
                    random=random.Random(1),
                    network=network,
                )
            )
            for name in ("a", "b")
        ]
        ta, tb = transports
        assert tb.address is not None
        ta.add_peer("b", tb.address)
        a = await stack.enter_async_context(open_actor_system("a", ta))
        b = await stack.enter_async_context(open_actor_system("b", tb))
        await b.spawn(ChildSpec("holder", Holder))
        ref = a.ref("b/holder")
        assert await ref.ask(Ping(1)) == 1  # connected, and b has answered
        network.blackhole(tb.address)
        network.sever(tb.address)
        while ta.peer_status("b").state is not PeerState.CONNECTING:  # type: ignore[union-attr]
            await trio.sleep(0.01)  # the redial hangs on the silent host
        t0 = trio.current_time()
        with pytest.raises(AskTimeout, match=r"b/holder within 0\.5 s"):
            await ref.ask(Ping(2), timeout=0.5)
        assert trio.current_time() - t0 == pytest.approx(0.5)
