"""A resource change (a redeploy with another ``--memory-mb`` / ``--disk-mb``) is placed
like a new app: it fits where the instance runs, or the instance is moved, or the app is
left unplaced with the reason; a node is never over-committed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.actors.planner import (
    AppSpec,
    InvalidPlanInput,
    NodeCapacity,
    NodeInfo,
    Placement,
    Policy,
    allocatable,
    next_placements,
    parse_plan_document,
    plan,
    plan_input,
    reserved_by_placements,
)

NOW = 100_000.0
#: Every brake on: a fresh placement, a long cooldown, no relocation allowed.
BRAKES = Policy(cooldown_s=600.0, disruption_budget=0)


def cap(mem: int = 8192, disk: int = 102_400) -> NodeCapacity:
    return NodeCapacity(memory_mb=mem, memory_free_mb=mem, disk_mb=disk, disk_free_mb=disk)


def nodes(*ids: str, mem: int = 8192) -> list[NodeInfo]:
    return [NodeInfo(i, capacity=cap(mem)) for i in ids]


def placed(node: str, reserved: tuple[int, int], *, placed_at: float = NOW - 10) -> Placement:
    return Placement(nodes=(node,), placed_at={node: placed_at}, reserved=reserved)


def committed_memory(
    apps: Sequence[AppSpec], placements: Mapping[str, Placement]
) -> dict[str, int]:
    return reserved_by_placements(apps, placements)[0]


def test_a_larger_size_that_fits_where_it_runs_keeps_it_there() -> None:
    apps = [AppSpec("web", replicas=1, memory_mb=3000), AppSpec("db", replicas=1, memory_mb=4096)]
    placements = {"web": placed("n1", (1024, 0)), "db": placed("n1", (4096, 0))}
    d = plan(apps, nodes("n1", "n2"), placements, BRAKES, NOW)
    assert d.placements == {"db": ("n1",), "web": ("n1",)}
    assert not d.changed
    assert d.unplaced == ()
    after = next_placements(placements, d, NOW, apps)
    assert after["web"].reserved == (3000, 0)
    assert committed_memory(apps, after) == {"n1": 7096}


def test_a_larger_size_that_does_not_fit_moves_whatever_the_brakes() -> None:
    apps = [AppSpec("web", replicas=1, memory_mb=5000), AppSpec("db", replicas=1, memory_mb=4096)]
    placements = {"web": placed("n1", (1024, 0)), "db": placed("n1", (4096, 0))}
    d = plan(apps, nodes("n1", "n2"), placements, BRAKES, NOW)
    # 8192 - 4096 (db) = 4096 < 5000 on n1: web goes to n2, in this pass, although it was
    # placed 10 s ago and the budget allows no relocation.
    assert d.placements == {"db": ("n1",), "web": ("n2",)}
    assert d.removals == (("web", "n1"),)
    assert d.additions == (("web", "n2"),)
    assert d.deferred == ()
    after = next_placements(placements, d, NOW, apps)
    assert committed_memory(apps, after) == {"n1": 4096, "n2": 5000}


def test_a_size_no_node_can_hold_leaves_the_app_unplaced_with_the_reason() -> None:
    apps = [AppSpec("web", replicas=1, memory_mb=999_999)]
    placements = {"web": placed("n1", (1024, 0))}
    d = plan(apps, nodes("n1", "n2", "n3", mem=247_779), placements, Policy(), NOW)
    assert d.placements == {}
    assert d.removals == (("web", "n1"),)
    (unplaced,) = d.unplaced
    assert unplaced.reason == "placement-unavailable"
    assert unplaced.message == (
        "cannot place web: of 3 matching node(s): 3 lack 999999 MiB of free memory"
    )
    after = next_placements(placements, d, NOW, apps)
    assert committed_memory(apps, after) == {}


def test_the_committed_memory_before_the_pass_is_what_was_placed() -> None:
    # What `corral node ls` shows between the redeploy and the pass: the old size.
    apps = [AppSpec("web", replicas=1, memory_mb=999_999)]
    placements = {"web": placed("n1", (1024, 0))}
    assert committed_memory(apps, placements) == {"n1": 1024}
    mem, _ = allocatable(cap(247_779), 1024, 0)
    assert mem == 246_755


def test_one_replica_moves_and_the_other_grows_in_place() -> None:
    apps = [
        AppSpec("web", replicas=2, memory_mb=3000),
        AppSpec("db", replicas=1, memory_mb=6000),
    ]
    placements = {
        "web": Placement(nodes=("n1", "n2"), reserved=(1000, 0)),
        "db": placed("n1", (6000, 0)),
    }
    d = plan(apps, nodes("n1", "n2", "n3"), placements, BRAKES, NOW)
    assert d.placements["web"] == ("n2", "n3")
    assert d.removals == (("web", "n1"),)
    assert d.additions == (("web", "n3"),)


def test_a_smaller_size_always_stays() -> None:
    # n1 is over-committed by something else (its total shrank): a shrink still stays.
    apps = [AppSpec("web", replicas=1, memory_mb=512), AppSpec("db", replicas=1, memory_mb=4096)]
    placements = {"web": placed("n1", (1024, 0)), "db": placed("n1", (4096, 0))}
    d = plan(apps, nodes("n1", "n2", mem=4096), placements, BRAKES, NOW)
    assert d.placements == {"db": ("n1",), "web": ("n1",)}
    assert not d.changed


def test_a_larger_disk_that_would_cross_the_floor_moves() -> None:
    apps = [AppSpec("logs", replicas=1, disk_mb=50_000)]
    placements = {"logs": placed("n1", (0, 1000))}
    small = NodeInfo("n1", capacity=cap(disk=40_000))
    big = NodeInfo("n2", capacity=cap(disk=1_000_000))
    d = plan(apps, [small, big], placements, BRAKES, NOW)
    assert d.placements == {"logs": ("n2",)}


def test_an_all_app_that_grows_past_a_node_leaves_only_that_node() -> None:
    apps = [AppSpec("agent", memory_mb=3000), AppSpec("db", replicas=1, memory_mb=6000)]
    placements = {
        "agent": Placement(nodes=("n1", "n2"), reserved=(500, 0)),
        "db": placed("n1", (6000, 0)),
    }
    d = plan(apps, nodes("n1", "n2"), placements, BRAKES, NOW)
    assert d.placements["agent"] == ("n2",)
    assert d.removals == (("agent", "n1"),)
    assert d.unplaced == ()  # "all" runs on every node that can take it


def test_a_pinned_app_that_no_longer_fits_stops_on_its_node_and_says_why() -> None:
    apps = [
        AppSpec("db", replicas=1, memory_mb=6000, pinned=True),
        AppSpec("cache", replicas=1, memory_mb=4096),
    ]
    placements = {"db": placed("n1", (2000, 0)), "cache": placed("n1", (4096, 0))}
    d = plan(apps, nodes("n1", "n2"), placements, Policy(), NOW)
    assert "db" not in d.placements  # not started elsewhere: it is pinned
    assert d.removals == (("db", "n1"),)
    assert d.stopped == {"db": ("n1",)}
    (stranded,) = d.stranded
    assert stranded.reason == (
        "stopped on n1; db is pinned, so it is not started elsewhere; it starts there again "
        "once it can, but n1 lacks the room db needs (6000 MiB of memory, 4096 MiB left)"
    )
    # Once the cache is gone it starts there again, at its new size.
    later = next_placements(placements, d, NOW, apps)
    del later["cache"]
    again = plan(apps[:1], nodes("n1", "n2"), later, Policy(), NOW)
    assert again.placements == {"db": ("n1",)}
    assert again.additions == (("db", "n1"),)


def test_relocations_refused_for_the_pass_still_never_over_commit() -> None:
    apps = [AppSpec("web", replicas=1, memory_mb=5000), AppSpec("db", replicas=1, memory_mb=4096)]
    placements = {"web": placed("n1", (1024, 0)), "db": placed("n1", (4096, 0))}
    views = [*nodes("n1", "n2"), NodeInfo("n3", state="down"), NodeInfo("n4", state="down")]
    d = plan(apps, views, placements, Policy(min_usable_fraction=0.9), NOW)
    assert d.refused is not None
    assert d.placements == {"db": ("n1",), "web": ("n2",)}  # new work is still placed


def test_an_unrecorded_size_is_the_declared_one() -> None:
    # A placement written before the size was recorded: nothing to compare, it stays.
    apps = [AppSpec("web", replicas=1, memory_mb=2048)]
    d = plan(apps, nodes("n1"), {"web": Placement(nodes=("n1",))}, BRAKES, NOW)
    assert d.placements == {"web": ("n1",)}
    assert not d.changed


# ------------------------------------------------------------------------ properties

SIZES = st.sampled_from([0, 512, 2048, 5000, 9000])
DISKS = st.sampled_from([0, 1000, 30_000])


@st.composite
def resize_sequences(
    draw: st.DrawFn,
) -> tuple[list[NodeInfo], list[list[AppSpec]], Policy]:
    node_list = [
        NodeInfo(
            f"n{i}",
            state=draw(st.sampled_from(["alive", "alive", "alive", "cordoned", "suspect"])),
            labels=draw(st.sampled_from([{}, {"tier": "a"}])),
            capacity=NodeCapacity(
                memory_mb=(mem := draw(st.sampled_from([4096, 8192, 16384]))),
                memory_free_mb=draw(st.sampled_from([mem, mem // 2])),
                disk_mb=(disk := draw(st.sampled_from([40_000, 102_400]))),
                disk_free_mb=disk,
            ),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    names = [f"app{i}" for i in range(draw(st.integers(1, 5)))]
    passes = []
    for _ in range(draw(st.integers(2, 5))):
        passes.append(
            [
                AppSpec(
                    name,
                    replicas=draw(st.one_of(st.just("all"), st.integers(1, 3))),
                    selector=draw(st.sampled_from([{}, {}, {"tier": "a"}])),
                    memory_mb=draw(SIZES),
                    disk_mb=draw(DISKS),
                    pinned=draw(st.integers(0, 4)) == 0,
                )
                for name in names
            ]
        )
    policy = Policy(
        cooldown_s=draw(st.sampled_from([0.0, 600.0])),
        disruption_budget=draw(st.sampled_from([0, 1, 5])),
    )
    return node_list, passes, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resize_sequences())
def test_committed_resources_never_exceed_a_node_across_resource_changes(
    data: tuple[list[NodeInfo], list[list[AppSpec]], Policy],
) -> None:
    # Every pass redeclares every app's size (and replicas, selector, pinning); the
    # output applied is what the instances then reserve. Measured free room stays as
    # reported (nothing has started yet): only what is recorded protects the node.
    node_list, passes, policy = data
    by_id = {n.id: n for n in node_list}
    placements: dict[str, Placement] = {}
    for apps in passes:
        decisions = plan(apps, node_list, placements, policy, NOW)
        placements = next_placements(placements, decisions, NOW, apps)
        memory, disk = reserved_by_placements(apps, placements)
        for node_id in memory.keys() | disk.keys():
            c = by_id[node_id].capacity
            assert c is not None
            mem, disk10 = allocatable(c, memory.get(node_id, 0), disk.get(node_id, 0))
            assert mem >= 0, (node_id, memory, decisions)
            assert disk10 >= 0, (node_id, disk, decisions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resize_sequences(), st.data())
def test_a_resource_change_that_fits_keeps_the_app_where_it_is(
    data: tuple[list[NodeInfo], list[list[AppSpec]], Policy], draw: st.DataObject
) -> None:
    # Settle the first pass's apps, then change one app's size and nothing else.
    node_list, passes, policy = data
    apps = passes[0]
    placements = next_placements({}, plan(apps, node_list, {}, policy, NOW), NOW, apps)
    settled = plan(apps, node_list, placements, policy, NOW)
    placements = next_placements(placements, settled, NOW, apps)
    target = draw.draw(st.sampled_from(apps))
    before = placements.get(target.name)
    if before is None or not before.nodes or not target.declares_resources:
        return
    resized = AppSpec(
        target.name,
        replicas=target.replicas,
        selector=target.selector,
        memory_mb=draw.draw(SIZES.filter(bool)),
        disk_mb=draw.draw(DISKS),
        pinned=target.pinned,
    )
    changed = [resized if a.name == target.name else a for a in apps]
    by_id = {n.id: n for n in node_list}
    memory, disk = reserved_by_placements(apps, placements)
    grow_mem = resized.memory_mb - target.memory_mb
    grow_disk = resized.disk_mb - target.disk_mb

    def fits(node_id: str) -> bool:
        node = by_id[node_id]
        c = node.capacity
        assert c is not None
        if grow_mem <= 0 and grow_disk <= 0:
            return True
        if node.state != "alive":
            return False
        mem, disk10 = allocatable(c, memory.get(node_id, 0), disk.get(node_id, 0))
        free_mem, free_disk10 = c.memory_free_mb, 10 * c.disk_free_mb - c.disk_floor_x10
        return (grow_mem <= 0 or min(mem, free_mem) >= grow_mem) and (
            grow_disk <= 0 or min(disk10, free_disk10) >= 10 * grow_disk
        )

    decisions = plan(changed, node_list, placements, policy, NOW)
    after = set(decisions.placements.get(target.name, ()))
    for node_id in before.nodes:
        if fits(node_id):
            assert node_id in after, (node_id, decisions)


def test_a_plan_document_names_what_a_placement_reserves() -> None:
    document = {
        "now": NOW,
        "nodes": [
            {
                "id": "n1",
                "capacity": {
                    "memory_mb": 8192,
                    "memory_free_mb": 8192,
                    "disk_mb": 102_400,
                    "disk_free_mb": 102_400,
                },
            },
        ],
        "apps": [{"name": "web", "replicas": 1, "memory_mb": 999_999}],
        "placements": {"web": {"nodes": ["n1"], "reserved": {"memory_mb": 1024}}},
    }
    data = parse_plan_document(document)
    assert data.placements["web"].reserved == (1024, 0)
    d = plan_input(data)
    assert d.placements == {}
    assert d.unplaced[0].message.endswith("1 lack 999999 MiB of free memory")
    bad = {**document, "placements": {"web": {"nodes": ["n1"], "reserved": {"cpu": 1}}}}
    with pytest.raises(InvalidPlanInput, match=r"placements\.web\.reserved"):
        parse_plan_document(bad)
