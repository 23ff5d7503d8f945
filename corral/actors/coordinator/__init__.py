"""The Coordinator: one lease, fenced writes, skipped idle passes, instant hand-back."""

from corral.actors.coordinator._writes import (
    DEFAULT_MAX_WRITES,
    CurrentPlacement,
    PlacementWrite,
    WriteBatch,
    WritePlan,
    fence_guard,
    plan_writes,
)

__all__ = [
    "DEFAULT_MAX_WRITES",
    "CurrentPlacement",
    "PlacementWrite",
    "WriteBatch",
    "WritePlan",
    "fence_guard",
    "plan_writes",
]
