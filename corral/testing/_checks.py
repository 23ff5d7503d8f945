"""What the public conformance suites share: naming the failed check, expecting an error."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


class CheckFailed(AssertionError):
    """A conformance check failed; the message names the check and what went wrong."""


class Caught(Generic[E]):
    """The error :func:`expect_error` caught (``value``, once the block is over)."""

    value: E


@contextmanager
def expect_error(error: type[E], match: str | None = None) -> Iterator[Caught[E]]:
    """The block must raise ``error`` (with a message matching ``match``, if given)."""
    caught: Caught[E] = Caught()
    try:
        yield caught
    except error as exc:
        if match is not None and not re.search(match, str(exc)):
            text = f"{type(exc).__name__}({str(exc)!r}) does not match {match!r}"
            raise CheckFailed(text) from exc
        caught.value = exc
        return
    raise CheckFailed(f"expected {error.__name__}, nothing was raised")


async def run_checks(
    suite: str,
    make: Callable[[], AbstractAsyncContextManager[T]],
    checks: Sequence[Callable[[T], Awaitable[None]]],
) -> None:
    """Run every check on a fresh subject from ``make``; a failure names its check."""
    for check in checks:
        name = check.__name__.removeprefix("_check_").replace("_", " ")
        try:
            async with make() as subject:
                await check(subject)
        except AssertionError as exc:
            raise CheckFailed(f"{suite}: {name}: {exc or 'assertion failed'}") from exc
        except Exception as exc:
            exc.add_note(f"(raised in the {suite} check: {name})")
            raise
