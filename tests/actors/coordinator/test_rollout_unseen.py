"""The rolling-deploy controller and placed nodes that publish no instance: their
record is not in the view (lapsed while the node or the registry was cut off, or
gone from a successor's first view after a registry stall) or was just written again
without its instances. Such a node may still run the old revision, so the rollout
never names the target for it outside the width; instances then restart at most
``max_parallel`` at a time, whenever records lapse and come back."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import ObservedInstance
from corral.actors.coordinator._rollout import (
    ROLLOUT_CHANGES,
    RolloutDone,
    RolloutInputs,
    RolloutPlan,
    SwitchRevision,
    plan_rollout,
)
from corral.registry import NodeRollout, RolloutOptions, RolloutRecord

OLD, NEW = "0" * 64, "1" * 64
T0 = 1_700_000_000.0
NODES = ("a", "b", "c", "d")


def ready(revision: str) -> ObservedInstance:
    return ObservedInstance(revision, ready=True, state="running")


def changes(result: RolloutPlan) -> list[object]:
    return [a for a in result.actions if isinstance(a, ROLLOUT_CHANGES)]


def plan(
    record: RolloutRecord | None,
    instances: dict[str, ObservedInstance],
    *,
    now: float = T0,
    placed: tuple[str, ...] = NODES,
) -> RolloutPlan:
    return plan_rollout(
        RolloutInputs(
            target=NEW,
            options=RolloutOptions(max_parallel=1, drain_ms=1000),
            placed=placed,
            instances=instances,
            proxies_applied=frozenset(),
            record=record,
            now=now,
        )
    )


def test_a_rollout_begun_while_records_are_missing_names_no_revision_for_those_nodes() -> None:
    """A successor's first view after a registry stall: only ``a`` re-registered. The
    others run the old revision unseen; before, each was taken for a node that runs
    nothing and marked done on the target, and every one of them restarted at once."""
    result = plan(None, {"a": ready(OLD)})
    assert result.record is not None
    assert set(result.record.nodes) == {"a"}
    for node in ("b", "c", "d"):
        assert result.record.revision_for(node) is None  # its reconciler keeps what it runs
    # a alone is seen, so it goes first (straight to its restart: no other instance is
    # known to serve while it is out), and it alone
    assert changes(result) == [SwitchRevision("a", NEW)]
    assert result.record.out_of_table() == {"a"}


def test_no_rollout_begins_while_no_record_of_a_placed_node_is_in_view() -> None:
    assert plan(None, {}).record is None


def test_a_node_whose_record_comes_back_joins_pending_and_waits_for_its_turn() -> None:
    record = RolloutRecord(NEW, {"a": NodeRollout(NEW, "restarting", T0)})
    result = plan(record, {"a": ObservedInstance(NEW, ready=False), "b": ready(OLD)}, now=T0 + 1)
    assert result.record is not None
    assert result.record.nodes["b"] == NodeRollout(OLD, "pending", T0 + 1)
    assert set(result.record.nodes) == {"a", "b"}


def test_the_rollout_is_not_done_while_a_placed_node_is_unseen() -> None:
    record = RolloutRecord(NEW, {n: NodeRollout(NEW, "done", T0) for n in ("a", "b", "c")})
    instances = {n: ready(NEW) for n in ("a", "b", "c")}
    waiting = plan(record, instances, now=T0 + 1)
    assert waiting.record is not None
    assert not any(isinstance(a, RolloutDone) for a in waiting.actions)
    # back, on the old revision: pending, then taken out like any other
    back = plan(waiting.record, {**instances, "d": ready(OLD)}, now=T0 + 2)
    assert back.record is not None
    assert back.record.nodes["d"].step == "out-of-table"
    # back, already on the target: done
    done = plan(waiting.record, {**instances, "d": ready(NEW)}, now=T0 + 2)
    assert done.record is None
    assert done.actions == (RolloutDone(NEW),)


def test_a_listed_node_keeps_its_entry_while_it_publishes_nothing() -> None:
    record = RolloutRecord(
        NEW, {"a": NodeRollout(NEW, "restarting", T0), "b": NodeRollout(OLD, "pending", T0)}
    )
    result = plan(record, {"b": ready(OLD)}, now=T0 + 1, placed=("a", "b"))
    assert result.record is not None
    assert result.record.nodes["a"] == NodeRollout(NEW, "restarting", T0)
    assert result.record.nodes["b"].step == "pending"  # a still counts against the width


# --------------------------------------------------------------------------- simulation


@dataclass
class Instance:
    """One node's instance, restarted by its reconciler whenever the record names
    another revision for it than the one it was last told (a record that names
    none: it keeps what it runs), and ready ``ready_ticks`` after a restart."""

    ready_ticks: int
    revision: str = OLD
    restarted_at: int | None = None
    restarts: int = 0

    def ready(self, tick: int) -> bool:
        return self.restarted_at is None or tick >= self.restarted_at + self.ready_ticks

    def follow(self, named: str | None, tick: int) -> None:
        if named is not None and named != self.revision:
            self.revision, self.restarted_at = named, tick
            self.restarts += 1


@settings(max_examples=200, deadline=None)
@given(
    ready_ticks=st.lists(st.integers(0, 8), min_size=2, max_size=5),
    lapses=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30), st.integers(1, 30)),
                    max_size=6),
    lost=st.frozensets(st.integers(0, 40), max_size=4),
    max_parallel=st.integers(1, 2),
)
def test_records_lapsing_at_any_moment_never_put_more_than_max_parallel_out(
    ready_ticks: list[int],
    lapses: list[tuple[int, int, int]],
    lost: frozenset[int],
    max_parallel: int,
) -> None:
    """Each tick a coordinator (any of them: a plan in ``lost`` is a write that never
    landed, a hand-over) decides from the node records in view; a node's record is
    missing during its lapses (start tick, length). Every node follows what the
    record names for it, seen or not. At no tick are more than ``max_parallel``
    instances restarting or not ready, and each restarts once."""
    names = [f"n{i}" for i in range(len(ready_ticks))]
    nodes = {name: Instance(ticks) for name, ticks in zip(names, ready_ticks, strict=True)}
    missing = {
        (names[node % len(names)], tick)
        for node, start, length in lapses
        for tick in range(start, start + length)
    }
    options = RolloutOptions(max_parallel=max_parallel, drain_ms=500, ready_timeout_ms=60_000)
    record: RolloutRecord | None = None
    for tick in range(200):
        unseen = frozenset(n for n in names if (n, tick) in missing)
        instances = {
            n: ObservedInstance(i.revision, ready=i.ready(tick), state="running")
            for n, i in nodes.items()
            if n not in unseen
        }
        out = frozenset() if record is None else record.out_of_table()
        result = plan_rollout(
            RolloutInputs(NEW, options, tuple(names), instances, out, record, T0 + tick * 0.5)
        )
        if tick not in lost:
            record = result.record
        for name, instance in nodes.items():
            instance.follow(None if record is None else record.revision_for(name), tick)
        busy = [n for n, i in nodes.items() if not i.ready(tick)]
        assert len(busy) <= max_parallel, f"tick {tick}: {busy} out at once"
        if record is None and all(i.revision == NEW for i in nodes.values()):
            break
    assert all(i.restarts <= 1 for i in nodes.values())
