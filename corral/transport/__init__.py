"""Moving messages between actor systems: envelope, codec, transports."""

from corral.transport._base import (
    Frame,
    FrameHandler,
    PeerLossListeners,
    PeerLost,
    PeerLostHandler,
    Transport,
)
from corral.transport._codec import (
    CodecLimits,
    Envelope,
    ErrorCode,
    decode_envelope,
    encode_envelope,
    peek_header,
    split_address,
)
from corral.transport._errors import (
    FrameError,
    FrameTooLarge,
    HandshakeFailed,
    MalformedFrame,
    PeerBusy,
    PeerUnavailable,
    SchemaError,
    TransportError,
    UnknownKind,
)
from corral.transport._log_budget import LogBudget, LogVerdict
from corral.transport._memory import MemoryNetwork, MemoryTransport
from corral.transport._schema import (
    decode_message,
    encode_message,
    encode_value,
    message,
    message_class,
    message_kind,
    registered_kinds,
)
from corral.transport._websocket import (
    DEFAULT_PORT,
    PeerState,
    PeerStatus,
    WebSocketConfig,
    WebSocketTransport,
    open_websocket_transport,
)
from corral.transport._ws_rules import ReconnectPolicy

__all__ = [
    "DEFAULT_PORT",
    "CodecLimits",
    "Envelope",
    "ErrorCode",
    "Frame",
    "FrameError",
    "FrameHandler",
    "FrameTooLarge",
    "HandshakeFailed",
    "LogBudget",
    "LogVerdict",
    "MalformedFrame",
    "MemoryNetwork",
    "MemoryTransport",
    "PeerBusy",
    "PeerLossListeners",
    "PeerLost",
    "PeerLostHandler",
    "PeerState",
    "PeerStatus",
    "PeerUnavailable",
    "ReconnectPolicy",
    "SchemaError",
    "Transport",
    "TransportError",
    "UnknownKind",
    "WebSocketConfig",
    "WebSocketTransport",
    "decode_envelope",
    "decode_message",
    "encode_envelope",
    "encode_message",
    "encode_value",
    "message",
    "message_class",
    "message_kind",
    "open_websocket_transport",
    "peek_header",
    "registered_kinds",
    "split_address",
]
