"""Unplaced messages, the output's shape, next_placements, and idempotence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from corral.actors.planner import (
    AppSpec,
    Decisions,
    NodeCapacity,
    NodeInfo,
    Placement,
    PlacementUnavailable,
    Policy,
    decisions_to_json,
    next_placements,
    plan,
)

NOW = 10_000.0


def run(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement] | None = None,
    **policy: float,
) -> Decisions:
    return plan(apps, nodes, placements or {}, Policy(**policy), NOW)  # type: ignore[arg-type]


def cap(mem_free: int = 8192) -> NodeCapacity:
    return NodeCapacity(
        memory_mb=16384, memory_free_mb=mem_free, disk_mb=102_400, disk_free_mb=90_000
    )


def messages(d: Decisions) -> dict[str, str]:
    assert all(u.reason == "placement-unavailable" for u in d.unplaced)
    return {u.app: u.message for u in d.unplaced}


# ----------------------------------------------------------------- unplaced


def test_message_counts_nodes_short_of_memory() -> None:
    nodes = [NodeInfo(f"n{i}", capacity=cap()) for i in range(3)]
    d = run([AppSpec("huge", replicas=1, memory_mb=49152)], nodes)
    assert d.placements == {}
    assert messages(d) == {
        "huge": "cannot place huge: of 3 matching node(s): 3 lack 49152 MiB of free memory"
    }


def test_message_names_the_labels_no_node_carries() -> None:
    d = run([AppSpec("eu", selector={"region": "eu-west-1"})], [NodeInfo("n1")])
    assert messages(d) == {
        "eu": "cannot place eu: no node carries the required labels region=eu-west-1"
    }


def test_message_when_every_usable_node_is_unable_to_take_work() -> None:
    nodes = [NodeInfo("c", state="cordoned"), NodeInfo("s", state="suspect"), NodeInfo("u")]
    d = run([AppSpec("demo", memory_mb=64)], nodes, min_usable_fraction=0)
    assert messages(d) == {
        "demo": "cannot place demo: every usable node is cordoned, suspect, "
        "or has not reported its capacity"
    }


def test_message_when_the_matching_nodes_are_down() -> None:
    nodes = [NodeInfo("n1"), NodeInfo("eu1", state="down", down_since=NOW, labels={"r": "eu"})]
    d = run([AppSpec("eu", selector={"r": "eu"})], nodes)
    assert messages(d) == {
        "eu": "cannot place eu: no usable node carries the required labels r=eu "
        "(1 that do are down or have left)"
    }


def test_message_counts_each_cause() -> None:
    nodes = [
        NodeInfo("mem", capacity=cap(mem_free=100)),
        NodeInfo("blind", capacity=NodeCapacity(16384, 16384, 0, 0)),
        NodeInfo("unknown"),
        NodeInfo("cordoned", state="cordoned", capacity=cap()),
    ]
    d = run([AppSpec("db", memory_mb=1024)], nodes)
    assert messages(d) == {
        "db": "cannot place db: of 4 matching node(s): 1 lack 1024 MiB of free memory; "
        "1 report a zero-sized disk; 1 have not reported their capacity; 1 are cordoned"
    }


def test_message_counts_disk_floor_and_memory_as_the_seed_does() -> None:
    def node(name: str, mem_free: int, disk_free: int) -> NodeInfo:
        return NodeInfo(name, capacity=NodeCapacity(16384, mem_free, 102_400, disk_free))

    # The floor of a 100 GiB disk is 10 GiB: 25 GiB free cannot take 20 GiB more.
    nodes = [node("n1", 8192, 25_600), node("n2", 8192, 25_600), node("n3", 1024, 90_000)]
    d = run([AppSpec("logs", replicas=1, memory_mb=4096, disk_mb=20480)], nodes)
    assert messages(d) == {
        "logs": "cannot place logs: of 3 matching node(s): 1 lack 4096 MiB of free memory; "
        "2 would fall below their free-disk floor (10% of the disk, at most 10 GiB) "
        "after reserving 20480 MiB"
    }


def test_no_live_node_counts_the_nodes_by_state() -> None:
    nodes = [NodeInfo("a", state="down"), NodeInfo("b", state="down"), NodeInfo("c", state="left")]
    with pytest.raises(PlacementUnavailable) as info:
        run([AppSpec("web")], nodes)
    assert str(info.value) == (
        "placement-unavailable: no live node at all (3 known node(s): 2 down, 1 left; "
        "none alive, suspect or cordoned); nothing can be placed until a node is up"
    )
    with pytest.raises(PlacementUnavailable, match=r"\(0 known node\(s\); none alive"):
        run([AppSpec("web")], [])


def test_each_unplaced_app_is_reported_once() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2", capacity=cap(mem_free=10))]
    d = run([AppSpec("db", replicas=2, memory_mb=64)], nodes, {"db": Placement(nodes=("n1",))})
    assert [u.app for u in d.unplaced] == ["db"]
    assert d.stranded == ()
    assert d.deferred == ()


# ------------------------------------------------------------------- output


def test_documented_example_output() -> None:
    nodes = [
        NodeInfo(
            "n1",
            labels={"region": "eu"},
            rack="r1",
            datacenter="dc1",
            capacity=NodeCapacity(8192, 8192, 102400, 90000),
        )
    ]
    apps = [AppSpec("shop", replicas="all", selector={"region": "eu"})]
    placements = {"shop": Placement(nodes=("n1",), placed_at={"n1": 900.0})}
    d = plan(apps, nodes, placements, Policy(), 1000.0)
    assert decisions_to_json(d) == {
        "placements": {"shop": ["n1"]},
        "removals": [],
        "additions": [],
        "deferred": [],
        "unplaced": [],
        "stranded": [],
        "refused": None,
        "paused": None,
        "stopped": {},
    }


def test_json_of_every_kind_of_entry() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    apps = [
        AppSpec("db", replicas=1, pinned=True),
        AppSpec("web", replicas=1),
        AppSpec("x", memory_mb=1),
    ]
    placements = {"db": Placement(nodes=("n1",)), "web": Placement(nodes=("n2",))}
    out = decisions_to_json(run(apps, nodes, placements))
    assert out["placements"] == {"db": ["n1"], "web": ["n2"]}
    assert out["refused"] == {
        "reason": "drain-would-interrupt-pinned",
        "message": "drain of n1 refused: it would interrupt pinned app(s) db",
        "drains": [{"node": "n1", "apps": ["db"]}],
    }
    assert out["unplaced"][0]["app"] == "x"
    assert set(out["unplaced"][0]) == {"app", "reason", "message"}
    paused = decisions_to_json(plan(apps, nodes, placements, Policy(), NOW, undecodable=["k"]))
    assert paused["paused"]["keys"] == ["k"]
    assert paused["placements"] == {"db": ["n1"], "web": ["n2"]}


def test_removals_and_additions_are_sorted_pairs() -> None:
    nodes = [NodeInfo(i) for i in ("n3", "n1", "n2")]
    apps = [AppSpec("b", replicas=2), AppSpec("a", replicas="all"), AppSpec("c", retired=True)]
    placements = {"c": Placement(nodes=("n2", "n1"))}
    d = run(apps, nodes, placements)
    assert list(d.additions) == sorted(d.additions)
    assert list(d.removals) == sorted(d.removals) == [("c", "n1"), ("c", "n2")]
    assert list(d.placements) == ["a", "b"]
    assert all(list(v) == sorted(v) for v in d.placements.values())


def test_removals_are_sorted_across_kinds_of_removal() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    apps = [AppSpec("a-moved", replicas=1), AppSpec("z-retired", retired=True)]
    placements = {
        "a-moved": Placement(nodes=("n1",)),
        "z-retired": Placement(nodes=("n2",)),
        "m-deleted": Placement(nodes=("n2",)),
    }
    d = run(apps, nodes, placements)
    assert d.removals == (("a-moved", "n1"), ("m-deleted", "n2"), ("z-retired", "n2"))


# ------------------------------------------------------------ next placements


def test_next_placements_stamps_additions_and_keeps_older_stamps() -> None:
    previous = {"web": Placement(nodes=("n1", "n2"), placed_at={"n1": 5.0, "n2": 6.0})}
    d = Decisions(
        placements={"web": ("n1", "n3")}, removals=(("web", "n2"),), additions=(("web", "n3"),)
    )
    after = next_placements(previous, d, 50.0)
    assert after == {"web": Placement(nodes=("n1", "n3"), placed_at={"n1": 5.0, "n3": 50.0})}


def test_planning_the_output_again_changes_nothing() -> None:
    nodes = [NodeInfo(f"n{i}", rack=f"r{i % 2}", capacity=cap()) for i in range(5)]
    apps = [
        AppSpec("web", replicas=2),
        AppSpec("all"),
        AppSpec("db", replicas=2, memory_mb=1000),
        AppSpec("huge", replicas=1, memory_mb=10**6),
    ]
    first = run(apps, nodes)
    assert first.changed
    again = run(apps, nodes, next_placements({}, first, NOW))
    assert not again.changed
    assert again.placements == first.placements
    assert again.unplaced == first.unplaced
