"""Two actor systems talking over the in-memory network.

Run: ``.venv/bin/python examples/two_systems.py``

It starts node-a and node-b on one MemoryNetwork, has a "counter" actor on
node-b answer asks from node-a, crashes the counter and watches its supervisor
restart it, cuts the network to show what a partition looks like (also to an
ask already on its way, which fails at once rather than at its deadline), and
shuts both systems down cleanly. Every step is printed in plain words.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from corral.supervision import (
    Actor,
    AskTimeout,
    Backoff,
    ChildSpec,
    RemoteError,
    Restart,
    Strategy,
    SupervisorSpec,
    open_actor_system,
)
from corral.transport import MemoryNetwork, PeerUnavailable, message


@message("example.add")
@dataclass(frozen=True)
class Add:
    amount: int


@message("example.total")
@dataclass(frozen=True)
class GetTotal:
    pass


@message("example.crash")
@dataclass(frozen=True)
class Crash:
    reason: str


@message("example.greeting")
@dataclass(frozen=True)
class Greeting:
    text: str


class Counter(Actor):
    """Keeps a running total. Its state is lost when it crashes: a new instance starts at 0."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    async def started(self) -> None:
        say(f"node-b: counter started at {self.ctx.path} with a total of {self.total}")

    async def handle(self, message: object) -> object:
        match message:
            case Add(amount=amount):
                self.total += amount
                return self.total
            case GetTotal():
                return self.total
            case Crash(reason=reason):
                raise RuntimeError(reason)
        return None

    async def stopping(self) -> None:
        say(f"node-b: counter is cleaning up (total was {self.total})")


class Greeter(Actor):
    """Prints the greetings it is told."""

    async def handle(self, message: object) -> object:
        if isinstance(message, Greeting):
            say(f"node-a: greeter got a greeting: {message.text!r}")
        return None

    async def stopping(self) -> None:
        say("node-a: greeter is cleaning up")


def say(text: str) -> None:
    print(f"[t={trio.current_time() - START:6.3f}s] {text}", flush=True)


START = 0.0


async def main() -> None:
    global START
    START = trio.current_time()
    network = MemoryNetwork()
    services = SupervisorSpec(
        name="services",
        children=[ChildSpec("counter", Counter, restart=Restart.PERMANENT, shutdown_grace=1.0)],
        strategy=Strategy.ONE_FOR_ONE,
        max_restarts=3,
        within=10.0,
        backoff=Backoff(initial=0.2, factor=2.0, maximum=2.0),
    )
    async with (
        open_actor_system("node-a", network.connect("node-a")) as node_a,
        open_actor_system("node-b", network.connect("node-b"), children=[services]) as node_b,
    ):
        say("both actor systems are up: node-a and node-b share one in-memory network")
        await node_a.spawn(ChildSpec("greeter", Greeter))

        counter = node_a.ref("node-b/services/counter")
        say("node-a: adding 5, then 7, to the counter on node-b")
        await counter.tell(Add(5))
        total = await counter.ask(Add(7))
        say(f"node-a: node-b says the total is now {total}")

        await node_b.ref("node-a/greeter").tell(Greeting("hello from node-b"))
        await trio.sleep(0.05)

        say("node-a: asking the counter on node-b to crash")
        try:
            await counter.ask(Crash("asked to crash"))
        except RemoteError as exc:
            say(f"node-a: the ask came back as an error with code {exc.code!r}: {exc.message}")
        say("node-b: the supervisor will restart the counter after its backoff (0.2 s)")
        await trio.sleep(0.3)
        snapshot = node_b.tree().find("/services/counter")
        assert snapshot is not None
        say(
            f"node-b: counter is {snapshot.state}, restarted {snapshot.restarts} time(s), "
            f"last error: {snapshot.last_error}"
        )
        total = await counter.ask(GetTotal())
        say(f"node-a: after the restart node-b reports a total of {total} (fresh state)")

        say("network: cutting node-a off from node-b")
        network.partition({"node-a"}, {"node-b"})
        try:
            await counter.ask(GetTotal(), timeout=1.0)
        except PeerUnavailable as exc:
            say(f"node-a: the ask failed at once: {exc}")
        except AskTimeout as exc:
            say(f"node-a: the ask timed out: {exc}")
        network.heal()

        say("network: 0.5 s of delay; the link is cut while an ask is on its way")
        network.set_delay(0.5)
        asked_at = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def cut_soon() -> None:
                await trio.sleep(0.2)
                network.partition({"node-a"}, {"node-b"})

            nursery.start_soon(cut_soon)
            try:
                await counter.ask(GetTotal(), timeout=30.0)
            except PeerUnavailable as exc:
                waited = trio.current_time() - asked_at
                say(f"node-a: the ask failed after {waited:.1f} s, not its 30 s deadline: {exc}")
        network.set_delay(0.0)
        network.heal()
        total = await counter.ask(Add(1))
        say(f"network healed; node-a adds 1 and node-b answers {total}")

        say("shutting down: each system stops its actors in reverse start order")
    say("both actor systems stopped cleanly")
    kinds = [e.kind for e in node_b.events()]
    say(f"node-b's event log: {', '.join(kinds)}")


if __name__ == "__main__":
    # The kernel logs each crash with its traceback at WARNING; this demo crashes on
    # purpose and prints its own account, so only errors are shown.
    logging.basicConfig(level=logging.ERROR)
    trio.run(main)
