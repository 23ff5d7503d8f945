"""Pure decisions of the process supervisor: backoff, crash loops, leftovers, environment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.process_supervisor import RestartPolicy
from corral.actors.process_supervisor._policy import (
    INSTANCE_VAR,
    ChildProcess,
    CrashHistory,
    ObservedProcess,
    PidRecord,
    backoff_schedule,
    decide_restart,
    instance_marker,
    is_leftover,
    is_marked_leftover,
    marker_scope,
    orphans_to_reap,
    parse_instance_marker,
    process_environment,
)

POLICY = RestartPolicy(
    initial_backoff=0.5,
    backoff_factor=2.0,
    max_backoff=30.0,
    stable_after=30.0,
    crash_loop_crashes=5,
)

#: Uptimes of runs that end before they are stable (0: a start that failed outright).
quick = st.floats(min_value=0, max_value=POLICY.stable_after, exclude_max=True)
stable = st.floats(min_value=POLICY.stable_after, max_value=1e9)


def test_quick_crashes_back_off_exponentially_then_report_a_crash_loop() -> None:
    assert backoff_schedule(POLICY, 7, spacing=0.1) == [0.5, 1.0, 2.0, 4.0, 30.0, 30.0, 30.0]


def test_a_stable_run_resets_the_backoff() -> None:
    history = CrashHistory()
    for _ in range(3):
        history = decide_restart(POLICY, history, uptime=0.5).history
    after_stable = decide_restart(POLICY, history, uptime=40.0)
    assert after_stable.delay == POLICY.initial_backoff
    assert not after_stable.crash_loop


def test_a_crash_loop_outlasting_any_window_stays_a_crash_loop() -> None:
    # Regression: the flag was "5 exits within 60 s"; at the 30 s cap only two fit in
    # the window, so a process exiting forever was shown as merely restarting.
    history = CrashHistory()
    for i in range(200):
        decision = decide_restart(POLICY, history, uptime=29.0)
        history = decision.history
        assert decision.crash_loop == (i + 1 >= POLICY.crash_loop_crashes)
    assert history.consecutive == 200


@settings(max_examples=100, deadline=None)
@given(
    before=st.integers(min_value=0, max_value=50),
    after=st.lists(quick, min_size=1, max_size=300),
)
def test_crash_loop_holds_for_any_number_of_quick_exits_past_the_threshold(
    before: int, after: list[float]
) -> None:
    history = CrashHistory(before)
    for n, uptime in enumerate(after, start=1):
        decision = decide_restart(POLICY, history, uptime=uptime)
        history = decision.history
        assert history.consecutive == before + n
        assert decision.crash_loop == (before + n >= POLICY.crash_loop_crashes)
        assert decision.crash_loop == history.crash_loop(POLICY)
        if decision.crash_loop:
            assert decision.delay == POLICY.max_backoff


@settings(max_examples=100, deadline=None)
@given(
    uptimes=st.lists(st.one_of(quick, stable), min_size=1, max_size=60),
    start=st.integers(min_value=0, max_value=1000),
)
def test_a_stable_run_starts_a_new_series_and_delays_stay_bounded(
    uptimes: list[float], start: int
) -> None:
    history = CrashHistory(start)
    since_stable = start
    for uptime in uptimes:
        decision = decide_restart(POLICY, history, uptime=uptime)
        history = decision.history
        since_stable = 1 if uptime >= POLICY.stable_after else since_stable + 1
        assert history.consecutive == since_stable
        assert decision.crash_loop == (since_stable >= POLICY.crash_loop_crashes)
        assert 0 <= decision.delay <= POLICY.max_backoff
        if not decision.crash_loop:
            expected = POLICY.initial_backoff * POLICY.backoff_factor ** (since_stable - 1)
            assert decision.delay == min(POLICY.max_backoff, expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_backoff": 5.0, "max_backoff": 1.0},
        {"backoff_factor": 0.5},
        {"crash_loop_crashes": 0},
        {"stable_after": 0.0},
    ],
)
def test_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RestartPolicy"):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


RECORD = PidRecord("hello", "node-a", 4242, 1000.25, ("python3", "server.py"), "ab" * 32)


def test_leftover_needs_the_same_start_time() -> None:
    same = ObservedProcess(1000.25, ("python3", "server.py"))
    reused = ObservedProcess(2000.0, ("python3", "server.py"))
    assert is_leftover(RECORD, same)
    assert not is_leftover(RECORD, reused)
    assert not is_leftover(RECORD, None)


def test_leftover_recognised_through_a_shim_or_its_environment() -> None:
    shim = ObservedProcess(1000.25, ("/opt/py/bin/python3.11", "server.py"))
    other = ObservedProcess(1000.25, ("/usr/bin/vim", "notes.txt"))
    by_env = ObservedProcess(1000.25, ("/usr/bin/vim",), corral_app="hello", corral_node="node-a")
    other_node = ObservedProcess(1000.25, ("/bin/x",), corral_app="hello", corral_node="node-b")
    assert is_leftover(RECORD, shim)
    assert not is_leftover(RECORD, other)
    assert is_leftover(RECORD, by_env)
    assert not is_leftover(RECORD, other_node)


def test_pid_record_round_trips_and_refuses_garbage() -> None:
    assert PidRecord.from_json(RECORD.to_json()) == RECORD
    assert PidRecord.from_json({"v": 1, "pid": "12"}) is None
    assert PidRecord.from_json({**RECORD.to_json(), "pid": 1}) is None
    assert PidRecord.from_json([1, 2]) is None


def test_environment_strips_node_secrets_and_sets_ports() -> None:
    env = process_environment(
        {"PATH": "/bin", "CORRAL_TOKEN": "secret", "PORT": "1"},
        {"GREETING": "hi", "PORT": "2", "CORRAL_APP": "spoof"},
        app="hello",
        node_id="node-a",
        public_port=24001,
        internal_port=24500,
        bind_host="127.0.0.1",
    )
    assert env == {
        "PATH": "/bin",
        "GREETING": "hi",
        "PORT": "24001",
        "CORRAL_PUBLIC_PORT": "24001",
        "CORRAL_INTERNAL_PORT": "24500",
        "CORRAL_APP": "hello",
        "CORRAL_NODE": "node-a",
        "CORRAL_BIND_HOST": "127.0.0.1",
    }


def test_environment_carries_the_instance_marker_which_an_app_cannot_spoof() -> None:
    marker = instance_marker("node-a", "hello", "ab12.3")
    env = process_environment(
        {"PATH": "/bin", INSTANCE_VAR: "node-x/outer/1"},
        {INSTANCE_VAR: "node-a/other/9"},
        app="hello",
        node_id="node-a",
        public_port=24001,
        internal_port=24500,
        bind_host="127.0.0.1",
        instance=marker,
    )
    assert env[INSTANCE_VAR] == "node-a/hello/ab12.3"
    assert parse_instance_marker(marker) == ("node-a", "hello", "ab12.3")


@pytest.mark.parametrize("bad", ["", "node-a", "node-a/hello", "a/b/c/d", "a//c", "/b/c"])
def test_a_malformed_marker_is_no_marker(bad: str) -> None:
    assert parse_instance_marker(bad) is None
    assert not is_marked_leftover(bad, scope="a", live=frozenset())


def test_marked_leftovers_are_this_nodes_and_not_of_this_life() -> None:
    scope = marker_scope("node-a", "/var/lib/corral")
    mine = instance_marker(scope, "hello", "1")
    live = frozenset({instance_marker(scope, "hello", "2")})
    assert is_marked_leftover(mine, scope=scope, live=live)
    assert not is_marked_leftover(next(iter(live)), scope=scope, live=live)
    other = marker_scope("node-b", "/var/lib/corral")
    assert not is_marked_leftover(instance_marker(other, "hello", "1"), scope=scope, live=live)
    assert not is_marked_leftover(None, scope=scope, live=live)


def test_a_node_id_reused_under_another_data_dir_is_another_scope() -> None:
    # A demo cluster and a test harness on one machine may both have a node-1.
    demo = marker_scope("node-1", "/tmp/demo/node-1")
    harness = marker_scope("node-1", "/tmp/harness/node-1")
    assert demo != harness
    assert demo == marker_scope("node-1", "/tmp/demo/./node-1/../node-1")
    assert parse_instance_marker(instance_marker(demo, "web", "1")) == (demo, "web", "1")
    assert not is_marked_leftover(
        instance_marker(harness, "web", "1"), scope=demo, live=frozenset()
    )


def test_a_leftover_is_recognised_by_its_recorded_instance_marker() -> None:
    record = PidRecord("hello", "node-a", 4242, 1000.25, ("sh",), "", "node-a/hello/7")
    assert PidRecord.from_json(record.to_json()) == record
    marked = ObservedProcess(1000.25, ("/other/prog",), instance="node-a/hello/7")
    assert is_leftover(record, marked)
    assert not is_leftover(record, ObservedProcess(1000.25, ("/other/prog",), instance="x/y/z"))
    assert not is_leftover(record, ObservedProcess(9.0, ("sh",), instance="node-a/hello/7"))


OWN_SESSION = 100


def child(pid: int, *, session: int, zombie: bool, marker: str | None = None) -> ChildProcess:
    return ChildProcess(
        pid=pid, start_ticks=pid * 10, session=session, zombie=zombie, marker=marker
    )


def test_orphans_in_a_foreign_session_are_reaped_direct_children_never() -> None:
    children = [
        child(10, session=OWN_SESSION, zombie=True),  # forked by the node: its parent waits
        child(11, session=11, zombie=True),  # the node's child that called setsid
        child(12, session=77, zombie=True),  # an orphan from an app's session
        child(13, session=77, zombie=True),  # launched leader (never in its own session)
    ]
    scan = orphans_to_reap(
        children, own_session=OWN_SESSION, own_marker=None, launched={13}, adopted={}
    )
    assert scan.reap == (12,)


def test_an_orphan_seen_alive_with_a_marker_is_reaped_once_it_died() -> None:
    marker = "node-a/hello/1"
    alive = [child(20, session=20, zombie=False, marker=marker)]
    first = orphans_to_reap(
        alive, own_session=OWN_SESSION, own_marker=None, launched=set(), adopted={}
    )
    assert first.reap == ()
    assert first.adopted == {20: 200}
    dead = [child(20, session=20, zombie=True)]
    second = orphans_to_reap(
        dead, own_session=OWN_SESSION, own_marker=None, launched=set(), adopted=first.adopted
    )
    assert second.reap == (20,)
    assert second.adopted == {}


def test_the_nodes_own_marker_and_reused_pids_adopt_nothing() -> None:
    own = "outer/node/1"
    scan = orphans_to_reap(
        [child(30, session=30, zombie=False, marker=own)],
        own_session=OWN_SESSION,
        own_marker=own,
        launched=set(),
        adopted={},
    )
    assert scan.adopted == {}
    # A remembered pid now held by another process (another start time) is not it.
    reused = orphans_to_reap(
        [child(31, session=31, zombie=True)],
        own_session=OWN_SESSION,
        own_marker=None,
        launched=set(),
        adopted={31: 1},
    )
    assert reused.reap == ()


@settings(max_examples=200, deadline=None)
@given(
    children=st.lists(
        st.builds(
            ChildProcess,
            pid=st.integers(2, 60),
            start_ticks=st.integers(0, 3),
            session=st.sampled_from([OWN_SESSION, 7, 8]),
            zombie=st.booleans(),
            marker=st.one_of(st.none(), st.sampled_from(["a/b/1", "own/x/1"])),
        ),
        unique_by=lambda c: c.pid,
    ),
    launched=st.frozensets(st.integers(2, 60)),
    adopted=st.dictionaries(st.integers(2, 60), st.integers(0, 3)),
)
def test_reaping_never_touches_launched_live_or_own_session_children(
    children: list[ChildProcess], launched: frozenset[int], adopted: dict[int, int]
) -> None:
    scan = orphans_to_reap(
        children,
        own_session=OWN_SESSION,
        own_marker="own/x/1",
        launched=launched,
        adopted=adopted,
    )
    by_pid = {c.pid: c for c in children}
    for pid in scan.reap:
        c = by_pid[pid]
        assert c.zombie
        assert pid not in launched
        assert c.session != OWN_SESSION or adopted.get(pid) == c.start_ticks
        assert c.session != pid or adopted.get(pid) == c.start_ticks
    assert not set(scan.adopted) & launched
    assert all(not by_pid[pid].zombie for pid in scan.adopted)
