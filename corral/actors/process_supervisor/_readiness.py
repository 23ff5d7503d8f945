"""Whether an instance is ready to be routed to (pure).

Theory of operation
-------------------
Once a process answered on its public port it is checked every interval: by
default a TCP connection to the public port, or, when the app's ``corral.toml``
has ``[health] path``, an HTTP GET of that path that must answer 2xx or 3xx.

A fresh process (a start or a restart) is **not ready** until one check
passes. A ready instance stays ready through one or two failed checks; the
:data:`FAILURES_TO_UNREADY`-th failure in a row makes it not ready (the routing
table drops it; the process is not killed). The next passing check makes it
ready again.

No trio, no clock, no I/O: :func:`after_check` is the whole decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["FAILURES_TO_UNREADY", "Readiness", "after_check", "http_status_passes"]

#: Failed checks in a row that make a ready instance not ready.
FAILURES_TO_UNREADY: Final = 3


@dataclass(frozen=True, slots=True)
class Readiness:
    """One instance's readiness: ``ready``, the failed checks in a row, checks done."""

    ready: bool = False
    failures: int = 0
    checks: int = 0


def after_check(
    state: Readiness, passed: bool, *, failures_to_unready: int = FAILURES_TO_UNREADY
) -> Readiness:
    """The readiness after one check that ``passed`` (or not).

    Args:
        state: the readiness before the check (``Readiness()`` for a fresh process).
        passed: whether the check passed.
        failures_to_unready: failed checks in a row that make it not ready (>= 1).

    Returns:
        Ready after any passing check; not ready once ``failures_to_unready``
        checks in a row failed, or while it never passed one.
    """
    if passed:
        return Readiness(ready=True, failures=0, checks=state.checks + 1)
    failures = state.failures + 1
    return Readiness(
        ready=state.ready and failures < max(1, failures_to_unready),
        failures=failures,
        checks=state.checks + 1,
    )


def http_status_passes(status_line: bytes) -> bool:
    """Whether an HTTP status line (``b"HTTP/1.1 204 No Content"``) is 2xx or 3xx."""
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        return False
    code = parts[1]
    return len(code) == 3 and code.isdigit() and code[:1] in (b"2", b"3")
