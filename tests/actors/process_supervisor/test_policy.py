"""Pure decisions of the process supervisor: backoff, crash loops, leftovers, environment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.process_supervisor import (
    CrashHistory,
    ObservedProcess,
    PidRecord,
    RestartPolicy,
    backoff_schedule,
    decide_restart,
    is_leftover,
    process_environment,
)

POLICY = RestartPolicy(
    initial_backoff=0.5,
    backoff_factor=2.0,
    max_backoff=30.0,
    stable_after=30.0,
    crash_loop_crashes=5,
    crash_loop_window=60.0,
)


def test_quick_crashes_back_off_exponentially_then_report_a_crash_loop() -> None:
    assert backoff_schedule(POLICY, 7, spacing=0.1) == [0.5, 1.0, 2.0, 4.0, 30.0, 30.0, 30.0]


def test_a_stable_run_resets_the_backoff() -> None:
    history = CrashHistory()
    for t in (0.0, 1.0, 3.0):
        history = decide_restart(POLICY, history, exited_at=t, uptime=0.5).history
    after_stable = decide_restart(POLICY, history, exited_at=100.0, uptime=40.0)
    assert after_stable.delay == POLICY.initial_backoff
    assert not after_stable.crash_loop


def test_exits_spread_beyond_the_window_are_no_crash_loop() -> None:
    history = CrashHistory()
    for i in range(20):
        decision = decide_restart(POLICY, history, exited_at=i * 20.0, uptime=1.0)
        history = decision.history
        assert not decision.crash_loop


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=30),
    uptimes=st.lists(st.floats(min_value=0, max_value=100), min_size=30, max_size=30),
)
def test_delay_is_bounded_and_crash_loop_means_n_exits_in_the_window(
    gaps: list[float], uptimes: list[float]
) -> None:
    history, now, exits = CrashHistory(), 0.0, []
    for gap, uptime in zip(gaps, uptimes, strict=False):
        now += gap
        exits.append(now)
        decision = decide_restart(POLICY, history, exited_at=now, uptime=uptime)
        history = decision.history
        assert 0 <= decision.delay <= POLICY.max_backoff
        recent = [t for t in exits if t > now - POLICY.crash_loop_window]
        assert decision.crash_loop == (len(recent) >= POLICY.crash_loop_crashes)
        if decision.crash_loop:
            assert decision.delay == POLICY.max_backoff
        assert len(history.exits) <= POLICY.crash_loop_crashes


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
