"""Hypothesis properties of the planner: determinism, idempotence, stability, balance,
capacity, and a memo that never changes a result."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from corral.actors.planner import (
    NODE_STATES,
    AppSpec,
    Decisions,
    NodeCapacity,
    NodeInfo,
    Placement,
    PlacementUnavailable,
    Policy,
    ScoreCache,
    next_placements,
    plan,
)
from corral.actors.planner import _planner as planner_module
from corral.actors.planner._rank import rendezvous_score

NOW = 100_000.0
NODE_IDS = [f"n{i:02d}" for i in range(12)]
APP_NAMES = [f"app{i:02d}" for i in range(14)]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

capacities = st.one_of(
    st.none(),
    st.builds(
        lambda mem, mem_free, disk, disk_free: NodeCapacity(
            memory_mb=mem,
            memory_free_mb=min(mem_free, mem),
            disk_mb=disk,
            disk_free_mb=min(disk_free, disk),
        ),
        st.sampled_from([4096, 16384]),
        st.sampled_from([0, 1000, 4096, 16384]),
        st.sampled_from([0, 20_000, 102_400, 1_048_576]),
        st.sampled_from([0, 2_500, 11_000, 30_000, 200_000]),
    ),
)
labels = st.dictionaries(st.sampled_from(["region", "tier"]), st.sampled_from(["a", "b"]))


@st.composite
def nodes_strategy(
    draw: st.DrawFn, *, plain: bool = False, pool: Sequence[str] = NODE_IDS, most: int = 10
) -> list[NodeInfo]:
    ids = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=most, unique=True))
    if plain:
        return [NodeInfo(i) for i in ids]
    nodes = []
    for i in ids:
        state = draw(st.sampled_from(NODE_STATES))
        nodes.append(
            NodeInfo(
                i,
                state=state,
                labels=draw(labels),
                rack=draw(st.sampled_from([None, "r1", "r2", "r3"])),
                datacenter=draw(st.sampled_from([None, "d1", "d2"])),
                down_since=draw(st.sampled_from([None, 0.0, NOW - 100])),
                capacity=draw(capacities),
                drain_forced=state == "left" and draw(st.booleans()),
            )
        )
    return nodes


@st.composite
def apps_strategy(draw: st.DrawFn, *, plain: bool = False) -> list[AppSpec]:
    names = draw(st.lists(st.sampled_from(APP_NAMES), min_size=1, max_size=10, unique=True))
    if plain:
        return [AppSpec(n, replicas=draw(st.integers(1, 3))) for n in names]
    return [
        AppSpec(
            n,
            replicas=draw(st.one_of(st.just("all"), st.integers(1, 4))),
            selector=draw(labels),
            memory_mb=draw(st.sampled_from([0, 0, 512, 4096])),
            disk_mb=draw(st.sampled_from([0, 0, 1000])),
            pinned=draw(st.booleans()) and draw(st.booleans()),
            retired=draw(st.integers(0, 9)) == 0,
            blocked=draw(st.integers(0, 9)) == 0,
        )
        for n in names
    ]


@st.composite
def placements_strategy(
    draw: st.DrawFn, apps: Sequence[AppSpec], nodes: Sequence[NodeInfo]
) -> dict[str, Placement]:
    pool = [n.id for n in nodes] + ["ghost"]
    result: dict[str, Placement] = {}
    for name in [a.name for a in apps] + ["deleted"]:
        if draw(st.booleans()):
            hosts = draw(st.lists(st.sampled_from(pool), max_size=4, unique=True))
            stamps = {h: draw(st.sampled_from([NOW - 10, NOW - 10_000])) for h in hosts}
            # Instances a forced drain stopped earlier (meaningful for pinned apps only).
            rest = [n for n in pool if n not in hosts]
            stopped = draw(st.lists(st.sampled_from(rest), max_size=2, unique=True)) if rest else []
            result[name] = Placement(nodes=tuple(hosts), placed_at=stamps, stopped=tuple(stopped))
    return result


policies = st.builds(
    Policy,
    grace_period_s=st.sampled_from([0.0, 300.0]),
    cooldown_s=st.sampled_from([0.0, 600.0]),
    disruption_budget=st.sampled_from([0, 1, 5, 100]),
    min_usable_fraction=st.sampled_from([0.0, 0.5]),
)


@st.composite
def cluster(draw: st.DrawFn) -> tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy]:
    nodes = draw(nodes_strategy())
    apps = draw(apps_strategy())
    return apps, nodes, draw(placements_strategy(apps, nodes)), draw(policies)


def attempt(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement],
    policy: Policy,
    now: float = NOW,
    cache: ScoreCache | None = None,
) -> Decisions | str:
    try:
        return plan(apps, nodes, placements, policy, now, cache=cache)
    except PlacementUnavailable:
        return "placement-unavailable"


def settle(nodes: Sequence[NodeInfo], apps: Sequence[AppSpec], d: Decisions) -> list[NodeInfo]:
    """The nodes as they report once the additions run: their free capacity goes down."""
    sizes = {a.name: a for a in apps}
    mem: Counter[str] = Counter()
    disk: Counter[str] = Counter()
    for app, node in d.additions:
        mem[node] += sizes[app].memory_mb
        disk[node] += sizes[app].disk_mb
    settled = []
    for n in nodes:
        if n.capacity is not None and (mem[n.id] or disk[n.id]):
            c = n.capacity
            n = replace(
                n,
                capacity=replace(
                    c,
                    memory_free_mb=c.memory_free_mb - mem[n.id],
                    disk_free_mb=c.disk_free_mb - disk[n.id],
                ),
            )
        settled.append(n)
    return settled


# ---------------------------------------------------------------- determinism


@FAST
@given(cluster(), st.randoms(use_true_random=False))
def test_same_input_in_any_order_gives_the_same_output(
    data: tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy], rnd: random.Random
) -> None:
    apps, nodes, placements, policy = data
    expected = attempt(apps, nodes, placements, policy)
    shuffled_apps, shuffled_nodes = list(apps), list(nodes)
    rnd.shuffle(shuffled_apps)
    rnd.shuffle(shuffled_nodes)
    relabelled = [replace(n, labels=dict(reversed(list(n.labels.items())))) for n in shuffled_nodes]
    keys = list(placements)
    rnd.shuffle(keys)
    reordered = {k: placements[k] for k in keys}
    assert attempt(shuffled_apps, relabelled, reordered, policy) == expected
    assert attempt(apps, nodes, placements, policy) == expected


# ----------------------------------------------------------------- idempotence


@FAST
@given(cluster())
def test_planning_the_applied_output_again_changes_nothing(
    data: tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy],
) -> None:
    apps, nodes, placements, policy = data
    first = attempt(apps, nodes, placements, policy)
    assume(isinstance(first, Decisions))
    assert isinstance(first, Decisions)
    assume(not first.deferred)
    applied = next_placements(placements, first, NOW)
    # Nothing else changes: the nodes now report the capacity the new instances take.
    second = attempt(apps, settle(nodes, apps, first), applied, policy)
    assert isinstance(second, Decisions)
    assert second.removals == ()
    assert second.additions == ()
    assert second.placements == first.placements
    assert second.stopped == first.stopped
    assert second.refused == first.refused


@FAST
@given(nodes_strategy(plain=True), apps_strategy(plain=True))
def test_without_resources_the_output_is_a_fixed_point_as_is(
    nodes: list[NodeInfo], apps: list[AppSpec]
) -> None:
    first = plan(apps, nodes, {}, Policy(), NOW)
    second = plan(apps, nodes, next_placements({}, first, NOW), Policy(), NOW)
    assert not second.changed
    assert second.placements == first.placements


# ------------------------------------------------------------------- stability


def top(app: AppSpec, ids: Sequence[str]) -> set[str]:
    ranked = sorted(ids, key=lambda n: rendezvous_score(app.name, n), reverse=True)
    assert isinstance(app.replicas, int)
    return set(ranked[: app.replicas])


LOOSE = Policy(cooldown_s=0, disruption_budget=10_000)


@FAST
@given(nodes_strategy(plain=True), apps_strategy(plain=True), st.sampled_from([*NODE_IDS, "new"]))
def test_adding_a_node_moves_only_apps_that_now_rank_it_in_their_top_n(
    nodes: list[NodeInfo], apps: list[AppSpec], joining: str
) -> None:
    assume(joining not in {n.id for n in nodes})
    before = plan(apps, nodes, {}, LOOSE, NOW)
    after = plan(apps, [*nodes, NodeInfo(joining)], next_placements({}, before, NOW), LOOSE, NOW)
    ids = [n.id for n in nodes] + [joining]
    for app in apps:
        old, new = set(before.placements[app.name]), set(after.placements[app.name])
        if joining in top(app, ids):
            assert new - old == {joining}
            assert len(old - new) <= 1
        else:
            assert new == old


@FAST
@given(nodes_strategy(plain=True), apps_strategy(plain=True), st.data())
def test_removing_a_node_moves_only_its_apps(
    nodes: list[NodeInfo], apps: list[AppSpec], data: st.DataObject
) -> None:
    assume(len(nodes) >= 2)
    leaving = data.draw(st.sampled_from([n.id for n in nodes]))
    before = plan(apps, nodes, {}, LOOSE, NOW)
    rest = [n for n in nodes if n.id != leaving]
    after = plan(apps, rest, next_placements({}, before, NOW), LOOSE, NOW)
    for app in apps:
        old, new = set(before.placements[app.name]), set(after.placements[app.name])
        if leaving in old:
            assert old - new == {leaving}
            assert len(new - old) <= 1
        else:
            assert new == old


# --------------------------------------------------------------------- balance


@settings(max_examples=3, deadline=None, derandomize=True)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8))
def test_rendezvous_spreads_ten_thousand_apps_evenly_over_ten_nodes(prefix: str) -> None:
    nodes = [NodeInfo(f"node-{i}") for i in range(10)]
    apps = [AppSpec(f"{prefix}{i}", replicas=1) for i in range(10_000)]
    d = plan(apps, nodes, {}, Policy(), NOW)
    counts = Counter(nodes[0] for nodes in d.placements.values())
    assert sum(counts.values()) == 10_000
    assert all(900 <= counts[n.id] <= 1100 for n in nodes), counts


# -------------------------------------------------------------------- capacity


@FAST
@given(cluster())
def test_capacity_is_never_over_committed_within_a_pass(
    data: tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy],
) -> None:
    apps, nodes, placements, policy = data
    d = attempt(apps, nodes, placements, policy)
    assume(isinstance(d, Decisions))
    assert isinstance(d, Decisions)
    sizes = {a.name: a for a in apps}
    by_id = {n.id: n for n in nodes}
    added: dict[str, list[AppSpec]] = {}
    for app, node in d.additions:
        added.setdefault(node, []).append(sizes[app])
    for node_id, new in added.items():
        node = by_id[node_id]
        assert node.state == "alive"
        c = node.capacity
        if c is None:
            assert all(a.memory_mb == 0 and a.disk_mb == 0 for a in new)
            continue
        assert c.disk_mb > 0
        assert sum(a.memory_mb for a in new) <= c.memory_free_mb
        floor = min(c.disk_mb / 10, 10_240)
        assert c.disk_free_mb - sum(a.disk_mb for a in new) >= floor


# ------------------------------------------------------------------------ memo


BIG_POOL = [f"m{i:02d}" for i in range(60)]


@st.composite
def histories(
    draw: st.DrawFn, *, pool: Sequence[str] = NODE_IDS, most: int = 10
) -> list[tuple[list[AppSpec], list[NodeInfo], float, bool]]:
    """A few passes, each a small change from the last.

    The placements follow the plans, except where a step says they are tampered with
    (an instance vanishes from its placement, as after an operator's edit).
    """
    apps = draw(apps_strategy())
    nodes = draw(nodes_strategy(pool=pool, most=most))
    now = NOW
    steps = [(apps, nodes, now, False)]
    for _ in range(draw(st.integers(1, 4))):
        change = draw(
            st.sampled_from(
                [
                    "join",
                    "leave",
                    "state",
                    "labels",
                    "capacity",
                    "app",
                    "selector",
                    "add-app",
                    "drop-app",
                    "time",
                    "tamper",
                    "none",
                ]
            )
        )
        nodes = list(nodes)
        apps = list(apps)
        if change == "join":
            free = [i for i in pool if i not in {n.id for n in nodes}]
            if free:
                nodes.append(
                    NodeInfo(
                        draw(st.sampled_from(free)),
                        labels=draw(labels),
                        rack=draw(st.sampled_from([None, "r1", "r4"])),
                    )
                )
        elif change == "leave" and len(nodes) > 1:
            nodes.pop(draw(st.integers(0, len(nodes) - 1)))
        elif change == "state":
            i = draw(st.integers(0, len(nodes) - 1))
            state = draw(st.sampled_from(NODE_STATES))
            # Only a node that has left can be under a forced drain.
            forced = nodes[i].drain_forced and state == "left"
            nodes[i] = replace(nodes[i], state=state, drain_forced=forced)
        elif change == "labels":
            i = draw(st.integers(0, len(nodes) - 1))
            nodes[i] = replace(nodes[i], labels=draw(labels))
        elif change == "capacity":
            i = draw(st.integers(0, len(nodes) - 1))
            nodes[i] = replace(nodes[i], capacity=draw(capacities))
        elif change == "app":
            i = draw(st.integers(0, len(apps) - 1))
            apps[i] = replace(apps[i], replicas=draw(st.one_of(st.just("all"), st.integers(1, 4))))
        elif change == "selector":
            i = draw(st.integers(0, len(apps) - 1))
            apps[i] = replace(apps[i], selector=draw(labels))
        elif change == "add-app":
            free_names = [n for n in APP_NAMES if n not in {a.name for a in apps}]
            if free_names:
                apps.append(
                    AppSpec(draw(st.sampled_from(free_names)), replicas=draw(st.integers(1, 3)))
                )
        elif change == "drop-app" and len(apps) > 1:
            apps.pop(draw(st.integers(0, len(apps) - 1)))
        elif change == "time":
            now += draw(st.sampled_from([1.0, 400.0, 5000.0]))
        steps.append((apps, nodes, now, change == "tamper"))
    return steps


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(histories(), histories(pool=BIG_POOL, most=45)),
    policies,
)
def test_the_memo_never_changes_a_result(
    steps: list[tuple[list[AppSpec], list[NodeInfo], float, bool]], policy: Policy
) -> None:
    cache = ScoreCache()
    placements: dict[str, Placement] = {}
    for apps, nodes, now, tamper in steps:
        if tamper:
            placements = {
                name: Placement(nodes=p.nodes[1:], placed_at={}) for name, p in placements.items()
            }
        with_memo = attempt(apps, nodes, placements, policy, now, cache=cache)
        without = attempt(apps, nodes, placements, policy, now)
        assert with_memo == without
        if isinstance(without, Decisions):
            placements = next_placements(placements, without, now)


# ------------------------------------------------------------------ shortcuts


def straightforward(
    apps: Sequence[AppSpec],
    nodes: Sequence[NodeInfo],
    placements: Mapping[str, Placement],
    policy: Policy,
    now: float = NOW,
) -> Decisions | str:
    """The pass with no memo and none of the planner's shortcuts: the reference."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner_module, "_SHORTCUTS", False)
        return attempt(apps, nodes, placements, policy, now)


@FAST
@given(cluster())
def test_the_shortcuts_never_change_a_result(
    data: tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy],
) -> None:
    apps, nodes, placements, policy = data
    assert attempt(apps, nodes, placements, policy) == straightforward(
        apps, nodes, placements, policy
    )


@st.composite
def losses(
    draw: st.DrawFn,
) -> tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy]:
    """A cluster of nodes that report capacity, mostly apps declaring resources, placed
    and then losing some nodes under a small disruption budget: the replacements queue
    behind the budget for several passes."""
    ids = draw(st.lists(st.sampled_from(NODE_IDS), min_size=3, max_size=12, unique=True))
    nodes = [
        NodeInfo(
            i,
            labels=draw(labels),
            rack=draw(st.sampled_from([None, "r1", "r2", "r3"])),
            capacity=NodeCapacity(
                memory_mb=4096,
                memory_free_mb=draw(st.sampled_from([4096, 2048, 600])),
                disk_mb=200_000,
                disk_free_mb=draw(st.sampled_from([200_000, 21_000, 20_000])),
            ),
        )
        for i in ids
    ]
    names = draw(st.lists(st.sampled_from(APP_NAMES), min_size=1, max_size=12, unique=True))
    apps = [
        AppSpec(
            n,
            replicas=draw(st.one_of(st.integers(1, 4), st.just("all"))),
            selector=draw(st.one_of(st.just({}), labels)),
            memory_mb=draw(st.sampled_from([0, 64, 512, 1024])),
            disk_mb=draw(st.sampled_from([0, 0, 1000])),
        )
        for n in names
    ]
    policy = Policy(
        grace_period_s=0.0,
        cooldown_s=draw(st.sampled_from([0.0, 600.0])),
        disruption_budget=draw(st.integers(0, 3)),
    )
    first = plan(apps, nodes, {}, policy, NOW)
    placements = next_placements({}, first, NOW)
    if draw(st.booleans()):
        # An operator's edit: some instances vanish, so some replicas are missing too.
        placements = {name: replace(p, nodes=p.nodes[1:]) for name, p in placements.items()}
    lost = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids) - 1, unique=True))
    how = draw(st.sampled_from(["down", "left", "absent"]))
    if how == "absent":
        nodes = [n for n in nodes if n.id not in lost]
    else:
        nodes = [replace(n, state=how, down_since=0.0) if n.id in lost else n for n in nodes]
    return apps, nodes, placements, policy


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(losses(), st.booleans())
def test_passes_after_a_loss_decide_as_the_straightforward_planner(
    data: tuple[list[AppSpec], list[NodeInfo], dict[str, Placement], Policy], memo: bool
) -> None:
    apps, nodes, placements, policy = data
    cache = ScoreCache() if memo else None
    now = NOW + 1000
    for _ in range(8):
        fast = attempt(apps, nodes, placements, policy, now, cache=cache)
        reference = straightforward(apps, nodes, placements, policy, now)
        assert fast == reference
        if not isinstance(reference, Decisions) or not (reference.additions or reference.removals):
            break
        placements = next_placements(placements, reference, now)
        nodes = settle(nodes, apps, reference)
        now += 700
