"""A tiny HTTP backend for the proxy tests: answers every GET with its own name
(``/slow...`` after 0.8 s, ``/wait/MS`` after MS milliseconds).

Run as ``python _backend.py NAME PORT``; listens on 127.0.0.1:PORT until killed.
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])
    body = name.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.startswith("/slow"):
                time.sleep(0.8)
            elif self.path.startswith("/wait/"):
                time.sleep(int(self.path.removeprefix("/wait/")) / 1000)
            # One write, headers and body together: two small writes on a kept-alive
            # connection stall 40 ms on Nagle and delayed ACKs.
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
            self.wfile.write(head % len(body) + body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
