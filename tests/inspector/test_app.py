"""The interactive inspector, driven headlessly with Textual's Pilot.

Each test runs the app inside a plain ``asyncio.run`` (Textual is asyncio; pytest-trio
owns async tests here), against an in-process fake of a node's API.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from corral.inspector import Inspector, NodeSource

from ._fake_api import TOKEN, FakeNode
from ._screen import screen_text

SIZE = (140, 40)


def run(scenario: Callable[[Inspector, Pilot[int], FakeNode], Awaitable[None]]) -> Inspector:
    fake = FakeNode()

    async def main() -> Inspector:
        source = NodeSource("http://127.0.0.1:7400", TOKEN, transport=fake.transport())
        app = Inspector(source, interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected and app.actor_tree != {})
            await scenario(app, pilot, fake)
        return app

    return asyncio.run(main())


async def until(pilot: Pilot[int], done: Callable[[], bool], what: str = "it") -> None:
    for _ in range(200):
        if done():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def text(app: Inspector, widget_id: str) -> str:
    return str(app.query_one(f"#{widget_id}", Static).render())


def cells(app: Inspector, table_id: str) -> list[list[str]]:
    table: DataTable[Any] = app.query_one(f"#{table_id}", DataTable)
    return [
        [getattr(c, "plain", str(c)) for c in table.get_row_at(i)] for i in range(table.row_count)
    ]


def test_cluster_pane_lists_nodes_with_coordinator_labels_and_capacity() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        rows = cells(app, "cluster-table")
        assert [r[0] for r in rows] == ["n1 *", "n2"]
        assert rows[0][1:4] == ["alive", "zone=a", "-"]
        assert rows[0][4] == "[####------] 40%"  # 400 of 1000 MiB in use
        assert rows[0][6] == "greeter, hello"
        assert rows[1][6] == "greeter, keeper"
        assert text(app, "cluster-summary").startswith("coordinator n1 (fence 7, * in the list)")

    run(scenario)


def test_tab_switches_panes_and_apps_show_instances_and_unplaced() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        await pilot.press("tab")
        assert app.pane == "apps"
        rows = cells(app, "apps-table")
        assert rows[2][:5] == ["hello", "n1", "running", "d5d8146adc47", "24399/24400"]
        extra = text(app, "apps-extra")
        assert "keeper: replicas 1, selector zone=b, domains - (pinned)" in extra
        assert "unplaced  db (placement-unavailable): cannot place db" in extra
        await pilot.press("tab")
        assert app.pane == "routes"
        assert text(app, "routes-text").startswith("no routing yet")
        await pilot.press("shift+tab", "shift+tab")
        assert app.pane == "cluster"

    run(scenario)


def test_actor_tree_rates_and_details_on_enter() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        await pilot.press("tab", "tab", "tab")
        assert app.pane == "actors"
        await until(pilot, lambda: cells(app, "actors-table")[0][3] != "-", "a handled rate")
        rows = cells(app, "actors-table")
        names = [r[0] for r in rows]
        assert names == [
            "node/",
            "  registration",
            "  agent/",
            "    reconciler",
            "    processes",
            "  coordinator",
        ]
        assert float(rows[0][3]) > 0  # handled per second, from two reads
        assert rows[3][4] == "2"
        assert rows[3][5] == "boom"
        assert rows[4][2].startswith("  3 ")  # mailbox depth, then its sparkline
        await pilot.press("down", "down", "down", "enter")
        details = text(app, "actor-details")
        assert "actor      /agent/reconciler" in details
        assert "last error boom" in details
        assert "actor.crashed /agent/reconciler error=boom" in details  # its recent events

    run(scenario)


def test_events_follow_and_filter() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        await pilot.press("shift+tab")
        assert app.pane == "events"
        await until(pilot, lambda: len(cells(app, "events-table")) == 3, "the event backlog")
        await pilot.press("slash", *"crash", "enter")
        rows = cells(app, "events-table")
        assert rows == [["#2 actor.crashed /agent/reconciler error=boom"]]
        await pilot.press("slash", "escape")
        assert len(cells(app, "events-table")) == 3

    run(scenario)


def test_cordon_uncordon_with_confirm_and_pinned_drain_refusal() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        await pilot.press("down")  # n2
        await pilot.press("c")
        dialog = str(app.screen.query_one("#confirm", Static).render())
        assert "Cordon n2: it keeps what it runs (greeter, keeper)" in dialog
        await pilot.press("n")
        assert fake.posts == []
        assert app.last_action == "cordon n2: cancelled"
        await pilot.press("c", "y")
        await until(pilot, lambda: fake.posts == ["cordon n2"])
        await until(pilot, lambda: cells(app, "cluster-table")[1][1] == "cordoned")
        await pilot.press("d")
        dialog = str(app.screen.query_one("#confirm", Static).render())
        assert "Drain n2 would be refused: it runs pinned app(s) keeper" in dialog
        await pilot.press("y")  # a refusal known in advance does nothing
        assert fake.posts == ["cordon n2"]
        await pilot.press("u", "y")
        await until(pilot, lambda: cells(app, "cluster-table")[1][1] == "alive")
        await pilot.press("up", "d")
        dialog = str(app.screen.query_one("#confirm", Static).render())
        assert "Would move elsewhere: hello." in dialog
        assert "Would stop there (replicas all" in dialog

    run(scenario)


def test_n_chooses_whose_actors_and_help_and_q() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        await pilot.press("question_mark")
        assert "cordon the node selected" in str(app.screen.query_one("#help", Static).render())
        await pilot.press("escape", "n", "down", "enter")
        assert app.actors_node == "n2"
        assert app.pane == "actors"
        await until(pilot, lambda: "actors of n2" in text(app, "actors-title"))
        await until(pilot, lambda: len(cells(app, "actors-table")) == 6, "n2's actors")
        await pilot.press("down", "down", "down", "enter")
        # Its recent events come from n2, not from the node the inspector follows.
        await until(pilot, lambda: "app=on-n2" in text(app, "actor-details"), "n2's events")
        assert "actor.crashed" not in text(app, "actor-details")
        await pilot.press("q")

    app = run(scenario)
    assert app.return_code == 0


def test_node_going_away_is_said_and_followed_back() -> None:
    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        fake.go_away()
        await until(pilot, lambda: not app.connected, "the loss to be noticed")
        status = text(app, "status")
        assert status.startswith("node gone: cannot reach http://127.0.0.1:7400")
        assert "retrying" in status
        assert "showing what was last read" in status
        assert [r[0] for r in cells(app, "cluster-table")] == ["n1 *", "n2"]
        fake.come_back()
        await until(pilot, lambda: app.connected, "the reconnection")
        await until(pilot, lambda: "events:" not in text(app, "status"), "the event stream")
        assert text(app, "status").startswith("http://127.0.0.1:7400 (node n1)")

    run(scenario)


def test_a_node_not_there_at_the_start_is_said_and_awaited() -> None:
    fake = FakeNode()
    fake.go_away()

    async def main() -> None:
        source = NodeSource("http://127.0.0.1:7400", TOKEN, transport=fake.transport())
        app = Inspector(source, interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: fake.requests >= 2, "a second try")
            status = text(app, "status")
            assert status.startswith("no node yet: cannot reach http://127.0.0.1:7400")
            fake.come_back()
            await until(pilot, lambda: app.connected, "the node")
            await until(pilot, lambda: len(cells(app, "cluster-table")) == 2, "its nodes")

    asyncio.run(main())


def test_missing_fields_never_crash_it() -> None:
    fake = FakeNode()
    fake.nodes = lambda: {  # type: ignore[method-assign]
        "nodes": [{"node": "x"}, "junk", {}, {"node": "[red]evil[/", "labels": {"[b": "]"}}]
    }
    fake.ps = lambda: {"rows": [{}, None]}  # type: ignore[method-assign]
    fake.apps = lambda: {"apps": "nope"}  # type: ignore[method-assign]
    fake.state = lambda: {"coordination": {"holder": "x", "error": "busy"}}  # type: ignore[method-assign]

    async def main() -> None:
        source = NodeSource("http://127.0.0.1:7400", TOKEN, transport=fake.transport())
        app = Inspector(source, interval=0.2)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected)
            await pilot.press("tab", "tab", "tab", "tab", "c", "escape", "d", "escape")
            names = [r[0] for r in cells(app, "cluster-table")]
            assert names == ["x", "?", "[red]evil[/"]  # junk collapses; markup stays text
            assert "decisions unknown: busy" in text(app, "apps-extra")
            # Acting on a node whose name looks like markup: it is shown as text.
            await pilot.press("shift+tab", "shift+tab", "shift+tab", "shift+tab")
            await pilot.press("down", "down", "c", "y")
            await until(
                pilot, lambda: "cordon [red]evil[/" in app.last_action, f"it: {fake.posts}"
            )

    asyncio.run(main())


SNAPSHOT = Path(__file__).parent / "snapshots" / "main_screen.txt"


def test_main_screen_snapshot() -> None:
    """The Cluster pane as a newcomer first sees it (UPDATE_SNAPSHOTS=1 rewrites it)."""
    shot: list[str] = []

    async def scenario(app: Inspector, pilot: Pilot[int], fake: FakeNode) -> None:
        def drawn() -> bool:
            # Wait for a frame with everything on it: rows and the footer's keys.
            screen = screen_text(app.export_screenshot())
            shot[:] = [screen]
            return "greeter, keeper" in screen and "q quit" in screen

        await until(pilot, drawn, "the whole screen")

    run(scenario)
    screen = re.sub(r"read \d\d:\d\d:\d\d", "read HH:MM:SS", shot[0])
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(screen + "\n")
    assert screen + "\n" == SNAPSHOT.read_text()
