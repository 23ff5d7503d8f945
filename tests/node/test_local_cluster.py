"""The local cluster's bookkeeping of what a node started (real processes, bounded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from corral.node.cli._local_cluster import LocalNode, wait_for

# A stand-in node: one child (an "app"), which has a helper child of its own, the way
# a version manager's shim runs helpers before it execs the real interpreter.
HELPER = "import time; time.sleep(30)"
APP = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {HELPER!r}]); "
APP += "time.sleep(30)"
NODE = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {APP!r}]); "
NODE += "time.sleep(30)"


def test_apps_are_the_nodes_direct_children_only(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", NODE], start_new_session=True)
    node = LocalNode("n1", tmp_path, 1, 2, [], process=process)
    try:
        wait_for("the app and its helper", lambda: len(node.note_descendants()) == 2, timeout=10)
        children = psutil.Process(process.pid).children()
        assert set(node.seen_children) == {children[0].pid}
        assert set(node.seen_children) < set(node.seen_descendants)
    finally:
        for pid in [*node.seen_descendants, process.pid]:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        process.wait(5)
