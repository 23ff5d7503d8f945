"""The process table on the in-memory launcher, in virtual time."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from corral.actors.process_supervisor import MemoryLauncher, ProcessStillRunning, RestartPolicy
from corral.actors.process_supervisor._memory import Behaviour
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.testing import until

REV_A = "a" * 64
REV_B = "b" * 64
POLICY = RestartPolicy(
    initial_backoff=0.5, max_backoff=30.0, stable_after=20.0, crash_loop_crashes=5
)


def request(app: str = "hello", revision: str = REV_A, public: int = 24001) -> StartRequest:
    return StartRequest(
        app=app,
        revision=revision,
        command=("python3", "server.py"),
        cwd=f"/srv/{app}",
        public_port=public,
        internal_port=public + 500,
        env={"GREETING": "hi"},
    )


class Harness:
    def __init__(self, nursery: trio.Nursery, data_dir: Path, **kwargs: Any) -> None:
        self.launcher = MemoryLauncher()
        self.events: list[tuple[str, dict[str, Any]]] = []
        #: The trio time of each event in ``events``.
        self.times: list[float] = []
        self.table = ProcessTable(
            node_id="node-a",
            data_dir=data_dir,
            launcher=self.launcher,
            start_soon=nursery.start_soon,
            policy=POLICY,
            grace=10.0,
            base_env={"PATH": "/bin", "CORRAL_SECRET": "x"},
            on_event=self._record,
            **kwargs,
        )

    def _record(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))
        self.times.append(trio.current_time())

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


async def test_ensure_starts_the_process_with_its_ports_and_marks_it_running(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        assert h.table.ensure(request())
        await until(lambda: (h.table.info("hello") or request()).state == "running", poll=0.01)  # type: ignore[union-attr]
        (process,) = h.launcher.spawned
        assert process.spec.env["PORT"] == "24001"
        assert process.spec.env["CORRAL_INTERNAL_PORT"] == "24501"
        assert process.spec.env["GREETING"] == "hi"
        assert "CORRAL_SECRET" not in process.spec.env
        assert process.spec.paths.root == tmp_path / "apps" / "hello"
        info = h.table.info("hello")
        assert info is not None
        assert (info.pid, info.revision, info.public_port, info.restarts) == (
            process.pid,
            REV_A,
            24001,
            0,
        )
        assert h.table.ensure(request())  # the same request again changes nothing
        assert len(h.launcher.spawned) == 1
        await h.table.shutdown()
    assert not h.launcher.alive()


async def test_crashes_back_off_exponentially_then_report_a_crash_loop(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("hello", Behaviour(exit_after=1.0, exit_code=3))
        t0 = trio.current_time()
        h.table.ensure(request())
        await until(lambda: len(h.launcher.spawned) == 6, poll=0.01)
        starts = [p.started_at - t0 for p in h.launcher.spawned]
        # exits at 1, 2.5, 4.5, 7.5, 12.5 -> delays 0.5, 1, 2, 4, then the crash loop's 30
        assert starts == [0.0, 1.5, 3.5, 6.5, 11.5, 42.5]
        info = h.table.info("hello")
        assert info is not None
        assert info.crash_loop
        assert info.restarts == 5
        assert info.last_exit_code == 3
        assert h.kinds().count("process.crash-loop") == 1
        loop_event = dict(h.events)["process.crash-loop"]
        assert loop_event["app"] == "hello"
        assert loop_event["backoff"] == 30.0
        await h.table.shutdown()


async def test_a_stable_run_clears_the_crash_loop(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("hello", Behaviour(exit_after=0.1))
        h.table.ensure(request())
        await until(lambda: bool((info := h.table.info("hello")) and info.crash_loop), poll=0.01)
        h.launcher.behave("hello", Behaviour())  # the next start stays up
        await until(lambda: not (info := h.table.info("hello")) or not info.crash_loop, poll=0.01)
        assert "process.recovered" in h.kinds()
        alive = h.launcher.alive()
        assert len(alive) == 1
        uptime = trio.current_time() - alive[0].started_at
        assert uptime == pytest.approx(POLICY.stable_after, abs=0.02)
        await h.table.shutdown()


async def test_stop_sends_sigterm_then_sigkill_after_the_grace_period(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("hello", Behaviour(ignore_term=True))
        h.table.ensure(request())
        await until(lambda: bool(h.launcher.spawned), poll=0.01)
        t0 = trio.current_time()
        assert h.table.stop("hello", "application is no longer served by this node")
        await until(lambda: (h.table.info("hello") or request()).state == "stopped", poll=0.01)  # type: ignore[union-attr]
        assert trio.current_time() - t0 == pytest.approx(10.0, abs=0.02)
        (process,) = h.launcher.spawned
        assert process.signals == ["SIGTERM", "SIGKILL"]
        info = h.table.info("hello")
        assert info is not None
        assert info.last_exit_code == -9
        assert info.stop_reason == "application is no longer served by this node"
        assert h.table.forget("hello")
        assert h.table.info("hello") is None


async def test_a_process_ignoring_sigterm_is_reported_after_1_s_and_its_kill_is_told(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("stuck", Behaviour(ignore_term=True))
        h.table.ensure(request("stuck", public=24001))
        h.table.ensure(request("polite", public=24002))
        await until(lambda: len(h.launcher.spawned) == 2, poll=0.01)
        stuck_pid = next(p.pid for p in h.launcher.spawned if p.spec.app == "stuck")
        first = len(h.events)
        t0 = trio.current_time()
        h.table.stop("stuck", "application is no longer served by this node")
        h.table.stop("polite", "application is no longer served by this node")
        await until(lambda: h.kinds().count("process.stopped") == 2, poll=0.01)
        told = list(zip(h.times[first:], h.events[first:], strict=True))
        # The stuck one is told 1 s after its SIGTERM, with when it will be killed;
        # the one that exits on SIGTERM is never reported overdue.
        overdue = [(t - t0, fields) for t, (kind, fields) in told if kind == "process.stop-overdue"]
        fields = {"app": "stuck", "pid": stuck_pid, "after": 1.0, "kill_in": 9.0, "grace": 10.0}
        assert overdue == [(pytest.approx(1.0, abs=0.02), fields)]
        stopped = {f["app"]: (t - t0, f) for t, (k, f) in told if k == "process.stopped"}
        assert stopped["stuck"][0] == pytest.approx(10.0, abs=0.05)
        assert stopped["stuck"][1]["code"] == -9
        assert stopped["stuck"][1]["reason"] == (
            "application is no longer served by this node; it was still running 10 s after "
            "SIGTERM, so it was killed (SIGKILL)"
        )
        assert stopped["polite"][1]["reason"] == "application is no longer served by this node"
        await h.table.shutdown()


async def test_a_new_revision_replaces_the_process_after_the_old_one_stopped(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.table.ensure(request(revision=REV_A))
        await until(lambda: bool(h.launcher.spawned), poll=0.01)
        h.table.ensure(request(revision=REV_B))
        await until(lambda: len(h.launcher.spawned) == 2, poll=0.01)
        old, new = h.launcher.spawned
        assert not old.alive
        assert old.signals == ["SIGTERM"]
        assert new.alive
        assert new.spec.revision == REV_B
        info = h.table.info("hello")
        assert info is not None
        assert info.revision == REV_B
        await h.table.shutdown()


async def test_forget_refuses_a_live_process(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.table.ensure(request())
        with pytest.raises(ProcessStillRunning, match="stop it"):
            h.table.forget("hello")
        await h.table.shutdown()
        assert h.table.forget("hello")


async def test_a_command_that_cannot_start_backs_off_with_its_error(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("hello", Behaviour(spawn_error="no such file: python3"))
        h.table.ensure(request())
        await until(lambda: "process.spawn-failed" in h.kinds(), poll=0.01)
        info = h.table.info("hello")
        assert info is not None
        assert info.state == "failed"
        assert info.live  # it is tried again after its backoff
        assert info.last_error is not None
        assert "no such file" in info.last_error
        await h.table.shutdown()


async def test_shutdown_stops_everything_and_refuses_new_work(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        for i in range(20):
            h.table.ensure(request(f"app-{i}", public=24000 + i))
        await until(lambda: len(h.launcher.alive()) == 20, poll=0.01)
        await h.table.shutdown()
        assert h.launcher.alive() == []
        assert h.table.active == 0
        assert not h.table.ensure(request("late"))
        assert {info.stop_reason for info in h.table.snapshot()} == {"the node is shutting down"}


async def test_cancellation_still_stops_every_process_gracefully(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        for i in range(5):
            h.table.ensure(request(f"app-{i}", public=24000 + i))
        await until(lambda: len(h.launcher.alive()) == 5, poll=0.01)
        nursery.cancel_scope.cancel()
    assert h.launcher.alive() == []
    assert all(p.signals == ["SIGTERM"] for p in h.launcher.spawned)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("embedded null byte"),
        RuntimeError("launcher bug"),
        KeyError("CORRAL_APP"),
    ],
)
async def test_a_start_that_raises_fails_that_app_alone(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, error: Exception
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        for app in ("alpha", "omega"):
            h.table.ensure(request(app, public=24010 if app == "alpha" else 24020))
        await until(lambda: len(h.launcher.alive()) == 2, poll=0.01)
        pids = {p.spec.app: p.pid for p in h.launcher.alive()}
        h.launcher.behave("broken", Behaviour(spawn_raises=error))
        h.table.ensure(request("broken", public=24030))
        await until(lambda: "process.failed" in h.kinds(), poll=0.01)
        info = h.table.info("broken")
        assert info is not None
        assert (info.state, info.pid) == ("failed", None)
        assert info.last_error is not None
        assert type(error).__name__ in info.last_error
        assert "could not start app 'broken'" in info.last_error
        # Tried again with backoff, never spinning, and never touching the others.
        await trio.sleep(300)
        assert {p.spec.app: p.pid for p in h.launcher.alive()} == pids
        assert all(p.signals == [] for p in h.launcher.spawned)
        failures = [f for kind, f in h.events if kind == "process.failed"]
        assert 5 <= len(failures) < 20
        info = h.table.info("broken")
        assert info is not None
        assert info.crash_loop
        # A fixed launcher gets it going at the next try.
        h.launcher.behave("broken", Behaviour())
        await until(lambda: (h.table.info("broken") or info).state == "running", poll=0.01)
        assert (h.table.info("broken") or info).last_error is None
        await h.table.shutdown()
    assert h.launcher.alive() == []


class _StopBreaks(MemoryLauncher):
    """Processes whose stop raises (as a buggy launcher or psutil might)."""

    async def spawn(self, spec: Any, nursery: trio.Nursery) -> Any:
        process = await super().spawn(spec, nursery)
        if spec.app == "sticky":

            async def broken_stop(grace: float) -> int:
                await trio.lowlevel.checkpoint()
                raise OSError("stop went wrong")

            process.stop = broken_stop  # type: ignore[method-assign]
        return process


async def test_a_stop_that_raises_fails_that_app_alone(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher = launcher = _StopBreaks()
        h.table._launcher = launcher
        h.table.ensure(request("other", public=24010))
        h.table.ensure(request("sticky", public=24020))
        await until(lambda: len(launcher.alive()) == 2, poll=0.01)
        (other,) = launcher.processes("other")
        assert h.table.stop("sticky", "test")
        await until(lambda: (h.table.info("sticky") or request()).state == "stopped", poll=0.01)  # type: ignore[union-attr]
        info = h.table.info("sticky")
        assert info is not None
        assert info.last_error is not None
        assert "could not stop app 'sticky'" in info.last_error
        assert "stop went wrong" in info.last_error
        (sticky,) = launcher.processes("sticky")
        assert not sticky.alive  # it was killed all the same
        assert other.alive
        assert launcher.alive() == [other]
        await h.table.shutdown()


async def test_restart_delays_are_exact_and_the_crash_loop_never_clears_while_it_exits(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        h.launcher.behave("hello", Behaviour(exit_after=2.0, exit_code=7))
        h.table.ensure(request())
        seen: list[bool] = []
        while len(h.launcher.spawned) < 12:
            await trio.sleep(0.25)
            info = h.table.info("hello")
            assert info is not None
            seen.append(info.crash_loop)
        processes = h.launcher.spawned
        delays = [
            round(b.started_at - (a.ended_at or 0.0), 6) for a, b in itertools.pairwise(processes)
        ]
        # 0.5 * 2**n for the first four, then the crash loop's 30 s, again and again
        assert delays == [0.5, 1.0, 2.0, 4.0] + [30.0] * 7
        # Once in the loop it stays (the old 60 s window forgot it at the 30 s cap).
        first = seen.index(True)
        assert all(seen[first:])
        info = h.table.info("hello")
        assert info is not None
        assert (info.state, info.crash_loop, info.restarts) in {
            ("starting", True, 11),
            ("running", True, 11),
        }
        assert h.kinds().count("process.crash-loop") == 1
        await h.table.shutdown()


def _tasks_under(nursery: trio.Nursery) -> list[trio.lowlevel.Task]:
    found = []
    for task in nursery.child_tasks:
        found.append(task)
        for child in task.child_nurseries:
            found += _tasks_under(child)
    return found


async def test_a_watched_process_runs_on_two_tasks(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Its runner (which also checks readiness) and one task awaiting its exit; its
    readiness checks sleep on the run's timer wheel: a fleet of a thousand nodes starts
    tens of thousands of them (it was one task per thing awaited: exit, wake,
    readiness, stable run)."""
    spawned: list[str] = []

    class Spawns(trio.abc.Instrument):
        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            spawned.append(task.name.rsplit(".", 1)[-1])

    async with trio.open_nursery() as nursery:
        h = Harness(nursery, tmp_path)
        trio.lowlevel.add_instrument(Spawns())
        for n in range(3):
            h.table.ensure(request(f"app-{n}", public=24001 + 10 * n))
        await until(lambda: all(info.ready for info in h.table.snapshot()), poll=0.01)
        # no more were ever started (a simulated process that never exits by itself
        # needs none of its own)
        own = sorted(name for name in spawned if name != "corral timer wheel")
        assert own == ["_await_exit"] * 3 + ["_run"] * 3
        assert len(_tasks_under(nursery)) == 2 * 3
        await trio.sleep(POLICY.stable_after + 1)  # past the stable run: still two
        assert len(_tasks_under(nursery)) == 2 * 3
        await h.table.shutdown()
        assert _tasks_under(nursery) == []
