"""Registry records to planner input, and the digest that lets idle passes skip."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral.actors.coordinator as coordinator
from corral.actors.coordinator import CurrentPlacement, MemberStatus
from corral.actors.coordinator._inputs import (
    InputCache,
    RegistryView,
    inputs_digest,
    needs_time,
    plan_input_from_view,
    view_from_kvs,
    with_placements,
)
from corral.actors.coordinator._membership import CurrentDown, effective_state
from corral.actors.planner import (
    AppSpec,
    Decisions,
    Deferred,
    NodeCapacity,
    NodeInfo,
    NodeState,
    Placement,
    PlanInput,
    Policy,
)
from corral.registry import (
    AppRecord,
    Deployment,
    KeyValue,
    MeasuredCapacity,
    NodeDown,
    NodeIntent,
    NodeRecord,
    PlacementRecord,
    Record,
    Undecodable,
    app_key,
    intent_key,
    node_key,
    placement_key,
)

STATES: list[NodeState] = ["alive", "suspect", "down", "cordoned", "left"]
POLICY = Policy()


def isort_order(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_exported() -> None:
    assert coordinator.__all__ == sorted(coordinator.__all__, key=isort_order)
    for name in coordinator.__all__:
        assert hasattr(coordinator, name)


def kv(key: str, value: bytes, rev: int = 10) -> KeyValue:
    return KeyValue(key, value, create_revision=rev, mod_revision=rev, version=1)


# ---------------------------------------------------------------------- node state


@pytest.mark.parametrize(
    ("record", "intent", "membership", "expected"),
    [
        ("alive", None, None, "alive"),
        ("alive", NodeIntent(cordoned=True), None, "cordoned"),
        ("suspect", NodeIntent(cordoned=True), None, "cordoned"),
        ("alive", NodeIntent(draining=True), None, "left"),
        ("alive", NodeIntent(cordoned=True, draining=True), None, "left"),
        ("down", NodeIntent(cordoned=True), None, "down"),  # a dead node keeps no work for ever
        ("left", NodeIntent(cordoned=True), None, "left"),
        ("down", NodeIntent(draining=True), None, "left"),
        ("alive", None, "suspect", "suspect"),
        ("alive", NodeIntent(cordoned=True), "down", "down"),
        ("alive", NodeIntent(), None, "alive"),
    ],
)
def test_effective_state(
    record: NodeState, intent: NodeIntent | None, membership: NodeState | None, expected: str
) -> None:
    assert effective_state(record, intent, membership) == expected


@given(
    record=st.sampled_from(STATES),
    membership=st.one_of(st.none(), st.sampled_from(STATES)),
    cordoned=st.booleans(),
    draining=st.booleans(),
)
def test_intent_only_ever_takes_work_away(
    record: NodeState, membership: NodeState | None, cordoned: bool, draining: bool
) -> None:
    base = membership if membership is not None else record
    state = effective_state(record, NodeIntent(cordoned=cordoned, draining=draining), membership)
    if draining:
        assert state == "left"
    elif cordoned:
        assert state != "alive"
    else:
        assert state == base
    # Never resurrects a node: a down or left node stays (at least) that gone.
    if base in ("down", "left"):
        assert state in ("down", "left")


# ---------------------------------------------------------------------- the view


def test_view_sorts_records_and_collects_undecodable_keys() -> None:
    app = AppRecord("shop", replicas=2)
    node = NodeRecord("n1")
    placement = PlacementRecord(nodes=["n1"], decided_at=1.0, fence=3)
    view = view_from_kvs(
        [
            kv(placement_key("shop"), placement.encode(), rev=7),
            kv(app_key("shop"), app.encode()),
            kv(node_key("n1"), node.encode()),
            kv(intent_key("n1"), NodeIntent(cordoned=True).encode()),
            kv(app_key("zeta"), b'{"v": 2, "name": "zeta"}'),  # a newer build's record
            kv(node_key("n2"), b"not json"),
            kv("apps/Bad_Name", b"{}"),
        ]
    )
    assert view.apps == {"shop": app}
    assert view.nodes == {"n1": node}
    assert view.intents == {"n1": NodeIntent(cordoned=True)}
    assert view.placements == {"shop": CurrentPlacement(placement, 7)}
    assert [u.key for u in view.undecodable] == ["apps/Bad_Name", "apps/zeta", "nodes/n2"]
    inputs = plan_input_from_view(view, policy=POLICY, now=5.0)
    assert inputs.undecodable == ("apps/Bad_Name", "apps/zeta", "nodes/n2")
    assert inputs.nodes == (NodeInfo("n1", state="cordoned"),)


def test_plan_input_carries_exactly_the_planner_fields() -> None:
    deployment = Deployment("a" * 64, ["./run"], {"X": "1"}, 9.0)
    app = AppRecord(
        "shop",
        replicas="all",
        selector={"zone": "a"},
        memory_mb=256,
        disk_mb=512,
        pinned=True,
        retired=False,
        blocked=True,
        deployment=deployment,
        domains=["shop.example"],
        labels={"team": "x"},
    )
    node = NodeRecord(
        "n1",
        state="down",
        down_since=100.0,
        labels={"zone": "a"},
        rack="r1",
        datacenter="dc1",
        capacity=MeasuredCapacity(1024, 512, 10_000, 5_000),
    )
    placement = PlacementRecord(nodes=["n1"], decided_at=1.0, fence=3, placed_at={"n1": 1.0})
    view = RegistryView(
        apps={"shop": app},
        nodes={"n1": node},
        placements={"shop": CurrentPlacement(placement, 4)},
        # Decided down at 100 by an earlier pass (or an earlier coordinator).
        down={"n1": CurrentDown(NodeDown("n1", 100.0, {"zone": "a"}, "r1", "dc1"), 6)},
    )
    inputs = plan_input_from_view(
        view, policy=POLICY, now=200.0, membership={"n1": MemberStatus("dead")}
    )
    assert inputs == PlanInput(
        apps=(
            AppSpec(
                "shop",
                replicas="all",
                selector={"zone": "a"},
                memory_mb=256,
                disk_mb=512,
                pinned=True,
                blocked=True,
            ),
        ),
        nodes=(
            NodeInfo(
                "n1",
                state="down",
                labels={"zone": "a"},
                rack="r1",
                datacenter="dc1",
                down_since=100.0,
                capacity=NodeCapacity(1024, 512, 10_000, 5_000),
            ),
        ),
        placements={"shop": Placement(nodes=("n1",), placed_at={"n1": 1.0})},
        policy=POLICY,
        now=200.0,
    )


# ---------------------------------------------------------------------- the digest

apps_strategy = st.lists(
    st.builds(
        AppRecord,
        name=st.sampled_from(["a", "b", "c", "shop"]),
        replicas=st.one_of(st.just("all"), st.integers(1, 3)),
        selector=st.dictionaries(st.sampled_from(["zone", "tier"]), st.sampled_from(["x", "y"])),
        memory_mb=st.integers(0, 4),
        disk_mb=st.integers(0, 4),
        pinned=st.booleans(),
        retired=st.booleans(),
        blocked=st.booleans(),
    ),
    unique_by=lambda a: a.name,
    max_size=4,
)
nodes_strategy = st.lists(
    st.builds(
        NodeRecord,
        id=st.sampled_from(["n1", "n2", "n3"]),
        state=st.sampled_from(STATES),
        labels=st.dictionaries(st.sampled_from(["zone", "tier"]), st.sampled_from(["x", "y"])),
        rack=st.one_of(st.none(), st.sampled_from(["r1", "r2"])),
        capacity=st.one_of(st.none(), st.builds(MeasuredCapacity, *[st.integers(0, 9)] * 4)),
        change_token=st.integers(0, 5),
    ),
    unique_by=lambda n: n.id,
    max_size=3,
)


def view_of(apps: list[AppRecord], nodes: list[NodeRecord]) -> RegistryView:
    apps = sorted(apps, key=lambda a: a.name)
    nodes = sorted(nodes, key=lambda n: n.id)
    placements = {
        app.name: CurrentPlacement(
            PlacementRecord(nodes=[n.id for n in nodes[:1]], decided_at=1.0, fence=2), 5
        )
        for app in apps[:2]
        if nodes
    }
    return RegistryView(
        apps={a.name: a for a in apps}, nodes={n.id: n for n in nodes}, placements=placements
    )


@settings(max_examples=60, deadline=None)
@given(apps=apps_strategy, nodes=nodes_strategy, seed=st.integers(0, 2**16))
def test_digest_ignores_what_the_planner_does_not_read(
    apps: list[AppRecord], nodes: list[NodeRecord], seed: int
) -> None:
    before = inputs_digest(plan_input_from_view(view_of(apps, nodes), policy=POLICY, now=1.0))
    rng = random.Random(seed)
    # Deploys, domains, app labels, the serving set, change tokens, addresses,
    # placement fences and mod revisions, the time and the policy: none matter.
    deployed = [
        dataclasses.replace(
            a,
            deployment=Deployment(f"{rng.randrange(16):x}" * 64, ["run"]),
            domains=[f"d{rng.randrange(9)}.example"],
            labels={"rev": str(rng.random())},
            teardown_pending=rng.random() < 0.5,
        )
        for a in apps
    ]
    republished = [
        dataclasses.replace(
            n,
            change_token=n.change_token + 1,
            api_address="127.0.0.1:1",
            started_at=rng.random(),
        )
        for n in nodes
    ]
    shuffled = list(reversed(deployed)), list(reversed(republished))
    view = view_of(*shuffled)
    view = dataclasses.replace(
        view,
        placements={
            app: CurrentPlacement(dataclasses.replace(c.record, fence=99, decided_at=7.0), 77)
            for app, c in view.placements.items()
        },
    )
    after = inputs_digest(
        plan_input_from_view(view, policy=Policy(cooldown_s=1.0), now=rng.random())
    )
    assert after == before


@settings(max_examples=60, deadline=None)
@given(apps=apps_strategy.filter(bool), nodes=nodes_strategy.filter(bool), data=st.data())
def test_digest_moves_with_every_planner_input(
    apps: list[AppRecord], nodes: list[NodeRecord], data: st.DataObject
) -> None:
    def digest(apps: list[AppRecord], nodes: list[NodeRecord]) -> str:
        return inputs_digest(plan_input_from_view(view_of(apps, nodes), policy=POLICY, now=1.0))

    before = digest(apps, nodes)
    app = apps[0]
    change = data.draw(
        st.sampled_from(
            ["replicas", "selector", "memory", "pinned", "retired", "blocked", "gone", "new"]
        )
    )
    changed = {
        "replicas": dataclasses.replace(app, replicas=5),
        "selector": dataclasses.replace(app, selector={**app.selector, "extra": "z"}),
        "memory": dataclasses.replace(app, memory_mb=app.memory_mb + 1),
        "pinned": dataclasses.replace(app, pinned=not app.pinned),
        "retired": dataclasses.replace(app, retired=not app.retired),
        "blocked": dataclasses.replace(app, blocked=not app.blocked),
    }
    if change == "gone":
        assert digest(apps[1:], nodes) != before
    elif change == "new":
        assert digest([*apps, AppRecord("brand-new")], nodes) != before
    else:
        assert digest([changed[change], *apps[1:]], nodes) != before
    node = nodes[0]
    node_change = data.draw(st.sampled_from(["state", "capacity", "labels", "rack", "gone"]))
    other_state: NodeState = "alive" if node.state != "alive" else "suspect"
    mutated = {
        "state": dataclasses.replace(node, state=other_state),
        # Reported or not always counts (see the capacity tests below for the figures).
        "capacity": dataclasses.replace(
            node, capacity=None if node.capacity else MeasuredCapacity(99, 99, 99, 99)
        ),
        "labels": dataclasses.replace(node, labels={**node.labels, "extra": "z"}),
        "rack": dataclasses.replace(node, rack="r-other"),
    }
    if node_change == "gone":
        assert digest(apps, nodes[1:]) != before
    else:
        assert digest(apps, [mutated[node_change], *nodes[1:]]) != before


def test_digest_moves_with_placements_and_undecodable_keys() -> None:
    view = view_of([AppRecord("shop")], [NodeRecord("n1"), NodeRecord("n2")])
    before = inputs_digest(plan_input_from_view(view, policy=POLICY, now=1.0))
    moved = with_placements(
        view,
        {"shop": CurrentPlacement(PlacementRecord(nodes=["n2"], decided_at=1.0, fence=2), 6)},
    )
    assert inputs_digest(plan_input_from_view(moved, policy=POLICY, now=1.0)) != before
    removed = with_placements(view, {"shop": None})
    assert removed.placements == {}
    assert inputs_digest(plan_input_from_view(removed, policy=POLICY, now=1.0)) != before
    broken = dataclasses.replace(view, undecodable=(Undecodable("apps/x", "bad"),))
    assert inputs_digest(plan_input_from_view(broken, policy=POLICY, now=1.0)) != before


def test_needs_time() -> None:
    down = NodeInfo("n1", state="down", down_since=5.0)
    placed = {"shop": Placement(nodes=("n1",))}
    inputs = PlanInput(apps=(), nodes=(down,), placements=placed, policy=POLICY, now=10.0)
    quiet = Decisions(placements={})
    assert needs_time(inputs, quiet)  # the down node's grace lapses with time
    assert not needs_time(dataclasses.replace(inputs, placements={}), quiet)
    unknown = dataclasses.replace(inputs, nodes=(NodeInfo("n1", state="down"),))
    assert not needs_time(unknown, quiet)  # no down_since: its grace never lapses
    deferred = Decisions(placements={}, deferred=(Deferred("shop", "n1", "cooldown"),))
    assert needs_time(dataclasses.replace(inputs, placements={}), deferred)


# ------------------------------------------------------------- forced drains


def test_a_forced_drain_reaches_the_planner_and_stopped_instances_come_back() -> None:
    placement = PlacementRecord(
        nodes=["n2"], decided_at=1.0, fence=3, placed_at={"n1": 1.0, "n2": 2.0}
    )
    view = RegistryView(
        apps={"db": AppRecord("db", replicas=2, pinned=True)},
        nodes={n: NodeRecord(n) for n in ("n1", "n2", "n3")},
        intents={
            "n1": NodeIntent(cordoned=True, draining=True, force=True),
            "n2": NodeIntent(cordoned=True, draining=True),
            "n3": NodeIntent(cordoned=True, force=True),  # force without a drain means nothing
        },
        placements={"db": CurrentPlacement(placement, 4)},
    )
    inputs = plan_input_from_view(view, policy=POLICY, now=5.0)
    assert inputs.nodes == (
        NodeInfo("n1", state="left", drain_forced=True),
        NodeInfo("n2", state="left"),
        NodeInfo("n3", state="cordoned"),
    )
    assert inputs.placements == {
        "db": Placement(nodes=("n2",), placed_at={"n2": 2.0}, stopped=("n1",))
    }
    forced = dataclasses.replace(view, intents={"n1": NodeIntent(draining=True, force=True)})
    plain = dataclasses.replace(view, intents={"n1": NodeIntent(draining=True)})
    assert inputs_digest(plan_input_from_view(forced, policy=POLICY, now=5.0)) != inputs_digest(
        plan_input_from_view(plain, policy=POLICY, now=5.0)
    )


# ------------------------------------------------------- capacity in the digest


def capacity_digest(apps: list[AppRecord], capacity: MeasuredCapacity, placed: bool = True) -> str:
    nodes = [NodeRecord("n1", capacity=capacity), NodeRecord("n2", capacity=capacity)]
    view = (
        view_of(apps, nodes)
        if placed
        else RegistryView(apps={a.name: a for a in apps}, nodes={n.id: n for n in nodes})
    )
    return inputs_digest(plan_input_from_view(view, policy=POLICY, now=1.0))


def test_measured_drift_is_no_input_when_no_app_declares_resources() -> None:
    apps = [AppRecord("web", replicas=2), AppRecord("big", memory_mb=512, retired=True)]
    before = capacity_digest(apps, MeasuredCapacity(8192, 4000, 100_000, 50_000))
    assert capacity_digest(apps, MeasuredCapacity(8192, 1000, 100_000, 40_000)) == before
    assert capacity_digest(apps, MeasuredCapacity(16384, 1000, 200_000, 40_000)) == before
    # Falling below the free-disk floor decides, even for apps declaring nothing.
    assert capacity_digest(apps, MeasuredCapacity(8192, 4000, 100_000, 9_999)) != before
    assert capacity_digest(apps, MeasuredCapacity(8192, 4000, 0, 0)) != before


def test_with_resources_only_allocatable_figures_count() -> None:
    apps = [AppRecord("web", replicas=2), AppRecord("db", memory_mb=512)]
    before = capacity_digest(apps, MeasuredCapacity(8192, 4000, 100_000, 50_000))
    # Free memory and disk move all the time: the allocatable figures do not.
    assert capacity_digest(apps, MeasuredCapacity(8192, 1000, 100_000, 40_000)) == before
    # Totals change allocatable; so do the placements that reserve it.
    assert capacity_digest(apps, MeasuredCapacity(16384, 4000, 100_000, 50_000)) != before
    smaller = MeasuredCapacity(8192, 4000, 100_000, 50_000)
    assert capacity_digest(apps, smaller, placed=False) != before


# ------------------------------------------------------------- the input cache


@settings(max_examples=40, deadline=None)
@given(
    apps=apps_strategy.filter(bool),
    nodes=nodes_strategy.filter(bool),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=1, max_size=6),
)
def test_a_sequence_of_passes_reads_the_same_with_and_without_the_cache(
    apps: list[AppRecord], nodes: list[NodeRecord], steps: list[tuple[int, int]]
) -> None:
    # Each step changes one record (or none) and reads everything again through the
    # decode memo, as a pass does: the cache must never change an input or a digest.
    cache: InputCache = InputCache()
    memo: dict[str, tuple[int, Record | Undecodable]] = {}
    records: dict[str, AppRecord | NodeRecord | PlacementRecord] = {
        **{app_key(a.name): a for a in apps},
        **{node_key(n.id): n for n in nodes},
        **{
            placement_key(a.name): PlacementRecord(nodes=[nodes[0].id], decided_at=1.0, fence=2)
            for a in apps
        },
    }
    revisions = dict.fromkeys(records, 1)
    for step, (what, which) in enumerate(steps, start=2):
        app, node = apps[which % len(apps)], nodes[which % len(nodes)]
        changed: tuple[str, AppRecord | NodeRecord | PlacementRecord] | None = None
        if what == 0:
            changed = app_key(app.name), dataclasses.replace(app, replicas=which + 1)
        elif what == 1:
            changed = node_key(node.id), dataclasses.replace(node, rack=f"r{step}")
        elif what == 2:
            changed = placement_key(app.name), PlacementRecord(
                nodes=[node.id], decided_at=float(step), fence=2
            )
        if changed is not None:
            records[changed[0]], revisions[changed[0]] = changed[1], step
        kvs = [kv(key, record.encode(), rev=revisions[key]) for key, record in records.items()]
        cached = plan_input_from_view(
            view_from_kvs(kvs, memo=memo), policy=POLICY, now=1.0, cache=cache
        )
        plain = plan_input_from_view(view_from_kvs(kvs), policy=POLICY, now=1.0)
        assert cached == plain
        assert inputs_digest(cached, cache=cache) == inputs_digest(plain)


def test_an_unchanged_record_keeps_its_planner_input_and_a_changed_one_is_rebuilt() -> None:
    cache, memo = InputCache(), {}
    apps = [AppRecord("a"), AppRecord("b")]
    placement = PlacementRecord(nodes=["n1"], decided_at=1.0, fence=2)
    node = NodeRecord("n1")

    def read(b: AppRecord, rev_b: int) -> PlanInput:
        kvs = [
            kv(app_key("a"), apps[0].encode(), rev=3),
            kv(app_key("b"), b.encode(), rev=rev_b),
            kv(node_key("n1"), node.encode(), rev=3),
            kv(placement_key("a"), placement.encode(), rev=3),
        ]
        return plan_input_from_view(
            view_from_kvs(kvs, memo=memo), policy=POLICY, now=1.0, cache=cache
        )

    first = read(apps[1], 3)
    digest = inputs_digest(first, cache=cache)
    second = read(dataclasses.replace(apps[1], replicas=2), 4)
    assert second.apps[0] is first.apps[0]  # "a" is not built (nor validated) again
    assert second.placements["a"] is first.placements["a"]
    assert second.apps[1] is not first.apps[1]
    assert second.apps[1].replicas == 2
    assert inputs_digest(second, cache=cache) == inputs_digest(second) != digest
    assert len(cache) == 3  # two apps and one placement: only what the last pass used
    cache.clear()
    assert len(cache) == 0
    assert inputs_digest(second, cache=cache) == inputs_digest(second)


def test_the_digest_is_the_sha256_of_the_canonical_document() -> None:
    # The digest is assembled from per-record parts; it is exactly the digest of the
    # whole canonical document, so a coordinator of an older release that digested
    # the document agrees on it.
    import hashlib
    import json

    inputs = PlanInput(
        apps=(AppSpec("b", replicas=2, selector={"z": "1", "a": "2"}), AppSpec("a")),
        nodes=(
            NodeInfo("n2", rack="r", capacity=NodeCapacity(100, 50, 1000, 900)),
            NodeInfo("n1", state="down", down_since=5.0, labels={"k": "v"}),
        ),
        placements={"b": Placement(nodes=("n2", "n1"), placed_at={"n1": 3.0})},
        policy=POLICY,
        now=1.0,
        undecodable=("apps/x",),
    )
    document = {
        "apps": [
            {"name": "a", "replicas": "all", "selector": {}, "memory_mb": 0, "disk_mb": 0,
             "pinned": False, "retired": False, "blocked": False},
            {"name": "b", "replicas": 2, "selector": {"a": "2", "z": "1"}, "memory_mb": 0,
             "disk_mb": 0, "pinned": False, "retired": False, "blocked": False},
        ],
        "nodes": [
            {"id": "n1", "state": "down", "labels": {"k": "v"}, "rack": None,
             "datacenter": None, "down_since": 5, "capacity": None, "drain_forced": False},
            {"id": "n2", "state": "alive", "labels": {}, "rack": "r", "datacenter": None,
             "down_since": None, "capacity": {"readable": True, "above_floor": True},
             "drain_forced": False},
        ],
        "placements": {
            "b": {"nodes": ["n1", "n2"], "placed_at": {"n1": 3}, "stopped": [],
                  "reserved": None},
        },
        "undecodable": ["apps/x"],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    assert inputs_digest(inputs) == hashlib.sha256(text.encode()).hexdigest()
