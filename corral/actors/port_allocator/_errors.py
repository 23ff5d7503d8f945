"""Errors of the port allocator.

::

    CorralError
    └── PortAllocatorError
        ├── InvalidPortRange         the configured range is empty or leaves 1-65535
        └── PlacementUnavailable     no pair can be given (code "placement-unavailable")
            └── PortProbeExhausted   the bounded probe ended before finding a free port
"""

from __future__ import annotations

from corral._errors import CorralError


class PortAllocatorError(CorralError):
    """Base of the port allocator's errors."""


class InvalidPortRange(PortAllocatorError, ValueError):
    """The port range is not ``1 <= start <= end <= 65535``."""


class PlacementUnavailable(PortAllocatorError):
    """No pair of ports can be given to the app; the message names the range and why."""

    code = "placement-unavailable"


class PortProbeExhausted(PlacementUnavailable):
    """Every port the bounded probe tried was taken (bound on the machine or claimed in
    the registry)."""
