"""Eligibility: node states, selectors, capacity, one instance per node."""

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
    plan,
)

NOW = 10_000.0


def run(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement] | None = None,
    now: float = NOW,
    **policy: float,
) -> Decisions:
    return plan(apps, nodes, placements or {}, Policy(**policy), now)  # type: ignore[arg-type]


def cap(mem_free: int = 8192, disk_free: int = 90_000, disk: int = 102_400) -> NodeCapacity:
    return NodeCapacity(
        memory_mb=16384, memory_free_mb=mem_free, disk_mb=disk, disk_free_mb=disk_free
    )


def at(*nodes: str) -> Placement:
    return Placement(nodes=nodes)


# ------------------------------------------------------------------ node states


def test_alive_node_takes_new_work() -> None:
    d = run([AppSpec("web", replicas=1)], [NodeInfo("n1")])
    assert d.placements == {"web": ("n1",)}
    assert d.additions == (("web", "n1"),)


@pytest.mark.parametrize("state", ["suspect", "cordoned"])
def test_suspect_and_cordoned_keep_work_but_take_none(state: str) -> None:
    nodes = [NodeInfo("n1", state=state), NodeInfo("n2")]  # type: ignore[arg-type]
    d = run(
        [AppSpec("kept", replicas=1), AppSpec("new", replicas="all")],
        nodes,
        {"kept": at("n1")},
    )
    assert d.placements["kept"] == ("n1",)
    assert d.placements["new"] == ("n2",)
    assert ("kept", "n1") not in d.removals


def test_down_node_keeps_work_within_grace_then_loses_it() -> None:
    apps = [AppSpec("web", replicas=1)]
    within = [NodeInfo("n1", state="down", down_since=NOW - 299), NodeInfo("n2")]
    d = run(apps, within, {"web": at("n1")}, grace_period_s=300)
    assert d.placements == {"web": ("n1",)}
    assert not d.changed

    lapsed = [NodeInfo("n1", state="down", down_since=NOW - 300), NodeInfo("n2")]
    d = run(apps, lapsed, {"web": at("n1")}, grace_period_s=300)
    assert d.placements == {"web": ("n2",)}
    assert d.removals == (("web", "n1"),)
    assert d.additions == (("web", "n2"),)


def test_down_node_takes_no_new_work() -> None:
    nodes = [NodeInfo("n1", state="down", down_since=NOW), NodeInfo("n2")]
    d = run([AppSpec("web", replicas="all")], nodes)
    assert d.placements == {"web": ("n2",)}


def test_left_node_keeps_nothing() -> None:
    nodes = [NodeInfo("n1", state="left"), NodeInfo("n2")]
    d = run([AppSpec("web", replicas=1)], nodes, {"web": at("n1")})
    assert d.placements == {"web": ("n2",)}
    assert d.removals == (("web", "n1"),)


def test_instance_on_unknown_node_is_replaced() -> None:
    d = run([AppSpec("web", replicas=1)], [NodeInfo("n2")], {"web": at("ghost")})
    assert d.placements == {"web": ("n2",)}
    assert d.removals == (("web", "ghost"),)


def test_no_live_node_at_all_fails_the_pass() -> None:
    nodes = [NodeInfo("n1", state="down", down_since=NOW), NodeInfo("n2", state="left")]
    with pytest.raises(PlacementUnavailable, match="placement-unavailable") as info:
        run([AppSpec("web")], nodes)
    assert info.value.code == "placement-unavailable"
    with pytest.raises(PlacementUnavailable):
        run([AppSpec("web")], [])


def test_a_suspect_node_alone_is_live() -> None:
    d = run([AppSpec("web", replicas=1)], [NodeInfo("n1", state="suspect")], min_usable_fraction=0)
    assert d.placements == {}
    assert d.unplaced[0].app == "web"


# -------------------------------------------------------------------- selectors


def test_selector_is_and_over_exact_values() -> None:
    nodes = [
        NodeInfo("both", labels={"region": "eu", "tier": "fast", "extra": "x"}),
        NodeInfo("region-only", labels={"region": "eu", "tier": "slow"}),
        NodeInfo("other", labels={"region": "us", "tier": "fast"}),
        NodeInfo("bare"),
    ]
    d = run([AppSpec("shop", selector={"region": "eu", "tier": "fast"})], nodes)
    assert d.placements == {"shop": ("both",)}


@pytest.mark.parametrize("selector", [None, {}])
def test_absent_or_empty_selector_selects_every_node(selector: dict[str, str] | None) -> None:
    nodes = [NodeInfo("labelled", labels={"a": "b"}), NodeInfo("bare")]
    app = AppSpec("shop") if selector is None else AppSpec("shop", selector=selector)
    d = run([app], nodes)
    assert d.placements == {"shop": ("bare", "labelled")}


def test_node_without_labels_matches_only_empty_selectors() -> None:
    nodes = [NodeInfo("bare"), NodeInfo("eu", labels={"region": "eu"})]
    d = run([AppSpec("shop", selector={"region": "eu"})], nodes)
    assert d.placements == {"shop": ("eu",)}


def test_selector_change_moves_an_instance_off_an_excluded_node() -> None:
    nodes = [NodeInfo("n1", labels={"region": "us"}), NodeInfo("n2", labels={"region": "eu"})]
    d = run([AppSpec("shop", replicas=1, selector={"region": "eu"})], nodes, {"shop": at("n1")})
    assert d.placements == {"shop": ("n2",)}
    assert d.removals == (("shop", "n1"),)


# --------------------------------------------------------------------- capacity


def test_disk_floor_is_ten_percent_of_the_disk() -> None:
    # A 50 GiB disk keeps a 5 GiB floor.
    app = AppSpec("data", replicas=1, disk_mb=1000)
    fits = [NodeInfo("n1", capacity=cap(disk=51_200, disk_free=5_120 + 1000))]
    assert run([app], fits).placements == {"data": ("n1",)}
    short = [NodeInfo("n1", capacity=cap(disk=51_200, disk_free=5_120 + 999))]
    d = run([app], short)
    assert d.placements == {}
    assert (
        "1 would fall below their free-disk floor (10% of the disk, at most 10 GiB) "
        "after reserving 1000 MiB"
    ) in d.unplaced[0].message


def test_disk_floor_is_capped_at_ten_gib() -> None:
    app = AppSpec("data", replicas=1, disk_mb=1000)
    # A 1 TiB disk would have a 100 GiB floor at 10 %; the cap keeps it at 10 GiB.
    fits = [NodeInfo("n1", capacity=cap(disk=1_048_576, disk_free=10_240 + 1000))]
    assert run([app], fits).placements == {"data": ("n1",)}
    short = [NodeInfo("n1", capacity=cap(disk=1_048_576, disk_free=10_240 + 999))]
    assert run([app], short).placements == {}


def test_floor_applies_to_apps_declaring_no_disk() -> None:
    app = AppSpec("web", replicas=1)
    at_floor = [NodeInfo("n1", capacity=cap(disk=100_000, disk_free=10_000))]
    assert run([app], at_floor).placements == {"web": ("n1",)}
    below = [NodeInfo("n1", capacity=cap(disk=100_000, disk_free=9_999))]
    d = run([app], below)
    assert d.placements == {}
    assert "1 are at their free-disk floor (10% of the disk, at most 10 GiB)" in (
        d.unplaced[0].message
    )


def test_memory_must_fit_in_free_memory() -> None:
    app = AppSpec("big", replicas=1, memory_mb=4096)
    assert run([app], [NodeInfo("n1", capacity=cap(mem_free=4096))]).placements == {"big": ("n1",)}
    assert run([app], [NodeInfo("n1", capacity=cap(mem_free=4095))]).placements == {}


def test_capacity_reserved_earlier_in_the_pass_counts() -> None:
    nodes = [NodeInfo("n1", capacity=cap(mem_free=6000))]
    apps = [AppSpec("a", replicas=1, memory_mb=4000), AppSpec("b", replicas=1, memory_mb=4000)]
    d = run(apps, nodes)
    assert d.placements == {"a": ("n1",)}
    assert [u.app for u in d.unplaced] == ["b"]
    assert "1 lack 4000 MiB of free memory" in d.unplaced[0].message


def test_disk_reserved_earlier_in_the_pass_counts() -> None:
    nodes = [NodeInfo("n1", capacity=cap(disk=100_000, disk_free=10_000 + 3000))]
    apps = [AppSpec("a", replicas=1, disk_mb=2000), AppSpec("b", replicas=1, disk_mb=2000)]
    d = run(apps, nodes)
    assert d.placements == {"a": ("n1",)}
    assert "free-disk floor (10% of the disk, at most 10 GiB) after reserving 2000 MiB" in (
        d.unplaced[0].message
    )


def test_existing_instances_reserve_nothing_again() -> None:
    # The node's free memory already reflects what runs there.
    nodes = [NodeInfo("n1", capacity=cap(mem_free=4000))]
    apps = [AppSpec("a", replicas=1, memory_mb=4000), AppSpec("b", replicas=1, memory_mb=4000)]
    d = run(apps, nodes, {"a": at("n1")})
    assert d.placements == {"a": ("n1",), "b": ("n1",)}


def test_zero_sized_disk_takes_no_work() -> None:
    nodes = [NodeInfo("blind", capacity=cap(disk=0, disk_free=0)), NodeInfo("n2")]
    d = run([AppSpec("web"), AppSpec("data", disk_mb=1)], nodes)
    assert d.placements == {"web": ("n2",)}
    assert "1 report a zero-sized disk" in d.unplaced[0].message


def test_node_without_capacity_takes_only_apps_declaring_no_resources() -> None:
    nodes = [NodeInfo("unreported")]
    d = run([AppSpec("plain"), AppSpec("sized", memory_mb=1)], nodes)
    assert d.placements == {"plain": ("unreported",)}
    assert d.unplaced[0].app == "sized"


def test_at_most_one_instance_per_node() -> None:
    d = run([AppSpec("web", replicas=3)], [NodeInfo("n1"), NodeInfo("n2")])
    assert d.placements == {"web": ("n1", "n2")}
    with pytest.raises(ValueError, match="one instance per node"):
        Placement(nodes=("n1", "n1"))
