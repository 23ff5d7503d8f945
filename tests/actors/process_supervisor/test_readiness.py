"""Readiness: the pure decision, the table's periodic checks, and the real probe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from corral.actors.process_supervisor import MemoryLauncher
from corral.actors.process_supervisor._memory import Behaviour
from corral.actors.process_supervisor._os import probe_ready
from corral.actors.process_supervisor._readiness import (
    FAILURES_TO_UNREADY,
    Readiness,
    after_check,
    http_status_passes,
)
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.registry import HealthSpec
from corral.testing import until

REV = "a" * 64


@given(st.lists(st.booleans(), max_size=40))
def test_ready_exactly_when_a_check_passed_and_fewer_than_three_failed_since(
    checks: list[bool],
) -> None:
    state = Readiness()
    for index, passed in enumerate(checks):
        state = after_check(state, passed)
        history = checks[: index + 1]
        ever_passed = True in history
        tail_failures = len(history) - (
            max(i for i, ok in enumerate(history) if ok) + 1 if ever_passed else 0
        )
        assert state.ready == (ever_passed and tail_failures < FAILURES_TO_UNREADY)
        assert state.failures == tail_failures
        assert state.checks == index + 1


def test_a_fresh_process_is_not_ready_until_it_passes() -> None:
    assert not Readiness().ready
    assert not after_check(Readiness(), False).ready
    ready = after_check(Readiness(), True)
    assert ready.ready
    two = after_check(after_check(ready, False), False)
    assert two.ready  # two failures in a row keep it
    assert not after_check(two, False).ready  # the third takes it out


@pytest.mark.parametrize(
    ("line", "passes"),
    [
        (b"HTTP/1.1 200 OK\r", True),
        (b"HTTP/1.0 204 No Content", True),
        (b"HTTP/1.1 302 Found", True),
        (b"HTTP/1.1 404 Not Found", False),
        (b"HTTP/1.1 503 Service Unavailable", False),
        (b"HTTP/1.1 2000 nope", False),
        (b"garbage", False),
        (b"", False),
    ],
)
def test_http_status_lines(line: bytes, passes: bool) -> None:
    assert http_status_passes(line) is passes


def test_health_spec_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="must start with '/'"):
        HealthSpec(path="healthz")
    with pytest.raises(ValueError, match="interval_ms"):
        HealthSpec(path="/h", interval_ms=0)
    with pytest.raises(ValueError, match="timeout_ms"):
        HealthSpec(timeout_ms=10**9)


def table(
    nursery: trio.Nursery, tmp_path: Path, events: list[Any]
) -> tuple[ProcessTable, MemoryLauncher]:
    launcher = MemoryLauncher()
    return (
        ProcessTable(
            node_id="node-a",
            data_dir=tmp_path,
            launcher=launcher,
            start_soon=nursery.start_soon,
            base_env={"PATH": "/bin"},
            on_event=lambda kind, **fields: events.append(kind),
        ),
        launcher,
    )


async def test_three_failed_checks_make_it_not_ready_without_killing_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    events: list[str] = []
    health = HealthSpec(path="/healthz", interval_ms=1000, timeout_ms=500)
    async with trio.open_nursery() as nursery:
        t, launcher = table(nursery, tmp_path, events)
        t.ensure(StartRequest("shop", REV, ("x",), "/srv", 24001, 24501, health=health))
        await until(lambda: bool((info := t.info("shop")) and info.ready), poll=0.01)
        (proc,) = launcher.spawned
        assert proc.spec.health == health
        proc.healthy = False
        t0 = trio.current_time()
        await until(lambda: not t.info("shop").ready, poll=0.01)  # type: ignore[union-attr]
        # Checks run every second: the third failure comes 3 s (+/- one interval) later.
        assert 2.0 <= trio.current_time() - t0 <= 3.0
        info = t.info("shop")
        assert info is not None
        assert info.state == "running"
        assert info.to_dict()["ready"] is False
        assert proc.alive
        assert "process.unready" in events
        proc.healthy = True
        await until(lambda: t.info("shop").ready, poll=0.01)  # type: ignore[union-attr]
        await t.shutdown()


async def test_a_restart_is_not_ready_until_it_passes_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    events: list[str] = []
    async with trio.open_nursery() as nursery:
        t, launcher = table(nursery, tmp_path, events)
        t.ensure(StartRequest("shop", REV, ("x",), "/srv", 24001, 24501))
        await until(lambda: bool((info := t.info("shop")) and info.ready), poll=0.01)
        launcher.behave("shop", Behaviour(ready_after=5.0))  # the next one is slow to answer
        launcher.spawned[0].exit(1)
        await until(lambda: not t.info("shop").ready, poll=0.01)  # type: ignore[union-attr]
        await until(lambda: len(launcher.spawned) == 2, poll=0.01)
        t0 = trio.current_time()
        assert not t.info("shop").ready  # type: ignore[union-attr]
        await until(lambda: t.info("shop").ready, poll=0.01)  # type: ignore[union-attr]
        assert trio.current_time() - t0 >= 5.0
        await t.shutdown()


class ScriptedChecks(MemoryLauncher):
    """Its processes' readiness checks take the scripted times (then pass); a check
    scripted as ``"swallow"`` hangs, swallows its cancellation and passes anyway."""

    def __init__(self, script: list[float | str]) -> None:
        super().__init__()
        self.script = script
        self.began: list[float] = []

    async def spawn(self, spec: Any, nursery: trio.Nursery) -> Any:
        process = await super().spawn(spec, nursery)

        async def check_ready() -> bool:
            self.began.append(trio.current_time())
            step = self.script.pop(0) if self.script else 0.0
            if step == "swallow":
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    return True
            assert isinstance(step, float)
            await trio.sleep(step)
            return True

        process.check_ready = check_ready  # type: ignore[method-assign]
        return process


async def test_a_check_that_overruns_its_timeout_fails_and_the_next_ones_go_on(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A check is bounded by ``timeout_ms``: one that overruns fails right then, and the
    next starts an interval later; a check that swallows its cancellation and answers
    counts as passed. The exact times the table always kept."""
    launcher = ScriptedChecks([0.0, 5.0, 0.2, 5.0, "swallow", 5.0, 5.0, 5.0, 0.0])
    seen: list[tuple[float, bool]] = []
    health = HealthSpec(interval_ms=1000, timeout_ms=500)
    async with trio.open_nursery() as nursery:
        t = ProcessTable(
            node_id="node-a",
            data_dir=tmp_path,
            launcher=launcher,
            start_soon=nursery.start_soon,
            base_env={"PATH": "/bin"},
            on_change=lambda: seen.append(
                (trio.current_time(), bool((info := t.info("shop")) and info.ready))
            ),
        )
        t.ensure(StartRequest("shop", REV, ("x",), "/srv", 24001, 24501, health=health))
        await until(lambda: len(launcher.began) == 9, poll=0.01)
        t0 = launcher.began[0]
        assert [round(b - t0, 6) for b in launcher.began] == [
            0.0,  # passes: ready
            1.0,  # overruns: fails at 1.5
            2.5,  # passes at 2.7
            3.7,  # overruns: fails at 4.2
            5.2,  # swallows its cancellation at 5.7: passes
            6.7,  # overruns: fails at 7.2
            8.2,  # overruns: fails at 8.7
            9.7,  # overruns: fails at 10.2, the third in a row: not ready
            11.2,  # passes: ready again
        ]
        flips = [(round(when - t0, 6), ready) for when, ready in seen]
        flips = [f for n, f in enumerate(flips) if n == 0 or f[1] != flips[n - 1][1]]
        assert flips[-3:] == [(0.0, True), (10.2, False), (11.2, True)]
        await t.shutdown()


async def _serve(status: bytes, task_status: trio.TaskStatus[int]) -> None:
    async def answer(stream: trio.SocketStream) -> None:
        with trio.move_on_after(5):
            await stream.receive_some(4096)
            await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, answer, listeners)
        task_status.started(port)


async def test_the_real_probe_reads_the_http_status_and_refusals() -> None:
    async with trio.open_nursery() as nursery:
        ok = await nursery.start(_serve, b"200 OK")
        bad = await nursery.start(_serve, b"503 Service Unavailable")
        health = HealthSpec(path="/healthz", timeout_ms=2000)
        assert await probe_ready("127.0.0.1", ok, health)
        assert not await probe_ready("127.0.0.1", bad, health)
        assert await probe_ready("127.0.0.1", bad, None)  # TCP only: it accepts
        nursery.cancel_scope.cancel()
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert not await probe_ready("127.0.0.1", closed, None)
