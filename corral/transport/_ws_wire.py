"""Writing several queued frames to a WebSocket in one socket write.

trio-websocket's public ``send_message`` costs one ``send_all`` (one system
call) per message. When a peer's outbound queue holds many small frames, the
transport instead encodes each as its own WebSocket binary message with the
connection's wsproto state machine and writes them all at once, under the
connection's own send lock, so they interleave safely with pings, pongs and
close frames that trio-websocket sends itself. On the wire it is exactly the
same sequence of messages.

When a connection is idle, :func:`write_now` goes one step further for a
single frame: it encodes it and hands the bytes to the socket at once from the
sending task (a non-blocking ``write``), so a request or a reply leaves without
waiting for the writer task's next turn. If the socket takes only part of it,
the sending task holds the connection's send lock and must finish with
:func:`finish_write`; if it takes none, the frame goes through the queue.

This is the only module that reaches into trio-websocket's private attributes
(``_wsproto``, ``_stream``, ``_stream_lock``, ``_abort_web_socket``), present
in 0.11 and 0.12. If they are missing (a future version), every frame goes
through ``send_message`` instead: slower, equally correct.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from enum import Enum

import trio
import trio_websocket
from wsproto.events import BytesMessage
from wsproto.utilities import LocalProtocolError

_INTERNALS = ("_wsproto", "_stream", "_stream_lock", "_abort_web_socket")


def can_batch(ws: trio_websocket.WebSocketConnection) -> bool:
    """Whether ``ws`` exposes the internals batched writes need."""
    return all(hasattr(ws, name) for name in _INTERNALS)


def can_write_now(ws: trio_websocket.WebSocketConnection) -> bool:
    """Whether :func:`write_now` may be used on ``ws`` (a TCP socket on a POSIX system)."""
    return os.name == "posix" and can_batch(ws) and isinstance(ws._stream, trio.SocketStream)


class Written(Enum):
    """What :func:`write_now` did."""

    ALL = "all"  # the whole frame is on its way
    NOTHING = "nothing"  # the connection was busy or the socket full: queue the frame
    PART = "part"  # the rest must follow at once: call finish_write (the lock is held)


def write_now(ws: trio_websocket.WebSocketConnection, frame: bytes) -> tuple[Written, bytes]:
    """Write ``frame`` as one binary message straight to the socket, without yielding.

    Only for connections :func:`can_write_now` accepts, and only when nothing else
    waits to be written ahead of it (the caller knows its own queue; this checks
    the connection's send lock). Returns ``(Written.PART, rest)`` when the socket
    took part of the message: the send lock is then held by the calling task,
    and it must call :func:`finish_write` with ``rest`` before anything else.

    Raises:
        trio_websocket.ConnectionClosed: the connection is closed or closing.
    """
    lock = ws._stream_lock
    if lock.locked():
        return Written.NOTHING, b""
    if ws.closed is not None:
        raise trio_websocket.ConnectionClosed(ws.closed)
    try:
        wire = ws._wsproto.send(BytesMessage(data=frame))
    except LocalProtocolError:
        raise trio_websocket.ConnectionClosed(ws.closed) from None
    stream = ws._stream
    assert isinstance(stream, trio.SocketStream)
    try:
        sent = os.write(stream.socket.fileno(), wire)
    except OSError:
        # Full (EAGAIN) or broken: the queue's writer retries and reports a broken
        # socket as trio-websocket does. wsproto keeps no state for a whole message.
        return Written.NOTHING, b""
    if sent == len(wire):
        return Written.ALL, b""
    lock.acquire_nowait()  # free: nothing yielded since the check above
    return Written.PART, wire[sent:]


async def finish_write(ws: trio_websocket.WebSocketConnection, rest: bytes) -> None:
    """Write what :func:`write_now` left over, then release the send lock it took.

    Raises:
        trio_websocket.ConnectionClosed: the connection broke.
    """
    broken = False
    try:
        await ws._stream.send_all(rest)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        broken = True
    finally:
        ws._stream_lock.release()
    if broken:
        await ws._abort_web_socket()
        raise trio_websocket.ConnectionClosed(ws.closed)


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
