"""Human-readable output."""

from __future__ import annotations

from typing import Any

import corral.node
from corral._text import duration
from corral.node.cli._cli import drain_message
from corral.node.cli._format import (
    event_line,
    nodes_table,
    ps_table,
    state_summary,
    table,
)

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
    assert {"main", "NodeError"} <= set(corral.node.__all__)
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
        "REVISION",
        "PUBLIC",
        "INTERNAL",
        "RESTARTS",
        "RELOC",
    ]
    assert "corral deploy" in ps_table([])


def test_ps_says_why_an_instance_is_still_starting() -> None:
    # Issue 25 item 8: the node's port range is exhausted; the row alone said "starting".
    reason = (
        "cannot start: placement-unavailable: port range 24000-24002 has 1 free port(s) for "
        "app 'web', a pair needs 2 (1 held by apps of this node, 0 in quarantine, 0 found "
        "taken on this machine or in the registry); widen the range with "
        "--port-range-start/--port-range-end or delete apps this node no longer needs"
    )
    rows = [
        {
            "app": "web",
            "node": "n1",
            "state": "starting",
            "public_port": None,
            "internal_port": None,
            "restarts": 0,
            "reloc": "yes",
            "reason": reason,
        },
        {
            "app": "api",
            "node": "n1",
            "state": "starting",
            "public_port": None,
            "internal_port": None,
            "restarts": 0,
            "reloc": "yes",
            "reason": None,
        },
    ]
    lines = ps_table(rows).splitlines()
    assert lines[3:] == [f"starting web on n1: {reason}"]


def test_ps_shows_each_revision_and_the_rollout_progress() -> None:
    def row(node: str, revision: str, step: str) -> dict[str, object]:
        return {
            "app": "web",
            "node": node,
            "state": "running",
            "revision": revision * 64,
            "public_port": 1,
            "internal_port": 2,
            "restarts": 0,
            "reloc": "yes",
            "rollout": "rolling 1/3",
            "rollout_step": step,
        }

    text = ps_table([row("n1", "b", "done"), row("n2", "a", "draining"), row("n3", "a", "pending")])
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["web", "n1", "running", "b" * 12]
    assert lines[2].split()[3:5] == ["a" * 12, "(draining)"]
    assert lines[-1] == "rollout web: rolling 1/3"
    halted = row("n1", "b", "waiting-ready") | {"rollout": "halted: revision bbbb was not ready"}
    assert ps_table([halted]).splitlines()[-1] == "rollout web: halted: revision bbbb was not ready"


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


#: The lease holder's coordinator state, as GET /v1/state carries it in ``coordination``.
COORDINATION: dict[str, Any] = {
    "node": "c",
    "holder": "c",
    "last_pass": {
        "outcome": "applied",
        "wall_time": 995.0,
        "trigger": "watch",
        "counts": {"writes": 1},
        "error": None,
    },
    "policy": {
        "cooldown_s": 600.0,
        "grace_period_s": 300.0,
        "disruption_budget": 5,
        "min_usable_fraction": 0.5,
    },
    "unplaced": [],
    "deferred": [
        {
            "app": "web",
            "node": "n1",
            "reason": "cooldown: placed 48 s ago, less than the 600 s cooldown; it stays for now",
            "until": 1552.0,
        },
        {"app": "api", "node": "n1", "reason": "cooldown: ...", "until": 990.0},
        {
            "app": "shop",
            "node": "n3",
            "reason": "disruption budget: the 5 relocation(s) allowed per pass are used; "
            "it moves on a later pass",
            "until": None,
        },
    ],
    "stranded": [
        {
            "app": "db",
            "node": "n2",
            "reason": "the forced drain of n2 stopped it; db is pinned, so it is not started "
            "elsewhere (end the drain to start it on n2 again, or unpin db to have it placed "
            "elsewhere)",
        }
    ],
    "refused": None,
    "paused": None,
}


def test_state_summary_shows_the_holders_deferred_moves_and_stranded_work() -> None:
    state = {
        "node_id": "n1",
        "lease": {"holder": "c", "fence": 9},
        "coordinating": False,
        "coordination": COORDINATION,
        "placements": {
            "db": {"nodes": [], "fence": 9, "placed_at": {"n2": 1.0}},
            "web": {"nodes": ["n1"], "fence": 9, "placed_at": {"n1": 952.0}},
        },
        "unplaced": [],
    }
    lines = state_summary(state, now=1000.0).splitlines()
    assert "last pass   applied 5 s ago (trigger watch, 1 write(s))" in lines
    assert (
        "policy      cooldown 600 s, grace 300 s, disruption budget 5 per pass, relocations "
        "need 50% of the nodes usable"
    ) in lines
    assert "deferred    web on n1: cooldown, may move in 9m 12s" in lines
    assert "deferred    api on n1: cooldown, may move on the next pass" in lines
    assert (
        "deferred    shop on n3: disruption budget: the 5 relocation(s) allowed per pass are "
        "used; it moves on a later pass"
    ) in lines
    assert any(
        line.startswith("stranded    db on n2: the forced drain of n2 stopped it") for line in lines
    )
    assert ["db", "n2", "(stopped", "by", "a", "forced", "drain)", "9"] in [
        line.split() for line in lines
    ]
    # What is held back comes last, after the tables.
    assert lines.index("deferred    web on n1: cooldown, may move in 9m 12s") > lines.index(
        "processes   none on this node"
    )


def test_state_summary_says_when_the_holders_decisions_cannot_be_had() -> None:
    why = "cannot ask coordinator c: peer 'c' at 127.0.0.1:9 is unreachable"
    state = {
        "node_id": "n1",
        "lease": {"holder": "c", "fence": 9},
        "coordination": {"holder": "c", "error": why},
        "unplaced": {"error": why},
    }
    lines = state_summary(state, now=0.0).splitlines()
    assert f"decisions   unknown: {why}" in lines
    assert not any(line.startswith("unplaced") for line in lines)  # said once, not twice
    assert not any(line.startswith(("deferred", "policy")) for line in lines)
    # No holder at all: nothing to say beyond "none holds the lease".
    alone = state_summary(
        {"node_id": "n1", "lease": None, "coordination": {"holder": None, "error": "none"}},
        now=0.0,
    )
    assert "decisions" not in alone


def test_ps_table_says_why_reloc_cannot_tell_cooldowns() -> None:
    row = {
        "app": "web",
        "node": "n1",
        "state": "running",
        "public_port": 1,
        "internal_port": 2,
        "restarts": 0,
        "reloc": "yes (cooldown unknown: the coordinator's state is unavailable)",
    }
    text = ps_table([row], {"holder": "c", "error": "cannot ask coordinator c: timed out"})
    assert (
        text.splitlines()[-1] == "RELOC cannot tell cooldowns: cannot ask coordinator c: timed out"
    )
    assert len(ps_table([row], {"holder": "c", "cooldown_s": 600.0}).splitlines()) == 2


def test_duration_and_drain_messages() -> None:
    assert [duration(s) for s in (0.2, 45, 61, 3600 * 2 + 301)] == ["1s", "45s", "1m 1s", "2h 5m"]
    assert drain_message("n2", [], forced=False) == "n2: draining; its work moves to other nodes"
    assert drain_message("n2", [], forced=True) == (
        "n2: draining (forced); its work moves to other nodes (no pinned app there)"
    )
    assert "pinned app(s) db are stopped there" in drain_message("n2", ["db"], forced=True)


def test_state_shows_a_rollout_and_why_it_halted() -> None:
    rollout = {
        "revision": "b" * 64,
        "nodes": {
            "n1": {"revision": "b" * 64, "step": "restarting", "since": 1.0},
            "n2": {"revision": "a" * 64, "step": "pending", "since": 1.0},
        },
        "halted": "revision bbbbbbbbbbbb was not ready on node n1 within 60000 ms",
    }
    state = {**STATE, "placements": {"web": {"nodes": ["n1", "n2"], "fence": 7,
                                             "rollout": rollout}}}
    text = state_summary(state, now=1000.0)
    assert (
        f"rollout     web to {'b' * 12}: halted: revision bbbbbbbbbbbb was not ready on node n1 "
        "within 60000 ms (n1 restarting, n2 pending)"
    ) in text
    broken = {**STATE, "placements": {"web": {"nodes": [], "rollout": {"nodes": {}}}}}
    assert "rollout     web: cannot be read" in state_summary(broken, now=1000.0)
