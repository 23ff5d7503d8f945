"""Actors on one system: tell/ask, deadlines, backpressure, timers, tasks, introspection."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio
import trio.testing

from corral.supervision import (
    Actor,
    ActorCrashed,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    AskTimeout,
    ChildSpec,
    MailboxFull,
    Restart,
    UnhandledMessage,
    open_actor_system,
    run_actor_system,
)


@dataclass(frozen=True)
class Add:
    n: int


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Boom:
    pass


@dataclass(frozen=True)
class Tick:
    pass


class Counter(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.log: list[object] = []

    async def handle(self, message: object) -> object:
        match message:
            case Add(n=n):
                self.total += n
                self.log.append(n)
                return self.total
            case Get():
                return self.total
            case Sleep(seconds=seconds):
                await trio.sleep(seconds)
                return "slept"
            case Boom():
                raise ValueError("boom")
        raise UnhandledMessage(message)


async def test_tell_then_ask_sees_every_message_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        for n in range(1, 101):
            await ref.tell(Add(n))
        assert await ref.ask(Get()) == sum(range(1, 101))
        snapshot = system.tree().find("/counter")
        assert snapshot is not None
        assert snapshot.messages_handled == 101


async def test_any_python_object_can_be_sent_locally(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Keep(Actor):
        async def handle(self, message: object) -> object:
            return message

    marker = object()
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("keep", Keep))
        assert await ref.ask(marker) is marker  # never encoded, never copied


async def test_ask_deadline_raises_ask_timeout_at_exactly_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        t0 = trio.current_time()
        with pytest.raises(AskTimeout, match=r"within 2\.5 s"):
            await ref.ask(Sleep(100), timeout=2.5)
        assert trio.current_time() - t0 == pytest.approx(2.5)


async def test_ask_that_crashes_the_actor_raises_actor_crashed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        with pytest.raises(ActorCrashed, match="ValueError: boom") as info:
            await ref.ask(Boom())
        assert isinstance(info.value.__cause__, ValueError)


async def test_unhandled_message_goes_to_asker_and_actor_keeps_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        with pytest.raises(UnhandledMessage):
            await ref.ask("what is this")
        await ref.tell("and this")  # a tell of an unhandled message is logged, not a crash
        assert await ref.ask(Add(1)) == 1
        snapshot = system.tree().find("/counter")
        assert snapshot is not None
        assert snapshot.restarts == 0
        assert any(e.kind == "actor.unhandled" for e in system.events())


async def test_ask_to_unknown_path_raises_actor_not_found(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        with pytest.raises(ActorNotFound, match="/ghost"):
            await system.ref("/ghost").ask(Get())
        with pytest.raises(ActorNotFound):
            await system.ref("/ghost").tell(Get())


async def test_ref_made_before_spawn_resolves_when_used(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        early = system.ref("/counter")
        await system.spawn(ChildSpec("counter", Counter))
        assert await early.ask(Add(2)) == 2
        assert early == system.ref("n/counter")
        assert hash(early) == hash(system.ref("/counter", node="n"))


async def test_stopped_actor_fails_queued_and_later_asks_instead_of_hanging(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        results: list[BaseException] = []

        async def ask_busy() -> None:
            try:
                await ref.ask(Sleep(100), timeout=1000)
            except (ActorStopped, ActorNotFound) as exc:
                results.append(exc)

        async def ask_queued() -> None:
            try:
                await ref.ask(Get(), timeout=1000)
            except (ActorStopped, ActorNotFound) as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_busy)
            await trio.sleep(1)
            nursery.start_soon(ask_queued)
            await trio.sleep(1)
            t0 = trio.current_time()
            await system.stop(ref)
        assert trio.current_time() - t0 < 1  # nobody waited for the 1000 s deadline
        assert len(results) == 2
        assert all(isinstance(r, ActorStopped) for r in results)
        with pytest.raises((ActorStopped, ActorNotFound)):
            await ref.ask(Get())
        assert system.tree().find("/counter") is None


async def test_full_mailbox_applies_backpressure(autojump_clock: trio.testing.MockClock) -> None:
    class Gate(Actor):
        def __init__(self) -> None:
            super().__init__()
            self.open = trio.Event()
            self.seen: list[int] = []

        async def handle(self, message: object) -> object:
            if message == "open":
                self.open.set()
                return None
            await self.open.wait()
            assert isinstance(message, int)
            self.seen.append(message)
            return None

    gate = Gate()
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("gate", lambda: gate, mailbox_size=4))
        await ref.tell(0)  # taken at once; the actor blocks on it
        await trio.testing.wait_all_tasks_blocked()
        for i in range(1, 5):
            ref.tell_nowait(i)  # fills the 4 slots
        with pytest.raises(MailboxFull, match="4 messages"):
            ref.tell_nowait(99)
        snapshot = system.tree().find("/gate")
        assert snapshot is not None
        assert snapshot.mailbox_depth == 4
        assert snapshot.current_message == "int"

        sent = trio.Event()

        async def blocked_sender() -> None:
            await ref.tell(5)  # waits for room
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked_sender)
            await trio.sleep(10)
            assert not sent.is_set()  # still waiting: no unbounded growth
            gate.open.set()
            await sent.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert gate.seen == [0, 1, 2, 3, 4, 5]


async def test_mailbox_size_comes_from_the_actor_class(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Small(Actor):
        mailbox_size = 2

        async def handle(self, message: object) -> object:
            await trio.sleep(100)
            return None

    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("small", Small))
        ref.tell_nowait(1)
        await trio.testing.wait_all_tasks_blocked()
        ref.tell_nowait(2)
        ref.tell_nowait(3)
        with pytest.raises(MailboxFull):
            ref.tell_nowait(4)


async def test_every_and_after_timers_fire_on_time_and_die_with_the_actor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ticks: list[tuple[str, float]] = []

    class Timed(Actor):
        async def started(self) -> None:
            self.every_handle = self.ctx.every(10.0, "every")
            self.ctx.after(25.0, "after")
            cancelled = self.ctx.after(5.0, "never")
            cancelled.cancel()
            assert cancelled.cancelled

        async def handle(self, message: object) -> object:
            ticks.append((str(message), trio.current_time()))
            if message == "stop-ticking":
                self.every_handle.cancel()
            return None

    async with open_actor_system("n") as system:
        t0 = trio.current_time()
        ref = await system.spawn(ChildSpec("timed", Timed))
        await trio.sleep(35)
        assert [(k, t - t0) for k, t in ticks] == [
            ("every", 10.0),
            ("every", 20.0),
            ("after", 25.0),
            ("every", 30.0),
        ]
        await system.stop(ref)
        count = len(ticks)
        await trio.sleep(100)
        assert len(ticks) == count  # timers died with the actor


async def test_background_task_failure_crashes_the_actor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts: list[float] = []

    class Watcher(Actor):
        async def started(self) -> None:
            starts.append(trio.current_time())
            self.ctx.start_task(self._watch)

        async def _watch(self) -> None:
            await trio.sleep(3)
            raise ConnectionError("lost the lease")

    async with open_actor_system("n") as system:
        await system.spawn(ChildSpec("watcher", Watcher, restart=Restart.TEMPORARY))
        await trio.sleep(5)
        crashed = [e for e in system.events() if e.kind == "actor.crashed"]
        assert len(crashed) == 1
        assert crashed[0].fields["error"] == "ConnectionError: lost the lease"
        assert system.tree().find("/watcher") is None  # temporary: removed, not restarted
        assert len(starts) == 1


async def test_ctx_exposes_identity_log_and_events(autojump_clock: trio.testing.MockClock) -> None:
    seen: dict[str, object] = {}

    class Introspective(Actor):
        async def started(self) -> None:
            seen["path"] = self.ctx.path
            seen["name"] = self.ctx.name
            seen["node"] = self.ctx.node_id
            seen["ref"] = self.ctx.ref
            seen["logger"] = self.ctx.log.name
            seen["system"] = self.ctx.system
            self.ctx.emit("placement.pending", app="web", replicas=2)

    async with open_actor_system("node-a") as system:
        ref = await system.spawn(ChildSpec("intro", Introspective))
        assert seen["path"] == "/intro"
        assert seen["name"] == "intro"
        assert seen["node"] == "node-a"
        assert seen["ref"] == ref
        assert seen["system"] is system
        assert seen["logger"] == "corral.actor.node-a.intro"
        event = next(e for e in system.events() if e.kind == "placement.pending")
        assert event.path == "/intro"
        assert event.fields == {"app": "web", "replicas": 2}
        assert event.to_dict()["kind"] == "placement.pending"


async def test_ctx_is_not_available_in_init(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(RuntimeError, match="only available once the actor is spawned"):
        _ = Counter().ctx


async def test_spawning_a_taken_name_raises_actor_exists(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n") as system:
        await system.spawn(ChildSpec("counter", Counter))
        with pytest.raises(ActorExists, match="counter"):
            await system.spawn(ChildSpec("counter", Counter))


async def test_event_log_is_a_bounded_ring_and_subscribers_get_live_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_actor_system("n", event_log_size=5) as system:
        async with system.subscribe_events(buffer=100) as stream:
            for i in range(20):
                system.emit("test.event", "/", i=i)
            assert [e.fields["i"] for e in system.events()] == [15, 16, 17, 18, 19]
            received = [stream.receive_nowait().fields["i"] for _ in range(20)]
            assert received == list(range(20))


async def test_tree_snapshot_reports_every_field(autojump_clock: trio.testing.MockClock) -> None:
    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("counter", Counter))
        with pytest.raises(ActorCrashed):
            await ref.ask(Boom())
        await trio.sleep(1)  # restart backoff
        await ref.ask(Add(1))
        tree = system.tree()
        assert tree.path == "/"
        assert tree.kind == "supervisor"
        assert tree.name == "n"
        (child,) = tree.children
        data = child.to_dict()
        assert data == {
            "path": "/counter",
            "name": "counter",
            "kind": "actor",
            "state": "running",
            "mailbox_depth": 0,
            "messages_handled": 1,
            "restarts": 1,
            "last_error": "ValueError: boom",
            "current_message": None,
            "children": [],
        }
        assert [s.path for s in tree.walk()] == ["/", "/counter"]


async def test_run_actor_system_as_a_long_running_service(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        system = await nursery.start(run_actor_system, "svc")
        ref = await system.spawn(ChildSpec("counter", Counter))
        assert await ref.ask(Add(3)) == 3
        system.shutdown()
    (child,) = system.tree().children
    assert child.state == "stopped"
    with pytest.raises(ActorStopped):
        await system.spawn(ChildSpec("late", Counter))
    with pytest.raises((ActorStopped, ActorNotFound)):
        await ref.ask(Get())


async def test_a_failing_factory_is_a_crash_not_a_broken_supervisor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts: list[int] = []

    def flaky() -> Actor:
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("not yet")
        return Counter()

    async with open_actor_system("n") as system:
        ref = await system.spawn(ChildSpec("flaky", flaky))
        assert await ref.ask(Add(1), timeout=10) == 1
        snapshot = system.tree().find("/flaky")
        assert snapshot is not None
        assert snapshot.restarts == 2
        assert snapshot.last_error == "OSError: not yet"
