"""Wait in a test until something holds: the one polling helper of the suites."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable

import trio


def _described(predicate: Callable[[], object]) -> str:
    """The predicate as a reader of a failure wants it: a lambda's source line, or
    the function's name."""
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    if name.endswith("<lambda>"):
        try:
            return " ".join(inspect.getsource(predicate).split())
        except (OSError, TypeError):
            return name
    return name


async def until(
    predicate: Callable[[], object] | Callable[[], Awaitable[object]],
    *,
    within: float | None = None,
    poll: float = 0.05,
    what: str | None = None,
) -> float:
    """Poll ``predicate`` under trio until it returns something true.

    It is checked at once, then every ``poll`` seconds of trio's clock: with the
    ``autojump_clock`` fixture (``MockClock(autojump_threshold=0)``) that time is
    virtual and no test waits on the wall; under the real clock it is wall time.
    A predicate may be a plain function or an async one (its awaitable is
    awaited).

    Args:
        predicate: what is awaited; its truth ends the wait.
        within: seconds of trio's clock to wait at most; ``None`` sets no bound of
            its own (the test's own timeout applies).
        poll: seconds between checks.
        what: the awaited condition in words, for the timeout's message (the
            predicate's source or name if left out).

    Returns:
        ``trio.current_time()`` when the predicate held, so a test can assert how
        long it took in virtual time.

    Raises:
        trio.TooSlowError: ``within`` passed first; the message names what was
            awaited, the bound and the number of checks.
    """
    checks = 0
    deadline = math.inf if within is None else trio.current_time() + within
    with trio.move_on_at(deadline):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            checks += 1
            if value:
                return trio.current_time()
            await trio.sleep(poll)
    raise trio.TooSlowError(
        f"waited {within} s for {what or _described(predicate)}: still false after "
        f"{checks} checks, {poll} s apart; raise `within` if it is just slow"
    )
