"""`corral demo --keep`: the cluster stays up, says how to reach it, the inspector and
the CLI work against it, and Ctrl-C stops it cleanly."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Static

from corral.inspector import Inspector, NodeSource

pytestmark = pytest.mark.slow

NODE_LINE = re.compile(r"(node-\d)  API (http://127\.0\.0\.1:\d+)  token (\S+)")


def read_until(process: subprocess.Popen[str], marker: str, timeout: float) -> str:
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"no {marker!r} in the demo's output:\n{''.join(seen)}")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def corral(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "corral", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_demo_keep_leaves_a_cluster_to_inspect_until_ctrl_c() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "demo", "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as at a terminal, even when this run ignores SIGINT (a background job
        # of a script does, and its children inherit that, Python's included).
        preexec_fn=_default_sigint,
    )
    try:
        story = read_until(process, "Press Ctrl-C here", timeout=150)
        # At the demo's start the coordinator is asked again while busy: no "unknown".
        assert "cooldown unknown" not in story
        nodes = {m[1]: (m[2], Path(m[3])) for m in NODE_LINE.finditer(story)}
        assert sorted(nodes) == ["node-1", "node-2", "node-3"]
        assert "corral inspect --api http://127.0.0.1:" in story
        api, token_file = nodes["node-1"]
        data_dir = str(token_file.parent)
        # hello runs on all three (given a moment: a restart after a stray signal is
        # allowed, the kept cluster is a live one).
        for _ in range(60):
            ps = corral("ps", "--api", api, "--data-dir", data_dir)
            if len(re.findall(r"^hello\s+node-\d\s+running", ps, re.M)) == 3:
                break
            time.sleep(0.5)
        assert len(re.findall(r"^hello\s+node-\d\s+running", ps, re.M)) == 3, ps
        assert "node-1" in corral("inspect", "--once", "--api", api, "--data-dir", data_dir)

        async def inspect() -> None:
            app = Inspector(NodeSource(api, token_file.read_text().strip()), interval=0.3)
            async with app.run_test(size=(140, 40)) as pilot:
                for _ in range(500):
                    table: DataTable[Any] = app.query_one("#cluster-table", DataTable)
                    if table.row_count == 3:
                        break
                    await pilot.pause(0.02)
                assert table.row_count == 3
                # Another node's actors, with the token the demo's nodes share.
                await pilot.press("n", "down", "enter")
                assert app.actors_node == "node-2"
                for _ in range(500):
                    title = str(app.query_one("#actors-title", Static).render())
                    if app.actor_tree.get("path") == "/" and "actors of node-2" in title:
                        break
                    await pilot.pause(0.02)
                assert app.actors_error is None
                assert app.actor_tree.get("path") == "/"
                await pilot.press("q")

        asyncio.run(inspect())
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            # The demo stops its nodes on SIGTERM (they live in sessions of their own).
            process.terminate()
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, out
    assert "Ctrl-C: stopping the kept cluster." in out
    assert "none of the" in out
    assert "Kept the nodes' data directories and logs in" in out
