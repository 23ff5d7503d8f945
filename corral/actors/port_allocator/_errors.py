"""Errors of the port allocator.

::

    CorralError
    ├── PortAllocatorError
    │   ├── InvalidPortRange         the configured range is empty or leaves 1-65535
    │   └── PortProbeExhausted       the bounded probe ended before finding a free port
    └── PlacementUnavailable         no pair can be given (code "placement-unavailable";
        └── PortProbeExhausted       shared with the planner: ``corral.actors._errors``)
"""

from __future__ import annotations

from corral._errors import CorralError
from corral.actors._errors import PlacementUnavailable

__all__ = ["InvalidPortRange", "PlacementUnavailable", "PortAllocatorError", "PortProbeExhausted"]


class PortAllocatorError(CorralError):
    """Base of the port allocator's own errors."""


class InvalidPortRange(PortAllocatorError, ValueError):
    """The port range is not ``1 <= start <= end <= 65535``."""


class PortProbeExhausted(PlacementUnavailable, PortAllocatorError):
    """Every port the bounded probe tried was taken (bound on the machine or claimed in
    the registry)."""
