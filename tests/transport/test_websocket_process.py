"""A peer in another OS process, killed with SIGKILL and restarted, is reconnected to.

Real processes and loopback sockets, so marked slow; bounded by trio.fail_after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import trio

from corral.transport import (
    Frame,
    PeerUnavailable,
    ReconnectPolicy,
    WebSocketConfig,
    WebSocketTransport,
    open_websocket_transport,
)

pytestmark = pytest.mark.slow

SECRET = "process-test-secret"

# The peer: a node that echoes every frame back to its sender, prefixed with its pid.
ECHO_NODE = textwrap.dedent(
    """
    import os, sys, trio
    from corral.transport._websocket import open_websocket_transport

    async def main():
        listen = ("127.0.0.1", int(sys.argv[1]))
        secret = os.environ["CORRAL_TEST_SECRET"]
        async with open_websocket_transport("node-b", listen, secret=secret) as node:
            print("ready", node.address, flush=True)
            while True:
                frame = await node.receive()
                await node.send(frame.sender, b"%d:" % os.getpid() + frame.data)

    trio.run(main)
    """
)


async def start_echo_node(port: int) -> tuple[trio.Process, str]:
    env = dict(os.environ, CORRAL_TEST_SECRET=SECRET)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", ECHO_NODE, str(port)],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        chunk = await process.stdout.receive_some(1)
        assert chunk, "the echo node exited before it was ready"
        line += chunk
    word, address = line.decode().split()
    assert word == "ready"
    return process, address


async def stop(process: trio.Process) -> None:
    if process.returncode is None:
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
    if process.stdout is not None:
        await process.stdout.aclose()


async def echo(node: WebSocketTransport, text: bytes) -> Frame:
    while True:
        try:
            await node.send("node-b", text)
            break
        except PeerUnavailable:
            await trio.sleep(0.05)  # the redial is backing off; try again shortly
    return await node.receive()


async def until_unavailable(node: WebSocketTransport) -> None:
    """Send until the transport notices the peer is gone (it must, quickly)."""
    while True:
        try:
            await node.send("node-b", b"into the void")
        except PeerUnavailable:
            return
        await trio.sleep(0.05)


async def test_a_killed_and_restarted_peer_process_is_reconnected_to() -> None:
    config = WebSocketConfig(
        heartbeat_interval=0.5,
        heartbeat_timeout=1.0,
        reconnect=ReconnectPolicy(initial=0.05, maximum=0.5),
    )
    with trio.fail_after(60):
        first, address = await start_echo_node(0)
        try:
            async with open_websocket_transport(
                "node-a",
                ("127.0.0.1", 0),
                secret=SECRET,
                config=config,
                peers={"node-b": address},
            ) as a:
                reply = await echo(a, b"hello")
                assert reply == Frame("node-b", b"%d:hello" % first.pid)

                os.killpg(first.pid, signal.SIGKILL)  # no goodbye: the socket just dies
                await first.wait()
                await until_unavailable(a)

                port = int(address.rpartition(":")[2])
                second, again = await start_echo_node(port)
                try:
                    assert again == address
                    reply = await echo(a, b"hello again")
                    assert reply == Frame("node-b", b"%d:hello again" % second.pid)
                    assert second.pid != first.pid
                finally:
                    await stop(second)
        finally:
            await stop(first)
