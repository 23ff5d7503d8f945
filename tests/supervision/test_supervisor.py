"""Supervision: strategies, restart types, intensity and escalation, backoff, shutdown."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from corral.supervision import (
    Actor,
    ActorCrashed,
    ActorStopped,
    Backoff,
    ChildSpec,
    EscalationError,
    Restart,
    Strategy,
    SupervisorSpec,
    UnhandledMessage,
    open_actor_system,
)

NO_BACKOFF = Backoff(initial=0.0, factor=1.0, maximum=0.0)


class Journal:
    """What happened, in order: ("start" | "stop", name, time)."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, float]] = []

    def add(self, what: str, name: str) -> None:
        self.entries.append((what, name, trio.current_time()))

    def names(self, what: str) -> list[str]:
        return [n for w, n, _ in self.entries if w == what]

    def clear(self) -> None:
        self.entries.clear()


class Worker(Actor):
    """Records its start and stop; crashes on "crash", stops itself on "quit"."""

    def __init__(self, name: str, journal: Journal, cleanup: float = 0.0) -> None:
        super().__init__()
        self.name = name
        self.journal = journal
        self.cleanup = cleanup
        self.instance = object()

    async def started(self) -> None:
        self.journal.add("start", self.name)

    async def handle(self, message: object) -> object:
        if message == "crash":
            raise RuntimeError(f"{self.name} crashed")
        if message == "quit":
            self.ctx.stop()
            return "bye"
        if message == "who":
            return self.instance
        if message == "hang":
            await trio.sleep_forever()
        return None

    async def stopping(self) -> None:
        if self.cleanup:
            await trio.sleep(self.cleanup)
        self.journal.add("stop", self.name)


def worker(
    name: str,
    journal: Journal,
    restart: Restart = Restart.PERMANENT,
    cleanup: float = 0.0,
    grace: float = 10.0,
) -> ChildSpec:
    return ChildSpec(
        name, lambda: Worker(name, journal, cleanup), restart=restart, shutdown_grace=grace
    )


def sup(
    name: str,
    children: list[ChildSpec | SupervisorSpec],
    strategy: Strategy = Strategy.ONE_FOR_ONE,
    **kw: object,
) -> SupervisorSpec:
    kw.setdefault("backoff", NO_BACKOFF)
    return SupervisorSpec(name=name, children=children, strategy=strategy, **kw)  # type: ignore[arg-type]


async def crash(system: object, path: str) -> None:
    ref = system.ref(path)  # type: ignore[attr-defined]
    with pytest.raises(ActorCrashed):
        await ref.ask("crash")
    # the asker hears of the crash first; cleanup and the supervisor's decision follow
    await trio.testing.wait_all_tasks_blocked()


# --------------------------------------------------------------------------- strategies


async def test_one_for_one_restarts_only_the_crashed_child(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker(n, journal) for n in "abc"], Strategy.ONE_FOR_ONE)
    async with open_actor_system("n", children=[spec]) as system:
        before = {n: await system.ref(f"/s/{n}").ask("who") for n in "abc"}
        journal.clear()
        await crash(system, "/s/b")
        await trio.sleep(1)
        assert journal.names("stop") == ["b"]
        assert journal.names("start") == ["b"]
        after = {n: await system.ref(f"/s/{n}").ask("who") for n in "abc"}
        assert after["a"] is before["a"]
        assert after["c"] is before["c"]
        assert after["b"] is not before["b"]
        restarts = {s.name: s.restarts for s in system.tree().walk()}
        assert (restarts["a"], restarts["b"], restarts["c"]) == (0, 1, 0)


async def test_one_for_all_stops_the_others_in_reverse_and_restarts_all_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker(n, journal) for n in "abcd"], Strategy.ONE_FOR_ALL)
    async with open_actor_system("n", children=[spec]) as system:
        journal.clear()
        await crash(system, "/s/b")
        await trio.sleep(1)
        # b's own cleanup runs as it crashes; then the others go down in reverse order
        assert journal.names("stop") == ["b", "d", "c", "a"]
        assert journal.names("start") == ["a", "b", "c", "d"]
        workers = [s for s in system.tree().walk() if s.kind == "actor"]
        assert [s.restarts for s in workers] == [1, 1, 1, 1]


async def test_rest_for_one_restarts_the_crashed_child_and_those_started_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker(n, journal) for n in "abcd"], Strategy.REST_FOR_ONE)
    async with open_actor_system("n", children=[spec]) as system:
        journal.clear()
        await crash(system, "/s/b")
        await trio.sleep(1)
        assert journal.names("stop") == ["b", "d", "c"]
        assert journal.names("start") == ["b", "c", "d"]
        snapshot = system.tree().find("/s/a")
        assert snapshot is not None
        assert snapshot.restarts == 0


# --------------------------------------------------------------------------- restart types


async def test_permanent_child_is_restarted_even_after_a_normal_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    async with open_actor_system("n", children=[sup("s", [worker("p", journal)])]) as system:
        assert await system.ref("/s/p").ask("quit") == "bye"
        await trio.sleep(1)
        assert journal.names("start") == ["p", "p"]
        snapshot = system.tree().find("/s/p")
        assert snapshot is not None
        assert snapshot.state == "running"


async def test_transient_child_is_restarted_after_a_crash_but_not_after_a_normal_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker("t", journal, Restart.TRANSIENT)])
    async with open_actor_system("n", children=[spec]) as system:
        await crash(system, "/s/t")
        await trio.sleep(1)
        assert journal.names("start") == ["t", "t"]
        await system.ref("/s/t").ask("quit")
        await trio.sleep(1)
        assert journal.names("start") == ["t", "t"]
        snapshot = system.tree().find("/s/t")
        assert snapshot is not None
        assert snapshot.state == "stopped"  # still listed, not running
        with pytest.raises(ActorStopped):
            await system.ref("/s/t").ask("who")


async def test_temporary_child_is_never_restarted_and_is_removed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker("tmp", journal, Restart.TEMPORARY), worker("keep", journal)])
    async with open_actor_system("n", children=[spec]) as system:
        await crash(system, "/s/tmp")
        await trio.sleep(1)
        assert journal.names("start") == ["tmp", "keep"]
        assert system.tree().find("/s/tmp") is None
        assert system.tree().find("/s/keep") is not None


async def test_temporary_sibling_is_dropped_by_one_for_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup(
        "s",
        [worker("a", journal), worker("tmp", journal, Restart.TEMPORARY), worker("c", journal)],
        Strategy.ONE_FOR_ALL,
    )
    async with open_actor_system("n", children=[spec]) as system:
        journal.clear()
        await crash(system, "/s/a")
        await trio.sleep(1)
        assert journal.names("start") == ["a", "c"]
        assert system.tree().find("/s/tmp") is None


# --------------------------------------------------------------------------- intensity


async def test_exceeding_intensity_escalates_to_the_parent_which_restarts_the_subtree(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    inner = sup("inner", [worker("w", journal)], max_restarts=2, within=10.0)
    outer = sup("outer", [inner], max_restarts=5, within=10.0)
    async with open_actor_system("n", children=[outer]) as system:
        for _ in range(2):
            await crash(system, "/outer/inner/w")
            await trio.sleep(0.5)
        inner_snap = system.tree().find("/outer/inner")
        assert inner_snap is not None
        assert inner_snap.restarts == 0  # two restarts are within the limit
        await crash(system, "/outer/inner/w")  # the third within 10 s: too many
        await trio.sleep(0.5)
        escalations = [e for e in system.events() if e.kind == "supervisor.escalated"]
        assert [e.path for e in escalations] == ["/outer/inner"]
        inner_snap = system.tree().find("/outer/inner")
        assert inner_snap is not None
        assert inner_snap.restarts == 1
        assert inner_snap.state == "running"
        assert inner_snap.last_error is not None
        assert "EscalationError" in inner_snap.last_error
        w = system.tree().find("/outer/inner/w")
        assert w is not None
        assert w.state == "running"
        assert await system.ref("/outer/inner/w").ask("who") is not None


async def test_restarts_spread_beyond_the_window_do_not_escalate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    inner = sup("inner", [worker("w", journal)], max_restarts=2, within=10.0)
    async with open_actor_system("n", children=[inner]) as system:
        for _ in range(6):
            await crash(system, "/inner/w")
            await trio.sleep(6.0)
        assert not [e for e in system.events() if e.kind == "supervisor.escalated"]
        assert len(journal.names("start")) == 7


async def test_escalation_past_the_root_fails_the_system(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    root = SupervisorSpec(name="root", max_restarts=1, within=60.0, backoff=NO_BACKOFF)
    inner = sup("inner", [worker("w", journal)], max_restarts=0, within=60.0)

    async def run_until_failure() -> None:
        async with open_actor_system("n", root=root, children=[inner]) as system:
            await crash(system, "/inner/w")  # inner escalates; root restarts it (1 of 1)
            await trio.sleep(1)
            await crash(system, "/inner/w")  # inner escalates again; root gives up
            await trio.sleep_forever()

    with pytest.raises(EscalationError, match="gave up"):
        await run_until_failure()
    # everything was stopped on the way out
    assert journal.names("start").count("w") == journal.names("stop").count("w")


# --------------------------------------------------------------------------- backoff


async def test_backoff_grows_between_consecutive_restarts_and_is_capped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    backoff = Backoff(initial=0.5, factor=2.0, maximum=3.0)
    spec = sup("s", [worker("w", journal)], backoff=backoff, max_restarts=100, within=1000.0)
    async with open_actor_system("n", children=[spec]) as system:
        delays = []
        for _ in range(5):
            t_crash = trio.current_time()
            count = len(journal.names("start"))
            await crash(system, "/s/w")
            while len(journal.names("start")) == count:
                await trio.sleep(0.01)
            delays.append(journal.entries[-1][2] - t_crash)
        assert delays == pytest.approx([0.5, 1.0, 2.0, 3.0, 3.0])
        snapshot = system.tree().find("/s/w")
        assert snapshot is not None
        assert snapshot.restarts == 5


async def test_backoff_resets_after_the_child_ran_long_enough(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    backoff = Backoff(initial=1.0, factor=2.0, maximum=60.0, reset_after=30.0)
    spec = sup("s", [worker("w", journal)], backoff=backoff, max_restarts=100, within=1000.0)
    async with open_actor_system("n", children=[spec]) as system:
        for expected in (1.0, 2.0, 1.0):
            t0 = trio.current_time()
            await crash(system, "/s/w")
            await trio.sleep(expected - 0.01)
            assert journal.entries[-1][0] == "stop"  # not yet restarted
            await trio.sleep(0.02)
            assert journal.entries[-1][0] == "start"
            assert journal.entries[-1][2] - t0 == pytest.approx(expected)
            if expected == 2.0:
                await trio.sleep(31.0)  # run stably for longer than reset_after


async def test_restarting_child_shows_state_restarting_and_queues_messages(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker("w", journal)], backoff=Backoff(initial=5.0))
    async with open_actor_system("n", children=[spec]) as system:
        await crash(system, "/s/w")
        snapshot = system.tree().find("/s/w")
        assert snapshot is not None
        assert snapshot.state == "restarting"
        t0 = trio.current_time()
        assert (
            await system.ref("/s/w").ask("who", timeout=10.0) is not None
        )  # waits for the restart
        assert trio.current_time() - t0 == pytest.approx(5.0)


# --------------------------------------------------------------------------- shutdown


async def test_shutdown_goes_in_reverse_start_order_through_nested_supervisors(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    tree = sup(
        "top",
        [
            worker("a", journal),
            sup("mid", [worker("b", journal), worker("c", journal)]),
            worker("d", journal),
        ],
    )
    async with open_actor_system("n", children=[tree]) as system:
        await system.spawn(worker("e", journal))
        assert journal.names("start") == ["a", "b", "c", "d", "e"]
    assert journal.names("stop") == ["e", "d", "c", "b", "a"]
    assert [e.path for e in system.events() if e.kind == "actor.stopped"][-1] == "/top"


async def test_each_child_gets_its_cleanup_grace_one_after_another(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("s", [worker("a", journal, cleanup=2.0), worker("b", journal, cleanup=3.0)])
    async with open_actor_system("n", children=[spec]):
        t0 = trio.current_time()
    stops = [(n, t - t0) for w, n, t in journal.entries if w == "stop"]
    assert stops == [("b", pytest.approx(3.0)), ("a", pytest.approx(5.0))]


async def test_cleanup_finishes_while_the_parent_is_being_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup(
        "s",
        [worker("lease", journal, cleanup=4.0, grace=5.0), worker("procs", journal, cleanup=1.0)],
    )
    with trio.CancelScope() as outer:
        async with open_actor_system("n", children=[spec]):
            t0 = trio.current_time()
            outer.cancel()  # the whole system is being cancelled
            await trio.sleep_forever()
    assert outer.cancelled_caught
    # both cleanups ran to completion, in reverse start order, despite the cancellation
    stops = [(n, t - t0) for w, n, t in journal.entries if w == "stop"]
    assert stops == [("procs", pytest.approx(1.0)), ("lease", pytest.approx(5.0))]


async def test_cleanup_past_its_grace_is_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    journal = Journal()
    spec = sup("s", [worker("slow", journal, cleanup=100.0, grace=3.0)])
    async with open_actor_system("n", children=[spec]) as system:
        t0 = trio.current_time()
    assert trio.current_time() - t0 == pytest.approx(3.0)
    assert journal.names("stop") == []  # its cleanup never finished
    assert [e.path for e in system.events() if e.kind == "actor.cleanup-timeout"] == ["/s/slow"]


async def test_stopping_runs_after_a_crash_too(autojump_clock: trio.testing.MockClock) -> None:
    journal = Journal()
    spec = sup("s", [worker("w", journal, Restart.TEMPORARY)])
    async with open_actor_system("n", children=[spec]) as system:
        await crash(system, "/s/w")
        assert journal.names("stop") == ["w"]


async def test_stop_request_cancels_the_message_in_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    async with open_actor_system("n") as system:
        ref = await system.spawn(worker("w", journal))
        outcome: list[BaseException] = []

        async def ask_hanging() -> None:
            try:
                await ref.ask("hang", timeout=100)
            except ActorStopped as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_hanging)
            await trio.sleep(1)
            await system.stop(ref)
        assert len(outcome) == 1
        assert journal.names("stop") == ["w"]


async def test_spawn_under_a_nested_supervisor(autojump_clock: trio.testing.MockClock) -> None:
    journal = Journal()
    async with open_actor_system("n", children=[sup("apps", [])]) as system:
        parent = system.ref("/apps")
        ref = await system.spawn(worker("web", journal), parent=parent)
        assert ref.path == "/apps/web"
        assert await ref.ask("who") is not None
        await system.stop(ref)
        assert system.tree().find("/apps/web") is None
        assert journal.names("stop") == ["web"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChildSpec("a/b", Actor),
        lambda: ChildSpec("", Actor),
        lambda: ChildSpec("x", Actor, mailbox_size=0),
        lambda: SupervisorSpec("s", children=[ChildSpec("x", Actor), ChildSpec("x", Actor)]),
        lambda: SupervisorSpec("s", within=0),
        lambda: Backoff(factor=0.5),
    ],
)
def test_invalid_specs_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        make()


async def test_supervisors_appear_in_the_tree_and_take_no_messages(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal = Journal()
    spec = sup("node", [worker("coordinator", journal), sup("apps", [worker("web", journal)])])
    async with open_actor_system("n") as system:
        ref = await system.spawn(spec)
        tree = system.tree()
        kinds = {s.path: s.kind for s in tree.walk()}
        assert kinds == {
            "/": "supervisor",
            "/node": "supervisor",
            "/node/coordinator": "actor",
            "/node/apps": "supervisor",
            "/node/apps/web": "actor",
        }
        assert all(s.state == "running" for s in tree.walk())
        with pytest.raises(UnhandledMessage, match="supervisor"):
            await ref.tell("hello")
        with pytest.raises(UnhandledMessage, match="supervisor"):
            await system.ref("/node/apps").ask("hello")
