"""corral.testing.until: the one polling helper the suites wait with."""

from __future__ import annotations

import pytest
import trio

from corral.testing import until


async def test_returns_the_virtual_time_the_predicate_first_held(autojump_clock: object) -> None:
    start = trio.current_time()
    ready_at = start + 1.0
    held_at = await until(lambda: trio.current_time() >= ready_at, poll=0.25)
    # Checked at 0, 0.25, 0.5, 0.75, 1.0 (virtual seconds): true at the fifth check.
    assert held_at - start == 1.0


async def test_a_true_predicate_returns_at_once_without_sleeping(autojump_clock: object) -> None:
    start = trio.current_time()
    assert await until(lambda: True, within=0) == start


async def test_an_async_predicate_is_awaited(autojump_clock: object) -> None:
    checks: list[float] = []

    async def settled() -> bool:
        await trio.sleep(0)
        checks.append(trio.current_time())
        return len(checks) == 3

    start = trio.current_time()
    held_at = await until(settled, within=5.0, poll=0.1)
    assert len(checks) == 3
    assert held_at - start == pytest.approx(0.2)


async def test_the_timeout_names_what_was_awaited_and_how_long(autojump_clock: object) -> None:
    start = trio.current_time()
    with pytest.raises(trio.TooSlowError) as caught:
        await until(lambda: False, within=2.0, poll=0.5, what="node-b to serve v2")
    assert trio.current_time() - start == 2.0
    message = str(caught.value)
    assert "waited 2.0 s for node-b to serve v2" in message
    assert "0.5 s apart" in message


async def test_the_timeout_quotes_a_lambda_when_not_told_what(autojump_clock: object) -> None:
    flags = {"up": False}
    with pytest.raises(trio.TooSlowError, match=r'flags\["up"\]'):
        await until(lambda: flags["up"], within=1.0)
