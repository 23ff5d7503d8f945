"""Errors of the placement planner.

::

    CorralError
    ├── PlannerError
    │   └── InvalidPlanInput       a field of the planner's input is invalid; names the field
    └── PlacementUnavailable       no live node at all: the whole pass fails (shared with
                                   the port allocator: ``corral.actors._errors``)
"""

from __future__ import annotations

from corral._errors import CorralError
from corral.actors._errors import PlacementUnavailable

__all__ = ["InvalidPlanInput", "PlacementUnavailable", "PlannerError"]


class PlannerError(CorralError):
    """Base of the planner's own errors (its input was invalid)."""


class InvalidPlanInput(PlannerError, ValueError):
    """A field of the planner's input is invalid.

    ``field`` is the path of the offending field (``"apps[2].replicas"``, ``"nodes[0].id"``),
    and the message starts with it and says what is allowed.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
