"""Real processes: own process group, logs, tree kill, leftovers of a previous life."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.process_supervisor import (
    AppPaths,
    RestartPolicy,
    SpawnFailed,
    write_json_atomically,
)
from corral.actors.process_supervisor._os import OsLauncher
from corral.actors.process_supervisor._policy import PidRecord
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.testing import until

pytestmark = pytest.mark.slow

REV = "c" * 64
SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def line_written(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


def request(tmp_path: Path, code: str, app: str = "hello") -> StartRequest:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return StartRequest(
        app=app,
        revision=REV,
        command=(sys.executable, "-c", code),
        cwd=str(cwd),
        public_port=24001,
        internal_port=24502,
    )


async def test_process_runs_in_its_own_group_with_its_env_and_logs(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "print(os.environ['PORT'], os.environ['CORRAL_APP'], os.environ['CORRAL_NODE'], "
        "os.getpgid(0) == os.getpid(), os.getcwd(), flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
    )
    paths = AppPaths.of(tmp_path, "hello")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            table = ProcessTable(
                node_id="node-a",
                data_dir=tmp_path,
                launcher=OsLauncher(),
                start_soon=nursery.start_soon,
                grace=5.0,
                ready_timeout=0.5,
            )
            table.ensure(request(tmp_path, code))
            await until(lambda: line_written(paths.stdout_log), poll=0.02)
            assert paths.stdout_log.read_text().split() == [
                "24001",
                "hello",
                "node-a",
                "True",
                str(tmp_path / "cwd"),
            ]
            await until(lambda: "to stderr" in paths.stderr_log.read_text(), poll=0.02)
            info = table.info("hello")
            assert info is not None
            assert info.pid is not None
            pid = info.pid
            record = PidRecord.from_json(json.loads(paths.pid_file.read_text()))
            assert record is not None
            assert record.pid == pid
            assert record.create_time == pytest.approx(psutil.Process(pid).create_time())
            await table.shutdown()
    assert gone(pid)
    assert not paths.pid_file.exists()
    assert "exited with code -15" in paths.stderr_log.read_text()


async def test_stop_kills_the_whole_tree_after_the_grace_period(tmp_path: Path) -> None:
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"sleeper = [sys.executable, '-c', {SLEEPER!r}]\n"
        "child = subprocess.Popen(sleeper)\n"
        "escaped = subprocess.Popen(sleeper, start_new_session=True)\n"
        "print(child.pid, escaped.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    paths = AppPaths.of(tmp_path, "hello")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            table = ProcessTable(
                node_id="node-a",
                data_dir=tmp_path,
                launcher=OsLauncher(),
                start_soon=nursery.start_soon,
                grace=1.0,
                ready_timeout=0.5,
            )
            table.ensure(request(tmp_path, code))
            await until(lambda: line_written(paths.stdout_log), poll=0.02)
            info = table.info("hello")
            assert info is not None
            assert info.pid is not None
            pids = [info.pid, *map(int, paths.stdout_log.read_text().split())]
            assert not any(gone(pid) for pid in pids)
            t0 = trio.current_time()
            table.stop("hello", "test")
            await table.wait_idle()
            elapsed = trio.current_time() - t0
    assert all(gone(pid) for pid in pids)
    assert 1.0 <= elapsed < 5.0
    info = table.info("hello")
    assert info is not None
    assert info.last_exit_code == -9


async def test_a_command_that_does_not_exist_fails_to_spawn(tmp_path: Path) -> None:
    launcher = OsLauncher()
    spec_request = request(tmp_path, "")
    table = ProcessTable(
        node_id="node-a", data_dir=tmp_path, launcher=launcher, start_soon=lambda *a: None
    )
    spec = dataclasses.replace(table._launch_spec(spec_request), command=("/nope/x",))
    async with trio.open_nursery() as nursery:
        with pytest.raises(SpawnFailed, match="/nope/x"):
            await launcher.spawn(spec, nursery)


async def test_crash_loop_of_a_real_process_backs_off(tmp_path: Path) -> None:
    events: list[str] = []
    policy = RestartPolicy(initial_backoff=0.05, max_backoff=1.0, crash_loop_crashes=3)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            table = ProcessTable(
                node_id="node-a",
                data_dir=tmp_path,
                launcher=OsLauncher(),
                start_soon=nursery.start_soon,
                policy=policy,
                on_event=lambda kind, **_: events.append(kind),
            )
            table.ensure(request(tmp_path, "import sys; sys.exit(3)"))
            await until(lambda: "process.crash-loop" in events, poll=0.02)
            info = table.info("hello")
            assert info is not None
            assert info.crash_loop
            assert info.last_exit_code == 3
            assert info.state == "backoff"
            # backing off, not spinning: no new start within the next half second
            starts = events.count("process.started")
            await trio.sleep(0.5)
            assert events.count("process.started") == starts
            await table.shutdown()


def _start_orphan(tmp_path: Path, app: str) -> subprocess.Popen[bytes]:
    """A process as a previous life of the node would have left it, with its pid file."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    command = [sys.executable, "-c", SLEEPER]
    orphan = subprocess.Popen(command, cwd=cwd, start_new_session=True)
    proc = psutil.Process(orphan.pid)
    record = PidRecord(app, "node-a", orphan.pid, proc.create_time(), tuple(command), REV)
    write_json_atomically(AppPaths.of(tmp_path, app).pid_file, record.to_json())
    return orphan


async def test_leftovers_are_ended_but_a_reused_pid_is_left_alone(tmp_path: Path) -> None:
    orphan = _start_orphan(tmp_path, "hello")
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        # A pid file whose pid now belongs to another process (other start time).
        fake = PidRecord("other", "node-a", stranger.pid, 12345.0, ("python3", "x.py"))
        write_json_atomically(AppPaths.of(tmp_path, "other").pid_file, fake.to_json())
        with trio.fail_after(20):
            ended = await OsLauncher().end_leftovers(tmp_path, grace=0.5)
        assert [r.pid for r in ended] == [orphan.pid]
        assert gone(orphan.pid)
        assert not gone(stranger.pid)
        assert not AppPaths.of(tmp_path, "hello").pid_file.exists()
        assert not AppPaths.of(tmp_path, "other").pid_file.exists()
    finally:
        for p in (orphan, stranger):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert os.path.isdir(tmp_path / "apps" / "hello")


def test_a_process_newer_than_the_parent_scan_gets_a_fresh_scan() -> None:
    # Regression: a stop within the scan's max_age of an earlier one reused a scan taken
    # before the process existed, and missed the descendants that left its group.
    from corral.actors.process_supervisor._os import _ParentMap

    parents = _ParentMap(max_age=3600.0)
    parents.descendants(os.getpid())  # a scan from before the process below
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        try:
            assert child in [p.pid for p in parents.descendants(proc.pid)]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, 9)
            proc.kill()
