"""Errors of the coordinator.

::

    CorralError
    └── CoordinatorError
        └── LeadershipLost      this node no longer holds the coordinator lease
            ├── LeaseExpired    the lease lapsed (renewal refused, or its TTL passed locally)
            └── FenceRejected   a write's fence guard failed: a newer coordinator exists

They are raised inside a pass and caught by the Coordinator actor, which then
stops coordinating and campaigns again; they appear in its events and state
(``last_pass.error``), not to callers.
"""

from __future__ import annotations

from corral._errors import CorralError

__all__ = ["CoordinatorError", "FenceRejected", "LeadershipLost", "LeaseExpired"]


class CoordinatorError(CorralError):
    """Base of the coordinator's errors."""


class LeadershipLost(CoordinatorError):
    """This node stopped holding the coordinator lease; it writes nothing more."""


class LeaseExpired(LeadershipLost):
    """The coordinator lease lapsed before it could be renewed."""


class FenceRejected(LeadershipLost):
    """The registry refused a write because the lease key no longer carries this fence."""

    def __init__(self, fence: int, holder_fence: int | None) -> None:
        now = "no coordinator holds the lease" if holder_fence is None else (
            f"the lease now carries fence {holder_fence}"
        )
        super().__init__(
            f"write under fence {fence} rejected: {now}; this node stops coordinating "
            "and campaigns again"
        )
        self.fence = fence
        self.holder_fence = holder_fence
