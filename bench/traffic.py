"""The user-facing figure: requests through a real HAProxy while the cluster changes.

Run: ``.venv/bin/python bench/traffic.py`` (about 75 s of wall time, of which about
60 s under load; ``--rate`` changes the load). Needs ``/usr/sbin/haproxy``. ``--quick``
(about half a minute) sends 50 requests/s, with short direct and steady slices, and runs
only the ``steady`` and ``alias-flip`` phases and the 1-replica redeploy.

Three real ``corral node run`` processes on one SQLite registry, a real HAProxy
under ``corral proxy run``, and a 3-replica HTTP app (``examples/apps/steady``:
a ``[health] path``, a graceful SIGTERM) behind it under the alias ``www.test``.
An open-loop load generator (:class:`corral.testing.TrafficGenerator`) sends
``GET /`` at a fixed rate, a new connection per request, while these phases run
one after the other, each until the cluster has settled again:

* ``steady``: nothing happens (the proxy's own cost);
* ``redeploy``: a new revision of the app (an env change);
* ``alias-flip``: ``corral alias flip www.test web-b``, then ``corral alias rollback``;
* ``drain``: ``corral node drain`` one node, then ``corral node uncordon`` it;
* ``sigterm``: SIGTERM a node that does not hold the lease, then start it again;
* ``hand-back``: SIGTERM the lease holder (it hands the lease back), then start it again.

Baseline, in the same run: the same load sent straight to one backend of the app
(no proxy), in slices before, between and after the phases, so that it meets
the same background load as they do (the machine may be shared); its p99 is the
median of the slices' p99s. Per phase the
table shows requests sent, failed (a non-2xx answer or a connection error, by
kind), p50 and p99 latency of the successful ones, and p99 as a ratio of the
direct p99. Then a 1-replica app is redeployed under the
same load: the time its requests fail is ``single_instance_gap_ms``.

Everything started is stopped by pid.

Figures (the last line, one JSON object): ``failed_requests`` through the proxy over
all the phases (target 0), ``p99_ratio`` (the phases' p99 through the proxy / direct; target
<= 3), ``single_instance_gap_ms``, and beside them ``rate_per_s``, ``sent_requests``,
``p99_ms``, ``direct_p99_ms``, ``direct_p50_ms``, ``direct_failed``,
``direct_slice_p99_ms``, ``steady_p99_ratio``, ``single_instance_failed``, ``phases``
(per phase: sent, failed, p50, p99, p99 ratio, seconds), ``solo``,
``leftover_processes``, ``loadavg``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from corral.node.cli._local_cluster import LocalCluster, LocalNode, free_port, wait_for
from corral.proxy import DEFAULT_HAPROXY
from corral.proxy._local import LocalProxy
from corral.testing import PhaseSummary, RequestOutcome, TrafficGenerator, summarize

HOST = "www.test"
#: The phases ``--quick`` runs: the proxy's own cost and a change that moves no process.
QUICK_PHASES = ("steady", "alias-flip")
SETTLE = 1.0  # seconds of load after a phase's change settled, still counted in it
STEP = 60.0  # the longest wait for one thing to happen

#: The app: a 200 for every GET with its ``GREETING``, ``/healthz`` for readiness, and on
#: SIGTERM it stops accepting and finishes the requests it has.
STEADY = Path(__file__).resolve().parents[1] / "examples" / "apps" / "steady"


# --------------------------------------------------------------------------- the cluster


class Bench:
    """The cluster, the proxy, and the operator's moves (blocking; run in threads)."""

    def __init__(self, root: Path, app_dir: Path, proxy_dir: Path) -> None:
        self.root = root
        self.app_dir = app_dir
        self.cluster = LocalCluster(
            root, lease_ttl_ms=3000, node_ttl_ms=3000, shutdown_grace_ms=5000
        )
        tag = uuid.uuid4().hex[:6]
        for index in range(3):
            start = 27000 + 200 * index
            self.cluster.add_node(f"tr{tag}-{index + 1}", port_range=(start, start + 199))
        self.proxy_dir = proxy_dir
        self.proxy: LocalProxy | None = None
        self.revision = 0
        #: What web answers (its GREETING): the redeploy phase changes it.
        self.web_says = "web-1"

    @property
    def nodes(self) -> list[LocalNode]:
        return list(self.cluster.nodes.values())

    def cli(self, *args: str) -> str:
        node = self.cluster.running_nodes()[0]
        done = subprocess.run(
            [sys.executable, "-m", "corral", *args, "--api", node.api_url, "--token", node.token()],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"corral {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def deploy(self, name: str, greeting: str, *extra: str) -> str:
        out = self.cli(
            "deploy", str(self.app_dir), "--name", name, "--env", f"GREETING={greeting}",
            "--json", *extra,
        )  # fmt: skip
        return str(json.loads(out)["app"]["deployment"]["revision"])

    def rows(self, app: str) -> list[dict[str, Any]]:
        with self.cluster.any_client() as client:
            return [row for row in client.ps() if row["app"] == app]

    def backends(self, domain: str) -> list[str]:
        with self.cluster.any_client() as client:
            return list(client.routes()["routes"].get(domain, []))

    def holder(self) -> str | None:
        with self.cluster.any_client() as client:
            holder = client.ps_answer().get("coordinator", {}).get("holder")
        return str(holder) if holder else None

    def proxy_says(self, domain: str) -> set[str]:
        """What 12 requests through the proxy answer (``says``), or empty on any failure."""
        import httpx

        assert self.proxy is not None
        said = set()
        for _ in range(12):
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{self.proxy.listen}/",
                    headers={"Host": domain},
                    timeout=3.0,
                )
            except httpx.HTTPError:
                return set()
            if response.status_code != 200:
                return set()
            said.add(response.json()["says"])
        return said

    def settled(self, app: str, revision: str, count: int, domain: str) -> bool:
        rows = self.rows(app)
        return (
            len(rows) == count
            and all(r["revision"] == revision and r["state"] == "running" for r in rows)
            and len(self.backends(domain)) == count
        )

    def wait_settled(self, app: str, revision: str, count: int, domain: str, what: str) -> None:
        wait_for(what, lambda: self.settled(app, revision, count, domain), timeout=STEP)

    # ------------------------------------------------------------------ setup

    def start(self) -> dict[str, str]:
        self.cluster.start_all()
        revisions = {
            "web": self.deploy("web", self.web_says, "--replicas", "3", "--domain", "web.test"),
            "web-b": self.deploy("web-b", "b", "--replicas", "3", "--domain", "webb.test"),
            "solo": self.deploy("solo", "solo-1", "--replicas", "1", "--domain", "solo.test"),
        }
        self.cli("alias", "set", HOST, "web")
        self.proxy = LocalProxy.start(
            "haproxy",
            listen=free_port(),
            registry_url=self.cluster.registry_url,
            data_dir=self.proxy_dir,
            proxy_id="bench-haproxy",
        )
        self.wait_settled("web", revisions["web"], 3, HOST, "web on three nodes, routed")
        self.wait_settled("web-b", revisions["web-b"], 3, "webb.test", "web-b on three nodes")
        self.wait_settled("solo", revisions["solo"], 1, "solo.test", "solo on one node")
        wait_for(
            "www.test to answer through the proxy",
            lambda: self.proxy_says(HOST) == {self.web_says},
            timeout=STEP,
        )
        return revisions

    def direct_target(self) -> tuple[str, int]:
        url = sorted(self.backends("web.test"))[0]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def close(self) -> list[int]:
        leftovers: list[int] = []
        if self.proxy is not None:
            leftovers += self.proxy.stop()
        self.cluster.stop_all()
        leftovers += self.cluster.kill_leftovers()
        return leftovers

    # ------------------------------------------------------------------ phases

    def redeploy(self) -> None:
        self.web_says = "web-2"
        revision = self.deploy("web", self.web_says)
        self.wait_settled("web", revision, 3, HOST, "web's new revision on three nodes")
        wait_for(
            "www.test to answer as web-2", lambda: self.proxy_says(HOST) == {"web-2"}, timeout=STEP
        )

    def alias_flip(self) -> None:
        self.cli("alias", "flip", HOST, "web-b")
        wait_for(
            "www.test to answer as web-b", lambda: self.proxy_says(HOST) == {"b"}, timeout=STEP
        )
        time.sleep(SETTLE)
        self.cli("alias", "rollback", HOST)
        wait_for(
            "www.test back on web", lambda: self.proxy_says(HOST) == {self.web_says}, timeout=STEP
        )

    def drain(self) -> None:
        node = self.nodes[1]
        before = self.rows("web")[0]["revision"]
        self.cli("node", "drain", node.node_id)
        wait_for(
            f"web to leave {node.node_id}",
            lambda: (
                node.node_id not in {r["node"] for r in self.rows("web")}
                and len(self.backends(HOST)) == 2
            ),
            timeout=STEP,
        )
        time.sleep(SETTLE)
        self.cli("node", "uncordon", node.node_id)
        self.wait_settled("web", before, 3, HOST, f"web back on {node.node_id}")

    def _restart(self, node: LocalNode) -> None:
        revision = self.rows("web")[0]["revision"]
        self.cluster.stop(node)
        wait_for(
            f"{node.node_id} to leave the table",
            lambda: len(self.backends(HOST)) == 2,
            timeout=STEP,
        )
        time.sleep(SETTLE)
        self.cluster.start(node)
        self.cluster.wait_ready(node)
        self.wait_settled("web", revision, 3, HOST, f"web back on {node.node_id}")

    def sigterm(self) -> None:
        holder = self.holder()
        victim = next(n for n in reversed(self.nodes) if n.node_id != holder)
        self._restart(victim)

    def hand_back(self) -> None:
        holder = wait_for("a lease holder", self.holder, timeout=STEP)
        (node,) = [n for n in self.nodes if n.node_id == holder]
        self._restart(node)
        wait_for("a lease holder again", self.holder, timeout=STEP)

    def solo_redeploy(self) -> None:
        revision = self.deploy("solo", "solo-2")
        self.wait_settled("solo", revision, 1, "solo.test", "solo's new revision")
        wait_for(
            "solo.test to answer as solo-2",
            lambda: self.proxy_says("solo.test") == {"solo-2"},
            timeout=STEP,
        )


# --------------------------------------------------------------------------- the run


async def under_load(
    target: tuple[str, int], host: str, rate: float, name: str, step: Callable[[], None]
) -> tuple[list[RequestOutcome], float]:
    """Run ``step`` (blocking, in a thread) under load; its requests and its seconds.

    The load starts half a second before the step (not counted: the generator's
    own start) and goes on for ``SETTLE`` seconds after it, counted."""
    traffic = TrafficGenerator(target, host=host, rate=rate, timeout=3.0, phase="warm-up")
    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        await trio.sleep(0.5)
        traffic.mark(name)
        started = time.monotonic()
        await trio.to_thread.run_sync(step)
        await trio.sleep(SETTLE)
        took = time.monotonic() - started
        traffic.stop()
    return [row for row in traffic.report().outcomes if row.phase == name], took


def idle(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def gap_ms(summary: PhaseSummary, rate: float) -> float:
    """How long requests failed: first to last failure, plus the one interval each stands for."""
    if summary.failed == 0:
        return 0.0
    return round((summary.failure_window + 1.0 / rate) * 1000, 1)


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return round(value / base, 2)


async def bench(
    rate: float, direct_seconds: float, steady_seconds: float, quick: bool = False
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="corral-traffic-"))
    proxy_dir = Path(tempfile.mkdtemp(prefix="corral-tp-", dir="/tmp"))
    run = Bench(root, STEADY, proxy_dir)
    leftovers: list[int] = []
    proxied: dict[str, tuple[list[RequestOutcome], float]] = {}
    direct: list[list[RequestOutcome]] = []
    direct_took: list[float] = []
    try:
        await trio.to_thread.run_sync(run.start)
        assert run.proxy is not None
        through_proxy = ("127.0.0.1", run.proxy.listen)
        backend = run.direct_target()

        async def direct_slice() -> None:
            # The baseline is sampled between the phases, so it meets the same
            # background load (this machine is shared) as the phases do.
            rows, took = await under_load(backend, "web.test", rate, "direct", idle(direct_seconds))
            direct.append(rows)
            direct_took.append(took)

        phases = [
            ("steady", idle(steady_seconds)),
            ("redeploy", run.redeploy),
            ("alias-flip", run.alias_flip),
            ("drain", run.drain),
            ("sigterm", run.sigterm),
            ("hand-back", run.hand_back),
        ]
        if quick:
            phases = [(name, step) for name, step in phases if name in QUICK_PHASES]
        await direct_slice()
        for name, step in phases:
            proxied[name] = await under_load(through_proxy, HOST, rate, name, step)
            await direct_slice()
        solo, solo_took = await under_load(
            through_proxy, "solo.test", rate, "solo-redeploy", run.solo_redeploy
        )
    finally:
        leftovers = await trio.to_thread.run_sync(run.close)
        shutil.rmtree(proxy_dir, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)

    # The baseline p99 is the median of the slices' p99s: one slice that met a stall
    # of this (shared) machine must not make the proxy look better than it is.
    base = summarize("direct", [row for rows_ in direct for row in rows_])
    slices = sorted(p for p in (summarize("slice", rows_).p99 for rows_ in direct) if p)
    base = dataclasses.replace(base, p99=statistics.median(slices) if slices else None)
    rows = [(base, sum(direct_took))]
    rows += [(summarize(name, proxied[name][0]), proxied[name][1]) for name, _ in phases]
    during = summarize("all", [row for outcomes, _ in proxied.values() for row in outcomes])
    single = summarize("solo-redeploy", solo)
    result: dict[str, Any] = {
        "rate_per_s": rate,
        "failed_requests": during.failed,
        "sent_requests": during.sent,
        "p99_ms": round((during.p99 or 0) * 1000, 2),
        "direct_p99_ms": round((base.p99 or 0) * 1000, 2),
        "direct_p50_ms": round((base.p50 or 0) * 1000, 2),
        "direct_failed": base.failed,
        "direct_slice_p99_ms": [round(p * 1000, 2) for p in slices],
        "p99_ratio": ratio(during.p99, base.p99),
        "steady_p99_ratio": ratio(summarize("steady", proxied["steady"][0]).p99, base.p99),
        "single_instance_gap_ms": gap_ms(single, rate),
        "single_instance_failed": single.failed,
        "phases": {
            row.phase: {
                **{k: v for k, v in row.to_dict().items() if k != "phase"},
                "p99_ratio": ratio(row.p99, base.p99),
                "seconds": round(seconds, 1),
            }
            for row, seconds in rows
        },
        "solo": {**single.to_dict(), "seconds": round(solo_took, 1)},
        "leftover_processes": len(leftovers),
        # How busy the machine was (1-minute load average, before and after): on a
        # shared machine the p99s move with it.
        "loadavg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=None, help="requests per second (200)")
    parser.add_argument(
        "--direct-s", type=float, default=None, help="seconds of direct load before each phase"
    )
    parser.add_argument("--steady-s", type=float, default=None, help="seconds of steady load")
    parser.add_argument(
        "--quick", action="store_true", help=f"50 req/s, phases {', '.join(QUICK_PHASES)} only"
    )
    args = parser.parse_args()
    args.rate = args.rate or (50.0 if args.quick else 200.0)
    args.direct_s = args.direct_s or (0.5 if args.quick else 1.5)
    args.steady_s = args.steady_s or (1.0 if args.quick else 4.0)
    if not os.access(DEFAULT_HAPROXY, os.X_OK):
        sys.exit(f"haproxy is not installed at {DEFAULT_HAPROXY} (apt-get install haproxy)")
    result = trio.run(bench, args.rate, args.direct_s, args.steady_s, args.quick)
    print(
        f"traffic through HAProxy, 3 nodes, {args.rate:g} req/s open loop, "
        f"no keep-alive, cores={os.cpu_count()}, load average {result['loadavg'][0]:g} "
        f"before, {result['loadavg'][1]:g} after"
    )
    print(
        f"{'phase':<15}{'s':>6}{'sent':>7}{'failed':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'p99/direct':>12}  failures"
    )
    for name, row in result["phases"].items():
        kinds = ", ".join(f"{k} {v}" for k, v in row["failures"].items()) or "-"
        print(
            f"{name:<15}{row['seconds']:>6}{row['sent']:>7}{row['failed']:>8}"
            f"{row['p50_ms'] or 0:>9.2f}{row['p99_ms'] or 0:>9.2f}"
            f"{row['p99_ratio'] or 0:>12.2f}  {kinds}"
        )
    solo = result["solo"]
    kinds = ", ".join(f"{k} {v}" for k, v in solo["failures"].items()) or "-"
    print(
        f"{'solo-redeploy':<15}{solo['seconds']:>6}{solo['sent']:>7}{solo['failed']:>8}"
        f"{solo['p50_ms'] or 0:>9.2f}{solo['p99_ms'] or 0:>9.2f}{'':>12}  {kinds}"
    )
    print(
        "direct p99 is the median of its slices' (ms): "
        + " ".join(f"{p:g}" for p in result["direct_slice_p99_ms"])
    )
    print(
        f"failed requests through the proxy: {result['failed_requests']} of "
        f"{result['sent_requests']} (target 0); p99 {result['p99_ms']} ms = "
        f"{result['p99_ratio']} x direct {result['direct_p99_ms']} ms (target <= 3); "
        f"1-replica redeploy gap {result['single_instance_gap_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
