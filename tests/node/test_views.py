"""ps rows and the RELOC column (pure)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import CoordinatorState, NodeStatus
from corral.actors.planner import Deferred, Policy
from corral.node.server._views import (
    CoordinatorUnavailable,
    CoordinatorView,
    NodeStatesView,
    node_rows,
    node_state,
    ps_rows,
    relocation,
    stopped_reason,
)
from corral.registry import (
    AppRecord,
    Deployment,
    MeasuredCapacity,
    NodeIntent,
    NodeRecord,
    NodeRollout,
    PlacementRecord,
    RolloutRecord,
    ServingEntry,
)

REV = "b" * 64


def holder(node: str, **fields: Any) -> CoordinatorState:
    """The coordinator state of ``node`` (the lease holder), with ``fields``."""
    base: dict[str, Any] = {"coordinating": True, "fence": 3, "lease_ttl": 45.0, "policy": Policy()}
    return CoordinatorState(node=node, holder=node, **{**base, **fields})


def serving(state: str = "running") -> dict[str, ServingEntry]:
    return {"web": ServingEntry(REV, 24001, 24002, state, 2)}  # type: ignore[arg-type]


def placement(*nodes: str) -> PlacementRecord:
    return PlacementRecord(nodes=list(nodes), decided_at=0.0, fence=1)


def test_states_and_reloc_reasons() -> None:
    nodes = {
        "n1": NodeRecord(id="n1", serving=serving(), labels={"disk": "ssd"}),
        "n2": NodeRecord(id="n2", labels={"disk": "hdd"}),
        "n3": NodeRecord(id="n3", serving=serving("crash-loop")),
    }
    apps = {
        "web": AppRecord(name="web", replicas=1, selector={"disk": "ssd"}),
        "db": AppRecord(name="db", replicas=1, pinned=True),
        "old": AppRecord(name="old", retired=True),
    }
    placements = {"web": placement("n1"), "db": placement("n2", "gone")}
    rows = ps_rows(apps, placements, nodes, {})
    summary = [(r.app, r.node, r.state, r.reloc) for r in rows]
    assert summary == [
        ("db", "gone", "node-gone", "no (pinned)"),
        ("db", "n2", "starting", "no (pinned)"),
        ("old", "-", "retired", "-"),
        ("web", "n1", "running", "no (no other node matches the selector)"),
        ("web", "n3", "stopping", "no (no other node matches the selector)"),
    ]
    assert rows[3].restarts == 2
    assert rows[3].public_port == 24001


def test_cordoned_nodes_do_not_count_as_somewhere_to_go() -> None:
    nodes = {"n1": NodeRecord(id="n1", serving=serving()), "n2": NodeRecord(id="n2")}
    apps = {"web": AppRecord(name="web", replicas=1)}
    placements = {"web": placement("n1")}
    assert ps_rows(apps, placements, nodes, {})[0].reloc == "yes"
    cordoned = {"n2": NodeIntent(cordoned=True)}
    assert ps_rows(apps, placements, nodes, cordoned)[0].reloc == "no (no other node takes work)"
    all_apps = {"web": AppRecord(name="web", replicas="all")}
    assert ps_rows(all_apps, placements, nodes, {})[0].reloc.startswith("no (replicas all")


@settings(max_examples=50)
@given(
    placed=st.sets(st.sampled_from(["n1", "n2", "n3", "n4"])),
    live=st.sets(st.sampled_from(["n1", "n2", "n3"])),
    pinned=st.booleans(),
)
def test_one_row_per_placed_or_serving_node(placed: set[str], live: set[str], pinned: bool) -> None:
    nodes = {n: NodeRecord(id=n, serving=serving() if n == "n1" else {}) for n in live}
    apps = {"web": AppRecord(name="web", replicas=1, pinned=pinned)}
    rows = ps_rows(apps, {"web": placement(*placed)} if placed else {}, nodes, {})
    expected = placed | ({"n1"} & live)
    if expected:
        assert [r.node for r in rows] == sorted(expected)
    else:
        assert [(r.node, r.state) for r in rows] == [("-", "undeployed")]
    if pinned and expected:
        assert {r.reloc for r in rows} == {"no (pinned)"}


def test_reloc_tells_the_cooldown_left() -> None:
    nodes = {"n1": NodeRecord(id="n1", serving=serving()), "n2": NodeRecord(id="n2")}
    apps = {"web": AppRecord(name="web", replicas=1)}
    record = PlacementRecord(nodes=["n1"], decided_at=0.0, fence=1, placed_at={"n1": 100.0})
    placed = {"web": record}

    coordinator = CoordinatorView(cooldown_s=600.0)

    def reloc(now: float | None) -> str:
        return ps_rows(apps, placed, nodes, {}, now=now, coordinator=coordinator)[0].reloc

    assert reloc(160.0) == "yes (only if its node is lost: cooldown, 9m 0s left)"
    assert reloc(699.5) == "yes (only if its node is lost: cooldown, 1s left)"
    assert reloc(700.0) == "yes"
    assert reloc(None) == "yes"  # no clock given: the cooldown is not judged
    # A pinned app or one that cannot move says so first.
    pinned = {"web": AppRecord(name="web", replicas=1, pinned=True)}
    assert ps_rows(pinned, placed, nodes, {}, now=160.0, coordinator=coordinator)[0].reloc == (
        "no (pinned)"
    )
    # Without the coordinator's view the cooldown is not judged either.
    assert ps_rows(apps, placed, nodes, {}, now=160.0)[0].reloc == "yes"


def test_reloc_prefers_the_coordinators_deferred_until() -> None:
    nodes = {"n1": NodeRecord(id="n1", serving=serving()), "n2": NodeRecord(id="n2")}
    apps = {"web": AppRecord(name="web", replicas=1)}
    placed = {
        "web": PlacementRecord(nodes=["n1"], decided_at=0.0, fence=1, placed_at={"n1": 100.0})
    }

    def reloc(coordinator: CoordinatorView, now: float = 160.0) -> str:
        return ps_rows(apps, placed, nodes, {}, now=now, coordinator=coordinator)[0].reloc

    until = CoordinatorView(cooldown_s=600.0, deferred={("web", "n1"): 220.0})
    assert reloc(until) == "yes (only if its node is lost: cooldown, 1m 0s left)"
    assert reloc(until, now=220.0) == "yes"  # the cooldown is over: it moves next pass
    budget = CoordinatorView(cooldown_s=600.0, deferred={("web", "n1"): None})
    assert reloc(budget) == "yes (deferred by the disruption budget: moves on a later pass)"
    unknown = CoordinatorView(
        holder="n2", error="cannot ask coordinator n2: no reply from n2/coordinator within 2.0 s"
    )
    assert reloc(unknown) == (
        "yes (cooldown unknown: coordinator n2 is busy and did not answer in time)"
    )
    nobody = CoordinatorView.from_state(CoordinatorUnavailable(None, "no coordinator holds it"))
    assert reloc(nobody) == "yes (cooldown unknown: no node holds the coordinator lease yet)"
    # An instance that cannot move says so whatever the coordinator's state.
    all_apps = {"web": AppRecord(name="web", replicas="all")}
    assert ps_rows(all_apps, placed, nodes, {}, now=160.0, coordinator=unknown)[0].reloc.startswith(
        "no (replicas all"
    )


def test_coordinator_view_from_the_holders_state() -> None:
    state = holder(
        "c",
        policy=Policy(cooldown_s=120, grace_period_s=300.0),
        deferred=(
            Deferred("web", "n1", "cooldown: ...", 500.0),
            Deferred("api", "n2", "disruption budget: ...", None),
        ),
    )
    view = CoordinatorView.from_state(state)
    assert view == CoordinatorView(
        cooldown_s=120.0, deferred={("web", "n1"): 500.0, ("api", "n2"): None}, holder="c"
    )
    assert view.to_json() == {"holder": "c", "cooldown_s": 120.0}
    failed = CoordinatorView.from_state(CoordinatorUnavailable("c", "cannot ask coordinator c: x"))
    assert (failed.cooldown_s, failed.holder) == (None, "c")
    assert failed.to_json() == {"holder": "c", "error": "cannot ask coordinator c: x"}
    assert CoordinatorView.from_state(None).error == "no coordinator holds the lease right now"


def test_a_pinned_instance_a_forced_drain_stopped_shows_as_stopped_not_pending() -> None:
    nodes = {"n1": NodeRecord(id="n1"), "n2": NodeRecord(id="n2")}
    forced = {"n2": NodeIntent(cordoned=True, draining=True, force=True)}
    deployment = Deployment(revision=REV, command=["./run"])
    db = {"web": AppRecord(name="web", replicas=1, pinned=True, deployment=deployment)}
    only = {"web": PlacementRecord(nodes=[], decided_at=5.0, fence=1, placed_at={"n2": 1.0})}
    (row,) = ps_rows(db, only, nodes, forced)
    assert (row.node, row.state, row.reason) == ("n2", "stopped", stopped_reason("n2"))
    assert row.reason == "forced drain of n2; pinned, not started elsewhere"
    assert row.reloc == f"no ({row.reason})"
    assert row.to_json()["reason"] == row.reason
    # Two replicas: one runs on n1, the other was stopped on n2; while n2 still serves
    # it, it is stopping (with the same reason).
    two = {"web": AppRecord(name="web", replicas=2, pinned=True)}
    both = {
        "web": PlacementRecord(
            nodes=["n1"], decided_at=5.0, fence=1, placed_at={"n1": 1.0, "n2": 1.0}
        )
    }
    still = {
        "n1": NodeRecord(id="n1", serving=serving()),
        "n2": NodeRecord(id="n2", serving=serving()),
    }
    assert [(r.node, r.state, r.reason) for r in ps_rows(two, both, still, forced)] == [
        ("n1", "running", None),
        ("n2", "stopping", stopped_reason("n2")),
    ]
    # The drain ended, or the app's new resources do not fit n2: still stopped, and why.
    (row,) = ps_rows(db, only, nodes, {})
    assert (row.state, row.reason) == ("stopped", stopped_reason("n2", forced_drain=False))
    assert row.reason.startswith("n2 cannot take it back yet")
    # An app no longer pinned forgets its stopped instances: pending until placed again.
    unpinned = {"web": AppRecord(name="web", replicas=1, deployment=deployment)}
    assert [(r.node, r.state) for r in ps_rows(unpinned, only, nodes, forced)] == [("-", "pending")]


@settings(max_examples=50)
@given(age=st.floats(min_value=0, max_value=10_000), cooldown=st.floats(0, 5_000))
def test_reloc_cooldown_matches_the_planners_rule(age: float, cooldown: float) -> None:
    nodes = {"n1": NodeRecord(id="n1"), "n2": NodeRecord(id="n2")}
    app = AppRecord(name="web", replicas=1)
    view = CoordinatorView(cooldown_s=cooldown)
    text = relocation(
        app, "n1", frozenset({"n1"}), nodes, {}, placed_at=0.0, now=age, coordinator=view
    )
    # The planner defers a rank move while age < cooldown_s.
    assert (text != "yes") == (age < cooldown)
    assert text.startswith("yes")


def test_node_rows_put_the_intent_on_top_of_the_record() -> None:
    nodes = {
        "a": NodeRecord(id="a", serving=serving(), labels={"zone": "a"}, api_address="h:1"),
        "b": NodeRecord(id="b"),
        "c": NodeRecord(id="c", state="suspect"),
    }
    intents = {
        "b": NodeIntent(cordoned=True, draining=True),
        "c": NodeIntent(cordoned=True),
        "d": NodeIntent(cordoned=True),
    }
    rows = node_rows(nodes, intents, coordinator="a")
    assert [(r.node, r.state, r.serving, r.coordinator) for r in rows] == [
        ("a", "alive", 1, True),
        ("b", "draining", 0, False),
        ("c", "cordoned", 0, False),
        ("d", "gone (cordoned)", 0, False),
    ]
    assert rows[0].api_address == "h:1"
    assert rows[1].api_address is None
    assert node_state(None, None) == "gone"
    assert node_state(nodes["b"], NodeIntent(draining=True, force=True)) == "draining, forced"


def test_node_rows_take_the_coordinator_s_states_and_fall_back_to_records() -> None:
    nodes = {"a": NodeRecord(id="a"), "b": NodeRecord(id="b")}
    intents = {"b": NodeIntent(draining=True, force=True)}
    holder_state = holder(
        "a",
        coordinating=True,
        node_states=(
            NodeStatus("a", "suspect", 5.0, None, None, 2, record=True, reason=""),
            NodeStatus("b", "left", None, None, None, None, record=True, reason=""),
            # Its record lapsed: known to the coordinator only, down in its grace.
            NodeStatus("c", "down", 7.0, 7.0, 307.0, None, record=False, reason=""),
        ),
    )
    states = NodeStatesView.from_state(holder_state)
    assert states.to_json() == {"source": "coordinator", "holder": "a"}
    rows = node_rows(nodes, intents, coordinator="a", states=states)
    assert [(r.node, r.state, r.incarnation, r.since, r.down_since, r.grace_until)
            for r in rows] == [
        ("a", "suspect", 2, 5.0, None, None),
        ("b", "draining, forced", None, None, None, None),
        ("c", "down", None, 7.0, 7.0, 307.0),
    ]
    # The holder cannot be asked, or does not coordinate: the records, saying so.
    for answer in (
        CoordinatorUnavailable("a", "timed out"),
        holder("a", coordinating=False),
    ):
        fallback = NodeStatesView.from_state(answer)
        assert fallback.states is None
        assert fallback.to_json()["source"] == "records"
        assert fallback.error
        rows = node_rows(nodes, intents, coordinator="a", states=fallback)
        assert [(r.node, r.state, r.incarnation) for r in rows] == [
            ("a", "alive", None), ("b", "draining, forced", None),
        ]


def test_node_rows_show_what_placements_leave_allocatable() -> None:
    capacity = MeasuredCapacity(8192, 1000, 100_000, 50_000)
    nodes = {"a": NodeRecord("a", capacity=capacity), "b": NodeRecord("b")}
    apps = {
        "db": AppRecord("db", memory_mb=512, disk_mb=1000),
        "web": AppRecord("web"),
        "old": AppRecord("old", memory_mb=4096, retired=True),
    }
    placements = {
        "db": PlacementRecord(["a"], 0.0, 1),
        "web": PlacementRecord(["a", "b"], 0.0, 1),
        "old": PlacementRecord(["a"], 0.0, 1),
    }
    rows = node_rows(nodes, {}, coordinator="a", apps=apps, placements=placements)
    # 100 000 - 1 000 reserved - the 10 000 floor; measured free memory is not counted.
    assert rows[0].allocatable == {"memory_mb": 8192 - 512, "disk_mb": 89_000}
    assert rows[1].allocatable is None  # no capacity reported


def test_node_ls_counts_what_was_placed_not_what_a_redeploy_asks() -> None:
    # Issue 25 item 12: `--memory-mb 999999` on a running app showed -975894/247779 MiB.
    # Until the planner places the change, the node holds what the placement recorded;
    # afterwards the placement moves or goes, so it never goes negative.
    nodes = {"a": NodeRecord("a", capacity=MeasuredCapacity(247_779, 1000, 100_000, 50_000))}
    apps = {"web": AppRecord("web", memory_mb=999_999)}
    placements = {"web": PlacementRecord(["a"], 0.0, 1, reserved=(1024, 0))}
    rows = node_rows(nodes, {}, coordinator="a", apps=apps, placements=placements)
    assert rows[0].allocatable == {"memory_mb": 247_779 - 1024, "disk_mb": 90_000}


def test_ps_rows_carry_each_revision_and_the_rollout() -> None:
    old, new = "a" * 64, "b" * 64
    rollout = RolloutRecord(
        new,
        {
            "n1": NodeRollout(new, "done", 1.0),
            "n2": NodeRollout(new, "restarting", 1.0),
            "n3": NodeRollout(old, "pending", 1.0),
        },
    )
    placement = PlacementRecord(["n1", "n2", "n3"], decided_at=0.0, fence=1, rollout=rollout)
    nodes = {
        "n1": NodeRecord(id="n1", serving={"web": ServingEntry(new, 1, 2, "running", ready=True)}),
        "n2": NodeRecord(id="n2", serving={"web": ServingEntry(old, 3, 4, "running", ready=True)}),
        "n3": NodeRecord(id="n3", serving={"web": ServingEntry(old, 5, 6, "running", ready=True)}),
    }
    app = AppRecord("web", replicas=3, deployment=Deployment(new, ["x"]))
    rows = ps_rows({"web": app}, {"web": placement}, nodes, {})
    assert [(r.node, r.revision, r.rollout, r.rollout_step) for r in rows] == [
        ("n1", new, "rolling 1/3", "done"),
        ("n2", old, "rolling 1/3", "stopping"),
        ("n3", old, "rolling 1/3", "pending"),
    ]
    assert rows[0].to_json()["rollout"] == "rolling 1/3"
    plain = ps_rows({"web": app}, {"web": PlacementRecord(["n1"], 0.0, 1)}, nodes, {})
    assert (plain[0].rollout, plain[0].rollout_step) == (None, None)
