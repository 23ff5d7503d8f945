"""The inspector against a real node process: nodes, actors, cordon and uncordon, and
the node going away and coming back (marked slow: real processes and sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from corral.inspector import Inspector, NodeSource
from corral.node.cli._local_cluster import LocalCluster

pytestmark = pytest.mark.slow


async def until(pilot: Pilot[int], done: Callable[[], bool], what: str) -> None:
    for _ in range(750):  # 15 s
        if done():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def column(app: Inspector, table_id: str, index: int) -> list[str]:
    table: DataTable[Any] = app.query_one(f"#{table_id}", DataTable)
    return [getattr(table.get_row_at(i)[index], "plain", "") for i in range(table.row_count)]


def test_inspector_drives_a_real_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        node = cluster.add_node("solo", port_range=(26400, 26499))
        cluster.start(node)
        cluster.wait_ready(node)

        async def main() -> None:
            app = Inspector(NodeSource(node.api_url, node.token()), interval=0.2)
            async with app.run_test(size=(140, 40)) as pilot:
                await until(pilot, lambda: column(app, "cluster-table", 0) == ["solo *"], "solo")
                await pilot.press("tab", "tab", "tab")
                await until(
                    pilot, lambda: "  coordinator" in column(app, "actors-table", 0), "actors"
                )
                row = column(app, "actors-table", 0).index("  coordinator")
                await pilot.press(*["down"] * row, "enter")
                details = str(app.query_one("#actor-details", Static).render())
                assert "actor      /coordinator" in details
                await pilot.press("tab", "tab")  # back to Cluster
                await pilot.press("c", "y")
                await until(
                    pilot, lambda: column(app, "cluster-table", 1) == ["cordoned"], "cordoned"
                )
                await pilot.press("u", "y")
                await until(pilot, lambda: column(app, "cluster-table", 1) == ["alive"], "alive")
                # The node goes away: the inspector says so, then follows it back.
                cluster.stop(node)
                await until(pilot, lambda: not app.connected, "the node's loss")
                status = str(app.query_one("#status", Static).render())
                assert status.startswith(f"node gone: cannot reach {node.api_url}")
                cluster.start(node)
                await until(pilot, lambda: app.connected, "the node's return")
                await pilot.press("q")
            assert app.return_code == 0

        asyncio.run(main())
