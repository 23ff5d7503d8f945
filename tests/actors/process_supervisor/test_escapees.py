"""Descendants that escape: ``setsid`` and a double fork take a process out of its
app's group and out of its ancestry. They are found by the ``CORRAL_APP_INSTANCE``
marker in their environment: on stop, and after a crash of the node by its next life.
A subreaper node adopts them, and collects their exit status.

Every process here is started by the test and ended by pid (or found by the test's own
unique node id in its marker).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.process_supervisor import AppPaths
from corral.actors.process_supervisor._os import OsLauncher
from corral.actors.process_supervisor._policy import (
    INSTANCE_VAR,
    marker_scope,
    parse_instance_marker,
)
from corral.actors.process_supervisor._table import ProcessTable, StartRequest
from corral.testing import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc"),
]

REV = "e" * 64

#: An app that daemonizes a worker the classic way (fork, setsid, fork, close stdio),
#: forks a second one that dies on its own after half a second, then prints the
#: worker's pid and sleeps.
DAEMONIZING_APP = textwrap.dedent(
    """
    import os, sys, time

    def daemon(lifetime):
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.close(r)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.write(w, str(os.getpid()).encode())
                os.close(w)
                time.sleep(lifetime)
                os._exit(0)
            os._exit(0)
        os.close(w)
        os.wait()
        pid = int(os.read(r, 32))
        os.close(r)
        return pid

    worker = daemon(600)
    short_lived = daemon(0.5)
    print(worker, short_lived, flush=True)
    time.sleep(600)
    """
)

#: A node without corral's assembly: a process table on real processes, in a process
#: of its own that made itself a subreaper. It prints what it started as one JSON
#: line, stops cleanly on SIGTERM (then prints what is left of its children), and can
#: be SIGKILLed to play a crash.
NODE_PROCESS = textwrap.dedent(
    """
    import json, signal, sys, time
    from pathlib import Path
    import psutil, trio
    from corral.actors.process_supervisor import enable_subreaper
    from corral.actors.process_supervisor._os import OsLauncher
    from corral.actors.process_supervisor._table import ProcessTable, StartRequest

    node_id, data_dir, app_code = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    async def main():
        subreaper = enable_subreaper()
        launcher = OsLauncher()
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                table = ProcessTable(
                    node_id=node_id, data_dir=data_dir, launcher=launcher,
                    start_soon=nursery.start_soon, grace=1.0, ready_timeout=0.2,
                )
                cwd = data_dir / "cwd"
                cwd.mkdir(exist_ok=True)
                table.ensure(StartRequest(
                    app="daemon", revision="e" * 64, command=(sys.executable, "-c", app_code),
                    cwd=str(cwd), public_port=24201, internal_port=24701,
                ))
                out = data_dir / "apps" / "daemon" / "logs" / "stdout.log"
                while not (out.exists() and out.read_text().endswith("\\n")):
                    await trio.sleep(0.02)
                worker, short_lived = map(int, out.read_text().split())
                await trio.sleep(1.0)  # the short-lived one is dead by now
                reaped = 0
                for _ in range(3):
                    reaped += await launcher.reap_orphans()
                    await trio.sleep(0.05)
                info = table.info("daemon")
                print(json.dumps({
                    "subreaper": subreaper,
                    "leader": info.pid,
                    "worker": worker,
                    "worker_parent": psutil.Process(worker).ppid(),
                    "short_lived": short_lived,
                    "reaped": reaped,
                }), flush=True)
                async for _ in signals:
                    break
                await table.shutdown()
                for _ in range(3):
                    await launcher.reap_orphans()
                    await trio.sleep(0.05)
                left = [
                    (c.pid, c.status()) for c in psutil.Process().children()
                ]
                print(json.dumps({"children_left": left}), flush=True)
                nursery.cancel_scope.cancel()

    trio.run(main)
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def ending(pids: list[int]) -> Iterator[list[int]]:
    """Whatever happens, SIGKILL the processes the test started (by pid, only those)."""
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                proc.kill()


def start_node(tmp_path: Path, node_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", NODE_PROCESS, node_id, str(tmp_path), DAEMONIZING_APP],
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_stop_ends_a_double_forked_daemon_found_by_its_marker(tmp_path: Path) -> None:
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    paths = AppPaths.of(tmp_path, "daemon")
    (tmp_path / "cwd").mkdir()
    with trio.fail_after(30), ending([]) as started:
        async with trio.open_nursery() as nursery:
            table = ProcessTable(
                node_id=node_id,
                data_dir=tmp_path,
                launcher=OsLauncher(),
                start_soon=nursery.start_soon,
                grace=1.0,
                ready_timeout=0.2,
            )
            table.ensure(
                StartRequest(
                    app="daemon",
                    revision=REV,
                    command=(sys.executable, "-c", DAEMONIZING_APP),
                    cwd=str(tmp_path / "cwd"),
                    public_port=24211,
                    internal_port=24711,
                )
            )
            await until(
                lambda: paths.stdout_log.exists() and paths.stdout_log.read_text().endswith("\n"),
                within=10.0,
                poll=0.02,
            )
            worker = int(paths.stdout_log.read_text().split()[0])
            started.append(worker)
            info = table.info("daemon")
            assert info is not None
            assert info.pid is not None
            leader = psutil.Process(info.pid)
            # It escaped: another session, another group, not a descendant of its app.
            assert os.getsid(worker) != os.getsid(leader.pid)
            assert os.getpgid(worker) != leader.pid
            assert worker not in {p.pid for p in leader.children(recursive=True)}
            marker = psutil.Process(worker).environ()[INSTANCE_VAR]
            scope = marker_scope(node_id, table.data_dir)
            assert parse_instance_marker(marker) == (scope, "daemon", marker.split("/")[2])
            assert table.stop("daemon", "test")
            await table.wait_idle()
            await until(lambda: gone(worker), within=10.0, poll=0.02)
            assert gone(leader.pid)


async def test_a_subreaper_node_adopts_reaps_and_on_sigterm_stops_escaped_daemons(
    tmp_path: Path,
) -> None:
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    node = start_node(tmp_path, node_id)
    with ending([node.pid]) as started:
        assert node.stdout is not None
        line = await trio.to_thread.run_sync(node.stdout.readline)
        report = json.loads(line)
        started += [report["leader"], report["worker"]]
        assert report["subreaper"] is True
        # The orphaned worker came back to the node, not to init.
        assert report["worker_parent"] == node.pid
        # The one that died on its own was collected, not left a zombie.
        assert report["reaped"] >= 1
        assert gone(report["short_lived"])
        node.send_signal(signal.SIGTERM)
        rest = await trio.to_thread.run_sync(node.stdout.read)
        assert await trio.to_thread.run_sync(node.wait) == 0
        node.stdout.close()
        assert json.loads(rest) == {"children_left": []}
        assert gone(report["worker"])
        assert gone(report["leader"])


async def test_after_a_node_crash_the_next_life_ends_escaped_daemons_by_marker(
    tmp_path: Path,
) -> None:
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    node = start_node(tmp_path, node_id)
    # Processes of another node carrying a marker (one with this node's id under another
    # data directory), and one of ours without any: untouched.
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    strangers = [
        subprocess.Popen(sleeper, env={**os.environ, INSTANCE_VAR: f"{scope}/daemon/1"})
        for scope in (
            marker_scope(f"other-{node_id}", tmp_path),
            marker_scope(node_id, tmp_path / "elsewhere"),
        )
    ]
    unmarked = subprocess.Popen(sleeper)
    with ending([node.pid, unmarked.pid] + [s.pid for s in strangers]) as started:
        assert node.stdout is not None
        report = json.loads(await trio.to_thread.run_sync(node.stdout.readline))
        started += [report["leader"], report["worker"]]
        node.kill()  # the node crashes: nothing of its own cleanup runs
        await trio.to_thread.run_sync(node.wait)
        node.stdout.close()
        assert not gone(report["leader"])
        assert not gone(report["worker"])

        with trio.fail_after(20):
            ended = await OsLauncher().end_leftovers(tmp_path, grace=1.0, node_id=node_id)
        assert {r.pid for r in ended} == {report["leader"], report["worker"]}
        assert {r.app for r in ended} == {"daemon"}
        await until(
            lambda: gone(report["worker"]) and gone(report["leader"]), within=10.0, poll=0.02
        )
        assert not any(gone(s.pid) for s in strangers)
        assert not gone(unmarked.pid)
    for proc in (*strangers, unmarked):
        proc.wait()


def test_a_real_node_stops_its_escaped_daemons_on_sigterm_and_after_sigkill(
    tmp_path: Path,
) -> None:
    # `corral node run` itself: a subreaper, and the marker sweep of its next life.
    from corral.node.artifacts._artifacts import pack_directory
    from corral.node.cli._local_cluster import LocalCluster, wait_for

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    worker_app = DAEMONIZING_APP.replace("short_lived = daemon(0.5)", "short_lived = 0")
    (app_dir / "daemon.py").write_text(worker_app)
    (app_dir / "corral.toml").write_text(f"command = [{json.dumps(sys.executable)}, 'daemon.py']\n")
    node_id = f"node-{uuid.uuid4().hex[:8]}"
    cluster = LocalCluster(
        tmp_path / "cluster", lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=3000
    )
    (tmp_path / "cluster").mkdir()
    node = cluster.add_node(node_id, port_range=(25900, 25949))
    out = node.data_dir / "apps" / "daemon" / "logs" / "stdout.log"

    def workers() -> list[int]:
        if not out.exists():
            return []
        return [int(line.split()[0]) for line in out.read_text().splitlines() if line.strip()]

    def new_worker(after: int) -> int:
        found = wait_for("the daemon's worker", lambda: len(workers()) > after, timeout=30.0)
        assert found
        return workers()[-1]

    with ending([]) as started, cluster:
        cluster.start(node)
        cluster.wait_ready(node)
        assert node.process is not None
        with node.client() as client:
            client.deploy("daemon", pack_directory(app_dir), replicas=1)
        first = new_worker(0)
        started.append(first)
        assert psutil.Process(first).ppid() == node.process.pid  # adopted by the node
        scope = marker_scope(node_id, node.data_dir)
        assert psutil.Process(first).environ()[INSTANCE_VAR].startswith(f"{scope}/daemon/")

        cluster.kill(node)  # a crash: the worker outlives the node
        assert not gone(first)
        cluster.start(node)
        cluster.wait_ready(node)
        wait_for("the next life to end the worker", lambda: gone(first), timeout=30.0)

        second = new_worker(1)
        started.append(second)
        assert cluster.stop(node) == 0  # SIGTERM: a clean stop ends it too
        assert gone(second)
