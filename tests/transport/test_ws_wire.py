"""Packets: several frames in one WebSocket message (pure, no event loop)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.transport._ws_wire import (
    HEADER_BYTES,
    MAX_FRAMES_PER_PACKET,
    MalformedPacket,
    pack,
    pack_into_messages,
    unpack,
)

frames_strategy = st.lists(st.binary(max_size=300), min_size=1, max_size=40)


@given(frames_strategy)
def test_unpack_gives_back_what_was_packed(frames: list[bytes]) -> None:
    assert unpack(pack(frames)) == frames


@given(frames_strategy, st.integers(min_value=1, max_value=2000))
def test_messages_keep_order_and_budget(frames: list[bytes], budget: int) -> None:
    messages = pack_into_messages(frames, budget)
    assert [f for m in messages for f in unpack(m)] == frames
    for message in messages:
        inside = unpack(message)
        # over the budget only when one frame alone is larger than it
        assert len(message) <= budget or len(inside) == 1


@given(frames_strategy, st.data())
def test_a_cut_packet_is_refused_whole(frames: list[bytes], data: st.DataObject) -> None:
    packet = pack(frames)
    cut = data.draw(st.integers(min_value=0, max_value=len(packet) - 1))
    try:
        got = unpack(packet[:cut])
    except MalformedPacket:
        return
    # a cut on a frame boundary is a shorter, valid packet of the leading frames
    assert got == frames[: len(got)]
    assert pack(got) == packet[:cut]


def test_the_limits_and_the_messages_name_the_fault() -> None:
    with pytest.raises(MalformedPacket, match="empty"):
        unpack(b"")
    with pytest.raises(MalformedPacket, match="cut short at byte 0"):
        unpack(b"\x00\x01")
    with pytest.raises(MalformedPacket, match="9-byte frame at byte 4 runs past"):
        unpack(b"\x00\x00\x00\x09short")
    assert unpack(pack([b""] * MAX_FRAMES_PER_PACKET)) == [b""] * MAX_FRAMES_PER_PACKET
    with pytest.raises(MalformedPacket, match=f"more than {MAX_FRAMES_PER_PACKET} frames"):
        unpack(b"\x00" * HEADER_BYTES * (MAX_FRAMES_PER_PACKET + 1))
