"""steady: an HTTP app that stops the way a rolling deploy wants (standard library only).

``GET /healthz`` answers 200 once the server listens, which is when corral routes
to it; any other ``GET`` answers ``{"app", "node", "says"}`` (``says`` is
``$GREETING``). On SIGTERM it stops accepting at once (new connections are
refused, so a proxy sends them to another instance) and finishes the requests
it has before it exits.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = json.dumps(
    {
        "app": os.environ.get("CORRAL_APP", "steady"),
        "node": os.environ.get("CORRAL_NODE", "local"),
        "says": os.environ.get("GREETING", ""),
    }
).encode()


class Steady(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would fill the log under load


class Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for the requests in flight
    block_on_close = True
    request_queue_size = 256


def main() -> None:
    address = (os.environ.get("CORRAL_BIND_HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000")))
    server = Server(address, Steady)

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever() to return: not from its own thread.
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever(poll_interval=0.05)
    server.server_close()


if __name__ == "__main__":
    main()
