"""Drains of nodes holding pinned work: refused unless forced; a forced drain stops the
pinned instances, never starts them elsewhere, and starts them again when it ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from corral.actors.planner import (
    AppSpec,
    Decisions,
    InvalidPlanInput,
    NodeCapacity,
    NodeInfo,
    Placement,
    Policy,
    decisions_to_json,
    next_placements,
    parse_plan_document,
    plan,
)

NOW = 10_000.0
CAP = NodeCapacity(memory_mb=8192, memory_free_mb=8192, disk_mb=100_000, disk_free_mb=90_000)


def run(
    apps: Sequence[AppSpec], nodes: Sequence[NodeInfo], placements: Mapping[str, Placement]
) -> Decisions:
    return plan(apps, nodes, placements, Policy(), NOW)


def forced(node_id: str, **fields: object) -> NodeInfo:
    return NodeInfo(node_id, state="left", drain_forced=True, **fields)  # type: ignore[arg-type]


def at(*nodes: str) -> Placement:
    return Placement(nodes=nodes)


APPS = [
    AppSpec("db", replicas=1, pinned=True),
    AppSpec("logs", replicas="all"),
    AppSpec("web", replicas=1),
]
BEFORE = {"db": at("n1"), "logs": at("n1", "n2", "n3"), "web": at("n1")}


def test_an_unforced_drain_of_pinned_work_is_refused_and_the_node_keeps_everything() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2"), NodeInfo("n3")]
    d = run(APPS, nodes, BEFORE)
    assert d.refused is not None
    assert d.refused.reason == "drain-would-interrupt-pinned"
    assert [(r.node, r.apps) for r in d.refused.drains] == [("n1", ("db",))]
    assert d.removals == ()
    assert d.stopped == {}


def test_a_forced_drain_empties_the_node_and_stops_pinned_work_without_replacing_it() -> None:
    nodes = [forced("n1"), NodeInfo("n2"), NodeInfo("n3")]
    d = run(APPS, nodes, BEFORE)
    assert d.refused is None
    assert "n1" not in {node for nodes_ in d.placements.values() for node in nodes_}
    assert d.placements["web"] in (("n2",), ("n3",))  # moved
    assert d.placements["logs"] == ("n2", "n3")
    assert "db" not in d.placements  # stopped, and started nowhere else
    assert ("db", "n1") in d.removals
    assert not any(app == "db" for app, _ in d.additions)
    assert d.stopped == {"db": ("n1",)}
    (stranded,) = d.stranded
    assert (stranded.app, stranded.node) == ("db", "n1")
    assert stranded.reason.startswith(
        "the forced drain of n1 stopped it; db is pinned, so it is not started elsewhere"
    )
    assert d.unplaced == ()  # it is accounted for (stranded), not pending


def test_later_passes_keep_it_stopped_and_write_nothing() -> None:
    nodes = [forced("n1"), NodeInfo("n2"), NodeInfo("n3")]
    first = run(APPS, nodes, BEFORE)
    placements = next_placements(BEFORE, first, NOW)
    assert placements["db"] == Placement(nodes=(), stopped=("n1",))
    for _ in range(3):
        again = run(APPS, nodes, placements)
        assert not again.changed
        assert again.stopped == {"db": ("n1",)}
        assert [(s.app, s.node) for s in again.stranded] == [("db", "n1")]
        placements = next_placements(placements, again, NOW)


def test_it_starts_on_its_own_node_again_once_the_drain_ends() -> None:
    placements = {"db": Placement(nodes=(), stopped=("n1",))}
    apps = [AppSpec("db", replicas=1, pinned=True)]
    d = run(apps, [NodeInfo("n1"), NodeInfo("n2")], placements)
    assert d.placements == {"db": ("n1",)}
    assert d.additions == (("db", "n1"),)
    assert d.stopped == {}
    assert d.stranded == ()


def test_a_node_that_cannot_take_it_back_yet_keeps_it_stopped_and_says_why() -> None:
    placements = {"db": Placement(nodes=(), stopped=("n1",))}
    apps = [AppSpec("db", replicas=1, pinned=True)]
    d = run(apps, [NodeInfo("n1", state="cordoned"), NodeInfo("n2")], placements)
    assert d.placements == {}
    assert d.stopped == {"db": ("n1",)}
    (stranded,) = d.stranded
    assert stranded.reason.endswith(
        "it starts there again once it can, but n1 is cordoned and takes no work"
    )
    gone = run(apps, [NodeInfo("n2")], placements)
    assert gone.stopped == {"db": ("n1",)}
    assert "n1 is absent" in gone.stranded[0].reason


def test_unpinning_forgets_the_stopped_instance_and_places_it_as_usual() -> None:
    placements = {"db": Placement(nodes=(), stopped=("n1",))}
    d = run([AppSpec("db", replicas=1)], [forced("n1"), NodeInfo("n2")], placements)
    assert d.placements == {"db": ("n2",)}
    assert d.stopped == {}


def test_with_two_replicas_the_other_instance_stays_and_none_is_added() -> None:
    apps = [AppSpec("db", replicas=2, pinned=True)]
    nodes = [forced("n1"), NodeInfo("n2"), NodeInfo("n3")]
    d = run(apps, nodes, {"db": at("n1", "n2")})
    assert d.placements == {"db": ("n2",)}
    assert d.removals == (("db", "n1"),)
    assert d.additions == ()
    assert d.stopped == {"db": ("n1",)}
    assert d.unplaced == ()


@pytest.mark.parametrize("replicas", [1, "all"])
def test_resource_apps_are_stopped_too_and_come_back_when_there_is_room(
    replicas: int | str,
) -> None:
    apps = [AppSpec("db", replicas=replicas, memory_mb=1024, pinned=True)]  # type: ignore[arg-type]
    nodes = [forced("n1", capacity=CAP), NodeInfo("n2", capacity=CAP)]
    d = run(apps, nodes, {"db": at("n1", "n2")} if replicas == "all" else {"db": at("n1")})
    assert d.stopped == {"db": ("n1",)}
    assert ("db", "n1") in d.removals
    assert not any(node == "n1" for _, node in d.additions)
    if replicas == 1:
        assert d.placements == {}
        assert d.additions == ()
    placements = next_placements({}, d, NOW)
    # The drain ends, but n1 is full: it stays stopped; once there is room, it is back.
    full = NodeCapacity(memory_mb=8192, memory_free_mb=100, disk_mb=100_000, disk_free_mb=90_000)
    stuck = run(apps, [NodeInfo("n1", capacity=full), NodeInfo("n2", capacity=CAP)], placements)
    assert stuck.stopped == {"db": ("n1",)}
    assert "n1 lacks the room db needs" in stuck.stranded[0].reason
    back = run(apps, [NodeInfo("n1", capacity=CAP), NodeInfo("n2", capacity=CAP)], placements)
    assert ("db", "n1") in back.additions
    assert back.stopped == {}


def test_only_a_node_that_left_can_be_force_drained() -> None:
    with pytest.raises(InvalidPlanInput) as info:
        NodeInfo("n1", drain_forced=True)
    assert info.value.field == "nodes[n1].drain_forced"
    with pytest.raises(InvalidPlanInput, match="stopped"):
        Placement(nodes=("n1",), stopped=("n1",))


# ------------------------------------------------------------------ the document


def test_the_document_accepts_a_forced_drain_and_stopped_instances() -> None:
    doc = {
        "now": NOW,
        "nodes": [{"id": "n1", "drain": "forced"}, {"id": "n2", "state": "left"}, {"id": "n3"}],
        "apps": [{"name": "db", "replicas": 1, "pinned": True}],
        "placements": {"db": {"nodes": [], "stopped": ["n1"]}},
    }
    data = parse_plan_document(doc)
    assert data.nodes[0] == forced("n1")
    assert data.nodes[1] == NodeInfo("n2", state="left")
    assert data.placements["db"] == Placement(nodes=(), stopped=("n1",))
    out = decisions_to_json(plan(data.apps, data.nodes, data.placements, data.policy, data.now))
    assert out["stopped"] == {"db": ["n1"]}
    assert out["placements"] == {}


@pytest.mark.parametrize(
    ("node", "placement", "field"),
    [
        ({"id": "n1", "drain": "yes"}, {}, "nodes[0].drain"),
        ({"id": "n1", "drain": "forced", "state": "alive"}, {}, "nodes[0].drain"),
        ({"id": "n1"}, {"nodes": ["n1"], "stopped": ["n1"]}, "placements.db.stopped[0]"),
        ({"id": "n1"}, {"stopped": "n1"}, "placements.db.stopped"),
    ],
)
def test_the_document_names_a_bad_drain_or_stopped_field(
    node: dict[str, object], placement: dict[str, object], field: str
) -> None:
    doc = {"now": 0, "nodes": [node], "placements": {"db": placement}}
    with pytest.raises(InvalidPlanInput) as info:
        parse_plan_document(doc)
    assert info.value.field == field


def test_a_cooldown_deferral_says_until_when() -> None:
    ranked = run([AppSpec("web", replicas=1)], [NodeInfo(i) for i in ("a", "b", "c")], {})
    (best,) = ranked.placements["web"]
    other = next(i for i in ("a", "b", "c") if i != best)
    placements = {"web": Placement(nodes=(other,), placed_at={other: NOW - 100})}
    d = plan(
        [AppSpec("web", replicas=1)],
        [NodeInfo(i) for i in ("a", "b", "c")],
        placements,
        Policy(cooldown_s=600),
        NOW,
    )
    (deferred,) = d.deferred
    assert deferred.until == NOW - 100 + 600
    assert decisions_to_json(d)["deferred"][0]["until"] == NOW + 500
    budget = plan(
        [AppSpec("web", replicas=1)],
        [NodeInfo(i) for i in ("a", "b", "c")],
        {"web": Placement(nodes=(other,), placed_at={other: NOW - 10_000})},
        Policy(disruption_budget=0),
        NOW,
    )
    assert [d.until for d in budget.deferred] == [None]
