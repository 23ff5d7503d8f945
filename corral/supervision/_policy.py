"""Restart decisions, as pure functions.

Theory of operation: when a child ends, its supervisor asks three questions,
each answered here without a clock or an event loop (times are passed in):

1. :func:`should_restart` — does this child come back at all? (restart type
   and whether it crashed or stopped normally)
2. :func:`restart_set` — which siblings go down and come back with it? (the
   strategy)
3. :func:`record_restart` — does one more restart exceed the intensity (more
   than ``max_restarts`` within ``within`` seconds)? If so the supervisor fails.

And :func:`backoff_delay` gives how long to wait before the restart.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.supervision._spec import Backoff, Restart, Strategy

__all__ = ["backoff_delay", "record_restart", "restart_set", "should_restart"]


def should_restart(restart: Restart, crashed: bool) -> bool:
    """Whether a child that ended comes back.

    Args:
        restart: the child's restart type.
        crashed: True if it raised; False if it stopped itself normally.
    """
    if restart is Restart.PERMANENT:
        return True
    if restart is Restart.TRANSIENT:
        return crashed
    return False


def restart_set(strategy: Strategy, count: int, failed: int) -> list[int]:
    """Indices (in start order) of the children that restart after child ``failed`` ended.

    Args:
        strategy: the supervisor's strategy.
        count: how many children the supervisor has.
        failed: index of the child that ended.
    """
    if not 0 <= failed < count:
        raise IndexError(f"child index {failed} out of range for {count} children")
    if strategy is Strategy.ONE_FOR_ONE:
        return [failed]
    if strategy is Strategy.ONE_FOR_ALL:
        return list(range(count))
    return list(range(failed, count))


def record_restart(
    history: Sequence[float], now: float, max_restarts: int, within: float
) -> tuple[tuple[float, ...], bool]:
    """Add a restart at ``now`` to the history and say whether the intensity is exceeded.

    Returns:
        ``(history within the window, including now; exceeded)``. ``exceeded``
        is True when the window holds more than ``max_restarts`` restarts.
    """
    kept = (*(t for t in history if now - t < within), now)
    return kept, len(kept) > max_restarts


def backoff_delay(backoff: Backoff, attempt: int) -> float:
    """Seconds to wait before the ``attempt``-th consecutive restart (1-based)."""
    if attempt < 1:
        return 0.0
    delay = backoff.initial * backoff.factor ** (attempt - 1)
    return min(delay, backoff.maximum)


def next_attempt(previous_attempt: int, ran_for: float, reset_after: float) -> int:
    """The consecutive-restart count after a child that ran ``ran_for`` seconds ended."""
    if ran_for >= reset_after:
        return 1
    return previous_attempt + 1
