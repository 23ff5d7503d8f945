"""The blip suite, scenario 6 (issue 26): a drain with a stuck app (it ignores SIGTERM).

Three hosts, each an etcd member and a node (the bed's 5 s shutdown grace: an app
gets 5 s between SIGTERM and SIGKILL, after the stop's 2.5 s drain wait). ``stuck``
(one replica) ignores SIGTERM; its host is drained with ``corral node drain``.
Asserted, printed (``-s``): the drain answers, and the node's ``corral ps`` shows the
instance ``stopping``, within 2 s (see VISIBLE_WITHIN_S); 1 s after the SIGTERM it ignores,
the node reports it (one ``process.stop-overdue`` event: 1 s after SIGTERM, killed in
4 s); it is killed at its deadline (SIGKILL, 5 s after SIGTERM) and the node says so
(``process.stopped``: code -9, the reason naming the SIGKILL); exactly one ``stuck``
runs afterwards, on another host, and none is left on the drained one.

Measured (2026-12-08, 5 runs): drain answered in 0.23-0.71 s, ``stopping`` shown 0.24-0.71 s after
it, the overdue report 4.01 s before the kill, the process gone 7.6-8.5 s after the
drain. Before this branch nothing was said between the SIGTERM and the kill, and the
kill showed only as ``code: -9``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import wait_for
from corral.testing import HostBed, open_hosts, require_netns

from .conftest import NODE_TTL_MS, SWIM_ENV, keep_logs_on_failure, require_etcd_binary

pytestmark = pytest.mark.slow

HOSTS = ["h1", "h2", "h3"]
STEP = 40.0
#: The bed's --shutdown-grace-ms (open_hosts' default) in seconds: SIGTERM to SIGKILL.
PROCESS_GRACE_S = 5.0
#: corral.node.server._node.stop_drain: half the shutdown grace, at most 5 s.
STOP_DRAIN_S = 2.5
#: The drain's answer and the ``stopping`` row are API round trips: 0.2-0.45 s on a
#: quiet machine, 1.02 s with six beds on its 2 cores; 2 s keeps the test from failing
#: on load. The report of the stuck process itself (1 s after its SIGTERM) is timed by
#: the node and asserted exactly.
VISIBLE_WITHIN_S = 2.0

STUCK_APP = """\
import os, signal
from http.server import BaseHTTPRequestHandler, HTTPServer
signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
HTTPServer((os.environ["CORRAL_BIND_HOST"], int(os.environ["PORT"])), H).serve_forever()
"""


@pytest.fixture
def drain_bed(request: pytest.FixtureRequest) -> Iterator[HostBed]:
    require_netns()
    require_etcd_binary()
    with open_hosts(HOSTS, node_ttl_ms=NODE_TTL_MS, extra_env=SWIM_ENV) as bed:
        bed.start_etcd()
        for name in HOSTS:
            bed.add_node(name, labels={"host": name})
        bed.start_nodes(HOSTS)
        yield bed
        keep_logs_on_failure(request, bed)


def stuck_processes(bed: HostBed, name: str) -> list[int]:
    found = []
    for pid in bed.hosts[name].pids():
        try:
            if any(part.endswith("stuck.py") for part in psutil.Process(pid).cmdline()):
                found.append(pid)
        except psutil.Error:
            continue
    return found


def stuck_rows(bed: HostBed, observer: str) -> list[dict[str, Any]]:
    with bed.node(observer).client(timeout=2.0) as client:
        return [row for row in client.ps() if row["app"] == "stuck"]


def test_a_drain_reports_a_stuck_app_at_once_and_kills_it_at_its_deadline(
    drain_bed: HostBed, tmp_path: Path
) -> None:
    bed = drain_bed
    app = tmp_path / "stuck"
    app.mkdir()
    (app / "stuck.py").write_text(STUCK_APP)
    (app / "Procfile").write_text("web: python3 stuck.py\n")
    with bed.node("h2").client() as client:
        client.deploy("stuck", pack_directory(app), replicas=1)
    rows = wait_for(
        "stuck to run",
        lambda: [r for r in stuck_rows(bed, "h2") if r["state"] == "running"] or None,
        timeout=STEP,
    )
    node_id = rows[0]["node"]
    host = next(name for name in HOSTS if bed.node(name).node_id == node_id)
    pids = stuck_processes(bed, host)
    assert len(pids) == 1, pids

    started = time.monotonic()
    with bed.node(host).client() as client:
        answer = client.node_operation(node_id, "drain")
    answered_s = time.monotonic() - started

    def shown_stopping() -> float | None:
        """When the ps that first showed the instance stopping was asked."""
        asked = time.monotonic()
        rows = stuck_rows(bed, host)
        shown = any(r["node"] == node_id and r["state"] == "stopping" for r in rows)
        return asked - started if shown else None

    shown_s = wait_for("the instance shown stopping", shown_stopping, timeout=STEP, interval=0.05)
    wait_for(
        "the stuck process to end",
        lambda: not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == "zombie",
        timeout=STEP,
        interval=0.05,
    )
    ended_s = time.monotonic() - started

    def told() -> dict[str, dict[str, Any]] | None:
        with bed.node(host).client() as client:
            events = client.events()
        found = {
            e["kind"]: e
            for e in events
            if e["kind"] in ("process.stop-overdue", "process.stopped")
            and e["fields"].get("pid") == pids[0]
        }
        return found if "process.stopped" in found else None

    events = wait_for("the node to tell the stop", told, timeout=10.0)
    overdue, stopped = events.get("process.stop-overdue"), events["process.stopped"]
    after = wait_for(
        "stuck to run elsewhere",
        lambda: [r for r in stuck_rows(bed, "h2") if r["state"] == "running"] or None,
        timeout=STEP,
    )
    counts = {
        "drain_answer_s": round(answered_s, 2),
        "stuck_shown_stopping_s": round(shown_s, 2),
        "stuck_ended_s": round(ended_s, 2),
        "overdue_reports": int(overdue is not None),
        "overdue_fields": None if overdue is None else overdue["fields"],
        # The overdue report came 1 s after SIGTERM when it came grace - 1 s before the kill.
        "overdue_to_kill_s": None
        if overdue is None
        else round(stopped["wall_time"] - overdue["wall_time"], 2),
        "stuck_exit_code": stopped["fields"].get("code"),
        "stop_reason": stopped["fields"].get("reason"),
        "stuck_left_on_drained": len(stuck_processes(bed, host)),
        "stuck_running_after": len(after),
        "stuck_running_on_drained_after": sum(1 for r in after if r["node"] == node_id),
        "drain_message": answer,
    }
    print(json.dumps(counts))
    assert answered_s <= VISIBLE_WITHIN_S, counts
    assert shown_s <= VISIBLE_WITHIN_S, counts
    assert counts["overdue_reports"] == 1, counts
    assert overdue is not None
    assert overdue["fields"]["after"] == 1.0, counts
    assert overdue["fields"]["kill_in"] == PROCESS_GRACE_S - 1.0, counts
    assert PROCESS_GRACE_S - 1.5 <= counts["overdue_to_kill_s"] <= PROCESS_GRACE_S - 0.5, counts
    assert PROCESS_GRACE_S <= ended_s <= STOP_DRAIN_S + PROCESS_GRACE_S + 2.0, counts
    assert counts["stuck_exit_code"] == -9, stopped
    assert "killed (SIGKILL)" in str(counts["stop_reason"]), stopped
    assert counts["stuck_left_on_drained"] == 0, counts
    assert counts["stuck_running_after"] == 1, after
    assert counts["stuck_running_on_drained_after"] == 0, after
