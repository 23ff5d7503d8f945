"""hello: the smallest corral app.

It listens on $PORT (the public port corral gives it) and answers ``GET /`` with
its app name, the node it runs on and its port, as JSON. Standard library only.

Run it by hand with ``PORT=8000 python3 server.py``; under corral, deploy this
directory (see ``corral.toml``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

APP = os.environ.get("CORRAL_APP", "hello")
NODE = os.environ.get("CORRAL_NODE", "local")
HOST = os.environ.get("CORRAL_BIND_HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/":
            self.send_error(404, "only / is here")
            return
        body = json.dumps({"app": APP, "node": NODE, "port": PORT}).encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def main() -> None:
    server = ThreadingHTTPServer((HOST, PORT), Hello)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"{APP} on {NODE} listening on {HOST}:{PORT}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
