"""``corral demo``: a three-node cluster on this machine, told as it happens.

Three ``corral node run`` processes on loopback share one SQLite registry in a
temporary directory. The demo deploys two example apps (``hello`` on every
node, ``greeter`` once on a node labelled ``disk=ssd``), shows where they run
and that each answers HTTP, stops the node running the single ``greeter``,
shows it placed and answering elsewhere, then stops everything and checks that
no process is left. Lease TTLs are short (3 s), so it all takes a few seconds
(well under a minute on a busy machine).

With ``--keep`` the story ends with the stopped node started again, and the
cluster keeps running until Ctrl-C: the demo prints each node's API address and
token file (all three nodes share one token, so the inspector reaches every
node's actors from any of them) and the commands to try, ``corral inspect``
first. Ctrl-C then stops it the same clean way, and the data directories and
logs are kept.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

import corral
from corral.node._errors import NodeError
from corral.node._identity import TOKEN_FILE
from corral.node.artifacts import pack_directory
from corral.node.cli._format import ps_table
from corral.node.cli._local_cluster import LocalCluster, LocalNode, wait_for

NODES: tuple[tuple[str, dict[str, str], tuple[int, int]], ...] = (
    ("node-1", {"disk": "ssd", "zone": "a"}, (24000, 24199)),
    ("node-2", {"disk": "ssd", "zone": "b"}, (24200, 24399)),
    ("node-3", {"disk": "hdd", "zone": "c"}, (24400, 24599)),
)
STEP_TIMEOUT = 30.0
#: Seconds between checks that the kept cluster still runs.
KEEP_POLL = 1.0


def find_example_apps() -> Path:
    """``examples/apps`` of the source tree corral runs from.

    Raises:
        NodeError: the package is installed without its examples.
    """
    candidates = [
        Path(corral.__file__).resolve().parent.parent / "examples" / "apps",
        Path.cwd() / "examples" / "apps",
    ]
    for candidate in candidates:
        if (candidate / "hello").is_dir() and (candidate / "greeter").is_dir():
            return candidate
    raise NodeError(
        "the demo's example apps (examples/apps/hello and examples/apps/greeter) are not "
        "next to the installed package; run the demo from a clone of the repository, "
        "installed with `pip install -e .`, or from the clone's directory"
    )


class Narrator:
    def __init__(self, stdout: TextIO) -> None:
        self._out = stdout
        self._t0 = time.monotonic()

    def __call__(self, text: str = "") -> None:
        stamp = f"[{time.monotonic() - self._t0:5.1f}s] " if text else ""
        print(stamp + text, file=self._out, flush=True)

    def block(self, text: str) -> None:
        for line in text.splitlines():
            print("          " + line, file=self._out)
        self._out.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0


def _labels(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _running(rows: Sequence[Mapping[str, Any]], app: str) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["app"] == app and r["state"] == "running" and r["public_port"]]


def _ask_app(port: int) -> str:
    response = httpx.get(f"http://127.0.0.1:{port}/", timeout=2.0)
    response.raise_for_status()
    return response.text.strip().splitlines()[0][:100] if response.text.strip() else "(empty)"


def _answer(port: int) -> str:
    def probe() -> str | None:
        try:
            return _ask_app(port)
        except httpx.HTTPError:
            return None

    return wait_for(f"an answer on port {port}", probe, timeout=10.0)


class Demo:
    def __init__(self, cluster: LocalCluster, apps_dir: Path, say: Narrator) -> None:
        self.cluster = cluster
        self.apps_dir = apps_dir
        self.say = say
        #: the node the story stopped (started again for --keep).
        self.victim: LocalNode | None = None

    def ps(self) -> list[dict[str, Any]]:
        with self.cluster.any_client() as client:
            return client.ps()

    def wait_rows(self, what: str, done: Any) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            rows = self.ps()
            return rows if done(rows) else None

        return wait_for(what, probe, timeout=STEP_TIMEOUT, interval=0.3)

    def coordinator(self) -> tuple[str, Any]:
        def probe() -> tuple[str, Any] | None:
            with self.cluster.any_client() as client:
                lease = client.state().get("lease") or {}
            return (lease["holder"], lease.get("fence")) if lease.get("holder") else None

        return wait_for("a node to take the coordinator lease", probe, timeout=STEP_TIMEOUT)

    def start_nodes(self, token: str | None = None) -> None:
        say = self.say
        say(
            f"Starting three corral nodes, each its own OS process on 127.0.0.1, sharing one "
            f"SQLite registry at {self.cluster.registry_url.removeprefix('sqlite://')}."
        )
        for node_id, labels, port_range in NODES:
            node = self.cluster.add_node(node_id, labels=labels, port_range=port_range)
            if token is not None:
                # One token for all: a client of one node can read the others (a node
                # reads the token file it finds and keeps it).
                token_file = node.data_dir / TOKEN_FILE
                token_file.write_text(token + "\n")
                os.chmod(token_file, 0o600)
        for node in self.cluster.nodes.values():
            self.cluster.start(node)
        for node in self.cluster.nodes.values():
            self.cluster.wait_ready(node, timeout=60.0)
            labels = dict(NODES[[n for n, _, _ in NODES].index(node.node_id)][1])
            say(f"{node.node_id} is up (pid {node.pid}, API {node.api_url}, {_labels(labels)}).")
        holder, fence = self.coordinator()
        say(
            f"{holder} holds the coordinator lease (fence {fence}): it alone decides where "
            "apps run; every node starts and stops only its own processes."
        )

    def deploy(
        self, app: str, replicas: str, selector: dict[str, str] | None, env: dict[str, str]
    ) -> None:
        directory = self.apps_dir / app
        packed = pack_directory(directory)
        with self.cluster.any_client() as client:
            answer = client.deploy(app, packed, replicas=replicas, selector=selector, env=env)
        where = f"on nodes labelled {_labels(selector)}" if selector else "on every node"
        self.say(
            f"Deployed {directory.relative_to(self.apps_dir.parent.parent)} as {app!r}: "
            f"{packed.size} bytes, revision {answer['app']['deployment']['revision'][:12]}, "
            f"replicas {replicas} {where}."
        )

    def show_answers(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            if row["state"] == "running" and row["public_port"]:
                self.say(
                    f"{row['app']} on {row['node']} answers on port {row['public_port']}: "
                    f"{_answer(int(row['public_port']))}"
                )

    def run(self, *, token: str | None = None) -> None:
        say = self.say
        self.start_nodes(token)
        say()
        self.deploy("hello", "all", None, {})
        self.deploy("greeter", "1", {"disk": "ssd"}, {"GREETING": "hello from the corral demo"})
        say(
            "Waiting for the coordinator to place them and for each node to fetch the "
            "artifact, check its digest, unpack it and start the process on a port pair of "
            "its own..."
        )
        rows = self.wait_rows(
            "hello on all three nodes and greeter on one",
            lambda rows: len(_running(rows, "hello")) == 3 and len(_running(rows, "greeter")) == 1,
        )
        say("Where they run (corral ps):")
        say.block(ps_table(rows))
        self.show_answers(rows)
        say()

        victim_id = _running(rows, "greeter")[0]["node"]
        victim = self.cluster.nodes[victim_id]
        old_holder, old_fence = self.coordinator()
        role = " and holds the coordinator lease" if old_holder == victim_id else ""
        say(
            f"Stopping {victim_id} with SIGTERM: it runs greeter's only replica{role}. It hands "
            "back its leases, stops its processes, leaves the membership and removes its node "
            "record."
        )
        started = time.monotonic()
        status = self.cluster.stop(victim)
        left = [pid for pid in self._left_by(victim) if pid]
        say(
            f"{victim_id} exited with status {status} after {time.monotonic() - started:.1f} s; "
            + ("none of its processes is left." if not left else f"left behind: {left}")
        )
        rows = self.wait_rows(
            "greeter to run on another node",
            lambda rows: any(r["node"] != victim_id for r in _running(rows, "greeter")),
        )
        moved = _running(rows, "greeter")[0]
        holder, fence = self.coordinator()
        if holder != old_holder:
            say(
                f"{holder} took over the coordinator lease the moment {victim_id} handed it "
                f"back; its fence is {fence}, larger than {old_fence}, so anything the old "
                "coordinator might still try to write would be refused."
            )
        say(
            f"{victim_id} left the cluster's SWIM membership as it stopped, so the "
            f"coordinator ({holder}) moved its work at once (a node that vanishes without "
            "leaving is down instead, and keeps its work for the grace period: "
            f"{DEMO_GRACE_PERIOD_MS / 1000:g} s in this demo, 300 s by default, so one "
            "that comes back in time keeps everything); it placed greeter on "
            f"{moved['node']}, the other node labelled disk=ssd; hello keeps running on the "
            "two nodes left:"
        )
        say.block(ps_table(rows))
        self.show_answers([moved])
        say()
        self.victim = victim

    def restart(self, node: LocalNode) -> None:
        """Start a node the story stopped again, so the kept cluster has all three."""
        self.say(f"Starting {node.node_id} again, so the cluster you keep has all three nodes.")
        self.cluster.start(node)
        self.cluster.wait_ready(node, timeout=60.0)
        self.wait_rows(
            f"hello to run on {node.node_id} again",
            lambda rows: any(r["node"] == node.node_id for r in _running(rows, "hello")),
        )
        self.say(
            f"{node.node_id} is up again (pid {node.pid}, API {node.api_url}) and runs hello "
            "(replicas all); greeter stays where it moved."
        )

    def how_to_reach(self, root: Path) -> str:
        """What to run against the kept cluster: every node's API and token file."""
        nodes = list(self.cluster.nodes.values())
        first = nodes[0]
        data = shlex.quote(str(first.data_dir))
        lines = ["The cluster keeps running. Its nodes:"]
        for node in nodes:
            lines.append(
                f"  {node.node_id}  API {node.api_url}  token {node.data_dir / TOKEN_FILE}"
            )
        lines += [
            "Try, in another terminal (add .venv/bin/ in front of corral if needed):",
            f"  corral inspect --api {first.api_url} --data-dir {data}",
            f"  corral ps --api {first.api_url} --data-dir {data}",
            f"  corral node cordon node-3 --api {first.api_url} --data-dir {data}",
            f'  curl -s -H "Authorization: Bearer $(cat {data}/{TOKEN_FILE})" '
            f"{first.api_url}/metrics",
            f"Nodes' logs: {root}/<node>/node.log. Press Ctrl-C here to stop the cluster.",
        ]
        return "\n".join(lines)

    def _left_by(self, node: LocalNode) -> list[int]:
        alive = set(self.cluster.leftovers())
        return sorted(pid for pid in node.seen_descendants if pid in alive)


#: How long the demo's stopped node keeps its work (``--grace-period-ms``).
DEMO_GRACE_PERIOD_MS = 2000


def _until_interrupted(cluster: LocalCluster) -> None:
    """Block until Ctrl-C or SIGTERM (KeyboardInterrupt), or until no node runs."""
    while cluster.running_nodes():
        time.sleep(KEEP_POLL)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def demo_command(
    stdout: TextIO,
    *,
    keep: bool = False,
    wait: Callable[[LocalCluster], None] | None = None,
) -> int:
    """Run the demo; return 0 when the story ran to a clean finish.

    With ``keep``, leave the cluster running after the story and print how to reach it,
    until ``wait`` returns (by default: until Ctrl-C); then stop it as without.

    Raises:
        NodeError: the example apps are not there (a non-editable install).
    """
    apps_dir = find_example_apps()
    # SIGTERM stops the demo as Ctrl-C does: its nodes live in sessions of their own,
    # so they are stopped here or not at all.
    if threading.current_thread() is not threading.main_thread():
        return _run_demo(stdout, apps_dir, keep=keep, wait=wait)  # signals go elsewhere
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        return _run_demo(stdout, apps_dir, keep=keep, wait=wait)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_demo(
    stdout: TextIO,
    apps_dir: Path,
    *,
    keep: bool,
    wait: Callable[[LocalCluster], None] | None,
) -> int:
    say = Narrator(stdout)
    root = Path(tempfile.mkdtemp(prefix="corral-demo-"))
    cluster = LocalCluster(
        root,
        secret=secrets.token_urlsafe(24),
        lease_ttl_ms=3000,
        node_ttl_ms=3000,
        shutdown_grace_ms=5000,
        extra_env={"CORRAL_GRACE_PERIOD_MS": str(DEMO_GRACE_PERIOD_MS)},
    )
    status = 0
    kept = False
    try:
        demo = Demo(cluster, apps_dir, say)
        demo.run(token=secrets.token_urlsafe(24) if keep else None)
        if keep:
            if demo.victim is not None:
                demo.restart(demo.victim)
            say()
            say.block(demo.how_to_reach(root))
            kept = True
            (wait or _until_interrupted)(cluster)
            say("Stopping the kept cluster.")
    except KeyboardInterrupt:
        if kept:
            say("Ctrl-C: stopping the kept cluster.")
        else:
            say("Interrupted; shutting the nodes down.")
            status = 130
    except (NodeError, httpx.HTTPError) as exc:
        say(f"The demo failed: {exc}")
        for node in cluster.nodes.values():
            say(f"The log of {node.node_id} ends with:")
            say.block(node.log_tail(15))
        status = 1
    finally:
        say("Shutting down the remaining nodes with SIGTERM.")
        cluster.note_descendants()
        cluster.stop_all()
        leftover = cluster.leftovers()
        if leftover:
            cluster.kill_leftovers()
            say(f"These processes outlived their node and were killed: {leftover}")
            status = status or 1
        else:
            count = sum(len(n.seen_children) for n in cluster.nodes.values())
            say(
                f"All {len(cluster.nodes)} nodes exited and none of the {count} app processes "
                "they started is left."
            )
        if keep:
            say(f"Kept the nodes' data directories and logs in {root}.")
        else:
            shutil.rmtree(root, ignore_errors=True)
    if status == 0:
        say(f"Done in {say.elapsed:.0f} s. Next: README.md has a tour with one node of your own.")
    return status
