"""Errors shared by the actors: one concept, one class.

::

    CorralError
    └── PlacementUnavailable        code "placement-unavailable": work cannot be placed
        └── PortProbeExhausted      (corral.actors.port_allocator; also a PortAllocatorError)

Both causes of ``placement-unavailable`` raise :class:`PlacementUnavailable`: the
planner when no node is live at all (``corral.actors.planner``), and the port
allocator when its range cannot give an app a pair (``corral.actors.port_allocator``).
So ``except PlacementUnavailable`` catches either, and the message names which.
"""

from __future__ import annotations

from typing import Final

from corral._errors import CorralError

__all__ = ["PLACEMENT_UNAVAILABLE", "PlacementUnavailable"]

PLACEMENT_UNAVAILABLE: Final = "placement-unavailable"
"""The reason (error code) of work that cannot be placed, raised or reported."""


class PlacementUnavailable(CorralError):
    """Work cannot be placed; the message names the cause with counts and what to do.

    Raised by :func:`corral.actors.planner.plan` when no node is live at all, and by
    the port allocator when fewer than two ports of its range can be given. ``code``
    is ``"placement-unavailable"``, the reason unplaced applications carry too.
    """

    code: Final = PLACEMENT_UNAVAILABLE
