"""The write plan: fenced, minimal, removals first, never over a larger fence."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import (
    CurrentPlacement,
    fence_guard,
    plan_rollout_writes,
    plan_writes,
)
from corral.actors.coordinator._writes import PlacementWrite, WritePlan
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AppRecord,
    Compare,
    CompareTarget,
    Delete,
    Deployment,
    NodeAssignment,
    NodeRollout,
    PlacementRecord,
    Put,
    RolloutRecord,
    decode_record,
    placement_key,
)

NODES = ["n1", "n2", "n3", "n4"]
APPS = ["a", "b", "c", "d", "e", "f"]

node_sets = st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True).map(tuple)
targets_strategy = st.dictionaries(
    st.sampled_from(APPS), st.one_of(st.none(), st.just(()), node_sets), max_size=len(APPS)
)


@st.composite
def currents(draw: st.DrawFn) -> dict[str, CurrentPlacement]:
    apps = draw(st.lists(st.sampled_from(APPS), unique=True, max_size=len(APPS)))
    out: dict[str, CurrentPlacement] = {}
    for index, app in enumerate(apps):
        nodes = draw(node_sets)
        fence = draw(st.integers(1, 20))
        placed = {n: draw(st.floats(0, 100)) for n in nodes}
        record = PlacementRecord(nodes=list(nodes), decided_at=50.0, fence=fence, placed_at=placed)
        out[app] = CurrentPlacement(record, mod_revision=100 + index)
    return out


def apply(plan: WritePlan, current: dict[str, CurrentPlacement]) -> dict[str, CurrentPlacement]:
    after = dict(current)
    for write in plan.writes:
        if write.record is None:
            del after[write.app]
        else:
            after[write.app] = CurrentPlacement(write.record, mod_revision=1000)
    return after


@settings(max_examples=150, deadline=None)
@given(
    targets=targets_strategy,
    current=currents(),
    fence=st.integers(1, 20),
    max_writes=st.integers(1, 4),
)
def test_plan_properties(
    targets: dict[str, tuple[str, ...] | None],
    current: dict[str, CurrentPlacement],
    fence: int,
    max_writes: int,
) -> None:
    plan = plan_writes(targets, current, fence=fence, decided_at=200.0, max_writes=max_writes)
    written = {w.app for w in plan.writes}

    # Every target is accounted for exactly once.
    assert sorted(written | set(plan.superseded) | set(plan.unchanged)) == sorted(targets)
    assert not written & set(plan.superseded)

    # Never over a larger fence; everything else ends where the planner said.
    for app in plan.superseded:
        assert current[app].record.fence > fence
    after = apply(plan, current)
    for app, wanted in targets.items():
        if app in plan.superseded:
            assert after[app] == current[app]
        elif not wanted:
            assert app not in after
        else:
            assert after[app].record.nodes == sorted(wanted)

    # Batches: bounded, each guarded by the fence and by every placement it writes; the
    # index writes of the nodes they touch ride along (or follow, fence-guarded).
    index: dict[str, list[str]] = {}
    for batch in plan.batches:
        assert len(batch.writes) <= max_writes
        assert batch.compares[0] == fence_guard(fence)
        assert list(batch.compares[1:]) == [w.guard() for w in batch.writes]
        placement_ops = batch.operations[: len(batch.writes)]
        assert [op.key for op in placement_ops] == [w.key for w in batch.writes]
        index_ops = batch.operations[len(batch.writes) :]
        assert 1 <= len(batch.writes) + len(index_ops)
        assert len(index_ops) <= max_writes
        for op in index_ops:
            node = op.key.removeprefix("assign/")
            if isinstance(op, Delete):
                index[node] = []
            else:
                decoded = decode_record(op.key, op.value)
                assert isinstance(decoded, NodeAssignment)
                index[node] = decoded.apps
    # Once every batch landed, each node touched is indexed with exactly its apps.
    touched = {n for w in plan.writes for n in set(w.previous or ()) ^ set(w.nodes or ())}
    assert set(index) == touched
    for node in touched:
        assert index[node] == sorted(a for a, c in after.items() if node in c.record.nodes)

    # Removals strictly before anything that adds a node.
    kinds = [w.is_removal for w in plan.writes]
    assert kinds == sorted(kinds, reverse=True)
    assert plan.removals == sum(kinds)
    assert plan.placements == len(kinds) - sum(kinds)

    # Written records carry the writer's fence and keep placement times of kept nodes.
    for write in plan.writes:
        record = write.record
        if record is None:
            assert isinstance(write.operation(), Delete)
            continue
        assert record.fence == fence
        assert record.decided_at == 200.0
        assert set(record.placed_at) <= set(record.nodes)
        old = current.get(write.app)
        for node in record.nodes:
            if old is not None and node in old.record.nodes:
                assert record.placed_at.get(node) == old.record.placed_at.get(node)
            else:
                assert record.placed_at[node] == 200.0
        op = write.operation()
        assert isinstance(op, Put)
        assert decode_record(op.key, op.value) == record

    # A second plan over the result writes nothing.
    again = plan_writes(targets, after, fence=fence, decided_at=300.0, max_writes=max_writes)
    assert again.batches == ()


def test_unchanged_cluster_writes_nothing() -> None:
    record = PlacementRecord(nodes=["n1", "n2"], decided_at=1.0, fence=3, placed_at={})
    current = {"a": CurrentPlacement(record, 7)}
    plan = plan_writes({"a": ("n2", "n1")}, current, fence=5, decided_at=9.0)
    assert plan.batches == ()
    assert plan.unchanged == ("a",)


def test_new_placement_is_guarded_on_absence_and_fence() -> None:
    plan = plan_writes({"a": ("n2", "n1")}, {}, fence=5, decided_at=9.0)
    (batch,) = plan.batches
    assert batch.compares == (
        Compare(COORDINATOR_LEASE_KEY, CompareTarget.CREATE_REVISION, fence_guard(5).op, 5),
        Compare.absent(placement_key("a")),
    )
    op, *index = batch.operations
    assert isinstance(op, Put)
    record = PlacementRecord(
        nodes=["n1", "n2"], decided_at=9.0, fence=5, placed_at={"n1": 9.0, "n2": 9.0}
    )
    assert decode_record(op.key, op.value) == record
    # In the same fenced transaction: each node's assignment index, with its stamp.
    assert [decode_record(i.key, i.value) for i in index if isinstance(i, Put)] == [
        NodeAssignment("n1", ["a"], {"a": record.stamp_for("n1")}),
        NodeAssignment("n2", ["a"], {"a": record.stamp_for("n2")}),
    ]


def test_larger_fence_is_superseded_not_overwritten() -> None:
    newer = PlacementRecord(nodes=["n1"], decided_at=1.0, fence=9, placed_at={"n1": 1.0})
    plan = plan_writes(
        {"a": ("n2",), "b": None}, {"a": CurrentPlacement(newer, 4)}, fence=5, decided_at=2.0
    )
    assert plan.superseded == ("a",)
    assert plan.batches == ()
    assert plan.unchanged == ("b",)


def test_removals_come_before_placements_across_batches() -> None:
    def cp(nodes: list[str], rev: int) -> CurrentPlacement:
        return CurrentPlacement(PlacementRecord(nodes=nodes, decided_at=0.0, fence=1), rev)

    current = {"a": cp(["n1"], 1), "b": cp(["n1", "n2"], 2), "z": cp(["n3"], 3)}
    targets: dict[str, tuple[str, ...] | None] = {
        "a": ("n2",),  # a move: one atomic write, counted as a placement
        "b": ("n2",),  # shrink: a removal
        "c": ("n1",),  # new: a placement
        "z": None,  # deleted: a removal
    }
    plan = plan_writes(targets, current, fence=2, decided_at=5.0, max_writes=1)
    assert [w.app for w in plan.writes] == ["b", "z", "a", "c"]
    # The move touches two nodes: its second index write follows in a batch of its own.
    assert [len(b.writes) for b in plan.batches] == [1, 1, 1, 0, 1]
    assert [op.key for op in plan.batches[3].operations] == ["assign/n2"]
    moved = plan.writes[2]
    assert isinstance(moved, PlacementWrite)
    assert moved.previous == ("n1",)
    assert moved.guard() == Compare.mod_revision_is(placement_key("a"), 1)


@pytest.mark.parametrize(("fence", "max_writes"), [(0, 1), (1, 0)])
def test_bad_arguments_are_refused(fence: int, max_writes: int) -> None:
    with pytest.raises(ValueError, match="must"):
        plan_writes({}, {}, fence=fence, decided_at=0.0, max_writes=max_writes)


# -------------------------------------------- pinned instances a forced drain stopped


def test_a_stopped_instance_is_remembered_in_placed_at_only() -> None:
    record = PlacementRecord(nodes=["n1"], decided_at=1.0, fence=3, placed_at={"n1": 1.0})
    current = {"db": CurrentPlacement(record, 7)}
    plan = plan_writes({"db": None}, current, fence=5, decided_at=9.0, stopped={"db": ("n1",)})
    (write,) = plan.writes
    assert write.record == PlacementRecord(nodes=[], decided_at=9.0, fence=5, placed_at={"n1": 1.0})
    assert write.is_removal  # n1 stops running it
    after = {"db": CurrentPlacement(write.record, 8)}
    # The same decision again writes nothing; forgetting it (unpinned) deletes the record.
    same = plan_writes({"db": None}, after, fence=5, decided_at=10.0, stopped={"db": ("n1",)})
    assert same.batches == ()
    assert same.unchanged == ("db",)
    (gone,) = plan_writes({"db": None}, after, fence=5, decided_at=10.0).writes
    assert gone.record is None
    # Started on its node again: a placement stamped now, no marker left.
    (back,) = plan_writes({"db": ("n1",)}, after, fence=5, decided_at=11.0).writes
    assert back.record == PlacementRecord(
        nodes=["n1"], decided_at=11.0, fence=5, placed_at={"n1": 11.0}
    )


def test_a_new_record_may_carry_only_stopped_instances() -> None:
    (write,) = plan_writes(
        {"db": ("n2",)}, {}, fence=5, decided_at=9.0, stopped={"db": ("n1",)}
    ).writes
    assert write.record == PlacementRecord(
        nodes=["n2"], decided_at=9.0, fence=5, placed_at={"n1": 9.0, "n2": 9.0}
    )


# --------------------------------------------------------------------------- rollouts


def _rolling() -> RolloutRecord:
    return RolloutRecord(
        "1" * 64,
        {"n1": NodeRollout("1" * 64, "done", 5.0), "n2": NodeRollout("0" * 64, "pending", 5.0)},
        started_at=5.0,
    )


def test_a_node_set_change_carries_the_rollout_over() -> None:
    record = PlacementRecord(
        nodes=["n1", "n2"], decided_at=1.0, fence=3, placed_at={}, rollout=_rolling()
    )
    plan = plan_writes(
        {"a": ("n1", "n2", "n3")}, {"a": CurrentPlacement(record, 7)}, fence=5, decided_at=9.0
    )
    (write,) = plan.writes
    assert write.record is not None
    assert write.record.rollout == _rolling()


def test_rollout_writes_only_what_changed_under_the_fence() -> None:
    plain = PlacementRecord(nodes=["n1", "n2"], decided_at=1.0, fence=3, placed_at={})
    rolling = dataclasses.replace(plain, rollout=_rolling())
    newer = dataclasses.replace(plain, fence=9)
    current = {
        "same": CurrentPlacement(rolling, 10),
        "starts": CurrentPlacement(plain, 11),
        "ends": CurrentPlacement(rolling, 12),
        "newer": CurrentPlacement(newer, 13),
    }
    wanted = {
        "same": _rolling(),
        "starts": _rolling(),
        "ends": None,
        "newer": _rolling(),
        "unplaced": _rolling(),
    }
    (batch,) = plan_rollout_writes(wanted, current, fence=5)
    assert [w.app for w in batch.writes] == ["ends", "starts"]
    assert batch.compares == (
        fence_guard(5),
        Compare.mod_revision_is(placement_key("ends"), 12),
        Compare.mod_revision_is(placement_key("starts"), 11),
    )
    decoded = [
        decode_record(op.key, op.value)
        for op in batch.operations
        if isinstance(op, Put) and op.key.startswith("placement/")
    ]
    assert decoded == [
        dataclasses.replace(plain, fence=5),
        dataclasses.replace(plain, fence=5, rollout=_rolling()),
    ]
    # The node sets did not move, but the revision a rollout names for n1 and n2 did
    # (from none), so their indexes are written in the same transaction.
    index = [op.key for op in batch.operations if not op.key.startswith("placement/")]
    assert index == ["assign/n1", "assign/n2"]
    assert plan_rollout_writes({"a": None}, {}, fence=5) == ()
    many = {f"app{i}": CurrentPlacement(plain, i + 1) for i in range(5)}
    batches = plan_rollout_writes(dict.fromkeys(many, _rolling()), many, fence=5, max_writes=2)
    assert [len(b.writes) for b in batches] == [2, 2, 1]
    with pytest.raises(ValueError, match="fence"):
        plan_rollout_writes({}, {}, fence=0)


def _index_of(operations: Sequence[Put | Delete], node: str) -> NodeAssignment:
    (op,) = [o for o in operations if isinstance(o, Put) and o.key == f"assign/{node}"]
    record = decode_record(op.key, op.value)
    assert isinstance(record, NodeAssignment)
    return record


def test_a_rollout_switching_one_node_moves_that_nodes_index_alone() -> None:
    old, new = "0" * 64, "1" * 64
    pending = RolloutRecord(
        new, {n: NodeRollout(old, "pending", 1.0) for n in ("n1", "n2", "n3")}, started_at=1.0
    )
    record = PlacementRecord(["n1", "n2", "n3"], 1.0, 3, rollout=pending)
    other = PlacementRecord(["n1"], 1.0, 3)
    current = {"a": CurrentPlacement(record, 7), "b": CurrentPlacement(other, 8)}
    # n1 is taken out of the table: a step, no new revision for any node.
    out = dataclasses.replace(
        pending, nodes={**pending.nodes, "n1": NodeRollout(old, "out-of-table", 2.0)}
    )
    (batch,) = plan_rollout_writes({"a": out}, current, fence=5)
    assert [op.key for op in batch.operations] == [placement_key("a")]
    # n2 is told to run the new revision: its index moves, in the same fenced txn.
    switched = dataclasses.replace(
        pending, nodes={**pending.nodes, "n2": NodeRollout(new, "restarting", 2.0)}
    )
    (batch,) = plan_rollout_writes({"a": switched}, current, fence=5)
    assert batch.compares == (fence_guard(5), Compare.mod_revision_is(placement_key("a"), 7))
    assert [op.key for op in batch.operations] == [placement_key("a"), "assign/n2"]
    index = _index_of(batch.operations, "n2")
    written = dataclasses.replace(record, rollout=switched, fence=5)
    assert index == NodeAssignment("n2", ["a"], {"a": written.stamp_for("n2")})
    assert written.stamp_for("n2") != record.stamp_for("n2")


def test_an_app_change_its_nodes_act_on_moves_their_indexes() -> None:
    app = AppRecord("a", deployment=Deployment("1" * 64, ["run"]))
    placed = plan_writes({"a": ("n1", "n2")}, {}, fence=5, decided_at=1.0, apps={"a": app})
    record = placed.records["a"]
    assert record is not None
    assert record.spec == app.node_spec()
    current = {"a": CurrentPlacement(record, 7)}
    # Labels, replicas: nothing a node acts on, nothing written.
    relabelled = dataclasses.replace(app, labels={"team": "x"}, replicas=2)
    assert plan_rollout_writes({"a": None}, current, fence=5, apps={"a": relabelled}) == ()
    # A new revision, a memory limit, a flag: the placement takes the new spec and both
    # nodes' indexes move with it.
    for changed in (
        dataclasses.replace(app, deployment=Deployment("2" * 64, ["run"])),
        dataclasses.replace(app, memory_mb=64),
        dataclasses.replace(app, teardown_pending=True),
    ):
        (batch,) = plan_rollout_writes({"a": None}, current, fence=5, apps={"a": changed})
        assert [op.key for op in batch.operations] == [placement_key("a"), "assign/n1", "assign/n2"]
        (write,) = batch.writes
        assert write.record is not None
        assert write.record.spec == changed.node_spec() != app.node_spec()
        assert write.record.nodes == record.nodes
        for node in ("n1", "n2"):
            assert _index_of(batch.operations, node).stamps == {"a": write.record.stamp_for(node)}


def test_a_moved_placement_writes_the_old_nodes_index_too() -> None:
    record = PlacementRecord(["n1", "n2"], 1.0, 3)
    other = PlacementRecord(["n1"], 1.0, 3)
    current = {"a": CurrentPlacement(record, 7), "b": CurrentPlacement(other, 8)}
    plan = plan_writes({"a": ("n2", "n3")}, current, fence=5, decided_at=9.0)
    (batch,) = plan.batches
    keys = [op.key for op in batch.operations]
    assert keys == [placement_key("a"), "assign/n1", "assign/n3"]  # n2's stamp is the same
    assert _index_of(batch.operations, "n1").apps == ["b"]
    assert _index_of(batch.operations, "n3").apps == ["a"]
