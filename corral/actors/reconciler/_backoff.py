"""Backing off a revision this node could not get onto disk.

Theory of operation
-------------------
Getting a revision onto disk (fetch, verify, unpack) can fail for reasons a
retry a few seconds later will not fix: the archive is refused (a bomb, a
member escaping its directory), its bytes do not match the digest, no node
holds a copy. Retrying each pass would burn a core forever on a refused bomb.

So a failure is recorded per app with the revision it was for
(:class:`FailedRevision`): the start of that revision waits until
``retry_at``, and each failure in a row doubles the wait, from ``base`` up to
``cap`` (:func:`retry_delay`). Success forgets the record; so does a new
revision (a redeploy is tried at once) and an app no longer to run here
(:func:`forget_settled`). While a record is waiting the instance is *failed*,
with the reason, in ``ps`` and ``state``.

Pure: no clock, no trio — ``now`` is given (the loop's time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the first wait, the pass interval: a transient failure costs what it did before
DEFAULT_BASE = 5.0
#: the longest wait between two tries of one revision
DEFAULT_CAP = 300.0


@dataclass(frozen=True, slots=True)
class FailedRevision:
    """``app``'s ``revision`` failed to get onto disk ``attempts`` times in a row, last
    at ``failed_at`` (loop time), for ``reason``; it is tried again at ``retry_at``."""

    app: str
    revision: str
    reason: str
    attempts: int
    failed_at: float
    retry_at: float
    #: no copy could be had (every holder tried): the instance stays ``starting``, not
    #: ``failed``, since a holder may come back.
    starting: bool = False

    def waiting(self, revision: str, now: float) -> bool:
        """Whether a start of ``revision`` must wait (it is this one and not due yet)."""
        return revision == self.revision and now < self.retry_at

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "app": self.app,
            "revision": self.revision,
            "reason": self.reason,
            "attempts": self.attempts,
            "retry_in": max(0.0, self.retry_at - now),
        }


def retry_delay(attempts: int, base: float = DEFAULT_BASE, cap: float = DEFAULT_CAP) -> float:
    """The wait after the ``attempts``-th failure in a row (1 = the first): ``base``
    doubled each time, never more than ``cap``."""
    if attempts < 1:
        raise ValueError("attempts counts failures, from 1")
    return float(min(cap, base * 2 ** min(attempts - 1, 64)))


def record_failure(
    previous: FailedRevision | None,
    app: str,
    revision: str,
    reason: str,
    now: float,
    *,
    base: float = DEFAULT_BASE,
    cap: float = DEFAULT_CAP,
    starting: bool = False,
) -> FailedRevision:
    """The record after ``revision`` of ``app`` failed at ``now``: one more attempt in a
    row when ``previous`` was for the same revision, else the first."""
    attempts = previous.attempts + 1 if previous and previous.revision == revision else 1
    return FailedRevision(
        app, revision, reason, attempts, now, now + retry_delay(attempts, base, cap), starting
    )


def forget_settled(
    failures: Mapping[str, FailedRevision], wanted: Mapping[str, str]
) -> dict[str, FailedRevision]:
    """The records still meaningful: those whose app is still to run that revision here
    (``wanted``: app -> the revision it should run on this node)."""
    return {
        app: failure for app, failure in failures.items() if wanted.get(app) == failure.revision
    }
