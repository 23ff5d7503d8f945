"""Two actor systems in two OS processes, talking over WebSockets on loopback.

Run: ``.venv/bin/python examples/two_processes.py``

The script is node-a. It draws a fresh cluster secret, starts its own
WebSocketTransport on 127.0.0.1 (a free port), then starts itself a second time
as node-b in a child process, handing over the secret in the environment and
its own address on the command line. node-b prints ``ready <address>`` when it
listens; everything else it prints is shown prefixed with ``node-b |``.

Then, through the same ``tell``/``ask`` as inside one process:

1. node-a tells and asks the counter actor living in node-b's process;
2. node-b's counter tells node-a's greeter a greeting (over the same connection:
   one WebSocket per pair of nodes, used both ways);
3. a third process that does not know the secret tries to reach node-b and is
   refused by the handshake;
4. node-a asks node-b to shut down; node-b stops its actors and exits, and node-a's
   next ask fails at once with PeerUnavailable instead of hanging.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass

import trio

from corral.supervision import Actor, ChildSpec, open_actor_system, run_actor_system
from corral.transport import PeerUnavailable, message
from corral.transport._websocket import open_websocket_transport

SECRET_ENV = "CORRAL_EXAMPLE_SECRET"


@message("example.ws.add")
@dataclass(frozen=True)
class Add:
    amount: int


@message("example.ws.total")
@dataclass(frozen=True)
class GetTotal:
    pass


@message("example.ws.greet")
@dataclass(frozen=True)
class GreetBack:
    """Ask the counter to send a greeting to an actor on another node."""

    to: str


@message("example.ws.greeting")
@dataclass(frozen=True)
class Greeting:
    text: str
    pid: int


@message("example.ws.quit")
@dataclass(frozen=True)
class Quit:
    pass


class Counter(Actor):
    """Lives in node-b's process: keeps a total, greets back, quits on request."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    async def handle(self, msg: object) -> object:
        match msg:
            case Add(amount=amount):
                self.total += amount
                say("node-b", f"counter: +{amount} -> {self.total}")
                return self.total
            case GetTotal():
                return self.total
            case GreetBack(to=to):
                greeting = Greeting(f"hello from the counter in process {os.getpid()}", os.getpid())
                await self.ctx.system.ref(to).tell(greeting)
                return "sent"
            case Quit():
                say("node-b", "counter: asked to quit; shutting node-b down")
                self.ctx.system.shutdown()
                return "bye"
        return None


class Greeter(Actor):
    """Lives in node-a's process: prints what it is told."""

    def __init__(self, got_one: trio.Event) -> None:
        super().__init__()
        self.got_one = got_one

    async def handle(self, msg: object) -> object:
        if isinstance(msg, Greeting):
            say("node-a", f"greeter got {msg.text!r} (sender pid {msg.pid}, mine {os.getpid()})")
            self.got_one.set()
        return None


def say(node: str, text: str) -> None:
    print(f"{node} | {text}", flush=True)


# ----------------------------------------------------------------------------- node-b


async def run_node_b(node_a_address: str) -> None:
    secret = os.environ[SECRET_ENV]
    async with open_websocket_transport(
        "node-b", ("127.0.0.1", 0), secret=secret, peers={"node-a": node_a_address}
    ) as transport:
        async with trio.open_nursery() as nursery:
            # run_actor_system runs until system.shutdown(): the counter calls it on Quit
            await nursery.start(
                functools.partial(
                    run_actor_system, "node-b", transport, children=[ChildSpec("counter", Counter)]
                )
            )
            print(f"ready {transport.address}", flush=True)
            say("node-b", f"pid {os.getpid()}: actor system up, counter at /counter")
        say("node-b", "actors stopped; closing the transport")


# ----------------------------------------------------------------------------- intruder


async def run_intruder(node_b_address: str) -> None:
    async with open_websocket_transport(
        "intruder", None, secret="not-the-cluster-secret", peers={"node-b": node_b_address}
    ) as transport:
        async with open_actor_system("intruder", transport) as system:
            try:
                await system.ref("node-b/counter").ask(Add(1000), timeout=2.0)
                print("intruder | got in (this should not happen)", flush=True)
            except PeerUnavailable as exc:
                print(f"intruder | refused: {exc}", flush=True)


# ----------------------------------------------------------------------------- node-a


async def relay_output(stream: trio.abc.ReceiveStream, ready: trio.MemorySendChannel[str]) -> None:
    """Echo the child's lines; hand the first ``ready <address>`` line over."""
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode()
            if text.startswith("ready "):
                await ready.send(text.split()[1])
            else:
                print(text, flush=True)


async def start_child(
    nursery: trio.Nursery, args: list[str], env: dict[str, str]
) -> tuple[trio.Process, str | None]:
    process = await trio.lowlevel.open_process(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, env=env
    )
    assert process.stdout is not None
    ready_send, ready_receive = trio.open_memory_channel[str](1)
    nursery.start_soon(relay_output, process.stdout, ready_send)
    if args[0] != "--node-b":
        return process, None
    with trio.fail_after(15):
        return process, await ready_receive.receive()


async def run_node_a() -> None:
    secret = secrets.token_hex(16)
    env = dict(os.environ, **{SECRET_ENV: secret})
    got_greeting = trio.Event()
    async with (
        open_websocket_transport("node-a", ("127.0.0.1", 0), secret=secret) as transport,
        open_actor_system("node-a", transport) as system,
        trio.open_nursery() as nursery,
    ):
        assert transport.address is not None
        await system.spawn(ChildSpec("greeter", lambda: Greeter(got_greeting)))
        say("node-a", f"pid {os.getpid()}: listening on {transport.address}; starting node-b")
        node_b, address = await start_child(nursery, ["--node-b", transport.address], env)
        assert address is not None
        transport.add_peer("node-b", address)
        say("node-a", f"node-b (pid {node_b.pid}) listens on {address}")

        counter = system.ref("node-b/counter")
        with trio.fail_after(20):
            await counter.tell(Add(5))
            total = await counter.ask(Add(7))
            say("node-a", f"told +5, asked +7: node-b's counter answers {total}")
            status = transport.peer_status("node-b")
            assert status is not None
            say("node-a", f"link to node-b: {status.state.value}, dialed by {status.initiator}")

            await counter.ask(GreetBack("node-a/greeter"))
            await got_greeting.wait()

            say("node-a", "a process without the secret now tries to reach node-b ...")
            intruder, _ = await start_child(nursery, ["--intruder", address], dict(os.environ))
            await intruder.wait()
            say("node-a", f"... and the counter is untouched: {await counter.ask(GetTotal())}")

            say("node-a", "asking node-b to quit")
            await counter.ask(Quit())
            await node_b.wait()
            say("node-a", f"node-b exited with status {node_b.returncode}")
            try:
                await counter.ask(GetTotal(), timeout=5.0)
            except PeerUnavailable as exc:
                say("node-a", f"the next ask fails at once: {exc}")
        nursery.cancel_scope.cancel()
    say("node-a", "done")


def main() -> None:
    # Handshake refusals are logged at WARNING by the transport; this demo shows
    # the refusal through the intruder's own error, so only errors are logged.
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    if len(sys.argv) == 3 and sys.argv[1] == "--node-b":
        trio.run(run_node_b, sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--intruder":
        trio.run(run_intruder, sys.argv[2])
    else:
        trio.run(run_node_a)


if __name__ == "__main__":
    main()
