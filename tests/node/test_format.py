"""Human-readable output."""

from __future__ import annotations

from typing import Any

import corral.node
from corral.node._format import event_line, nodes_table, ps_table, state_summary, table

STATE: dict[str, Any] = {
    "node_id": "n1",
    "node": {
        "id": "n1",
        "state": "alive",
        "labels": {"zone": "a"},
        "rack": "r1",
        "datacenter": None,
        "peer_address": "127.0.0.1:7401",
        "api_address": "127.0.0.1:7400",
        "capacity": {"memory_mb": 100, "memory_free_mb": 50, "disk_mb": 10, "disk_free_mb": 5},
    },
    "lease": {"holder": "n1", "fence": 7, "acquired_at": 0.0},
    "coordinating": True,
    "coordinator": {
        "last_pass": {
            "outcome": "applied",
            "wall_time": 990.0,
            "trigger": "tick",
            "counts": {"writes": 2},
            "error": None,
        },
    },
    "reconcile": {
        "time": 999.5,
        "token": 12,
        "skipped": False,
        "actions": [{}],
        "serving": 1,
        "errors": [],
    },
    "processes": [
        {
            "app": "web",
            "pid": 42,
            "state": "running",
            "public_port": 24001,
            "internal_port": 24002,
            "restarts": 0,
        }
    ],
    "placements": {"web": {"nodes": ["n1"], "fence": 7}},
    "unplaced": [
        {
            "app": "big",
            "reason": "placement-unavailable",
            "message": "cannot place big: no node carries the required labels zone=b",
        }
    ],
}


def test_package_exports_are_sorted() -> None:
    assert corral.node.__all__ == sorted(corral.node.__all__)
    assert {"main", "NodeError", "pack_directory"} <= set(corral.node.__all__)
    assert all(hasattr(corral.node, name) for name in corral.node.__all__)


def test_table_aligns_and_dashes_missing() -> None:
    assert table(("A", "BB"), [("x", None), ("long", 1)]).splitlines() == [
        "A     BB",
        "x     -",
        "long  1",
    ]


def test_ps_table_and_empty_hint() -> None:
    row = {
        "app": "web",
        "node": "n1",
        "state": "running",
        "public_port": 1,
        "internal_port": 2,
        "restarts": 0,
        "reloc": "yes",
    }
    assert ps_table([row]).splitlines()[0].split() == [
        "APP",
        "NODE",
        "STATE",
        "PUBLIC",
        "INTERNAL",
        "RESTARTS",
        "RELOC",
    ]
    assert "corral deploy" in ps_table([])


def test_state_summary_says_who_coordinates_and_what_is_stuck() -> None:
    text = state_summary(STATE, now=1000.0)
    assert "coordinator n1 (this node), fence 7" in text
    assert "last pass   applied 10 s ago (trigger tick, 2 write(s))" in text
    assert "reconcile   just now at change token 12: 1 action(s), serving 1" in text
    assert "memory 50/100 MiB free" in text
    assert "location    rack r1" in text
    assert "unplaced    cannot place big: no node carries the required labels zone=b" in text
    assert "42" in text


def test_state_summary_without_lease_or_views() -> None:
    text = state_summary(
        {"node_id": "n2", "lease": None, "processes": {"error": "ask timed out"}}, now=0.0
    )
    assert "none holds the lease" in text
    assert "processes   unknown: ask timed out" in text


def test_event_line() -> None:
    line = event_line(
        {
            "wall_time": 0,
            "kind": "process.started",
            "path": "/agent/x",
            "fields": {"pid": 3, "app": "web"},
        }
    )
    assert line.endswith("process.started /agent/x app=web pid=3")


def test_state_summary_says_why_a_process_keeps_restarting() -> None:
    processes = [
        {"app": "web", "pid": 42, "state": "running", "restarts": 0},
        {
            "app": "boom",
            "pid": None,
            "state": "backoff",
            "crash_loop": True,
            "restarts": 5,
            "last_exit_code": 3,
        },
        {
            "app": "nocmd",
            "pid": None,
            "state": "backoff",
            "crash_loop": False,
            "restarts": 1,
            "last_error": "cannot start app 'nocmd': No such file or directory",
        },
    ]
    text = state_summary({**STATE, "processes": processes, "data_dir": "/srv/c"}, now=1000.0)
    assert (
        "crash loop  boom: it exits with code 3 (restarted 5 times, with backoff); "
        "its output is in /srv/c/apps/boom/logs/"
    ) in text
    assert "restarting  nocmd: cannot start app 'nocmd': No such file or directory" in text
    assert "web:" not in text
    header = next(line for line in text.splitlines() if line.startswith("APP  "))
    assert header.split()[-2:] == ["LAST", "EXIT"]
    assert "boom   -    crash-loop" in text


def test_event_line_leaves_out_empty_fields_and_shortens_revisions() -> None:
    line = event_line(
        {"kind": "coordinator.pass", "path": "/coordinator", "fields": {"error": None, "n": 0}}
    )
    assert line == "coordinator.pass /coordinator n=0"
    fields = {"revision": "ab12" * 16, "other": "x" * 64}
    line = event_line({"kind": "process.started", "path": "/p", "fields": fields})
    assert line == f"process.started /p other={'x' * 64} revision={'ab12' * 3}"


def test_nodes_table_without_a_coordinator_and_without_nodes() -> None:
    row = {"node": "n1", "state": "alive", "serving": 0, "labels": {}, "coordinator": False}
    text = nodes_table({"nodes": [row], "coordinator": None, "fence": None})
    assert text.splitlines()[-1] == "coordinator: none holds the lease right now"
    assert "corral node run" in nodes_table({"nodes": []})
