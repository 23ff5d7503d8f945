"""Declared resources of placed instances count against a node's total across passes:
allocatable = total - reserved by placements - the disk floor; measured free room is a
second check. A pass never gives away room an earlier pass promised."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.actors.planner import (
    AppSpec,
    NodeCapacity,
    NodeInfo,
    Placement,
    Policy,
    allocatable,
    next_placements,
    plan,
    reserved_by_placements,
)

NOW = 100_000.0


def cap(
    mem: int = 8192, mem_free: int = 8192, disk: int = 102_400, free: int = 90_000
) -> NodeCapacity:
    return NodeCapacity(memory_mb=mem, memory_free_mb=mem_free, disk_mb=disk, disk_free_mb=free)


def test_an_instance_not_yet_started_still_holds_its_memory() -> None:
    # The node still reports all its memory free: "a" was placed but has not started.
    nodes = [NodeInfo("n1", capacity=cap(mem=6000, mem_free=6000))]
    first = plan([AppSpec("a", replicas=1, memory_mb=4000)], nodes, {}, Policy(), NOW)
    assert first.placements == {"a": ("n1",)}
    placements = next_placements({}, first, NOW)
    apps = [AppSpec("a", replicas=1, memory_mb=4000), AppSpec("b", replicas=1, memory_mb=4000)]
    second = plan(apps, nodes, placements, Policy(), NOW)
    assert second.placements == {"a": ("n1",)}
    assert [u.app for u in second.unplaced] == ["b"]


def test_an_instance_running_under_its_limit_still_holds_its_disk() -> None:
    nodes = [NodeInfo("n1", capacity=cap(disk=100_000, free=100_000))]
    placements = {"a": Placement(nodes=("n1",))}
    apps = [AppSpec("a", replicas=1, disk_mb=85_000), AppSpec("b", replicas=1, disk_mb=6000)]
    # 100 000 - 85 000 reserved - 10 000 floor = 5 000 allocatable: b does not fit.
    d = plan(apps, nodes, placements, Policy(), NOW)
    assert "b" not in d.placements


def test_outside_pressure_still_takes_work_away() -> None:
    nodes = [NodeInfo("n1", capacity=cap(mem=16384, mem_free=1000))]
    d = plan([AppSpec("a", replicas=1, memory_mb=2000)], nodes, {}, Policy(), NOW)
    assert d.placements == {}


def test_allocatable_is_total_minus_reservations_minus_the_floor() -> None:
    apps = [
        AppSpec("a", memory_mb=512, disk_mb=100),
        AppSpec("b", memory_mb=256),
        AppSpec("gone", memory_mb=999, retired=True),
        AppSpec("plain"),
    ]
    placements = {
        "a": Placement(nodes=("n1", "n2")),
        "b": Placement(nodes=("n1",)),
        "gone": Placement(nodes=("n1",)),
        "plain": Placement(nodes=("n1",)),
    }
    memory, disk = reserved_by_placements(apps, placements)
    assert memory == {"n1": 768, "n2": 512}
    assert disk == {"n1": 100, "n2": 100}
    expected = (4096 - 768, 10 * 199_900 - 102_400)
    assert allocatable(cap(mem=4096, disk=200_000), 768, 100) == expected


SIZES = st.sampled_from([0, 256, 1024, 3000])


@st.composite
def pass_sequences(draw: st.DrawFn) -> tuple[list[NodeInfo], list[list[AppSpec]]]:
    nodes = [
        NodeInfo(
            f"n{i}",
            rack=draw(st.sampled_from([None, "r1", "r2"])),
            capacity=cap(
                mem=draw(st.sampled_from([2048, 4096, 8192])),
                mem_free=draw(st.sampled_from([2048, 4096, 8192])),
                disk=draw(st.sampled_from([20_000, 102_400])),
                free=draw(st.sampled_from([15_000, 20_000, 90_000])),
            ),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    apps: list[AppSpec] = []
    passes: list[list[AppSpec]] = []
    for p in range(draw(st.integers(1, 5))):
        for i in range(draw(st.integers(0, 4))):
            apps.append(
                AppSpec(
                    f"app{p}-{i}",
                    replicas=draw(st.one_of(st.just("all"), st.integers(1, 3))),
                    memory_mb=draw(SIZES),
                    disk_mb=draw(st.sampled_from([0, 500, 4000])),
                )
            )
        passes.append(list(apps))
    return nodes, passes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pass_sequences())
def test_declared_memory_on_a_node_never_exceeds_its_total_across_passes(
    data: tuple[list[NodeInfo], list[list[AppSpec]]],
) -> None:
    # The nodes keep reporting the same measured free room (the new instances have not
    # started yet, or run below their declared size): only declarations protect the node.
    nodes, passes = data
    by_id = {n.id: n for n in nodes}
    placements: dict[str, Placement] = {}
    for apps in passes:
        decisions = plan(apps, nodes, placements, Policy(), NOW)
        placements = next_placements(placements, decisions, NOW)
        memory, disk = reserved_by_placements(apps, placements)
        for node_id, used in memory.items():
            c = by_id[node_id].capacity
            assert c is not None
            assert used <= c.memory_mb
        for node_id, used in disk.items():
            c = by_id[node_id].capacity
            assert c is not None
            assert 10 * (c.disk_mb - used) >= c.disk_floor_x10


# The shrunk examples of the idempotence property: a smaller app planned after a larger one
# frees room on a node; the larger one must see it in the same pass, not the next.
def _replanned(
    apps: list[AppSpec], nodes: list[NodeInfo], placements: dict[str, Placement], policy: Policy
) -> tuple[dict[str, tuple[str, ...]], tuple[tuple[str, str], ...]]:
    first = plan(apps, nodes, placements, policy, NOW)
    second = plan(apps, nodes, next_placements(placements, first, NOW), policy, NOW)
    return dict(first.placements), second.additions


def test_an_all_app_sees_the_room_a_smaller_app_excluded_by_its_selector_frees() -> None:
    full = cap(mem=4096, mem_free=4096, disk=20_000, free=2_500)
    nodes = [NodeInfo("n0"), NodeInfo("n3", capacity=full), NodeInfo("n5")]
    apps = [
        AppSpec("small", replicas="all", selector={"region": "a"}, memory_mb=512),
        AppSpec("big", replicas="all", memory_mb=4096),
    ]
    # No node carries region=a any more: "small" leaves n3, whose 4096 MiB "big" takes now.
    placements = {"small": Placement(nodes=("n0", "n3"), placed_at={"n0": NOW, "n3": NOW})}
    first, again = _replanned(apps, nodes, placements, Policy(disruption_budget=0))
    assert first == {"big": ("n3",)}
    assert again == ()


def test_an_unreplaceable_excluded_instance_frees_its_room_whatever_the_budget() -> None:
    # "small" has one replica and no node to move to: its instances go without asking the
    # disruption budget (0 here), so their room is given back before "big" is placed.
    full = cap(mem=4096, mem_free=4096, disk=20_000, free=2_500)
    nodes = [NodeInfo("n0"), NodeInfo("n1", capacity=full), NodeInfo("n2")]
    apps = [
        AppSpec("small", replicas=1, selector={"region": "a"}, memory_mb=512),
        AppSpec("big", replicas="all", memory_mb=4096),
    ]
    placements = {"small": Placement(nodes=("n0", "n1"))}
    first, again = _replanned(apps, nodes, placements, Policy(disruption_budget=0))
    assert first == {"big": ("n1",)}
    assert again == ()


def test_a_relocation_the_budget_defers_keeps_its_room() -> None:
    # "small" could move from n1 (excluded) to n2, but the budget is 0: it stays on n1,
    # so n1 keeps its 512 MiB reserved and "wide", planned before it, must not count on them.
    nodes = [
        NodeInfo("n1", capacity=cap(mem=4096, mem_free=4096, disk=20_000, free=20_000)),
        NodeInfo("n2", labels={"region": "a"}, capacity=cap(mem=8192, mem_free=8192)),
    ]
    apps = [
        AppSpec("small", replicas=1, selector={"region": "a"}, memory_mb=512),
        AppSpec("wide", replicas="all", memory_mb=3700),
    ]
    placements = {"small": Placement(nodes=("n1",))}
    d = plan(apps, nodes, placements, Policy(disruption_budget=0), NOW)
    assert d.placements["small"] == ("n1",)
    assert [x.node for x in d.deferred] == ["n1"]
    # n1 has 4096 - 512 = 3584 allocatable: "wide" fits only on n2.
    assert d.placements["wide"] == ("n2",)
    # With a budget, the move is sure: n1's room is "wide"'s in the same pass.
    d = plan(apps, nodes, placements, Policy(disruption_budget=1), NOW)
    assert d.placements == {"small": ("n2",), "wide": ("n1", "n2")}
