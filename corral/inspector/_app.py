"""``corral inspect``: the interactive inspector, a Textual app.

Five panes (Cluster, Apps, Routes, Actors, Events) fed by two workers: one polls
the node's API every ``interval`` seconds, one follows ``GET /v1/events?follow=1``.
When the node goes away both say so on the status line and keep trying; what was
last read stays on screen, marked stale. What each pane shows is decided in
:mod:`corral.inspector._model`; this module only puts it on screen and maps keys.

Keys: arrows and enter select, tab switches pane, ``/`` filters the pane,
``n`` chooses whose actors are shown, ``c`` / ``u`` / ``d`` cordon, uncordon or
drain the node selected in the Cluster pane (after a confirm dialog), ``?`` lists
the keys and ``q`` quits with status 0.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import (
    DataTable,
    Footer,
    Input,
    OptionList,
    Static,
    TabbedContent,
    TabPane,
)

from corral.inspector import _model as model
from corral.inspector._source import JSONDict, NodeSource, SourceError

PANES = ("cluster", "apps", "routes", "actors", "events")
#: Events kept on screen (the node keeps its own last thousand).
EVENTS_KEPT = 500
#: Seconds between reconnection attempts of the event stream, at most.
MAX_BACKOFF = 5.0

KEYS = (
    ("arrows, enter", "select a row; enter on an actor opens its details"),
    ("tab / shift+tab", "switch pane"),
    ("/", "filter the rows of this pane (escape clears)"),
    ("n", "choose the node whose actors are shown"),
    ("c", "cordon the node selected in the Cluster pane"),
    ("u", "uncordon it"),
    ("d", "drain it (the dialog says what would move, or why it is refused)"),
    ("r", "read everything again now"),
    ("?", "this help"),
    ("q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q,enter", "close", "close"),
    ]

    def compose(self) -> ComposeResult:
        lines = ["corral inspect: keys", ""]
        lines += [f"{key:<16} {text}" for key, text in KEYS]
        lines += ["", "escape closes this"]
        yield Static("\n".join(lines), id="help", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """Says what an operation would do; y confirms, n or escape cancels. A refusal
    known in advance offers only to close."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, text: str, refused: bool) -> None:
        super().__init__()
        self._prompt_text = text
        self._known_refusal = refused

    def compose(self) -> ComposeResult:
        prompt = "escape closes" if self._known_refusal else "y: do it    n / escape: cancel"
        yield Static(f"{self._prompt_text}\n\n{prompt}", id="confirm", markup=False)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes and not self._known_refusal)


class NodePicker(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, nodes: Sequence[str], current: str | None) -> None:
        super().__init__()
        self._choices = list(nodes)
        self._chosen = current

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Static("Whose actors? (enter picks, escape cancels)", markup=False)
            options = OptionList(*(Text(node) for node in self._choices), id="nodes")
            yield options

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if self._chosen in self._choices:
            options.highlighted = self._choices.index(self._chosen)
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self._choices[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class Inspector(App[int]):
    """The inspector over one node's API.

    Args:
        source: reads the node.
        interval: seconds between polls.
        clock: monotonic seconds (for handled per second).
        wall_clock: unix seconds (for cooldowns left).
    """

    TITLE = "corral inspect"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #status { height: 1; background: $panel; }
    #filter { display: none; }
    #cluster-summary, #apps-extra, #action { height: auto; }
    #actor-details { height: auto; border-top: solid $primary; }
    HelpScreen, ConfirmScreen, NodePicker { align: center middle; }
    #help, #confirm, #picker { width: 80%; height: auto; border: thick $primary;
        background: $surface; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("tab", "pane(1)", "next pane", priority=True),
        Binding("shift+tab", "pane(-1)", "previous pane", priority=True, show=False),
        Binding("slash", "filter", "filter"),
        Binding("n", "pick_node", "node"),
        Binding("c", "node_op('cordon')", "cordon"),
        Binding("u", "node_op('uncordon')", "uncordon"),
        Binding("d", "node_op('drain')", "drain"),
        Binding("r", "refresh", "refresh", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_inspector", "quit"),
        Binding("escape", "clear_filter", show=False),
    ]

    def __init__(
        self,
        source: NodeSource,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self._monotonic = clock
        self._unix_clock = wall_clock
        self.nodes_answer: JSONDict = {}
        self.ps_answer: JSONDict = {}
        self.apps_answer: JSONDict = {}
        self.state_answer: JSONDict = {}
        self.routes_answer: JSONDict | None = None
        self.actor_tree: JSONDict = {}
        self.event_log: deque[JSONDict] = deque(maxlen=EVENTS_KEPT)
        self.history = model.ActorHistory()
        self.filters: dict[str, str] = dict.fromkeys(PANES, "")
        self.actors_node: str | None = None
        self.selected_actor: str | None = None
        #: why the chosen node's actor tree cannot be read, if it cannot.
        self.actors_error: str | None = None
        #: recent events of the chosen node when it is not the one connected to.
        self.remote_events: list[JSONDict] = []
        #: the rows each table shows now (a table is redrawn only when they change).
        self._drawn: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        self.connected = False
        self.problem: str | None = None
        self.stream_problem: str | None = None
        self.last_read: float | None = None
        self.last_action = ""
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static("connecting...", id="status", markup=False)
        with TabbedContent(initial="cluster", id="panes"):
            with TabPane("Cluster", id="cluster"):
                yield Static("", id="cluster-summary", markup=False)
                yield DataTable(id="cluster-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="action", markup=False)
            with TabPane("Apps", id="apps"):
                yield DataTable(id="apps-table", cursor_type="row", zebra_stripes=True)
                yield Static("", id="apps-extra", markup=False)
            with TabPane("Routes", id="routes"):
                yield Static("", id="routes-text", markup=False)
            with TabPane("Actors", id="actors"):
                yield Static("", id="actors-title", markup=False)
                yield DataTable(id="actors-table", cursor_type="row", zebra_stripes=True)
                yield Static(
                    "enter on an actor shows its details here", id="actor-details", markup=False
                )
            with TabPane("Events", id="events"):
                yield DataTable(id="events-table", cursor_type="row")
        yield Input(placeholder="filter this pane (enter keeps it, escape clears)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        for table_id, columns in (
            ("cluster-table", model.CLUSTER_COLUMNS),
            ("apps-table", model.APP_COLUMNS),
            ("actors-table", model.ACTOR_COLUMNS),
            ("events-table", ("EVENT",)),
        ):
            self.query_one(f"#{table_id}", DataTable).add_columns(*columns)
        self.query_one("#cluster-table", DataTable).focus()
        self.run_worker(self._poll_forever(), name="poll", exit_on_error=False)
        self.run_worker(self._follow_forever(), name="events", exit_on_error=False)

    async def on_unmount(self) -> None:
        await self.source.aclose()

    @property
    def pane(self) -> str:
        return self.query_one(TabbedContent).active or "cluster"

    # ------------------------------------------------------------------ reading

    async def _poll_forever(self) -> None:
        while True:
            await self.read_all()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass

    async def read_all(self) -> None:
        """Read every view once and redraw; a failure is shown, never raised."""
        try:
            self.state_answer = await self.source.get("/v1/state")
            self.nodes_answer = await self.source.get("/v1/nodes")
            self.ps_answer = await self.source.get("/v1/ps")
            self.apps_answer = await self.source.get("/v1/apps")
            self.routes_answer = await self.source.routes()
        except SourceError as exc:
            self.connected = False
            self.problem = f"{exc}; retrying every {self.interval:g} s"
            self.redraw()
            return
        self.connected, self.problem = True, None
        self.last_read = self._unix_clock()
        if self.actors_node is None:
            me = self.state_answer.get("node_id")
            self.actors_node = me if isinstance(me, str) else None
        await self._read_actors()
        self.redraw()

    async def _read_actors(self) -> None:
        me = self.state_answer.get("node_id")
        base = None
        if self.actors_node and self.actors_node != me:
            address = model.node_api(self.nodes_answer, self.actors_node)
            if address is None:
                self.actor_tree = {}
                self.history.clear()
                self.actors_error = f"{self.actors_node} advertises no API address"
                return
            base = address if "://" in address else f"http://{address}"
        try:
            self.actor_tree = await self.source.get("/v1/actors", base)
            self.actors_error = None
            if base is not None and self.selected_actor is not None:
                # Another node's actor is open: its recent events come from that node.
                answer = await self.source.get("/v1/events", base)
                events = answer.get("events")
                self.remote_events = (
                    [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
                )
        except SourceError as exc:
            self.actor_tree = {}
            self.actors_error = str(exc)
            return
        self.history.observe(self.actor_tree, self._monotonic())

    async def _follow_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                first = True
                async for event in self.source.follow_events():
                    if first:
                        # A new stream starts with the node's backlog: take it anew (a
                        # restarted node numbers its events from 1 again).
                        self.event_log.clear()
                        first = False
                    self.stream_problem = None
                    backoff = 0.2
                    self.event_log.append(event)
                    self.redraw_events()
                self.stream_problem = "the event stream ended (the node stopped?); reconnecting"
            except SourceError as exc:
                self.stream_problem = f"{exc}; reconnecting"
            self.redraw_status()
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    # ------------------------------------------------------------------ drawing

    def redraw(self) -> None:
        self.redraw_status()
        self.query_one("#cluster-summary", Static).update(model.cluster_summary(self.nodes_answer))
        self._fill(
            "cluster-table",
            "cluster",
            [
                (r[0].removesuffix(" *"), r)
                for r in model.cluster_rows(self.nodes_answer, self.ps_answer)
            ],
        )
        self._fill(
            "apps-table", "apps", [(f"{r[0]}@{r[1]}", r) for r in model.app_rows(self.ps_answer)]
        )
        extra = model.app_specs(self.apps_answer) + model.held_back(
            self.state_answer, self._unix_clock()
        )
        self.query_one("#apps-extra", Static).update("\n".join(extra))
        self.query_one("#routes-text", Static).update(
            "\n".join(model.route_lines(self.routes_answer))
        )
        title = f"actors of {self.actors_node or '?'} (n: another node)"
        if self.actors_error:
            title += f"\n{self.actors_error}"
        self.query_one("#actors-title", Static).update(title)
        self._fill("actors-table", "actors", model.actor_rows(self.actor_tree, self.history))
        if self.selected_actor is not None:
            self.show_actor(self.selected_actor)
        self.redraw_events()

    def redraw_status(self) -> None:
        where = self.source.api_url
        me = self.state_answer.get("node_id") or "?"
        if self.problem and self.last_read is None:
            text = f"no node yet: {self.problem}"
        elif self.problem:
            text = f"node gone: {self.problem} (showing what was last read)"
        else:
            text = f"{where} (node {me})"
            if self.stream_problem:
                text += f"  events: {self.stream_problem}"
            if self.last_read is not None:
                text += "  read " + time.strftime("%H:%M:%S", time.localtime(self.last_read))
        self.query_one("#status", Static).update(text)

    def redraw_events(self) -> None:
        needle = self.filters["events"]
        rows = [
            (str(e.get("seq", index)), (model.event_text(e),))
            for index, e in enumerate(self.event_log)
        ]
        self._fill("events-table", "events", rows, follow=not needle)

    def _fill(
        self,
        table_id: str,
        pane: str,
        rows: Sequence[tuple[str, tuple[str, ...]]],
        *,
        follow: bool = False,
    ) -> None:
        """Replace a table's rows (those matching the pane's filter), keeping the cursor on
        the same key."""
        table = self.query_one(f"#{table_id}", DataTable)
        needle = self.filters[pane]
        kept = [(key, row) for key, row in rows if model.matches(" ".join(row), needle)]
        if self._drawn.get(table_id) == kept:
            return  # unchanged: no redraw, the cursor stays as it is
        self._drawn[table_id] = kept
        at_end = table.row_count == 0 or table.cursor_row >= table.row_count - 1
        current = self._cursor_key(table)
        table.clear()
        seen: set[str] = set()
        for key, row in kept:
            if key in seen:
                continue
            seen.add(key)
            table.add_row(*(Text(cell) for cell in row), key=key)
        if follow and at_end and table.row_count:
            table.move_cursor(row=table.row_count - 1)
        elif current is not None and current in seen:
            table.move_cursor(row=table.get_row_index(current))

    @staticmethod
    def _cursor_key(table: DataTable[Any]) -> str | None:
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except Exception:  # the cursor is outside the rows
            return None
        return None if key.value is None else str(key.value)

    def show_actor(self, path: str) -> None:
        self.selected_actor = path
        local = self.actors_node in (None, self.state_answer.get("node_id"))
        events = list(self.event_log) if local else self.remote_events
        details = model.actor_details(self.actor_tree, path, events)
        self.query_one("#actor-details", Static).update(details)

    # ------------------------------------------------------------------ keys

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "actors-table" and event.row_key.value is not None:
            self.show_actor(str(event.row_key.value))
            self._wake.set()  # another node's events for it are read on the next poll

    def action_pane(self, step: int) -> None:
        index = PANES.index(self.pane) if self.pane in PANES else 0
        pane = PANES[(index + step) % len(PANES)]
        self.query_one(TabbedContent).active = pane
        focus = {
            "cluster": "cluster-table",
            "apps": "apps-table",
            "actors": "actors-table",
            "events": "events-table",
        }.get(pane)
        if focus:
            self.query_one(f"#{focus}", DataTable).focus()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = self.filters[self.pane]
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filters[self.pane] = event.value
        self.redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.action_pane(0)

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display:
            self.filters[self.pane] = ""
            box.value = ""
            box.display = False
            self.action_pane(0)
            self.redraw()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_refresh(self) -> None:
        self._wake.set()

    def action_quit_inspector(self) -> None:
        self.exit(0)

    def action_pick_node(self) -> None:
        def chosen(node: str | None) -> None:
            if node is not None and node != self.actors_node:
                self.actors_node = node
                self.selected_actor = None
                self.remote_events = []
                self.history.clear()
                self.query_one(TabbedContent).active = "actors"
                self.query_one("#actors-table", DataTable).focus()
                self._wake.set()

        self.push_screen(NodePicker(model.node_ids(self.nodes_answer), self.actors_node), chosen)

    def selected_node(self) -> str | None:
        """The node under the Cluster pane's cursor."""
        key = self._cursor_key(self.query_one("#cluster-table", DataTable))
        return key

    def action_node_op(self, verb: str) -> None:
        node = self.selected_node()
        if node is None:
            self.say("no node selected: pick one in the Cluster pane first")
            return
        text, refused = model.action_preview(verb, node, self.ps_answer, self.apps_answer)

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._node_op(verb, node), name=f"{verb} {node}")
            else:
                self.say(f"{verb} {node}: " + ("refused, nothing done" if refused else "cancelled"))

        self.push_screen(ConfirmScreen(text, refused), answered)

    async def _node_op(self, verb: str, node: str) -> None:
        try:
            answer = await self.source.post(f"/v1/nodes/{quote(node, safe='')}/{verb}")
        except SourceError as exc:
            self.say(f"{verb} {node} failed: {exc}")
            return
        intent = answer.get("intent") if isinstance(answer.get("intent"), dict) else {}
        self.say(f"{verb} {node}: done ({model.pairs(intent)})")
        self._wake.set()

    def say(self, text: str) -> None:
        self.last_action = text
        self.query_one("#action", Static).update(text)
        self.notify(text, timeout=4, markup=False)


def run_app(source: NodeSource, *, interval: float = 1.0) -> int:
    """Run the inspector in this terminal until ``q``; returns the exit status (0)."""
    result = Inspector(source, interval=interval).run()
    return 0 if result is None else int(result)
