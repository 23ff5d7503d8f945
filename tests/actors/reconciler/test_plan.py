"""Pure reconcile planning."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import corral.actors.reconciler as reconciler
from corral.actors.reconciler._plan import (
    STOP_NOT_SERVED,
    STOP_TEARDOWN,
    AppView,
    PassInputs,
    ProcessView,
    Remove,
    Replace,
    Start,
    Stop,
    app_views,
    desired_revision,
    plan_pass,
    process_views,
    serving_set,
    should_skip,
    with_serving,
)
from corral.registry import (
    AppRecord,
    Deployment,
    NodeRecord,
    NodeRollout,
    PlacementRecord,
    RolloutRecord,
    ServingEntry,
)

R1, R2 = "1" * 64, "2" * 64


def isort_order(name: str) -> tuple[int, str]:
    """ruff's __all__ order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_exported() -> None:
    assert reconciler.__all__ == sorted(reconciler.__all__, key=isort_order)
    for name in reconciler.__all__:
        assert hasattr(reconciler, name)


def view(name: str, *, assigned: bool = True, revision: str | None = R1, **flags: bool) -> AppView:
    return AppView(name, assigned, revision, **flags)


def live(app: str, revision: str = R1) -> ProcessView:
    return ProcessView(app, revision, "live")


def test_the_table() -> None:
    inputs = PassInputs(
        apps={
            "start-me": view("start-me"),
            "keep": view("keep"),
            "new-rev": view("new-rev", revision=R2),
            "torn": view("torn", teardown_pending=True),
            "moved": view("moved", assigned=False),
            "retired": view("retired", retired=True),
            "blocked": view("blocked", blocked=True),
            "undeployed": view("undeployed", revision=None),
            "undeployed-running": view("undeployed-running", revision=None),
            "stopped-unassigned": view("stopped-unassigned", assigned=False),
        },
        processes={
            "keep": live("keep"),
            "new-rev": live("new-rev", R1),
            "torn": live("torn"),
            "moved": live("moved"),
            "retired": live("retired"),
            "blocked": live("blocked"),
            "undeployed-running": live("undeployed-running"),
            "stopped-unassigned": ProcessView("stopped-unassigned", R1, "stopped"),
            "deleted-live": live("deleted-live"),
            "deleted-stopping": ProcessView("deleted-stopping", R1, "stopping"),
            "deleted-stopped": ProcessView("deleted-stopped", R1, "stopped"),
        },
        local_state=frozenset({"deleted-dir-only", "keep", "deleted-stopping"}),
    )
    assert plan_pass(inputs) == (
        Replace("new-rev", R2, R1),
        Start("start-me", R1),
        Stop("blocked", STOP_NOT_SERVED),
        Stop("deleted-live", STOP_NOT_SERVED),
        Stop("moved", STOP_NOT_SERVED),
        Stop("retired", STOP_NOT_SERVED),
        Stop("torn", STOP_TEARDOWN),
        Remove("deleted-dir-only"),
        Remove("deleted-stopped"),
    )


def test_a_stopping_process_of_an_assigned_app_is_started_again_without_probing() -> None:
    inputs = PassInputs(apps={"a": view("a")}, processes={"a": ProcessView("a", R1, "stopping")})
    assert plan_pass(inputs) == (Start("a", R1, after_stop=True),)


def test_undecodable_apps_are_left_alone() -> None:
    inputs = PassInputs(
        apps={}, unknown=frozenset({"x"}), processes={"x": live("x")}, local_state=frozenset({"x"})
    )
    assert plan_pass(inputs) == ()


def test_inputs_from_records() -> None:
    apps = [
        AppRecord("a", deployment=Deployment(R1, ["python3", "server.py"])),
        AppRecord("b"),
        AppRecord("c", teardown_pending=True, deployment=Deployment(R2, ["x"])),
    ]
    placements = {
        "a": PlacementRecord(["node-a", "node-b"], 1.0, 1),
        "c": PlacementRecord(["node-b"], 1.0, 1),
    }
    assert app_views("node-a", apps, placements) == {
        "a": AppView("a", True, R1),
        "b": AppView("b", False, None),
        "c": AppView("c", False, R2, teardown_pending=True),
    }
    rows = [
        {"app": "a", "state": "backoff", "revision": R1},
        {"app": "b", "state": "stopping", "revision": R1},
        {"app": "c", "state": "stopped", "revision": ""},
    ]
    assert process_views(rows) == {
        "a": ProcessView("a", R1, "live"),
        "b": ProcessView("b", R1, "stopping"),
        "c": ProcessView("c", "", "stopped"),
    }


def test_serving_set_and_publishing() -> None:
    def row(
        app: str, state: str, crash_loop: bool = False, ready: bool = False
    ) -> dict[str, object]:
        return {
            "ready": ready,
            "app": app,
            "state": state,
            "revision": R1,
            "public_port": 24001,
            "internal_port": 24500,
            "restarts": 2,
            "crash_loop": crash_loop,
        }

    serving = serving_set(
        [
            row("a", "running", ready=True),
            row("b", "starting"),
            row("f", "running"),
            row("c", "backoff", crash_loop=True),
            row("d", "stopping"),
            row("e", "stopped"),
        ]
    )
    assert {app: entry.state for app, entry in serving.items()} == {
        "a": "running",
        "b": "starting",
        "c": "crash-loop",
        "f": "running",
    }
    assert serving["a"] == ServingEntry(R1, 24001, 24500, "running", 2, ready=True)
    # Running but not passing its check: published, and published as not ready.
    assert serving["f"].ready is False
    assert serving["b"].ready is False
    record = NodeRecord("node-a", labels={"zone": "x"}, change_token=7)
    updated = with_serving(record, serving)
    assert updated is not None
    assert updated.change_token == 8
    assert updated.labels == {"zone": "x"}
    assert updated.serving == serving
    assert with_serving(updated, serving) is None


def test_should_skip_only_when_nothing_moved_and_no_timer_is_due() -> None:
    same = {"token": 5, "last_token": 5, "generation": "1:3", "last_generation": "1:3"}
    assert should_skip(**same, timer_due=False)  # type: ignore[arg-type]
    assert not should_skip(**same, timer_due=True)  # type: ignore[arg-type]
    assert not should_skip(**{**same, "token": 6}, timer_due=False)  # type: ignore[arg-type]
    assert not should_skip(**{**same, "generation": "2:0"}, timer_due=False)  # type: ignore[arg-type]
    assert not should_skip(**{**same, "last_token": None}, timer_due=False)  # type: ignore[arg-type]


NAMES = ["a", "b", "c", "d", "e", "f"]
views = st.builds(
    AppView,
    name=st.just(""),
    assigned=st.booleans(),
    revision=st.sampled_from([None, R1, R2]),
    teardown_pending=st.booleans(),
    retired=st.booleans(),
    blocked=st.booleans(),
)
processes = st.builds(
    ProcessView,
    app=st.just(""),
    revision=st.sampled_from([R1, R2]),
    phase=st.sampled_from(["live", "stopping", "stopped"]),
)


@settings(max_examples=200, deadline=None)
@given(
    apps=st.dictionaries(st.sampled_from(NAMES), views),
    procs=st.dictionaries(st.sampled_from(NAMES), processes),
    local=st.frozensets(st.sampled_from(NAMES)),
    unknown=st.frozensets(st.sampled_from(NAMES), max_size=2),
)
def test_plan_properties(
    apps: dict[str, AppView],
    procs: dict[str, ProcessView],
    local: frozenset[str],
    unknown: frozenset[str],
) -> None:
    apps = {
        n: AppView(n, v.assigned, v.revision, v.teardown_pending, v.retired, v.blocked)
        for n, v in apps.items()
    }
    procs = {n: ProcessView(n, p.revision, p.phase) for n, p in procs.items()}
    actions = plan_pass(PassInputs(apps, unknown, procs, local))
    touched = [a.app for a in actions]
    assert len(touched) == len(set(touched)), "one action per app per pass"
    assert not set(touched) & unknown
    kinds = [
        0 if isinstance(a, Start | Replace) else 1 if isinstance(a, Stop) else 2 for a in actions
    ]
    assert kinds == sorted(kinds), "starts, then stops, then removals"
    for group in range(3):
        names = [a.app for a, k in zip(actions, kinds, strict=True) if k == group]
        assert names == sorted(names)
    for action in actions:
        proc = procs.get(action.app)
        app = apps.get(action.app)
        if isinstance(action, Start):
            assert app is not None
            assert app.should_run
            assert proc is None or proc.phase != "live"
            assert action.revision == app.revision
        elif isinstance(action, Replace):
            assert app is not None
            assert app.should_run
            assert proc is not None
            assert proc.phase == "live"
            assert proc.revision != app.revision
        elif isinstance(action, Stop):
            assert proc is not None
            assert proc.phase == "live"
            assert app is None or not app.should_run
            torn = app is not None and app.teardown_pending
            assert action.reason == (STOP_TEARDOWN if torn else STOP_NOT_SERVED)
        else:
            assert app is None
            assert proc is None or proc.phase == "stopped"
    # nothing left undone: every app that should run and does not is started
    for name, app in apps.items():
        if name in unknown:
            continue
        proc = procs.get(name)
        running = proc is not None and proc.phase == "live"
        if app.should_run and not (running and proc is not None and proc.revision == app.revision):
            assert name in touched
        if not app.should_run and running:
            never_deployed = app.assigned and app.revision is None and not app.teardown_pending
            assert (name in touched) != never_deployed


def test_the_revision_to_run_follows_the_rollout_then_keeps_the_previous_one() -> None:
    r3 = "3" * 64
    app = AppRecord(
        "a",
        deployment=Deployment(R2, ["x"]),
        previous_deployment=Deployment(R1, ["x"]),
    )
    plain = PlacementRecord(["n1", "n2", "n3"], 1.0, 1)
    rollout = RolloutRecord(
        R2,
        {
            "n1": NodeRollout(R2, "restarting", 1.0),
            "n2": NodeRollout(R1, "out-of-table", 1.0),
            "n3": NodeRollout(r3, "pending", 1.0),  # a revision the app no longer has
        },
    )
    rolling = PlacementRecord(["n1", "n2", "n3"], 1.0, 1, rollout=rollout)
    assert desired_revision("n1", app, rolling, running=R1) == R2
    assert desired_revision("n2", app, rolling, running=R1) == R1
    # a revision it runs is kept, even one the app no longer names; otherwise the app's
    assert desired_revision("n3", app, rolling, running=r3) == r3
    assert desired_revision("n3", app, rolling, running=None) == R2
    # before the coordinator lists a node, a node on the previous revision keeps it
    assert desired_revision("n4", app, rolling, running=R1) == R1
    assert desired_revision("n1", app, plain, running=R1) == R1
    assert desired_revision("n1", app, plain, running=None) == R2
    assert desired_revision("n1", app, plain, running=r3) == R2
    assert desired_revision("n1", AppRecord("a"), rolling, running=R1) is None
    views = app_views("n2", [app], {"a": rolling}, {"a": R1})
    assert views["a"].revision == R1
    assert plan_pass(PassInputs(apps=views, processes={"a": ProcessView("a", R1, "live")})) == ()
