"""One app's failure is its own: a start that raises never reaches another app.

The attack (issue 11, bug 2): a NUL byte in an env value or a command argument made
``ProcessSupervisor`` crash on ``ValueError: embedded null byte``; the agent's
supervisor gave up after 5 restarts and every app on the node stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from corral.actors.process_supervisor import (
    ListProcesses,
    ProcessSupervisor,
    RestartPolicy,
    StartProcess,
)
from corral.actors.reconciler._plan import serving_set
from corral.node.cli._format import ps_table, state_summary
from corral.node.server._views import ps_rows
from corral.registry import (
    AppRecord,
    Deployment,
    NodeRecord,
    PlacementRecord,
    decode_record,
    node_key,
)
from corral.supervision import ChildSpec, open_actor_system
from corral.testing import until

REV = "d" * 64
SLEEPER = "import time; time.sleep(600)"


def start(tmp_path: Path, app: str, port: int, **changes: Any) -> StartProcess:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "app": app,
        "revision": REV,
        "command": (sys.executable, "-c", SLEEPER),
        "cwd": str(cwd),
        "public_port": port,
        "internal_port": port + 500,
        "env": {"GREETING": "hi"},
    }
    fields.update(changes)
    return StartProcess(**fields)


@pytest.mark.slow
async def test_nul_bytes_fail_their_app_and_every_other_app_keeps_its_pid(
    tmp_path: Path,
) -> None:
    policy = RestartPolicy(initial_backoff=0.1, max_backoff=0.5, crash_loop_crashes=3)
    with trio.fail_after(30):
        async with open_actor_system("node-iso") as system:
            ref = await system.spawn(
                ChildSpec(
                    name="process_supervisor",
                    factory=lambda: ProcessSupervisor(
                        node_id="node-iso",
                        data_dir=tmp_path,
                        policy=policy,
                        grace=2.0,
                        ready_timeout=0.5,
                        notify=None,
                    ),
                    shutdown_grace=10.0,
                )
            )

            async def rows() -> dict[str, dict[str, Any]]:
                return {row["app"]: row for row in await ref.ask(ListProcesses())}

            for app, port in (("alpha", 24101), ("omega", 24102)):
                assert await ref.ask(start(tmp_path, app, port))

            async def both_running() -> bool:
                now = await rows()
                return all(now[a]["pid"] and now[a]["state"] == "running" for a in now)

            await until(both_running)
            pids = {app: row["pid"] for app, row in (await rows()).items()}

            bad_env = start(tmp_path, "bad-env", 24103, env={"TOKEN": "a\x00b"})
            bad_arg = start(
                tmp_path, "bad-arg", 24104, command=(sys.executable, "-c", "print(1)\x00")
            )
            assert await ref.ask(bad_env)
            assert await ref.ask(bad_arg)

            async def both_looping() -> bool:
                now = await rows()
                return all(
                    a in now and now[a]["state"] == "failed" and now[a]["crash_loop"]
                    for a in ("bad-env", "bad-arg")
                )

            await until(both_looping)
            await trio.sleep(1.0)  # a few more tries of the bad apps
            now = await rows()
            for app in ("bad-env", "bad-arg"):
                assert now[app]["pid"] is None
                assert f"cannot start app {app!r}" in now[app]["last_error"]
                assert "embedded null byte" in now[app]["last_error"]
                assert now[app]["restarts"] >= 3
            for app, pid in pids.items():
                assert now[app]["pid"] == pid
                assert now[app]["state"] == "running"
                assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            snapshot = system.tree().find(ref.path)
            assert snapshot is not None
            assert (snapshot.state, snapshot.restarts, snapshot.last_error) == (
                "running",
                0,
                None,
            )
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_a_failed_app_shows_failed_with_its_reason_in_ps_and_state() -> None:
    failed_row = {
        "app": "bad",
        "state": "failed",
        "pid": None,
        "revision": REV,
        "public_port": 24001,
        "internal_port": 24501,
        "restarts": 4,
        "started_at": None,
        "last_exit_code": None,
        "crash_loop": True,
        "last_error": "cannot start app 'bad': ... (ValueError: embedded null byte) ...",
        "stop_reason": None,
    }
    looping_row = {
        **failed_row,
        "app": "loop",
        "state": "backoff",
        "last_error": None,
        "last_exit_code": 3,
    }
    serving = serving_set([failed_row, looping_row])
    assert serving["bad"].state == "failed"
    assert "embedded null byte" in serving["bad"].reason
    assert serving["loop"].state == "crash-loop"
    assert serving["loop"].reason == "it keeps exiting (last exit code 3)"

    record = NodeRecord("node-a", serving=serving)
    decoded = decode_record(node_key("node-a"), record.encode())
    assert isinstance(decoded, NodeRecord)
    assert decoded.serving == serving
    apps = {name: AppRecord(name, deployment=Deployment(REV, ["x"])) for name in serving}
    placements = {name: PlacementRecord(["node-a"], 0.0, 1) for name in serving}
    rows = [row.to_json() for row in ps_rows(apps, placements, {"node-a": decoded}, {})]
    assert [(r["app"], r["state"]) for r in rows] == [("bad", "failed"), ("loop", "crash-loop")]
    text = ps_table(rows)
    assert "failed bad on node-a: cannot start app 'bad'" in text
    assert "crash-loop loop on node-a: it keeps exiting (last exit code 3)" in text

    summary = state_summary(
        {"node": {"node_id": "node-a"}, "processes": [failed_row, looping_row]}, now=0.0
    )
    table_lines = [
        line.split() for line in summary.splitlines() if line.startswith(("bad", "loop"))
    ]
    assert [line[:3] for line in table_lines] == [
        ["bad", "-", "failed"],
        ["loop", "-", "crash-loop"],
    ]
    assert "embedded null byte" in summary
