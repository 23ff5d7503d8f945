"""The rolling-deploy controller: pure decisions, tested step by step and by
simulating whole rollouts (hypothesis) against nodes that restart, become ready
late or never, and proxies that apply tables late."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator import ObservedInstance, restart_phase, rollout_status
from corral.actors.coordinator._rollout import (
    ROLLOUT_CHANGES,
    PutBack,
    RolloutAction,
    RolloutDone,
    RolloutHalted,
    RolloutInputs,
    RolloutPlan,
    RolloutWait,
    SwitchRevision,
    TakeOut,
    plan_rollout,
)
from corral.registry import NodeRollout, RolloutOptions, RolloutRecord, Undecodable

OLD, NEW = "0" * 64, "1" * 64
T0 = 1_700_000_000.0


def inputs(
    record: RolloutRecord | None,
    instances: dict[str, ObservedInstance],
    *,
    now: float = T0,
    target: str = NEW,
    applied: frozenset[str] = frozenset(),
    placed: tuple[str, ...] | None = None,
    **options: int,
) -> RolloutInputs:
    return RolloutInputs(
        target=target,
        options=RolloutOptions(**options),
        placed=tuple(sorted(instances)) if placed is None else placed,
        instances=instances,
        proxies_applied=applied,
        record=record,
        now=now,
    )


def ready(revision: str) -> ObservedInstance:
    return ObservedInstance(revision, ready=True, state="running")


def changes(plan: RolloutPlan) -> list[RolloutAction]:
    return [a for a in plan.actions if isinstance(a, ROLLOUT_CHANGES)]


def steps(plan: RolloutPlan) -> dict[str, str]:
    assert plan.record is not None
    return {node: entry.step for node, entry in plan.record.nodes.items()}


# --------------------------------------------------------------------------- step by step


def test_nothing_rolls_when_every_node_runs_the_target_or_nothing() -> None:
    plan = plan_rollout(inputs(None, {"a": ready(NEW), "b": ready(NEW)}, placed=("a", "b", "c")))
    assert plan == RolloutPlan(None)


def test_a_rollout_goes_node_by_node_through_every_step() -> None:
    instances = {"a": ready(OLD), "b": ready(OLD), "c": ready(OLD)}
    plan = plan_rollout(inputs(None, instances))
    assert changes(plan) == [TakeOut("a")]
    assert steps(plan) == {"a": "out-of-table", "b": "pending", "c": "pending"}
    assert plan.wake_at == T0 + 2.0  # the drain, at the latest
    assert rollout_status(plan.record) == "rolling 0/3"

    # the proxies applied the table without a: the drain starts
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 0.3, applied=frozenset("a")))
    assert steps(plan)["a"] == "draining"
    assert changes(plan) == []
    assert RolloutWait("a", "draining", T0 + 2.3) in plan.actions

    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 2.3))
    assert changes(plan) == [SwitchRevision("a", NEW)]
    assert plan.record is not None
    assert plan.record.revision_for("a") == NEW
    assert plan.record.revision_for("b") == OLD
    assert plan.wake_at == T0 + 2.3 + 60.0

    # it stops and starts the new revision: nothing moves until it is ready
    starting = {**instances, "a": ObservedInstance(NEW, ready=False, state="starting")}
    again = plan_rollout(inputs(plan.record, starting, now=T0 + 3.0))
    assert changes(again) == []
    assert again.record == plan.record
    assert plan.record.nodes["a"].step == "restarting"
    assert restart_phase(plan.record.nodes["a"], starting["a"]) == "waiting-ready"
    assert restart_phase(plan.record.nodes["a"], instances["a"]) == "stopping"
    assert restart_phase(plan.record.nodes["a"], None) == "starting"

    # ready on the new revision: back in the table, and the next node goes out
    instances["a"] = ready(NEW)
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 4.0))
    assert changes(plan) == [PutBack("a"), TakeOut("b")]
    assert steps(plan) == {"a": "done", "b": "out-of-table", "c": "pending"}
    assert rollout_status(plan.record) == "rolling 1/3"


def test_a_whole_rollout_ends_done_with_the_record_cleared() -> None:
    instances = {"a": ready(OLD), "b": ready(OLD)}
    record, now, switched = None, T0, []
    for _ in range(20):
        plan = plan_rollout(inputs(record, instances, now=now, drain_ms=0))
        for action in plan.actions:
            if isinstance(action, SwitchRevision):
                switched.append(action.node)
                instances[action.node] = ready(action.revision)
        if any(isinstance(a, RolloutDone) for a in plan.actions):
            break
        record, now = plan.record, now + 1
    assert plan == RolloutPlan(None, plan.actions)
    assert switched == ["a", "b"]
    assert plan_rollout(inputs(None, instances, now=now)) == RolloutPlan(None)


def test_the_width_is_max_parallel() -> None:
    instances = {n: ready(OLD) for n in "abcde"}
    plan = plan_rollout(inputs(None, instances, max_parallel=2))
    assert changes(plan) == [TakeOut("a"), TakeOut("b")]
    assert plan.record is not None
    assert plan.record.out_of_table() == {"a", "b"}


def test_a_proxy_that_never_applies_holds_a_node_out_no_longer_than_the_drain() -> None:
    instances = {"a": ready(OLD), "b": ready(OLD)}
    plan = plan_rollout(inputs(None, instances))
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 1.9))
    assert steps(plan)["a"] == "out-of-table"
    # at 2 s the drain begins (counted from then), at 4 s the node is told to switch
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 2.0))
    assert steps(plan)["a"] == "draining"
    assert plan.wake_at == T0 + 4.0
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 4.0))
    assert changes(plan) == [SwitchRevision("a", NEW)]


def test_a_one_instance_app_restarts_at_once_with_no_drain() -> None:
    plan = plan_rollout(inputs(None, {"a": ready(OLD)}))
    assert changes(plan) == [SwitchRevision("a", NEW)]
    assert steps(plan) == {"a": "restarting"}
    plan = plan_rollout(inputs(plan.record, {"a": ready(NEW)}, now=T0 + 0.4))
    assert changes(plan) == [PutBack("a"), RolloutDone(NEW)]
    assert plan.record is None


def test_a_revision_never_ready_halts_and_the_rest_keep_theirs() -> None:
    instances = {"a": ready(OLD), "b": ready(OLD), "c": ready(OLD)}
    plan = plan_rollout(inputs(None, instances, drain_ms=0, ready_timeout_ms=5000))
    assert changes(plan) == [TakeOut("a"), SwitchRevision("a", NEW)]
    looping = ObservedInstance(NEW, ready=False, state="crash-loop", reason="exit code 3")
    instances["a"] = looping
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 4.9, ready_timeout_ms=5000))
    assert changes(plan) == []
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 5.0, ready_timeout_ms=5000))
    (halt,) = changes(plan)
    assert isinstance(halt, RolloutHalted)
    assert "node a" in halt.reason
    assert "5000 ms" in halt.reason
    assert "crash-loop: exit code 3" in halt.reason
    assert plan.record is not None
    assert {n: plan.record.revision_for(n) for n in "bc"} == {"b": OLD, "c": OLD}
    assert steps(plan) == {"a": "restarting", "b": "pending", "c": "pending"}
    status = rollout_status(plan.record)
    assert status is not None
    assert status.startswith("halted: revision 111111111111 was not ready on node a")
    # halted stays halted: nothing more is admitted, later passes change nothing
    later = plan_rollout(inputs(plan.record, instances, now=T0 + 500, ready_timeout_ms=5000))
    assert later.record == plan.record
    assert changes(later) == []


def test_a_halt_puts_back_the_nodes_taken_out_but_not_switched() -> None:
    instances = {n: ready(OLD) for n in "abc"}
    record = RolloutRecord(
        NEW,
        {
            "a": NodeRollout(NEW, "restarting", T0),
            "b": NodeRollout(OLD, "draining", T0 + 59),
            "c": NodeRollout(OLD, "pending", T0),
        },
    )
    plan = plan_rollout(inputs(record, instances, now=T0 + 60, max_parallel=2))
    assert [type(a) for a in changes(plan)] == [RolloutHalted, PutBack]
    assert changes(plan)[1] == PutBack("b")
    assert steps(plan) == {"a": "restarting", "b": "pending", "c": "pending"}
    assert plan.record is not None
    assert plan.record.out_of_table() == {"a"}


def test_a_hand_off_continues_from_the_record_as_read_back() -> None:
    instances = {"a": ready(NEW), "b": ready(OLD), "c": ready(OLD)}
    record = RolloutRecord(
        NEW,
        {
            "a": NodeRollout(NEW, "done", T0),
            "b": NodeRollout(NEW, "restarting", T0 + 10),
            "c": NodeRollout(OLD, "pending", T0),
        },
        started_at=T0,
    )
    read_back = RolloutRecord.decode(record.encode())
    assert read_back == record
    assert isinstance(read_back, RolloutRecord)
    # the new coordinator sees b still stopping: it waits, and restarts nobody
    plan = plan_rollout(inputs(read_back, instances, now=T0 + 11))
    assert changes(plan) == []
    instances["b"] = ready(NEW)
    plan = plan_rollout(inputs(read_back, instances, now=T0 + 12))
    assert changes(plan) == [PutBack("b"), TakeOut("c")]


def test_a_rollback_mid_rollout_takes_the_same_path_back() -> None:
    instances = {"a": ready(NEW), "b": ObservedInstance(NEW, ready=False), "c": ready(OLD)}
    record = RolloutRecord(
        NEW,
        {
            "a": NodeRollout(NEW, "done", T0),
            "b": NodeRollout(NEW, "restarting", T0 + 10),
            "c": NodeRollout(OLD, "pending", T0),
        },
    )
    plan = plan_rollout(inputs(record, instances, now=T0 + 11, target=OLD))
    # b is switched back at once (it is out already), c already runs the target
    assert changes(plan) == [SwitchRevision("b", OLD)]
    assert plan.record is not None
    assert plan.record.revision == OLD
    assert steps(plan) == {"a": "pending", "b": "restarting", "c": "done"}
    assert plan.record.revision_for("b") == OLD
    instances["b"] = ready(OLD)
    plan = plan_rollout(inputs(plan.record, instances, now=T0 + 12, target=OLD))
    assert changes(plan) == [PutBack("b"), TakeOut("a")]


def test_placement_changes_mid_rollout() -> None:
    record = RolloutRecord(
        NEW, {"a": NodeRollout(NEW, "done", T0), "gone": NodeRollout(OLD, "draining", T0)}
    )
    instances = {"a": ready(NEW), "b": ready(OLD), "gone": ready(OLD)}
    plan = plan_rollout(inputs(record, instances, now=T0 + 1, placed=("a", "b", "fresh")))
    assert plan.record is not None
    # "fresh" publishes nothing yet: it is listed once it does (its reconciler starts
    # the app's revision there meanwhile: no rollout names it)
    assert set(plan.record.nodes) == {"a", "b"}
    assert changes(plan) == [TakeOut("b")]
    fresh = {**instances, "fresh": ObservedInstance(NEW, ready=False, state="starting")}
    later = plan_rollout(inputs(plan.record, fresh, now=T0 + 2, placed=("a", "b", "fresh")))
    assert later.record is not None
    assert later.record.nodes["fresh"] == NodeRollout(NEW, "done", T0 + 2)


def test_a_record_that_breaks_its_schema_is_undecodable() -> None:
    record = RolloutRecord(NEW, {"a": NodeRollout(OLD)})
    broken = record.encode().replace(b'"pending"', b'"sideways"')
    decoded = RolloutRecord.decode(broken)
    assert isinstance(decoded, Undecodable)
    assert "rollout.node.step" in decoded.reason
    assert isinstance(RolloutRecord.decode(b"\xff"), Undecodable)


# --------------------------------------------------------------------------- simulation

TICK = 0.5


@dataclass
class SimNode:
    """A node's instance: how many ticks a restart takes, then how many more until
    the new revision is ready (None: never; the old one is ready as soon as it
    runs), and how many ticks the proxies take to apply its removal."""

    restart_ticks: int
    ready_ticks: int | None
    proxy_lag: int
    running: str = OLD
    target: str = OLD
    switched_at: int | None = None
    out_at: int | None = None
    switches: list[str] = field(default_factory=list)

    def observed(self, tick: int) -> ObservedInstance:
        if self.switched_at is None:
            return ready(self.running)
        elapsed = tick - self.switched_at
        if elapsed < self.restart_ticks:
            return ObservedInstance(self.running, ready=False, state="stopping")
        wait = 0 if self.target == OLD else self.ready_ticks
        ok = wait is not None and elapsed >= self.restart_ticks + wait
        return ObservedInstance(self.target, ready=ok, state="running" if ok else "starting")

    def switch(self, tick: int, revision: str) -> None:
        self.running = self.observed(tick).revision
        self.target, self.switched_at = revision, tick
        self.switches.append(revision)


@dataclass
class Outcome:
    plans: list[RolloutPlan] = field(default_factory=list)
    done: str | None = None  # the revision the last RolloutDone was for
    halted: bool = False


sim_nodes = st.builds(
    SimNode,
    restart_ticks=st.integers(0, 3),
    ready_ticks=st.one_of(st.none(), st.integers(0, 12)),
    proxy_lag=st.integers(0, 6),
)
rollout_options = st.builds(
    RolloutOptions,
    max_parallel=st.integers(1, 3),
    drain_ms=st.sampled_from([0, 500, 2000]),
    ready_timeout_ms=st.sampled_from([1000, 4000]),
)


def simulate(
    nodes: dict[str, SimNode],
    options: RolloutOptions,
    lost: frozenset[int],
    rollback_at: int | None = None,
) -> Outcome:
    """Run the controller each tick against the simulated nodes, to NEW (and from
    ``rollback_at`` back to OLD), until it is done or has halted and nothing moves.
    A plan of a tick in ``lost`` is dropped unapplied: its write was lost, and the
    next coordinator reads the record from before it. Checks, every tick, the width
    and that the plan is deterministic and a replay of its state changes nothing."""
    outcome = Outcome()
    record: RolloutRecord | None = None
    for tick in range(400):
        target = NEW if rollback_at is None or tick < rollback_at else OLD
        observed = {name: node.observed(tick) for name, node in nodes.items()}
        applied = frozenset(
            name
            for name, node in nodes.items()
            if node.out_at is not None and tick >= node.out_at + node.proxy_lag
        )
        now = T0 + tick * TICK
        given_inputs = RolloutInputs(target, options, tuple(nodes), observed, applied, record, now)
        plan = plan_rollout(given_inputs)
        assert plan == plan_rollout(given_inputs), "not deterministic"
        replay = plan_rollout(dataclasses.replace(given_inputs, record=plan.record))
        assert replay.record == plan.record, "a replayed state decides again"
        assert changes(replay) == [], "a replayed state acts again"
        if tick in lost:
            continue
        outcome.plans.append(plan)
        for action in plan.actions:
            node = nodes.get(getattr(action, "node", ""))
            if isinstance(action, TakeOut):
                assert node is not None
                node.out_at = tick
            elif isinstance(action, PutBack):
                assert node is not None
                node.out_at = None
            elif isinstance(action, SwitchRevision):
                assert node is not None
                node.switch(tick, action.revision)
            elif isinstance(action, RolloutDone):
                outcome.done = action.revision
            elif isinstance(action, RolloutHalted):
                outcome.halted = True
        out = plan.record.out_of_table() if plan.record is not None else frozenset()
        assert len(out) <= options.max_parallel, f"width {len(out)} at tick {tick}"
        busy = [n for n, node in nodes.items() if node.out_at is not None or n in out]
        assert len(busy) <= options.max_parallel
        record = plan.record
        if rollback_at is not None and tick < rollback_at:
            continue
        settled = all(o.revision == target and o.ready for o in observed.values())
        if (record is None and settled) or (record is not None and record.halted and tick > 200):
            break
    return outcome


@settings(max_examples=150, deadline=None)
@given(
    st.lists(sim_nodes, min_size=1, max_size=5),
    rollout_options,
    st.frozensets(st.integers(0, 60), max_size=5),
)
def test_every_instance_ends_on_the_target_once_or_the_rollout_halts_with_the_rest_untouched(
    sim: list[SimNode], options: RolloutOptions, lost: frozenset[int]
) -> None:
    nodes = {f"n{i}": node for i, node in enumerate(sim)}
    outcome = simulate(nodes, options, lost)
    assert (outcome.done == NEW) != outcome.halted
    assert all(len(node.switches) <= 1 for node in nodes.values()), "a node restarted twice"
    timeout_ticks = options.ready_timeout_ms / 1000 / TICK
    if all(
        n.ready_ticks is not None and n.restart_ticks + n.ready_ticks + 1 < timeout_ticks
        for n in sim
    ):
        assert outcome.done == NEW
    if outcome.done:
        assert all(node.switches == [NEW] for node in nodes.values())
        assert all(node.observed(10**6) == ready(NEW) for node in nodes.values())
        return
    final = outcome.plans[-1].record
    assert final is not None
    assert final.halted
    for name, node in nodes.items():
        if not node.switches:  # never reached: still the old revision, in the table
            assert final.revision_for(name) == OLD
            assert name not in final.out_of_table()
            assert node.out_at is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(sim_nodes, min_size=1, max_size=4),
    rollout_options,
    st.integers(0, 40),
    st.frozensets(st.integers(0, 60), max_size=3),
)
def test_a_rollback_at_any_moment_brings_every_node_back_once_by_the_same_path(
    sim: list[SimNode], options: RolloutOptions, rollback_at: int, lost: frozenset[int]
) -> None:
    nodes = {f"n{i}": node for i, node in enumerate(sim)}
    outcome = simulate(nodes, options, lost, rollback_at)
    timeout_ticks = options.ready_timeout_ms / 1000 / TICK
    final = outcome.plans[-1].record
    if all(n.restart_ticks + 1 < timeout_ticks for n in sim):
        assert final is None
        assert all(node.observed(10**6) == ready(OLD) for node in nodes.values())
    for node in nodes.values():
        # at most one switch to the new revision and one back; a node the rollout
        # had not reached is not touched by the rollback either
        assert node.switches in ([], [NEW], [NEW, OLD]), node.switches
