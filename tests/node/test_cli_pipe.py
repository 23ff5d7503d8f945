"""``corral ... | head``: a reader that leaves ends the command quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corral.node.cli._cli import EXIT_BROKEN_PIPE

#: Far more than a pipe holds (64 KiB), so the writer is still writing when head leaves.
ROWS = 5000


class _BusyNode(BaseHTTPRequestHandler):
    """Answers ``GET /v1/ps`` and ``GET /v1/events`` as a busy node does."""

    def do_GET(self) -> None:
        if self.path.startswith("/v1/events"):
            events = [
                {
                    "seq": i,
                    "time": 1.0,
                    "wall_time": 1.0,
                    "kind": "started",
                    "path": "/a",
                    "fields": {},
                }
                for i in range(ROWS)
            ]
            answer: object = {"events": events}
        else:
            rows = [{"app": f"app-{i}", "node": "n1", "state": "running"} for i in range(ROWS)]
            answer = {"rows": rows, "coordinator": {"holder": None}}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def ps_node() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BusyNode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("command", [["ps", "--json"], ["events", "--json"], ["events"]])
def test_a_reader_that_leaves_ends_the_command_quietly(ps_node: str, command: list[str]) -> None:
    corral = subprocess.Popen(
        [sys.executable, "-m", "corral", *command, "--api", ps_node, "--token", "t"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.run(
        ["head", "-1"], stdin=corral.stdout, capture_output=True, timeout=30, check=True
    )
    assert corral.stdout is not None
    corral.stdout.close()  # head is gone: nobody reads any more
    _, err = corral.communicate(timeout=30)
    assert head.stdout.strip()  # head printed its line
    assert err.decode() == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert corral.returncode == EXIT_BROKEN_PIPE == 141


def test_a_closed_output_before_the_first_write_is_quiet_too(ps_node: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "corral", "ps", "--json", "--api", ps_node, "--token", "t"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == EXIT_BROKEN_PIPE
