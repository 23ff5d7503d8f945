"""Several frames in one WebSocket message: the transport's own batching, pure.

trio-websocket's public ``send_message`` costs one socket write per message, and
its reader hands over one message per task switch. So that a stream of small
frames does not pay that per frame, the WebSocket transport puts every frame
in a *packet*: each frame preceded by its length as 4 bytes, big-endian, as
many frames in one binary message as are waiting (up to a byte budget). A lone
frame is a packet of one. The receiver splits the packet and checks each frame
against its own limit, as if it had come alone.

Protocol version 2 of the peer handshake means "binary messages are packets";
version 1 (one frame per message) is no longer spoken, so a node of an older
release is refused at the handshake with close code 4002, not misread.

No trio, no I/O: :func:`pack`, :func:`pack_one`, :func:`pack_into_messages` and
:func:`unpack` are functions of their arguments.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

HEADER_BYTES = 4
# The length before each frame (unsigned, big-endian): one C call to write or read.
_HEADER = struct.Struct(">I")
_write_header = _HEADER.pack
_read_header = _HEADER.unpack_from
#: a packet carrying more frames than this is refused (a sender batches far fewer)
MAX_FRAMES_PER_PACKET = 4096


class MalformedPacket(ValueError):
    """A binary message that is not a sequence of length-prefixed frames."""


def pack(frames: Sequence[bytes]) -> bytes:
    """One packet holding ``frames`` in order."""
    if len(frames) == 1:
        return pack_one(frames[0])
    parts: list[bytes] = []
    for frame in frames:
        parts.append(_write_header(len(frame)))
        parts.append(frame)
    return b"".join(parts)


def pack_one(frame: bytes) -> bytes:
    """The packet of one frame (what a request or a reply written through is)."""
    return _write_header(len(frame)) + frame


def pack_into_messages(frames: Sequence[bytes], budget: int) -> list[bytes]:
    """``frames`` in order as packets of at most ``budget`` bytes each.

    A frame too large to share a packet within the budget travels alone (its
    packet is then larger than the budget; the caller bounds frame sizes).
    """
    messages: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for frame in frames:
        cost = HEADER_BYTES + len(frame)
        if group and size + cost > budget:
            messages.append(pack(group))
            group, size = [], 0
        group.append(frame)
        size += cost
    if group:
        messages.append(pack(group))
    return messages


def unpack(packet: bytes) -> list[bytes]:
    """The frames of ``packet``, in order.

    Raises:
        MalformedPacket: a length runs past the end, a header is cut short, or
            there are more than :data:`MAX_FRAMES_PER_PACKET` frames. No frame of
            a malformed packet is returned.
    """
    end = len(packet)
    if end >= HEADER_BYTES and _read_header(packet)[0] + HEADER_BYTES == end:
        return [packet[HEADER_BYTES:]]  # the common case: a packet of one
    frames: list[bytes] = []
    at = 0
    while at < end:
        if len(frames) == MAX_FRAMES_PER_PACKET:
            raise MalformedPacket(
                f"more than {MAX_FRAMES_PER_PACKET} frames in one {end}-byte message"
            )
        start = at + HEADER_BYTES
        if start > end:
            raise MalformedPacket(
                f"a frame header is cut short at byte {at} of a {end}-byte message"
            )
        (size,) = _read_header(packet, at)
        at = start + size
        if at > end:
            raise MalformedPacket(
                f"a {size}-byte frame at byte {start} runs past the end of a {end}-byte message"
            )
        frames.append(packet[start:at])
    if not frames:
        raise MalformedPacket("an empty message carries no frame")
    return frames
