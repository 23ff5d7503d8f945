"""Ranking (spread, best fit, rendezvous score, node id) and replica counts."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.planner import (
    AppSpec,
    Decisions,
    NodeCapacity,
    NodeInfo,
    Placement,
    Policy,
    plan,
)
from corral.actors.planner import _planner as planner_module
from corral.actors.planner._rank import rendezvous_score

NOW = 10_000.0


def run(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement] | None = None,
    **policy: float,
) -> Decisions:
    return plan(apps, nodes, placements or {}, Policy(**policy), NOW)  # type: ignore[arg-type]


def by_score(app: str, nodes: Sequence[str]) -> list[str]:
    return sorted(
        nodes, key=lambda n: int.from_bytes(rendezvous_score(app, n), "big"), reverse=True
    )


def app_whose_order_starts(prefix: Sequence[str], nodes: Sequence[str]) -> str:
    """The first name app-0, app-1, ... whose rendezvous order starts with ``prefix``."""
    for i in range(100_000):
        name = f"app-{i}"
        if by_score(name, nodes)[: len(prefix)] == list(prefix):
            return name
    raise AssertionError("no such app name")


def cap(mem_free: int, disk_free: int = 90_000) -> NodeCapacity:
    return NodeCapacity(
        memory_mb=16384, memory_free_mb=mem_free, disk_mb=102_400, disk_free_mb=disk_free
    )


# ------------------------------------------------------------- rendezvous score


def test_score_is_sha256_of_name_newline_node_in_utf8() -> None:
    assert rendezvous_score("shop", "n1") == hashlib.sha256(b"shop\nn1").digest()
    assert (
        rendezvous_score("caf\u00e9", "n\u00f8")
        == hashlib.sha256("caf\u00e9\nn\u00f8".encode()).digest()
    )


node_ids = st.lists(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=4),
    min_size=1,
    max_size=40,
    unique=True,
)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=6), node_ids)
def test_keyed_scores_order_as_score_then_node_id(app: str, ids: list[str]) -> None:
    # Ids that are prefixes of one another, or sort differently as UTF-8 and as text,
    # would show up here: the planner orders digest + UTF-8 id bytes, not (score, id).
    keyed = planner_module._keyed_scores(f"{app}\n".encode(), [i.encode() for i in ids])
    keyed.sort(reverse=True)
    expected = sorted(((rendezvous_score(app, i), i) for i in ids), reverse=True)
    assert [(k[:32], k[32:].decode()) for k in keyed] == expected


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=6), node_ids, st.integers(1, 5))
def test_replicas_take_the_top_scores_for_any_node_ids(
    app: str, ids: list[str], replicas: int
) -> None:
    d = run([AppSpec(app, replicas=replicas)], [NodeInfo(i) for i in ids])
    assert d.placements[app] == tuple(sorted(by_score(app, ids)[:replicas]))


def test_apps_without_resources_take_the_highest_scores() -> None:
    ids = [f"n{i}" for i in range(8)]
    nodes = [NodeInfo(i) for i in ids]
    apps = [AppSpec(f"app-{i}", replicas=3) for i in range(20)]
    d = run(apps, nodes)
    for app in apps:
        assert d.placements[app.name] == tuple(sorted(by_score(app.name, ids)[:3]))


def test_order_of_scores_is_big_endian() -> None:
    # Comparing digests as bytes is comparing them as big-endian numbers.
    ids = [f"n{i}" for i in range(50)]
    as_bytes = sorted(ids, key=lambda n: rendezvous_score("x", n), reverse=True)
    assert as_bytes == by_score("x", ids)
    d = run([AppSpec("x", replicas=1)], [NodeInfo(i) for i in ids])
    assert d.placements == {"x": (as_bytes[0],)}


# ------------------------------------------------------------------------ spread


def test_spread_over_racks_comes_before_the_score() -> None:
    racks = {"a1": "r1", "a2": "r1", "b1": "r2", "b2": "r2"}
    name = app_whose_order_starts(["a1", "a2"], list(racks))
    nodes = [NodeInfo(i, rack=r) for i, r in racks.items()]
    d = run([AppSpec(name, replicas=2)], nodes)
    chosen = d.placements[name]
    assert {racks[n] for n in chosen} == {"r1", "r2"}
    assert "a1" in chosen  # the best score still wins inside the spread
    # Without racks it would have been the two best scores.
    flat = run([AppSpec(name, replicas=2)], [NodeInfo(i) for i in racks])
    assert flat.placements[name] == ("a1", "a2")


def test_spread_over_datacenters_comes_after_racks() -> None:
    where = {"n1": ("r1", "d1"), "n2": ("r2", "d1"), "n3": ("r3", "d2")}
    name = app_whose_order_starts(["n1", "n2", "n3"], list(where))
    nodes = [NodeInfo(i, rack=r, datacenter=dc) for i, (r, dc) in where.items()]
    d = run([AppSpec(name, replicas=2)], nodes)
    assert d.placements[name] == ("n1", "n3")


def test_rack_spread_wins_over_datacenter_spread() -> None:
    # After n1 (r1, d1): n2 shares its rack but not its datacenter, n3 the reverse.
    where = {"n1": ("r1", "d1"), "n2": ("r1", "d2"), "n3": ("r2", "d1")}
    name = app_whose_order_starts(["n1", "n2", "n3"], list(where))
    nodes = [NodeInfo(i, rack=r, datacenter=dc) for i, (r, dc) in where.items()]
    d = run([AppSpec(name, replicas=2)], nodes)
    assert d.placements[name] == ("n1", "n3")


def test_spread_counts_instances_already_placed() -> None:
    racks = {"a1": "r1", "a2": "r1", "b1": "r2"}
    name = app_whose_order_starts(["a2", "a1", "b1"], list(racks))
    nodes = [NodeInfo(i, rack=r) for i, r in racks.items()]
    # Pinned keeps a1; the missing replica goes to the other rack despite a2's score.
    d = run([AppSpec(name, replicas=2, pinned=True)], nodes, {name: Placement(nodes=("a1",))})
    assert d.placements[name] == ("a1", "b1")


# ---------------------------------------------------------------------- best fit


def test_apps_with_resources_take_the_best_fit() -> None:
    nodes = [
        NodeInfo("loose", capacity=cap(8000)),
        NodeInfo("tight", capacity=cap(5000)),
        NodeInfo("middle", capacity=cap(6000)),
        NodeInfo("small", capacity=cap(3000)),
    ]
    d = run([AppSpec("db", replicas=1, memory_mb=4000)], nodes)
    assert d.placements == {"db": ("tight",)}


def test_best_fit_on_disk_when_only_disk_is_declared() -> None:
    nodes = [
        NodeInfo("roomy", capacity=cap(1000, disk_free=80_000)),
        NodeInfo("snug", capacity=cap(9000, disk_free=20_000)),
    ]
    d = run([AppSpec("logs", replicas=1, disk_mb=5000)], nodes)
    assert d.placements == {"logs": ("snug",)}


def test_equal_fit_ends_on_the_node_id() -> None:
    nodes = [NodeInfo(i, capacity=cap(5000)) for i in ("n3", "n1", "n2")]
    d = run([AppSpec("db", replicas=2, memory_mb=1000)], nodes)
    assert d.placements == {"db": ("n1", "n2")}


def test_spread_comes_before_best_fit() -> None:
    nodes = [
        NodeInfo("r1-tight", rack="r1", capacity=cap(4100)),
        NodeInfo("r1-tighter", rack="r1", capacity=cap(4050)),
        NodeInfo("r2-loose", rack="r2", capacity=cap(16000)),
    ]
    d = run([AppSpec("db", replicas=2, memory_mb=4000)], nodes)
    assert d.placements == {"db": ("r1-tighter", "r2-loose")}


def test_best_fit_does_not_move_placed_instances() -> None:
    nodes = [NodeInfo("loose", capacity=cap(12000)), NodeInfo("tight", capacity=cap(4100))]
    d = run([AppSpec("db", replicas=1, memory_mb=4000)], nodes, {"db": Placement(nodes=("loose",))})
    assert d.placements == {"db": ("loose",)}
    assert not d.changed


# ---------------------------------------------------------------------- replicas


def test_replicas_all_is_every_eligible_node() -> None:
    nodes = [NodeInfo("n1"), NodeInfo("n2"), NodeInfo("n3", state="cordoned")]
    d = run([AppSpec("agent", replicas="all")], nodes)
    assert d.placements == {"agent": ("n1", "n2")}


def test_replicas_n_is_the_top_n() -> None:
    ids = ["n1", "n2", "n3", "n4"]
    d = run([AppSpec("web", replicas=2)], [NodeInfo(i) for i in ids])
    assert d.placements == {"web": tuple(sorted(by_score("web", ids)[:2]))}


def test_fewer_eligible_nodes_than_replicas_places_what_fits_and_reports_it() -> None:
    d = run([AppSpec("web", replicas=3)], [NodeInfo("n1"), NodeInfo("n2")])
    assert d.placements == {"web": ("n1", "n2")}
    (short,) = d.unplaced
    assert short.app == "web"
    assert short.reason == "placement-unavailable"
    assert short.message == (
        "cannot place 1 of 3 replica(s) of web: of 2 matching node(s): 2 already run it"
    )


def test_scale_down_keeps_the_best_ranked() -> None:
    ids = ["n1", "n2", "n3", "n4"]
    order = by_score("web", ids)
    d = run(
        [AppSpec("web", replicas=1)],
        [NodeInfo(i) for i in ids],
        {"web": Placement(nodes=tuple(ids))},
    )
    assert d.placements == {"web": (order[0],)}
    assert d.removals == tuple(sorted(("web", n) for n in order[1:]))
    assert d.deferred == ()


def test_scale_up_is_not_a_relocation() -> None:
    ids = ["n1", "n2", "n3"]
    order = by_score("web", ids)
    d = run(
        [AppSpec("web", replicas=3)],
        [NodeInfo(i) for i in ids],
        {"web": Placement(nodes=(order[0],))},
        disruption_budget=0,
    )
    assert d.placements == {"web": ("n1", "n2", "n3")}
    assert d.deferred == ()
