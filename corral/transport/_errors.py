"""Errors of the transport layer.

::

    CorralError
    └── TransportError
        ├── PeerUnavailable      the peer is unknown, killed, partitioned or unreachable
        ├── PeerBusy             the outbound queue to the peer is full (fail fast)
        ├── HandshakeFailed      a peer could not prove the cluster secret / version
        └── FrameError           a frame was refused; the connection stays up
            ├── FrameTooLarge
            ├── MalformedFrame   not CBOR, not an envelope, or nested too deeply
            ├── UnknownKind      the envelope names a kind nobody declared
            └── SchemaError      the body does not match its kind's schema
"""

from __future__ import annotations

from corral._errors import CorralError


class TransportError(CorralError):
    """Base of transport errors."""


class PeerUnavailable(TransportError):
    """The peer cannot be reached now."""


class PeerBusy(TransportError):
    """The outbound queue to the peer is full; the frame was not queued."""


class HandshakeFailed(TransportError):
    """A peer failed authentication or spoke an unsupported protocol version."""


class FrameError(TransportError):
    """A frame was refused at the boundary."""


class FrameTooLarge(FrameError):
    """The frame exceeds the configured size limit."""


class MalformedFrame(FrameError):
    """The frame is not a valid envelope."""


class UnknownKind(FrameError):
    """The envelope's kind has no declared schema."""


class SchemaError(FrameError):
    """The body does not match the schema declared for its kind."""
