"""Writing several queued frames to a WebSocket in one socket write.

trio-websocket's public ``send_message`` costs one ``send_all`` (one system
call) per message. When a peer's outbound queue holds many small frames, the
transport instead encodes each as its own WebSocket binary message with the
connection's wsproto state machine and writes them all at once, under the
connection's own send lock, so they interleave safely with pings, pongs and
close frames that trio-websocket sends itself. On the wire it is exactly the
same sequence of messages.

This is the only module that reaches into trio-websocket's private attributes
(``_wsproto``, ``_stream``, ``_stream_lock``, ``_abort_web_socket``), present
in 0.11 and 0.12. If they are missing (a future version), every frame goes
through ``send_message`` instead: slower, equally correct.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio_websocket
from wsproto.events import BytesMessage
from wsproto.utilities import LocalProtocolError

_INTERNALS = ("_wsproto", "_stream", "_stream_lock", "_abort_web_socket")


def can_batch(ws: trio_websocket.WebSocketConnection) -> bool:
    """Whether ``ws`` exposes the internals batched writes need."""
    return all(hasattr(ws, name) for name in _INTERNALS)


async def send_frames(ws: trio_websocket.WebSocketConnection, frames: Sequence[bytes]) -> None:
    """Send ``frames`` in order, one binary WebSocket message each.

    Raises:
        trio_websocket.ConnectionClosed: the connection is closed or closing;
            some leading frames may have been written.
    """
    if len(frames) == 1 or not can_batch(ws):
        for frame in frames:
            await ws.send_message(frame)
        return
    if ws.closed is not None:
        raise trio_websocket.ConnectionClosed(ws.closed)
    try:
        wire = b"".join([ws._wsproto.send(BytesMessage(data=frame)) for frame in frames])
    except LocalProtocolError:
        # wsproto refuses data once a close frame went either way
        raise trio_websocket.ConnectionClosed(ws.closed) from None
    async with ws._stream_lock:
        try:
            await ws._stream.send_all(wire)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await ws._abort_web_socket()
            raise trio_websocket.ConnectionClosed(ws.closed) from None
