"""MemoryNetwork and MemoryTransport: delivery, ordering, and every injected fault."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from corral.transport import (
    Frame,
    MemoryNetwork,
    MemoryTransport,
    PeerBusy,
    PeerLost,
    PeerUnavailable,
)


async def test_frames_arrive_in_order_with_their_sender() -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    for i in range(10):
        await a.send("b", bytes([i]))
    frames = [await b.receive() for _ in range(10)]
    assert frames == [Frame("a", bytes([i])) for i in range(10)]
    assert network.nodes == ["a", "b"]
    assert a.node_id == "a"


async def test_send_to_unknown_peer_fails_fast() -> None:
    network = MemoryNetwork()
    a = network.connect("a")
    with pytest.raises(PeerUnavailable, match="no node 'zz'"):
        await a.send("zz", b"x")


async def test_full_inbox_raises_peer_busy() -> None:
    network = MemoryNetwork(inbox_size=3)
    a, b = network.connect("a"), network.connect("b")
    for _ in range(3):
        await a.send("b", b"x")
    with pytest.raises(PeerBusy, match="holds 3 frames"):
        await a.send("b", b"x")
    await b.receive()
    await a.send("b", b"x")  # room again


async def test_partition_cuts_links_both_ways_until_healed() -> None:
    network = MemoryNetwork()
    a, b, c = (network.connect(n) for n in "abc")
    network.partition({"a"}, {"b", "c"})
    with pytest.raises(PeerUnavailable, match="partitioned"):
        await a.send("b", b"x")
    with pytest.raises(PeerUnavailable):
        await c.send("a", b"x")
    await b.send("c", b"same side")
    assert (await c.receive()).data == b"same side"
    network.heal()
    await a.send("b", b"healed")
    assert (await b.receive()).data == b"healed"


async def test_a_one_way_cut_drops_one_direction_silently_until_healed() -> None:
    network = MemoryNetwork()
    a, b, c = network.connect("a"), network.connect("b"), network.connect("c")
    lost: list[str] = []
    b.on_peer_lost(lambda peer, reason: lost.append(peer))
    await a.send("b", b"hello")  # linked
    network.cut_one_way(["a"], ["b", "c"])
    await a.send("b", b"dropped")  # no error: the sender learns nothing
    await a.send("c", b"dropped")
    await b.send("a", b"heard")  # the other direction still works
    assert await a.receive() == Frame("b", b"heard")
    assert network.reachable("a", "b")  # not a partition: no link was cut
    assert network.stats["dropped"] == 2
    network.heal()
    await a.send("b", b"again")
    assert [await b.receive() for _ in range(2)] == [Frame("a", b"hello"), Frame("a", b"again")]
    await a.send("c", b"back")
    assert await c.receive() == Frame("a", b"back")
    assert lost == []


async def test_frames_in_flight_are_lost_when_the_link_is_cut(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    network.set_delay(1.0)
    await a.send("b", b"lost")
    network.partition({"a"}, {"b"})
    await trio.sleep(2)
    network.heal()
    await a.send("b", b"kept")
    t0 = trio.current_time()
    frame = await b.receive()
    assert frame.data == b"kept"
    assert trio.current_time() - t0 == pytest.approx(1.0)
    assert network.stats["lost_in_flight"] == 1


async def test_killed_node_neither_sends_nor_receives_until_revived() -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    await a.send("b", b"queued before the kill")
    network.kill("b")
    with pytest.raises(PeerUnavailable, match="killed"):
        await a.send("b", b"x")
    with pytest.raises(PeerUnavailable, match="killed"):
        await b.send("a", b"x")
    network.revive("b")
    await a.send("b", b"after revive")
    assert (await b.receive()).data == b"after revive"  # the queued frame died with the node


async def test_delay_keeps_order_and_costs_exactly_the_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    network.set_delay(0.5)
    t0 = trio.current_time()
    await a.send("b", b"1")
    network.set_delay(0.1)  # a shorter delay never overtakes an earlier frame
    await a.send("b", b"2")
    assert (await b.receive()).data == b"1"
    assert trio.current_time() - t0 == pytest.approx(0.5)
    assert (await b.receive()).data == b"2"


async def test_cancelled_receive_during_delay_loses_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    network.set_delay(5.0)
    await a.send("b", b"x")
    with trio.move_on_after(1.0):
        await b.receive()
    assert (await b.receive()).data == b"x"


async def test_drop_rate_is_deterministic_with_a_seeded_random() -> None:
    async def survivors(seed: int) -> list[int]:
        network = MemoryNetwork(random=random.Random(seed))
        a, b = network.connect("a"), network.connect("b")
        network.set_drop_rate(0.5)
        for i in range(100):
            await a.send("b", bytes([i]))
        out = []
        while True:
            try:
                out.append(b._inbox_receive.receive_nowait()[1].data[0])
            except trio.WouldBlock:
                return out

    first = await survivors(7)
    assert first == await survivors(7)
    assert 20 < len(first) < 80
    assert first == sorted(first)  # dropped, never reordered


async def test_aclose_is_idempotent_and_later_calls_raise_closed() -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    await a.aclose()
    await a.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await a.send("b", b"x")
    with pytest.raises(trio.ClosedResourceError):
        await a.receive()
    with pytest.raises(PeerUnavailable):
        await b.send("a", b"x")
    network.connect("a")  # the id is free again


async def test_aclose_wakes_a_blocked_receiver() -> None:
    network = MemoryNetwork()
    a = network.connect("a")
    errors: list[BaseException] = []

    async def receiver() -> None:
        try:
            await a.receive()
        except trio.ClosedResourceError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        await a.aclose()
    assert len(errors) == 1


def test_bad_fault_settings_are_refused() -> None:
    network = MemoryNetwork()
    network.connect("a")
    with pytest.raises(ValueError, match="already connected"):
        network.connect("a")
    with pytest.raises(ValueError, match="between 0 and 1"):
        network.set_drop_rate(1.5)
    with pytest.raises(ValueError, match="zero or more"):
        network.set_delay(-1)


async def _link(*transports: MemoryTransport) -> None:
    """Link every pair: a frame each way (then drained), as nodes that talk are linked."""
    for sender in transports:
        for receiver in transports:
            if sender is not receiver:
                await sender.send(receiver.node_id, b"hi")
    for receiver in transports:
        for _ in range(len(transports) - 1):
            await receiver.receive()


def _record_losses(*transports: MemoryTransport) -> list[tuple[str, str, str]]:
    """(observer, lost peer, reason) for every on_peer_lost report, in order."""
    seen: list[tuple[str, str, str]] = []
    for transport in transports:
        transport.on_peer_lost(
            lambda event, me=transport.node_id: seen.append((me, event.peer, event.reason))
        )
    return seen


async def test_a_kill_is_reported_to_both_ends_once() -> None:
    network = MemoryNetwork()
    a, b, c = (network.connect(n) for n in "abc")
    await _link(a, b, c)
    seen = _record_losses(a, b, c)
    network.kill("b")
    assert [(o, p) for o, p, _ in seen] == [("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")]
    assert "node 'b' is killed" in seen[0][2]
    network.kill("b")  # already unreachable: nothing new to report
    network.partition({"a"}, {"b"})
    assert len(seen) == 4
    network.revive("b")
    network.heal()
    network.kill("b")  # reachable again, but no frame linked them again: nothing
    assert len(seen) == 4
    network.revive("b")
    await _link(a, b, c)
    network.kill("b")  # linked again in between: reported again
    assert len(seen) == 8


async def test_nodes_that_never_talked_hear_nothing_of_each_other() -> None:
    network = MemoryNetwork()
    a, b, c = (network.connect(n) for n in "abc")
    await _link(a, b)
    seen = _record_losses(a, b, c)
    network.kill("c")  # linked to nobody
    network.partition({"a"}, {"c"})
    await c.aclose()
    assert seen == []
    network.kill("b")
    assert [(o, p) for o, p, _ in seen] == [("a", "b"), ("b", "a")]


async def test_a_partition_reports_only_the_links_it_newly_cuts() -> None:
    network = MemoryNetwork()
    a, b, c = (network.connect(n) for n in "abc")
    await _link(a, b, c)
    seen = _record_losses(a, b, c)
    network.partition({"a"}, {"b"})
    assert [(o, p) for o, p, _ in seen] == [("a", "b"), ("b", "a")]
    assert all("partitioned" in reason for _, _, reason in seen)
    network.partition({"a"}, {"b", "c"})  # a-b was cut already; a-c is new
    assert [(o, p) for o, p, _ in seen[2:]] == [("a", "c"), ("c", "a")]


async def test_closing_a_transport_is_reported_to_its_peers() -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    await _link(a, b)
    seen = _record_losses(a, b)
    await b.aclose()
    assert seen == [("a", "b", "node 'b' closed its transport")]


async def test_peer_lost_handlers_can_leave_and_a_failing_one_spoils_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    network = MemoryNetwork()
    a, b = network.connect("a"), network.connect("b")
    await _link(a, b)
    calls: list[str] = []

    def broken(event: PeerLost) -> None:
        raise RuntimeError("handler bug")

    a.on_peer_lost(broken)
    remove = a.on_peer_lost(lambda event: calls.append(event.peer))
    network.kill("b")
    assert calls == ["b"]
    assert any("peer-lost handler failed" in r.getMessage() for r in caplog.records)
    remove()
    remove()  # idempotent
    network.revive("b")
    await _link(a, b)
    network.kill("b")
    assert calls == ["b"]
