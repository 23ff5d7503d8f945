"""A node agent that a test kills with SIGKILL, leaving its processes behind.

Usage: python _first_life.py <data-dir>. Prints the pids of its two apps' processes
as one JSON line once both run, then waits to be killed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from corral.actors.process_supervisor import ListProcesses
from corral.actors.reconciler import AgentSpec
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    NodeRecord,
    app_key,
    node_key,
)
from corral.supervision import open_actor_system
from corral.testing import write_placement

APPS = ("one", "two")


async def main(data_dir: Path) -> None:
    registry = MemoryRegistry()
    await registry.put(node_key("node-a"), NodeRecord("node-a").encode())
    for app in APPS:
        deployment = Deployment("1" * 64, ["sleep", "600"])
        await registry.put(app_key(app), AppRecord(app, deployment=deployment).encode())
        await write_placement(registry, app, ["node-a"])

    async def materialize(app: str, deployment: Deployment) -> Path:
        path = data_dir / "apps" / app / "revisions" / deployment.revision
        path.mkdir(parents=True, exist_ok=True)
        return path

    spec = AgentSpec(
        node_id="node-a",
        data_dir=data_dir,
        registry=registry,
        materialize=materialize,
        ready_timeout=1.0,
    )
    async with open_actor_system("node-a") as system:
        await system.spawn(spec.supervisor_spec())
        processes = system.ref("/agent/process_supervisor")
        while True:
            rows = await processes.ask(ListProcesses())
            if len(rows) == len(APPS) and all(row["pid"] for row in rows):
                break
            await trio.sleep(0.05)
        print(json.dumps([row["pid"] for row in rows]), flush=True)
        await trio.sleep(600)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
