"""Moving messages between actor systems: envelope, codec, transports."""

from corral.transport._base import Frame, Transport
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

__all__ = [
    "Frame",
    "FrameError",
    "FrameTooLarge",
    "HandshakeFailed",
    "MalformedFrame",
    "PeerBusy",
    "PeerUnavailable",
    "SchemaError",
    "Transport",
    "TransportError",
    "UnknownKind",
]
