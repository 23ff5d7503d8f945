"""Routing end to end: three real nodes, a real ``corral proxy run`` (HAProxy and Caddy).

Each test deploys two apps with a domain each on every node (``corral deploy
--domain``), starts ``corral proxy run`` as its own process on loopback, and
checks what a user of the proxy sees: requests with ``Host:`` reach every
instance, a killed instance leaves the table and comes back once restarted and
ready, an unknown host gets 404, and ``corral alias set``, ``flip`` and
``rollback`` each change which app answers within one table. Every process is
stopped by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.node.artifacts import pack_directory
from corral.node.cli._local_cluster import LocalCluster, LocalNode, free_port, wait_for
from corral.proxy import DEFAULT_CADDY, DEFAULT_HAPROXY
from corral.proxy._local import LocalProxy

from .conftest import GREETER, _etcd_url, tagged_cluster

pytestmark = pytest.mark.slow

STEP = 40.0
BINARIES = {"haproxy": DEFAULT_HAPROXY, "caddy": DEFAULT_CADDY}


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCluster]:
    """Three nodes as in conftest, but with node ids of their own: a node ends the
    processes that carry its id's marker from another life, so two clusters on one
    machine with the same ids (parallel test runs) would end each other's apps."""
    url = _etcd_url() if request.param == "etcd" else None
    with tagged_cluster(tmp_path, "rt", 26000, url) as local:
        yield local


def node(cluster: LocalCluster, index: int) -> LocalNode:
    return list(cluster.nodes.values())[index - 1]


@pytest.fixture(params=["haproxy", "caddy"])
def kind(request: pytest.FixtureRequest) -> str:
    path = BINARIES[request.param]
    if not os.access(path, os.X_OK):
        reason = f"{request.param} is not installed at {path} (apt-get install {request.param})"
        if os.environ.get("CORRAL_REQUIRE_PROXIES") == "1":
            pytest.fail(f"CORRAL_REQUIRE_PROXIES=1 but {reason}")
        pytest.skip(reason)
    return str(request.param)


def get(run: LocalProxy, host: str, path: str = "/") -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{run.listen}{path}", headers={"Host": host}, timeout=5.0)


@pytest.fixture
def proxy_dir() -> Iterator[Path]:
    # Short: HAProxy's admin socket lives here, and a unix socket path is bounded.
    path = Path(tempfile.mkdtemp(prefix="corral-e2e-px-", dir="/tmp"))
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def start_proxy(cluster: LocalCluster, kind: str, data_dir: Path) -> LocalProxy:
    return LocalProxy.start(
        kind,
        listen=free_port(),
        registry_url=cluster.registry_url,
        data_dir=data_dir,
        proxy_id=f"edge-{kind}",
    )


def cli(node: LocalNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", *args, "--api", node.api_url, "--token", node.token()],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def routes(cluster: LocalCluster) -> dict[str, Any]:
    with cluster.any_client() as client:
        return client.routes()


def changed_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every ``routing.changed`` event in the running nodes' event logs (the lease
    holder's tell each table change), by revision."""
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for node in cluster.running_nodes():
        with node.client() as client:
            for event in client.events():
                if event.get("kind") == "routing.changed":
                    fields = event["fields"]
                    seen[(fields["fence"], fields["revision"])] = event
    return [seen[key] for key in sorted(seen)]


def answers(run: LocalProxy, host: str, count: int) -> list[dict[str, Any]]:
    bodies = []
    for _ in range(count):
        response = get(run, host)
        assert response.status_code == 200, (response.status_code, response.text, host)
        bodies.append(response.json())
    return bodies


def wait_serving(run: LocalProxy, host: str, what: str, done: Callable[[list[Any]], bool]) -> None:
    def probe() -> bool:
        if run.process.poll() is not None:
            raise AssertionError(f"corral proxy run exited: {run.log_tail()}")
        try:
            bodies = answers(run, host, 12)
        except (httpx.HTTPError, AssertionError, ValueError):
            return False
        return done(bodies)

    wait_for(what, probe, timeout=STEP, interval=0.2)


def test_a_real_proxy_serves_the_table_through_failures_and_alias_flips(
    cluster: LocalCluster, kind: str, proxy_dir: Path
) -> None:
    first = node(cluster, 1)
    deployed = cli(
        first, "deploy", str(GREETER), "--name", "shop", "--domain", "shop.test",
        "--replicas", "all", "--env", "GREETING=shop",
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr
    with cluster.any_client() as client:
        client.deploy(
            "blog",
            pack_directory(GREETER),
            replicas="all",
            env={"GREETING": "blog"},
            domains=["blog.test"],
        )

    run = start_proxy(cluster, kind, proxy_dir)
    try:
        # Every instance is reached through the proxy, by Host.
        wait_serving(
            run,
            "shop.test",
            "shop.test through the proxy to reach all three nodes",
            lambda bodies: (
                {b["node"] for b in bodies} == set(cluster.nodes)
                and {b["says"] for b in bodies} == {"shop!"}
            ),
        )
        table = routes(cluster)
        assert len(table["routes"]["shop.test"]) == 3
        assert all(u.startswith("http://127.0.0.1:") for u in table["routes"]["shop.test"])
        # Unknown host: 404 from the proxy itself.
        assert get(run, "nowhere.test").status_code == 404

        # The proxy reported what it applied in proxies/<id>.
        def reported() -> dict[str, Any] | None:
            answer = routes(cluster)
            rows = [p for p in answer["proxies"] if p["id"] == f"edge-{kind}"]
            ok = rows and rows[0]["applied"] == answer["version"] and rows[0]["lag_s"] == 0.0
            return rows[0] if ok else None

        row = wait_for("the proxy to report the current table", reported, timeout=STEP)
        assert row["kind"] == kind
        assert row["error"] is None
        # The same through the command line, as JSON and as text.
        printed = cli(first, "routes", "--json")
        assert printed.returncode == 0, printed.stderr
        shown = json.loads(printed.stdout)
        assert set(shown) == {"version", "routes", "held_back", "proxies"}
        assert shown["routes"]["shop.test"] == table["routes"]["shop.test"]
        text = cli(first, "routes")
        assert text.returncode == 0, text.stderr
        assert "shop.test" in text.stdout
        assert f"edge-{kind}" in text.stdout

        # Kill node-2's shop process: it leaves the table, then comes back once ready.
        victim = node(cluster, 2)

        def victim_process() -> dict[str, Any] | None:
            with victim.client() as client:
                rows = [p for p in client.state()["processes"] if p["app"] == "shop"]
            return rows[0] if rows and rows[0]["pid"] and rows[0]["ready"] else None

        proc = wait_for("node-2's shop process", victim_process, timeout=STEP)
        victim_url = f"http://127.0.0.1:{proc['public_port']}"
        assert victim_url in table["routes"]["shop.test"]
        before = table["version"]["revision"]
        os.kill(proc["pid"], signal.SIGKILL)

        def removal_seen() -> bool:
            return any(
                victim_url in e["fields"]["backends_removed"].get("shop.test", [])
                for e in changed_events(cluster)
            )

        wait_for("the killed instance to leave the table", removal_seen, timeout=STEP)
        wait_for(
            "the restarted instance to be back in the table",
            lambda: (
                victim_url in routes(cluster)["routes"].get("shop.test", [])
                and routes(cluster)["version"]["revision"] >= before + 2
            ),
            timeout=STEP,
        )
        wait_serving(
            run,
            "shop.test",
            "node 2 to answer through the proxy again",
            lambda bodies: victim.node_id in {b["node"] for b in bodies},
        )

        # An alias, a flip and a rollback: each changes which app answers, in one table.
        def flip_to(app: str, *command: str) -> None:
            before = routes(cluster)
            start = before["version"]["revision"]
            old = before["routes"].get("www.test", [])
            done = cli(first, "alias", *command)
            assert done.returncode == 0, done.stderr
            wait_serving(
                run,
                "www.test",
                f"www.test to answer as {app}",
                lambda bodies: {b["says"] for b in bodies} == {f"{app}!"},
            )
            table = routes(cluster)
            new = table["routes"][f"{app}.test"]
            assert table["routes"]["www.test"] == new
            # One table carried the whole change: no table between served www.test
            # half old, half new, or not at all.
            touching = [
                e["fields"]
                for e in changed_events(cluster)
                if e["fields"]["revision"] > start
                and (
                    "www.test" in e["fields"]["backends_added"]
                    or "www.test" in e["fields"]["backends_removed"]
                )
            ]
            assert len(touching) == 1, touching
            (change,) = touching
            assert sorted(change["backends_added"]["www.test"]) == sorted(set(new) - set(old))
            assert sorted(change["backends_removed"].get("www.test", [])) == sorted(
                set(old) - set(new)
            )
            assert "www.test" not in change["domains_removed"]

        flip_to("shop", "set", "www.test", "shop")
        flip_to("blog", "flip", "www.test", "blog")
        flip_to("shop", "rollback", "www.test")
        assert get(run, "nowhere.test").status_code == 404
    finally:
        leftovers = run.stop()
    assert run.process.returncode == 0, run.log_tail()
    assert not leftovers, f"proxy processes outlived corral proxy run: {leftovers}"
    # Stopped on purpose: it removed its proxies/<id> record.
    assert routes(cluster)["proxies"] == []


HEALTH_APP = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SICK = os.environ["SICK_DIR"] + "/" + os.environ["CORRAL_NODE"]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        status = 503 if self.path == "/healthz" and os.path.exists(SICK) else 200
        body = os.environ["CORRAL_NODE"].encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ADDRESS = (os.environ["CORRAL_BIND_HOST"], int(os.environ["PORT"]))
ThreadingHTTPServer(ADDRESS, Handler).serve_forever()
"""


def test_a_failing_health_path_takes_an_instance_out_without_killing_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    app = tmp_path / "health-app"
    app.mkdir()
    (app / "server.py").write_text(HEALTH_APP)
    (app / "corral.toml").write_text(
        'command = ["python3", "server.py"]\n'
        '[health]\npath = "/healthz"\ninterval_ms = 200\ntimeout_ms = 500\n'
    )
    sick = tmp_path / "sick"
    sick.mkdir()
    with cluster.any_client() as client:
        client.deploy(
            "api",
            pack_directory(app),
            replicas="all",
            env={"SICK_DIR": str(sick)},
            domains=["api.test"],
        )

    def backends() -> list[str]:
        return list(routes(cluster)["routes"].get("api.test", []))

    wait_for("api on three nodes in the table", lambda: len(backends()) == 3, timeout=STEP)
    victim = node(cluster, 3)
    with victim.client() as client:
        (proc,) = [p for p in client.state()["processes"] if p["app"] == "api"]
    url = f"http://127.0.0.1:{proc['public_port']}"
    assert url in backends()

    (sick / victim.node_id).touch()
    started = time.monotonic()
    wait_for("node-3 to leave the table", lambda: url not in backends(), timeout=STEP)
    # Three failed checks 200 ms apart: not at the first failure.
    assert time.monotonic() - started >= 0.4
    table = routes(cluster)
    assert any(
        h["node"] == victim.node_id and "not ready" in h["why"] for h in table["held_back"]
    ), table["held_back"]
    with victim.client() as client:
        (same,) = [p for p in client.state()["processes"] if p["app"] == "api"]
    assert same["pid"] == proc["pid"]  # not killed, not restarted
    assert same["state"] == "running"
    assert same["ready"] is False

    (sick / victim.node_id).unlink()
    wait_for("node-3 to come back once its check passes", lambda: url in backends(), timeout=STEP)


def test_the_lease_holder_pushes_each_table_to_a_caddy_admin_endpoint(
    tmp_path: Path, proxy_dir: Path
) -> None:
    if not os.access(DEFAULT_CADDY, os.X_OK):
        reason = f"caddy is not installed at {DEFAULT_CADDY} (apt-get install caddy)"
        if os.environ.get("CORRAL_REQUIRE_PROXIES") == "1":
            pytest.fail(f"CORRAL_REQUIRE_PROXIES=1 but {reason}")
        pytest.skip(reason)
    admin, listen = free_port(), free_port()
    # A Caddy of the operator's own, with an empty "corral" server: only the push feeds it.
    config = {
        "admin": {"listen": f"127.0.0.1:{admin}", "config": {"persist": False}},
        "apps": {
            "http": {
                "servers": {
                    "corral": {
                        "listen": [f"127.0.0.1:{listen}"],
                        "automatic_https": {"disable": True},
                        "routes": [],
                    }
                }
            }
        },
    }
    (proxy_dir / "caddy.json").write_text(json.dumps(config))
    home = proxy_dir / "home"
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data")}
    with (proxy_dir / "caddy.log").open("ab") as log:
        caddy = subprocess.Popen(
            [DEFAULT_CADDY, "run", "--config", str(proxy_dir / "caddy.json")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    local = LocalCluster(tmp_path, lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=5000)
    local.add_node(
        f"push{uuid.uuid4().hex[:6]}",
        port_range=(26800, 26899),
        extra_args=["--proxy", f"caddy=http://127.0.0.1:{admin}"],
    )
    try:
        local.start_all()
        with local.any_client() as client:
            client.deploy(
                "shop", pack_directory(GREETER), env={"GREETING": "shop"}, domains=["shop.test"]
            )

        def served() -> bool:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{listen}/", headers={"Host": "shop.test"}, timeout=2.0
                )
            except httpx.HTTPError:
                return False
            return response.status_code == 200 and response.json()["says"] == "shop!"

        wait_for("the pushed table to be served by caddy", served, timeout=STEP)
        assert changed_events(local), "no routing.changed event"
        with local.any_client() as client:
            applied = [e for e in client.events() if e["kind"] == "proxy.applied"]
        assert any(e["fields"]["proxy"] == f"caddy=http://127.0.0.1:{admin}" for e in applied)
    finally:
        local.stop_all()
        leftovers = local.kill_leftovers()
        caddy.terminate()
        try:
            caddy.wait(10)
        except subprocess.TimeoutExpired:
            caddy.kill()
            caddy.wait(5)
    assert not leftovers, f"app processes outlived their nodes: {leftovers}"
