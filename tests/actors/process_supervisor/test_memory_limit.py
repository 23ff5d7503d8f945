"""``memory_mb`` is a limit: a real process that allocates past it is ended, and its row
says why (cgroup v2 ``memory.max`` where the node can create one, else the RSS watchdog)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from corral.actors.process_supervisor import RestartPolicy
from corral.actors.process_supervisor._limits import (
    CgroupParent,
    oom_kills,
    parse_own_cgroup,
    rss_exceeds,
)
from corral.actors.process_supervisor._os import OsLauncher
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.testing import until

pytestmark = pytest.mark.slow

REV = "d" * 64
# Grows by 8 MiB every 10 ms (pages touched: bytearray zero-fills), up to 1 GiB at most
# so a broken limit cannot take the machine down, then sleeps.
GROWER = (
    "import time\n"
    "held = []\n"
    "while len(held) < 128:\n"
    "    held.append(bytearray(8 * 1024 * 1024))\n"
    "    time.sleep(0.01)\n"
    "time.sleep(600)\n"
)
MODEST = "import time\nheld = bytearray(4 * 1024 * 1024)\ntime.sleep(600)\n"


def request(tmp_path: Path, code: str, memory_mb: int, app: str = "hungry") -> StartRequest:
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return StartRequest(
        app=app,
        revision=REV,
        command=(sys.executable, "-c", code),
        cwd=str(cwd),
        public_port=24011,
        internal_port=24512,
        memory_mb=memory_mb,
    )


@pytest.mark.parametrize("cgroups", [None, False], ids=["detected", "watchdog"])
async def test_a_process_allocating_past_its_limit_is_stopped_with_the_reason(
    tmp_path: Path, cgroups: bool | None
) -> None:
    events: list[tuple[str, dict[str, object]]] = []
    policy = RestartPolicy(initial_backoff=30.0, max_backoff=30.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            table = ProcessTable(
                node_id="node-a",
                data_dir=tmp_path,
                launcher=OsLauncher(memory_cgroups=cgroups, watchdog_interval=0.05),
                start_soon=nursery.start_soon,
                policy=policy,
                ready_timeout=0.2,
                on_event=lambda kind, **fields: events.append((kind, fields)),
            )
            table.ensure(request(tmp_path, MODEST, 200, app="modest"))
            table.ensure(request(tmp_path, GROWER, 64))
            await until(lambda: any(k == "process.exited" for k, _ in events), poll=0.02)
            info = table.info("hungry")
            assert info is not None
            row = info.to_dict()
            assert row["last_error"] == "memory limit 64 MiB exceeded"
            # Restarted after its backoff, like a crash. (The limit event comes first,
            # while the run's own tasks wind down: the state moves on after them.)
            assert row["state"] == "backoff"
            kinds = [k for k, f in events if f.get("app") == "hungry"]
            assert kinds.index("process.limit-exceeded") < kinds.index("process.exited")
            assert row["last_exit_code"] == -9
            (fields,) = [f for k, f in events if k == "process.limit-exceeded"]
            assert fields["reason"] == "memory limit 64 MiB exceeded"
            # The app within its limit runs on.
            modest = table.info("modest")
            assert modest is not None
            assert modest.state in ("starting", "running")
            assert modest.last_error is None
            assert modest.restarts == 0
            assert not any(f.get("app") == "modest" for k, f in events if k != "process.started")
            await table.shutdown()


def test_rss_is_compared_with_the_limit_in_mib() -> None:
    mib = 1024 * 1024
    assert not rss_exceeds([10 * mib, 54 * mib], 64)
    assert rss_exceeds([10 * mib, 54 * mib + 1], 64)
    assert not rss_exceeds([10**12], 0)  # no limit declared


def test_cgroup_files_are_read_as_the_kernel_writes_them() -> None:
    assert parse_own_cgroup("4:memory:/x\n0::/system.slice/corral.service\n") == (
        "/system.slice/corral.service"
    )
    assert parse_own_cgroup("4:memory:/x\n") is None
    assert oom_kills("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n") == 1
    assert oom_kills("low 0\n") == 0


def test_no_cgroup_v2_memory_controller_means_the_watchdog(tmp_path: Path) -> None:
    # A cgroup v1 machine: no cgroup.controllers at the mount.
    own = tmp_path / "self"
    own.write_text("0::/\n")
    assert CgroupParent.detect(tmp_path, own) is None
    # cgroup v2 without the memory controller.
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    assert CgroupParent.detect(tmp_path, own) is None
