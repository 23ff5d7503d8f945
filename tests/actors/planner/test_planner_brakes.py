"""Stability and brakes: rank moves, cooldown, disruption budget, refusal, pause, pinned."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from corral.actors.planner import AppSpec, Decisions, NodeInfo, Placement, Policy, plan
from corral.actors.planner._rank import rendezvous_score

NOW = 10_000.0


def run(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement] | None = None,
    now: float = NOW,
    undecodable: Sequence[str] = (),
    **policy: float,
) -> Decisions:
    return plan(
        apps,
        nodes,
        placements or {},
        Policy(**policy),  # type: ignore[arg-type]
        now,
        undecodable=undecodable,
    )


def by_score(app: str, nodes: Sequence[str]) -> list[str]:
    return sorted(nodes, key=lambda n: rendezvous_score(app, n), reverse=True)


def at(*nodes: str, placed_at: float | None = None) -> Placement:
    stamps = {} if placed_at is None else dict.fromkeys(nodes, placed_at)
    return Placement(nodes=nodes, placed_at=stamps)


# ------------------------------------------------------------------- stability


def test_an_instance_on_a_node_that_keeps_work_stays() -> None:
    ids = ["n1", "n2", "n3"]
    best = by_score("web", ids)[0]
    nodes = [NodeInfo(i, state="cordoned" if i == best else "alive") for i in ids]
    d = run([AppSpec("web", replicas=1)], nodes, {"web": at(best)})
    assert d.placements == {"web": (best,)}
    assert not d.changed


def test_rank_moves_an_instance_to_a_better_ranked_node() -> None:
    ids = ["n1", "n2", "n3"]
    best, second = by_score("web", ids)[:2]
    d = run([AppSpec("web", replicas=1)], [NodeInfo(i) for i in ids], {"web": at(second)})
    assert d.placements == {"web": (best,)}
    assert d.removals == (("web", second),)
    assert d.additions == (("web", best),)


def test_cooldown_keeps_a_recent_instance_where_it_is() -> None:
    ids = ["n1", "n2", "n3"]
    best, second = by_score("web", ids)[:2]
    nodes = [NodeInfo(i) for i in ids]
    recent = {"web": at(second, placed_at=NOW - 100)}
    d = run([AppSpec("web", replicas=1)], nodes, recent, cooldown_s=600)
    assert d.placements == {"web": (second,)}
    assert not d.changed
    (held,) = d.deferred
    assert (held.app, held.node) == ("web", second)
    assert "cooldown" in held.reason
    assert d.unplaced == ()

    later = run([AppSpec("web", replicas=1)], nodes, recent, now=NOW + 500, cooldown_s=600)
    assert later.placements == {"web": (best,)}
    assert later.deferred == ()


def test_cooldown_does_not_hold_an_instance_whose_node_is_gone() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    d = run([AppSpec("web", replicas=1)], nodes, {"web": at("n1", placed_at=NOW - 1)})
    assert d.placements == {"web": ("n2",)}
    assert d.deferred == ()


def test_cooldown_does_not_hold_an_instance_its_selector_excludes() -> None:
    nodes = [NodeInfo("n1"), NodeInfo("n2", labels={"region": "eu"})]
    app = AppSpec("web", replicas=1, selector={"region": "eu"})
    d = run([app], nodes, {"web": at("n1", placed_at=NOW - 1)})
    assert d.placements == {"web": ("n2",)}


# ------------------------------------------------------------- disruption budget


def test_disruption_budget_caps_relocations_and_defers_the_rest() -> None:
    nodes = [NodeInfo("gone", state="left"), NodeInfo("n1"), NodeInfo("n2")]
    apps = [AppSpec(f"app{i}", replicas=1) for i in range(4)]
    placements = {a.name: at("gone") for a in apps}
    d = run(apps, nodes, placements, disruption_budget=2)
    moved = [a.name for a in apps if d.placements[a.name] != ("gone",)]
    assert moved == ["app0", "app1"]
    assert [(x.app, x.node) for x in d.deferred] == [("app2", "gone"), ("app3", "gone")]
    assert all("disruption budget" in x.reason for x in d.deferred)
    # Deferred moves are not failures.
    assert d.unplaced == ()
    assert d.stranded == ()
    assert len(d.removals) == len(d.additions) == 2


def test_new_placements_do_not_spend_the_budget() -> None:
    d = run(
        [AppSpec(f"new{i}", replicas=2) for i in range(3)],
        [NodeInfo("n1"), NodeInfo("n2")],
        disruption_budget=0,
    )
    assert len(d.additions) == 6
    assert d.deferred == ()


def test_replacing_lost_instances_comes_before_rank_moves() -> None:
    ids = ["n1", "n2", "n3"]
    second = by_score("a-rank", ids)[1]
    nodes = [NodeInfo(i) for i in ids] + [NodeInfo("dead", state="left")]
    placements = {"a-rank": at(second), "z-lost": at("dead")}
    apps = [AppSpec("a-rank", replicas=1), AppSpec("z-lost", replicas=1)]
    d = run(apps, nodes, placements, disruption_budget=1)
    assert d.placements["z-lost"] != ("dead",)
    assert d.placements["a-rank"] == (second,)
    assert [(x.app, x.node) for x in d.deferred] == [("a-rank", second)]


# ---------------------------------------------------------------------- refusal


def test_relocations_are_refused_when_too_few_nodes_are_usable() -> None:
    nodes = [
        NodeInfo("n1"),
        NodeInfo("d1", state="down", down_since=0.0),
        NodeInfo("d2", state="down", down_since=0.0),
        NodeInfo("d3", state="down", down_since=0.0),
    ]
    apps = [AppSpec("old", replicas=1), AppSpec("new", replicas=1)]
    d = run(apps, nodes, {"old": at("d1")}, min_usable_fraction=0.5)
    assert d.refused is not None
    assert d.refused.reason == "too-few-usable-nodes"
    assert "1 of 4 known node(s) usable" in d.refused.message
    # Nothing running moves...
    assert d.placements["old"] == ("d1",)
    assert d.removals == ()
    assert [(s.app, s.node) for s in d.stranded] == [("old", "d1")]
    # ...but new work is still placed.
    assert d.placements["new"] == ("n1",)
    assert d.additions == (("new", "n1"),)


def test_refusal_threshold_is_a_strict_lower_bound() -> None:
    nodes = [
        NodeInfo("n1"),
        NodeInfo("n2", state="suspect"),
        NodeInfo("d1", state="down", down_since=0.0),
        NodeInfo("d2", state="down", down_since=0.0),
    ]
    d = run([AppSpec("old", replicas=1)], nodes, {"old": at("d1")}, min_usable_fraction=0.5)
    assert d.refused is None
    assert d.placements["old"] == ("n1",)


def test_nodes_that_vanished_under_placements_count_as_known() -> None:
    # Two of three node records lapsed at once: most likely out of sight, not dead.
    nodes = [NodeInfo("n1")]
    apps = [AppSpec("web", replicas=2), AppSpec("new", replicas=1)]
    d = run(apps, nodes, {"web": at("n2", "n3")}, min_usable_fraction=0.5)
    assert d.refused is not None
    assert "1 of 3 known node(s) usable" in d.refused.message
    assert d.placements["web"] == ("n2", "n3")
    assert d.removals == ()
    assert [(s.app, s.node) for s in d.stranded] == [("web", "n2"), ("web", "n3")]
    assert "n2 is absent from the nodes this pass sees" in d.stranded[0].reason
    assert d.placements["new"] == ("n1",)
    # One of three vanished: relocations go ahead.
    d = run(apps, [NodeInfo("n1"), NodeInfo("n2")], {"web": at("n2", "n3")})
    assert d.refused is None
    assert d.placements["web"] == ("n1", "n2")


def test_vanished_nodes_of_retired_apps_do_not_count() -> None:
    # The pass removes a retired app's placement, so its nodes must not sway the guard
    # (or the next pass would decide differently).
    nodes = [NodeInfo("n1"), NodeInfo("n2")]
    placements = {"old": at("g1", "g2", "g3"), "web": at("g1")}
    apps = [AppSpec("old", retired=True), AppSpec("web", replicas=1)]
    d = run(apps, nodes, placements, min_usable_fraction=0.5)
    assert d.refused is None
    assert "old" not in d.placements
    assert len(d.placements["web"]) == 1
    assert d.placements["web"][0] in ("n1", "n2")


def test_nodes_that_left_are_not_counted_as_known() -> None:
    nodes = [NodeInfo("n1"), *(NodeInfo(f"l{i}", state="left") for i in range(5))]
    d = run([AppSpec("web", replicas=1)], nodes, {"web": at("l0")})
    assert d.refused is None
    assert d.placements == {"web": ("n1",)}


# ------------------------------------------------------------------------- pause


def test_an_undecodable_key_pauses_the_pass() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    apps = [AppSpec("web", replicas=1), AppSpec("new")]
    d = run(apps, nodes, {"web": at("n1")}, undecodable=["apps/future", "nodes/n9"])
    assert d.paused is not None
    assert d.paused.keys == ("apps/future", "nodes/n9")
    assert "apps/future" in d.paused.message
    assert d.placements == {"web": ("n1",)}
    assert not d.changed
    assert d.unplaced == d.deferred == d.stranded == ()


def test_a_paused_pass_does_not_fail_for_lack_of_nodes() -> None:
    d = run([AppSpec("web")], [], undecodable=["nodes/n1"])
    assert d.paused is not None


# ------------------------------------------------------------------------ pinned


def test_pinned_apps_never_move_for_rank() -> None:
    ids = ["n1", "n2", "n3"]
    second = by_score("db", ids)[1]
    d = run(
        [AppSpec("db", replicas=1, pinned=True)], [NodeInfo(i) for i in ids], {"db": at(second)}
    )
    assert d.placements == {"db": (second,)}
    assert not d.changed


def test_pinned_instance_on_a_gone_node_is_stranded_with_the_reason() -> None:
    nodes = [NodeInfo("n1", state="down", down_since=0.0), NodeInfo("n2")]
    d = run([AppSpec("db", replicas=1, pinned=True)], nodes, {"db": at("n1")})
    assert d.placements == {"db": ("n1",)}
    (stranded,) = d.stranded
    assert (stranded.app, stranded.node) == ("db", "n1")
    assert "down since 0" in stranded.reason
    assert "grace" in stranded.reason
    assert "pinned" in stranded.reason
    assert not d.changed


def test_drain_that_would_interrupt_pinned_work_is_refused() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    apps = [
        AppSpec("db", pinned=True),
        AppSpec("queue", replicas=1, pinned=True),
        AppSpec("web", replicas=1),
    ]
    placements = {"db": at("n1"), "queue": at("n1"), "web": at("n1")}
    d = run(apps, nodes, placements)
    assert d.refused is not None
    assert d.refused.reason == "drain-would-interrupt-pinned"
    assert [(x.node, x.apps) for x in d.refused.drains] == [("n1", ("db", "queue"))]
    assert "db" in d.refused.message
    assert "queue" in d.refused.message
    # The drain does not happen: n1 keeps its work (and, like a cordoned node, takes none).
    assert d.placements["web"] == ("n1",)
    assert d.placements["queue"] == ("n1",)
    assert d.removals == ()


def test_a_drain_without_pinned_work_goes_ahead() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    apps = [AppSpec("db", pinned=True, retired=True), AppSpec("web", replicas=1)]
    d = run(apps, nodes, {"db": at("n1"), "web": at("n1")})
    assert d.refused is None
    assert d.placements == {"web": ("n2",)}


def test_pinned_apps_still_get_missing_replicas() -> None:
    d = run(
        [AppSpec("db", replicas=2, pinned=True)], [NodeInfo("n1"), NodeInfo("n2")], {"db": at("n1")}
    )
    assert d.placements == {"db": ("n1", "n2")}
    assert d.additions == (("db", "n2"),)


# ------------------------------------------------------- retired, blocked, deleted


@pytest.mark.parametrize("flag", ["retired", "blocked"])
def test_retired_or_blocked_apps_have_no_placement(flag: str) -> None:
    app = AppSpec("web", **{flag: True})  # type: ignore[arg-type]
    d = run([app], [NodeInfo("n1"), NodeInfo("n2")], {"web": at("n1", "n2")})
    assert d.placements == {}
    assert d.removals == (("web", "n1"), ("web", "n2"))
    assert d.additions == ()
    assert d.unplaced == ()


def test_placements_of_deleted_apps_are_removed() -> None:
    d = run([AppSpec("kept", replicas=1)], [NodeInfo("n1")], {"gone": at("n1"), "kept": at("n1")})
    assert d.placements == {"kept": ("n1",)}
    assert d.removals == (("gone", "n1"),)
