"""A tiny greeting service (standard library only).

corral starts it with PORT (its public port), CORRAL_BIND_HOST and
CORRAL_NODE in the environment; GREETING may be set with `corral deploy --env`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NODE = os.environ.get("CORRAL_NODE", "somewhere")
GREETING = os.environ.get("GREETING", "hello")


class Greeter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"app": "greeter", "node": NODE, "says": f"{GREETING}!"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"greeter: {format % args}\n")


def main() -> None:
    host = os.environ.get("CORRAL_BIND_HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer((host, port), Greeter)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"greeter listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
