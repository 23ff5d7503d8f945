"""What each pane of the inspector shows, decided from the node's JSON answers. Pure.

Theory of operation: the inspector polls a node's API (``/v1/nodes``, ``/v1/ps``,
``/v1/apps``, ``/v1/state``, a chosen node's ``/v1/actors``) and follows its event
stream. Every answer is untrusted JSON from a node that may be older or newer than
this inspector, so nothing here indexes a field it has not checked: a missing or
odd field renders as ``-`` (or is left out), never raises. Functions take plain
mappings and return rows of strings; the Textual shell only puts them on screen.

Rates need history: :class:`ActorHistory` keeps, per actor path, the last few
mailbox depths (for the sparkline) and the previous ``messages_handled`` with the
time it was read (for handled per second). The time is given, never read here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral._text import duration

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 20
BAR_WIDTH = 10


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _text(value: object, default: str = "-") -> str:
    if value is None or value == "":
        return default
    return str(value)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def pairs(value: object) -> str:
    """``{"a": "1", "b": "2"}`` as ``a=1, b=2`` (``-`` when empty or not a mapping)."""
    mapping = _map(value)
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items())) or "-"


def sparkline(values: Sequence[float], width: int = HISTORY) -> str:
    """The last ``width`` values as block characters, scaled to the largest (an all-zero
    history is a flat baseline)."""
    recent = list(values)[-width:]
    if not recent:
        return ""
    top = max(recent)
    if top <= 0:
        return SPARK[0] * len(recent)
    steps = len(SPARK) - 1
    return "".join(SPARK[min(steps, round(v / top * steps))] for v in recent)


def bar(used: float | None, total: float | None, width: int = BAR_WIDTH) -> str:
    """``[####------] 40%`` for ``used`` of ``total``; ``-`` when either is unknown."""
    if used is None or total is None or total <= 0:
        return "-"
    fraction = min(1.0, max(0.0, used / total))
    filled = round(fraction * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {fraction:.0%}"


def capacity_bars(capacity: object) -> tuple[str, str]:
    """Memory and disk in use, as bars, from a node record's ``capacity``."""
    cap = _map(capacity)
    out: list[str] = []
    for kind in ("memory", "disk"):
        total = _number(cap.get(f"{kind}_mb"))
        free = _number(cap.get(f"{kind}_free_mb"))
        out.append(bar(None if total is None or free is None else total - free, total))
    return out[0], out[1]


# ---------------------------------------------------------------------- cluster


CLUSTER_COLUMNS = ("NODE", "STATE", "LABELS", "RACK", "MEMORY", "DISK", "APPS SERVED")


def served_by_node(ps_answer: Mapping[str, Any]) -> dict[str, list[str]]:
    """node -> the apps ``GET /v1/ps`` shows running (or starting) there, sorted."""
    served: dict[str, set[str]] = {}
    for row in _list(ps_answer.get("rows")):
        row = _map(row)
        node, app = row.get("node"), row.get("app")
        if (
            isinstance(node, str)
            and isinstance(app, str)
            and row.get("state")
            in (
                "running",
                "starting",
                "crash-loop",
            )
        ):
            served.setdefault(node, set()).add(app)
    return {node: sorted(apps) for node, apps in served.items()}


def _apps_served(names: list[str] | None, count: object) -> str:
    if names:
        return ", ".join(names)
    return _text(count) if count else "-"


def cluster_rows(
    nodes_answer: Mapping[str, Any], ps_answer: Mapping[str, Any] | None = None
) -> list[tuple[str, ...]]:
    """One row per node of ``GET /v1/nodes``; the coordinator's id carries a ``*``; the
    apps each serves by name when ``ps_answer`` says, else how many."""
    served = served_by_node(ps_answer or {})
    rows: list[tuple[str, ...]] = []
    for node in _list(nodes_answer.get("nodes")):
        node = _map(node)
        node_id = _text(node.get("node"), "?")
        memory, disk = capacity_bars(node.get("capacity"))
        rows.append(
            (
                node_id + (" *" if node.get("coordinator") else ""),
                _text(node.get("state")),
                pairs(node.get("labels")),
                _text(node.get("rack")),
                memory,
                disk,
                _apps_served(served.get(node_id), node.get("serving")),
            )
        )
    return rows


def cluster_summary(nodes_answer: Mapping[str, Any]) -> str:
    """Who coordinates, under which fence."""
    holder = nodes_answer.get("coordinator")
    if not holder:
        return "no node holds the coordinator lease right now"
    return (
        f"coordinator {holder} (fence {_text(nodes_answer.get('fence'))}, * in the list)   "
        "c / u / d: cordon, uncordon, drain the selected node"
    )


def node_ids(nodes_answer: Mapping[str, Any]) -> list[str]:
    ids = [_map(n).get("node") for n in _list(nodes_answer.get("nodes"))]
    return sorted(i for i in ids if isinstance(i, str))


def node_api(nodes_answer: Mapping[str, Any], node_id: str) -> str | None:
    """The API address a node advertises (``host:port``), if it says one."""
    for node in _list(nodes_answer.get("nodes")):
        node = _map(node)
        if node.get("node") == node_id and isinstance(node.get("api_address"), str):
            return str(node["api_address"]) or None
    return None


# ---------------------------------------------------------------------- apps


APP_COLUMNS = ("APP", "NODE", "STATE", "REVISION", "PORTS", "RESTARTS", "RELOC")


def app_rows(ps_answer: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per instance of ``GET /v1/ps``."""
    rows: list[tuple[str, ...]] = []
    for row in _list(ps_answer.get("rows")):
        row = _map(row)
        public, internal = row.get("public_port"), row.get("internal_port")
        ports = f"{public}/{internal}" if public and internal else "-"
        revision = row.get("revision")
        rows.append(
            (
                _text(row.get("app"), "?"),
                _text(row.get("node")),
                _text(row.get("state")),
                revision[:12] if isinstance(revision, str) and revision else "-",
                ports,
                _text(row.get("restarts"), "0"),
                _text(row.get("reloc")),
            )
        )
    return rows


def app_specs(apps_answer: Mapping[str, Any]) -> list[str]:
    """Each app's replicas, selector and domains, one line each."""
    lines: list[str] = []
    for app in _list(apps_answer.get("apps")):
        app = _map(app)
        flags = [name for name in ("pinned", "retired", "blocked") if app.get(name)]
        domains = ", ".join(str(d) for d in _list(app.get("domains"))) or "-"
        lines.append(
            f"{_text(app.get('name'), '?')}: replicas {_text(app.get('replicas'))}, "
            f"selector {pairs(app.get('selector'))}, domains {domains}"
            + (f" ({', '.join(flags)})" if flags else "")
        )
    return lines


def held_back(state: Mapping[str, Any], now: float) -> list[str]:
    """Unplaced apps (with their reason), deferred moves, stranded instances, a refusal or
    a pause, from the lease holder's coordination in ``GET /v1/state`` (``now``: unix
    time, for the cooldowns left)."""
    coordination = _map(state.get("coordination"))
    if "error" in coordination:
        if not coordination.get("holder"):
            return [f"decisions unknown: {_text(coordination.get('error'))}"]
        return [f"decisions unknown: {_text(coordination.get('error'))} (retrying)"]
    lines: list[str] = []
    for item in _list(coordination.get("unplaced")):
        item = _map(item)
        lines.append(
            f"unplaced  {_text(item.get('app'), '?')} ({_text(item.get('reason'))}): "
            f"{_text(item.get('message'))}"
        )
    for item in _list(coordination.get("deferred")):
        item = _map(item)
        until = _number(item.get("until"))
        why = (
            f"cooldown, may move in {duration(until - now)}"
            if until is not None and until > now
            else _text(item.get("reason"), "held back")
        )
        lines.append(
            f"deferred  {_text(item.get('app'), '?')} on {_text(item.get('node'), '?')}: {why}"
        )
    for item in _list(coordination.get("stranded")):
        item = _map(item)
        lines.append(
            f"stranded  {_text(item.get('app'), '?')} on {_text(item.get('node'), '?')}: "
            f"{_text(item.get('reason'))}"
        )
    for name in ("refused", "paused"):
        item = _map(coordination.get(name))
        if item:
            lines.append(f"{name:<9} {_text(item.get('message') or item.get('reason'))}")
    return lines


# ---------------------------------------------------------------------- routes


def route_lines(routes_answer: Mapping[str, Any] | None) -> list[str]:
    """Domain -> backends, and each proxy's applied version and lag; or why there are none."""
    if routes_answer is None:
        return [
            "no routing yet: this node's API has no routing table (GET /v1/routes); "
            "the Routes pane fills in once the cluster renders one"
        ]
    lines: list[str] = [f"routing version {_text(routes_answer.get('version'))}"]
    table = _map(routes_answer.get("routes") or routes_answer.get("table"))
    if not table:
        lines.append("no domain has a backend")
    for domain in sorted(table):
        backends = ", ".join(str(b) for b in _list(table[domain])) or "(none)"
        lines.append(f"{domain} -> {backends}")
    for proxy in _list(routes_answer.get("proxies")):
        proxy = _map(proxy)
        lines.append(
            f"proxy {_text(proxy.get('id'), '?')}: applied version "
            f"{_text(proxy.get('applied_version') or proxy.get('version'))}, lag "
            f"{_text(proxy.get('lag'))}"
        )
    return lines


# ---------------------------------------------------------------------- actors


ACTOR_COLUMNS = ("ACTOR", "STATE", "MAILBOX", "HANDLED/S", "RESTARTS", "LAST ERROR")


@dataclass
class _Seen:
    depths: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    handled: float | None = None
    at: float | None = None
    rate: float | None = None


class ActorHistory:
    """Per actor path: recent mailbox depths and the handled-per-second rate."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def clear(self) -> None:
        self._seen.clear()

    def observe(self, tree: Mapping[str, Any], now: float) -> None:
        """Take one snapshot of the tree read at ``now`` (seconds, any monotonic clock)."""
        live: set[str] = set()
        for _, node in walk_tree(tree):
            path = node.get("path")
            if not isinstance(path, str):
                continue
            live.add(path)
            seen = self._seen.setdefault(path, _Seen())
            seen.depths.append(_number(node.get("mailbox_depth")) or 0.0)
            handled = _number(node.get("messages_handled"))
            if handled is not None and seen.handled is not None and seen.at is not None:
                elapsed = now - seen.at
                if elapsed > 0 and handled >= seen.handled:
                    seen.rate = (handled - seen.handled) / elapsed
                elif handled < seen.handled:
                    seen.rate = None  # restarted: its count began again
            seen.handled, seen.at = handled, now
        for gone in set(self._seen) - live:
            del self._seen[gone]

    def depths(self, path: str) -> list[float]:
        seen = self._seen.get(path)
        return list(seen.depths) if seen else []

    def rate(self, path: str) -> float | None:
        seen = self._seen.get(path)
        return seen.rate if seen else None


def walk_tree(tree: Mapping[str, Any], depth: int = 0) -> Iterable[tuple[int, Mapping[str, Any]]]:
    """(depth, node) for the tree and every descendant, in order; bounded in depth."""
    if depth > 64:
        return
    yield depth, tree
    for child in _list(tree.get("children")):
        if isinstance(child, Mapping):
            yield from walk_tree(child, depth + 1)


def actor_rows(tree: Mapping[str, Any], history: ActorHistory) -> list[tuple[str, tuple[str, ...]]]:
    """(path, row) per actor, the name indented by its depth, with the mailbox sparkline."""
    rows: list[tuple[str, tuple[str, ...]]] = []
    for depth, node in walk_tree(tree):
        path = _text(node.get("path"), "?")
        name = _text(node.get("name") or node.get("path"), "?")
        if node.get("kind") == "supervisor":
            name += "/"
        depth_now = _text(node.get("mailbox_depth"), "0")
        rate = history.rate(path)
        rows.append(
            (
                path,
                (
                    "  " * depth + name,
                    _text(node.get("state")),
                    f"{depth_now:>3} {sparkline(history.depths(path))}",
                    "-" if rate is None else f"{rate:.1f}",
                    _text(node.get("restarts"), "0"),
                    _text(node.get("last_error"), ""),
                ),
            )
        )
    return rows


def find_actor(tree: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    for _, node in walk_tree(tree):
        if node.get("path") == path:
            return node
    return None


def actor_details(
    tree: Mapping[str, Any], path: str, events: Sequence[Mapping[str, Any]], limit: int = 10
) -> str:
    """An actor's fields, its current message and its most recent events."""
    node = find_actor(tree, path)
    if node is None:
        return f"{path}: no such actor on this node any more"
    lines = [
        f"actor      {path}  ({_text(node.get('kind'))})",
        f"state      {_text(node.get('state'))}",
        f"now        {_text(node.get('current_message'), 'idle')}",
        f"mailbox    {_text(node.get('mailbox_depth'), '0')}",
        f"handled    {_text(node.get('messages_handled'), '0')}",
        f"restarts   {_text(node.get('restarts'), '0')}",
        f"last error {_text(node.get('last_error'), 'none')}",
        "recent events:",
    ]
    mine = [e for e in events if e.get("path") == path][-limit:]
    lines += [f"  {event_text(e)}" for e in mine] or ["  (none kept)"]
    return "\n".join(lines)


# ---------------------------------------------------------------------- events


def event_text(event: Mapping[str, Any]) -> str:
    """One event as one line: kind, actor path, then its fields as k=v."""
    fields = _map(event.get("fields"))
    detail = " ".join(f"{k}={v}" for k, v in sorted(fields.items()))
    return f"#{_text(event.get('seq'), '?')} {_text(event.get('kind'), '?')} " + (
        f"{_text(event.get('path'), '/')} {detail}".rstrip()
    )


def matches(text: str, needle: str) -> bool:
    """Case-insensitive substring filter; an empty needle matches everything."""
    return not needle or needle.lower() in text.lower()


# ---------------------------------------------------------------------- node actions


def _instances_on(ps_answer: Mapping[str, Any], node: str) -> list[Mapping[str, Any]]:
    return [
        _map(r)
        for r in _list(ps_answer.get("rows"))
        if _map(r).get("node") == node and _map(r).get("state") not in ("stopped", "node-gone")
    ]


def _pinned_apps(apps_answer: Mapping[str, Any]) -> set[str]:
    return {
        str(_map(a).get("name")) for a in _list(apps_answer.get("apps")) if _map(a).get("pinned")
    }


def action_preview(
    verb: str,
    node: str,
    ps_answer: Mapping[str, Any],
    apps_answer: Mapping[str, Any],
) -> tuple[str, bool]:
    """What a confirm dialog says before ``verb`` (cordon, uncordon, drain) of ``node``,
    from what the inspector last read, and whether the node would refuse it. There is no
    dry run in the API, so this is a forecast: the coordinator decides on its next pass.
    """
    instances = _instances_on(ps_answer, node)
    apps = sorted({str(r.get("app")) for r in instances})
    listed = ", ".join(apps) if apps else "no app"
    if verb == "cordon":
        return (
            f"Cordon {node}: it keeps what it runs ({listed}) and takes no new work.",
            False,
        )
    if verb == "uncordon":
        return (
            f"Uncordon {node}: it takes work again (and a drain of it ends); the coordinator "
            "may place apps there on its next pass.",
            False,
        )
    pinned = sorted(set(apps) & _pinned_apps(apps_answer))
    if pinned:
        return (
            f"Drain {node} would be refused: it runs pinned app(s) {', '.join(pinned)}, which "
            "are never moved and would stop. Use `corral node drain "
            f"{node} --force` to stop them anyway.",
            True,
        )
    everywhere = sorted(
        str(r.get("app"))
        for r in instances
        if str(r.get("reloc", "")).startswith("no (replicas all")
    )
    moving = [a for a in apps if a not in everywhere]
    lines = [f"Drain {node}: it takes no new work and its instances leave it."]
    if moving:
        lines.append(f"Would move elsewhere: {', '.join(moving)}.")
    if everywhere:
        lines.append(
            f"Would stop there (replicas all, they run on every other node): "
            f"{', '.join(everywhere)}."
        )
    if not apps:
        lines.append("It runs no app: nothing moves.")
    return " ".join(lines), False
