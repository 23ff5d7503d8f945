"""The transport conformance suite: what every :class:`~corral.transport.Transport` must do.

Modelled on trio's ``check_two_way_stream``: hand :func:`check_transport` a
factory of connected pairs, and it runs every check, each on a fresh pair,
through the :class:`~corral.transport.Transport` interface alone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import trio

from corral.testing._checks import expect_error, run_checks
from corral.transport import Frame, PeerBusy, PeerLost, PeerUnavailable, Transport

__all__ = ["TransportPair", "check_transport"]

#: an async context manager yielding two transports that can reach each other
TransportPair = Callable[[], AbstractAsyncContextManager[tuple[Transport, Transport]]]

#: bound on every wait, in seconds (virtual under MockClock; generous on real sockets)
PATIENCE = 20.0
#: how many frames a clogged peer may absorb before ``send`` must raise PeerBusy
MAX_ABSORBED = 200_000


async def _send_patiently(transport: Transport, peer: str, data: bytes) -> None:
    """Send, letting a full queue drain (a well-behaved producer under backpressure)."""
    while True:
        try:
            await transport.send(peer, data)
            return
        except PeerBusy:
            await trio.sleep(0.001)


async def _link_up(sender: Transport, receiver: Transport) -> None:
    """Send until one frame gets through (frames lost while a link comes up are allowed)."""
    while True:
        await _send_patiently(sender, receiver.node_id, b"link up?")
        with trio.move_on_after(1.0):
            while (await receiver.receive()).data != b"link up?":
                pass
            return


async def _check_frames_arrive_intact_in_order_both_ways(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    count = 300
    sizes = [0, 1, 100, 4096, 65536]

    def payload(origin: str, seq: int) -> bytes:
        head = f"{origin}:{seq}:".encode()
        return head + b"x" * max(0, sizes[seq % len(sizes)] - len(head))

    async def send_all(sender: Transport, to: str) -> None:
        for seq in range(count):
            await _send_patiently(sender, to, payload(sender.node_id, seq))

    async def receive_all(receiver: Transport, origin: Transport, into: list[Frame]) -> None:
        while len(into) < count:
            into.append(await receiver.receive())

    got_a: list[Frame] = []
    got_b: list[Frame] = []
    with trio.fail_after(PATIENCE):
        # The contract allows loss while a link comes up or goes down ("in order, or
        # not at all"); on a link that is up, nothing may be lost.
        await _link_up(a, b)
        await _link_up(b, a)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive_all, b, a, got_b)
            nursery.start_soon(receive_all, a, b, got_a)
            nursery.start_soon(send_all, a, b.node_id)
            nursery.start_soon(send_all, b, a.node_id)
    for receiver, origin, got in ((b, a, got_b), (a, b, got_a)):
        assert [f.sender for f in got] == [origin.node_id] * count, (
            f"{receiver.node_id} saw senders other than {origin.node_id!r}"
        )
        expected = [payload(origin.node_id, seq) for seq in range(count)]
        for seq, (frame, sent) in enumerate(zip(got, expected, strict=True)):
            if frame.data != sent:
                raise AssertionError(
                    f"frame {seq} from {origin.node_id} to {receiver.node_id} arrived out of "
                    f"order or altered: got {frame.data[:40]!r}..., sent {sent[:40]!r}..."
                )


async def _check_an_unknown_peer_is_unavailable(pair: tuple[Transport, Transport]) -> None:
    a, _ = pair
    with trio.fail_after(PATIENCE), expect_error(PeerUnavailable):
        await a.send("no-such-node-in-this-test", b"anyone?")


async def _check_a_closed_peer_becomes_unavailable(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    await _send_patiently(a, b.node_id, b"hello")
    with trio.fail_after(PATIENCE):
        assert (await b.receive()).data == b"hello"
        await b.aclose()
        # a few frames may still be accepted (and lost) until the loss is noticed
        while True:
            try:
                await a.send(b.node_id, b"still there?")
            except PeerUnavailable:
                break
            await trio.sleep(0.01)


async def _check_a_stalled_peer_makes_send_raise_peer_busy(
    pair: tuple[Transport, Transport],
) -> None:
    a, b = pair
    with trio.fail_after(PATIENCE):
        frame = b"f" * 100
        for _ in range(MAX_ABSORBED):  # b takes nothing more: queues fill, none grows
            try:
                await a.send(b.node_id, frame)
            except PeerBusy:
                break
        else:
            raise AssertionError(
                f"{MAX_ABSORBED} frames to a peer that reads none were all accepted: "
                "some queue is unbounded"
            )
        with expect_error(PeerBusy):
            await a.send(b.node_id, frame)  # still full: refused at once, not blocked


async def _check_every_call_after_aclose_raises_closed_resource_error(
    pair: tuple[Transport, Transport],
) -> None:
    a, b = pair
    with trio.fail_after(PATIENCE):
        async with trio.open_nursery() as nursery:
            woken: list[BaseException] = []

            async def receive_until_closed() -> None:
                try:
                    await a.receive()
                except trio.ClosedResourceError as exc:
                    woken.append(exc)

            nursery.start_soon(receive_until_closed)
            await trio.sleep(0.1)
            await a.aclose()
        assert woken, "aclose did not wake a pending receive with ClosedResourceError"
        await a.aclose()  # idempotent
        with expect_error(trio.ClosedResourceError):
            await a.send(b.node_id, b"x")
        with expect_error(trio.ClosedResourceError):
            await a.receive()


async def _check_on_peer_lost_reports_a_closed_peer_once(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    lost: list[PeerLost] = []
    got_one = trio.Event()

    def record(event: PeerLost) -> None:
        lost.append(event)
        got_one.set()

    forget = a.on_peer_lost(record)
    if type(a).on_peer_lost is Transport.on_peer_lost:
        return  # the optional ability is not offered: nothing to check
    await _send_patiently(a, b.node_id, b"hello")
    with trio.fail_after(PATIENCE):
        assert (await b.receive()).data == b"hello"
        await b.aclose()
        await got_one.wait()
    assert lost[0].peer == b.node_id, f"reported {lost[0].peer!r}, not {b.node_id!r}"
    assert lost[0].reason, "a PeerLost must say why"
    await trio.sleep(1.0)
    assert [e.peer for e in lost] == [b.node_id], f"reported more than once: {lost}"
    forget()
    forget()  # idempotent


async def _check_deliver_frames_to_hands_over_every_frame_in_order(
    pair: tuple[Transport, Transport],
) -> None:
    a, b = pair
    got: list[Frame] = []
    enough = trio.Event()

    async def handler(frame: Frame) -> None:
        if frame.data == b"boom":
            raise RuntimeError("a handler bug the transport must survive")
        got.append(frame)
        if len(got) == 8:
            enough.set()

    with trio.fail_after(PATIENCE):
        for seq in range(5):
            await _send_patiently(a, b.node_id, b"early %d" % seq)
        await trio.sleep(0.5)  # the early frames reach b before it has a handler
        if not b.deliver_frames_to(handler):
            return  # the optional ability is not offered: receive() keeps working
        for data in (b"late 0", b"boom", b"late 1", b"late 2"):
            await _send_patiently(a, b.node_id, data)
        await enough.wait()
    expected = [b"early %d" % i for i in range(5)] + [b"late 0", b"late 1", b"late 2"]
    assert [f.data for f in got] == expected, f"the handler got {[f.data for f in got]}"
    assert {f.sender for f in got} == {a.node_id}


CHECKS = [
    _check_frames_arrive_intact_in_order_both_ways,
    _check_an_unknown_peer_is_unavailable,
    _check_a_closed_peer_becomes_unavailable,
    _check_every_call_after_aclose_raises_closed_resource_error,
    _check_on_peer_lost_reports_a_closed_peer_once,
    _check_deliver_frames_to_hands_over_every_frame_in_order,
]


async def check_transport(
    make_pair: TransportPair, *, make_clogged_pair: TransportPair | None = None
) -> None:
    """Check that a :class:`~corral.transport.Transport` implementation keeps the contract.

    Each check gets a fresh pair from ``make_pair`` and uses only the interface:

    * frames (empty to 64 KiB) arrive intact, in order per sender, both ways at once,
      with the sender's node id;
    * ``send`` to an unknown peer, or to one that closed, raises ``PeerUnavailable``
      (after at most a bounded wait);
    * after ``aclose``, ``send`` and ``receive`` raise ``trio.ClosedResourceError``,
      a pending ``receive`` is woken with it, and ``aclose`` is idempotent;
    * ``on_peer_lost`` (if offered) reports a peer that closed, once, with a reason;
    * ``deliver_frames_to`` (if offered) hands the handler the frames that arrived
      before it, then the later ones, in order, and survives a handler that raises;
    * with ``make_clogged_pair``: frames to a peer that reads none are accepted
      only up to a bound, then ``send`` raises ``PeerBusy`` at once (never blocks).

    Args:
        make_pair: an async context manager factory yielding ``(a, b)``: two open
            transports with different node ids that can send to each other by id.
            The factory closes them on exit (``aclose`` must be idempotent).
        make_clogged_pair: the same, but where frames from ``a`` to ``b`` back up
            once ``b`` stops reading (a bounded buffer between them). For most
            transports ``make_pair`` itself will do.

    Raises:
        CheckFailed: a check failed; the message names it.
        trio.TooSlowError: a check waited more than 20 s (virtual or real).

    Example::

        @asynccontextmanager
        async def memory_pair():
            network = MemoryNetwork()
            a, b = network.connect("a"), network.connect("b")
            try:
                yield a, b
            finally:
                await a.aclose()
                await b.aclose()

        async def test_memory_transport(autojump_clock):
            await check_transport(memory_pair, make_clogged_pair=memory_pair)
    """
    await run_checks("check_transport", make_pair, CHECKS)
    if make_clogged_pair is not None:
        await run_checks(
            "check_transport", make_clogged_pair, [_check_a_stalled_peer_makes_send_raise_peer_busy]
        )
