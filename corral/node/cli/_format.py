"""Human-readable rendering of API answers: tables, the state summary, event lines.

Whatever is shown comes from the registry or a peer, so it may carry control
characters (an ESC starting a terminal escape sequence, a newline forging a row).
Every renderer here runs its answer through :func:`printable_tree` first, and
:func:`table` escapes its cells, so the only control characters printed are the
newlines between the lines this module writes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from corral._text import duration
from corral.actors.coordinator import rollout_status
from corral.registry import RolloutRecord

# C0 and C1 controls and DEL, and the Unicode line separators and bidirectional
# overrides that reorder or break what a terminal shows.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as an escape, as Python spells
    it (``\\x1b``, ``\\n``, ``\\u202e``): safe to print on a terminal, one line."""
    return _UNPRINTABLE.sub(_escape, text)


def printable_tree(value: Any) -> Any:
    """A decoded JSON answer with :func:`printable` applied to every string in it,
    keys included."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_tree(item) for item in value]
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; None renders as '-'; control
    characters in a cell are escaped."""
    cells = [[("-" if c is None else printable(str(c))) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


PS_HEADERS = ("APP", "NODE", "STATE", "REVISION", "PUBLIC", "INTERNAL", "RESTARTS", "RELOC")
#: How much of a revision id ``ps`` shows.
SHORT_REVISION = 12


def ps_table(rows: Sequence[Mapping[str, Any]], coordinator: object = None) -> str:
    """``corral ps``; ``coordinator`` is what ``GET /v1/ps`` says of the coordinator
    RELOC asked: when it could not be asked, a last line says why the cooldowns are
    unknown."""
    if not rows:
        return "no apps; deploy one with: corral deploy DIR --name NAME"
    rows, coordinator = printable_tree(rows), printable_tree(coordinator)
    text = table(
        PS_HEADERS,
        [
            (
                r["app"],
                r["node"],
                r["state"],
                _revision_cell(r),
                r["public_port"],
                r["internal_port"],
                r["restarts"],
                r["reloc"],
            )
            for r in rows
        ],
    )
    for r in rows:
        # Why it is failed or crash-looping, why a start waits (no port pair, no copy
        # of the revision reachable), why it is stopped.
        if r.get("reason"):
            text += f"\n{r['state']} {r['app']} on {r['node']}: {r['reason']}"
    text += "".join(f"\n{line}" for line in _rollout_lines(rows))
    if isinstance(coordinator, Mapping) and coordinator.get("error"):
        text += f"\nRELOC cannot tell cooldowns: {coordinator['error']}"
    return text


def _revision_cell(row: Mapping[str, Any]) -> str:
    """The instance's revision, short, with its rollout step while one runs."""
    revision = str(row.get("revision") or "-")[:SHORT_REVISION]
    step = row.get("rollout_step")
    return f"{revision} ({step})" if step and step != "done" else revision


def _rollout_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per app with a rolling deploy: ``rollout shop: rolling 1/3``."""
    seen: dict[str, str] = {}
    for r in rows:
        if r.get("rollout") and r["app"] not in seen:
            seen[r["app"]] = str(r["rollout"])
    return [f"rollout {app}: {status}" for app, status in seen.items()]


def _pairs(mapping: Mapping[str, Any] | None) -> str:
    if not mapping:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in sorted(mapping.items()))


def _ago(when: object, now: float) -> str:
    if not isinstance(when, int | float):
        return "at an unknown time"
    seconds = max(0.0, now - float(when))
    return f"{seconds:.0f} s ago" if seconds >= 1 else "just now"


def _coordinator_line(coordinator: Mapping[str, Any], now: float) -> str | None:
    last = coordinator.get("last_pass")
    if not isinstance(last, Mapping):
        return None
    counts = last.get("counts") or {}
    text = (
        f"last pass   {last.get('outcome')} {_ago(last.get('wall_time'), now)} "
        f"(trigger {last.get('trigger')}, {counts.get('writes', 0)} write(s))"
    )
    if last.get("error"):
        text += f": {last['error']}"
    return text


def _placed_on(placement: Mapping[str, Any]) -> str:
    """The nodes of a placement record, then those where a forced drain stopped a
    pinned instance (in ``placed_at`` but not in ``nodes``)."""
    nodes = list(placement.get("nodes") or [])
    stopped = sorted(set(placement.get("placed_at") or {}) - set(nodes))
    text = ", ".join(nodes + [f"{node} (stopped by a forced drain)" for node in stopped])
    return text or "-"


def _deferred_line(item: Mapping[str, Any], now: float) -> str:
    where = f"{item.get('app')} on {item.get('node')}"
    until = item.get("until")
    reason = str(item.get("reason") or "")
    if isinstance(until, int | float):
        left = float(until) - now
        when = f"may move in {duration(left)}" if left > 0 else "may move on the next pass"
        return f"deferred    {where}: cooldown, {when}"
    return f"deferred    {where}: {reason or 'held back'}"


def _holder_state(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The lease holder's coordinator state, when the node could have it."""
    coordination = state.get("coordination")
    if isinstance(coordination, Mapping) and "error" not in coordination:
        return coordination
    return None


def _coordination_lines(state: Mapping[str, Any], now: float) -> list[str]:
    """The lease holder's last pass and policy (this node's own last pass while it
    coordinates, when the holder's state cannot be had)."""
    holder = _holder_state(state)
    local = state.get("coordinator")
    if holder is None:
        line = (
            _coordinator_line(local, now)
            if state.get("coordinating") and isinstance(local, Mapping)
            else None
        )
        return [line] if line else []
    lines: list[str] = []
    line = _coordinator_line(holder, now)
    if line:
        lines.append(line)
    policy = holder.get("policy")
    if isinstance(policy, Mapping):
        fraction = policy.get("min_usable_fraction")
        usable = f"{fraction:.0%}" if isinstance(fraction, int | float) else fraction
        lines.append(
            f"policy      cooldown {_number(policy.get('cooldown_s'))} s, grace "
            f"{_number(policy.get('grace_period_s'))} s, disruption budget "
            f"{policy.get('disruption_budget')} per pass, relocations need {usable} "
            "of the nodes usable"
        )
    return lines


def _held_back_lines(state: Mapping[str, Any], now: float) -> list[str]:
    """What the coordinator holds back: deferred moves, stranded instances, a refusal,
    a pause; or why that cannot be known."""
    coordination = state.get("coordination")
    holder = _holder_state(state)
    if holder is None:
        if isinstance(coordination, Mapping) and coordination.get("holder"):
            return [f"decisions   unknown: {coordination.get('error')}"]
        return []
    lines: list[str] = []
    for item in holder.get("deferred") or []:
        if isinstance(item, Mapping):
            lines.append(_deferred_line(item, now))
    for item in holder.get("stranded") or []:
        if isinstance(item, Mapping):
            where = f"{item.get('app')} on {item.get('node')}"
            lines.append(f"stranded    {where}: {item.get('reason')}")
    refused = holder.get("refused")
    if isinstance(refused, Mapping):
        lines.append(f"refused     {refused.get('message') or refused.get('reason')}")
    paused = holder.get("paused")
    if isinstance(paused, Mapping):
        lines.append(f"paused      {paused.get('message')}")
    return lines


def _number(value: object) -> object:
    """``600`` for 600.0: a whole float without its ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _reconcile_line(reconcile: Mapping[str, Any], now: float) -> str:
    what = (
        "skipped (nothing moved)"
        if reconcile.get("skipped")
        else (f"{len(reconcile.get('actions') or [])} action(s)")
    )
    text = (
        f"reconcile   {_ago(reconcile.get('time'), now)} at change token {reconcile.get('token')}: "
        f"{what}, serving {reconcile.get('serving')}"
    )
    errors = reconcile.get("errors") or []
    if errors:
        text += f"; errors: {'; '.join(str(e) for e in errors)}"
    for item in reconcile.get("failed") or ():
        text += (
            f"\nfailed      {item.get('app')} revision {str(item.get('revision'))[:12]}: "
            f"{item.get('reason')} (attempt {item.get('attempts')}, next try in "
            f"{duration(float(item.get('retry_in') or 0))})"
        )
    return text


def state_summary(state: Mapping[str, Any], now: float | None = None) -> str:
    """A few lines saying who this node is, who coordinates, what runs, what is stuck."""
    now = time.time() if now is None else now
    state = printable_tree(state)
    lines: list[str] = []
    node = state.get("node") or {}
    node_id = state.get("node_id", node.get("id", "?"))
    lines.append(f"node        {node_id}  ({node.get('state', 'no record published')})")
    if node:
        lines.append(f"labels      {_pairs(node.get('labels'))}")
        where = (
            ", ".join(f"{k} {node[k]}" for k in ("rack", "datacenter") if node.get(k))
            or "no rack or datacenter set"
        )
        lines.append(f"location    {where}")
        lines.append(f"addresses   peer {node.get('peer_address')}, api {node.get('api_address')}")
        capacity = node.get("capacity") or {}
        if capacity:
            lines.append(
                f"capacity    memory {capacity['memory_free_mb']}/{capacity['memory_mb']} "
                f"MiB free, disk {capacity['disk_free_mb']}/{capacity['disk_mb']} MiB free"
            )
    lease = state.get("lease") or {}
    if lease.get("holder"):
        me = " (this node)" if state.get("coordinating") else ""
        lines.append(f"coordinator {lease['holder']}{me}, fence {lease.get('fence')}")
    else:
        lines.append("coordinator none holds the lease right now")
    lines += _coordination_lines(state, now)
    lines += _artifact_lines(state.get("artifacts"))
    reconcile = state.get("reconcile")
    if isinstance(reconcile, Mapping) and "token" in reconcile:
        lines.append(_reconcile_line(reconcile, now))
    elif isinstance(reconcile, Mapping) and reconcile.get("error"):
        lines.append(f"reconcile   unknown: {reconcile['error']}")
    processes = state.get("processes") or []
    if isinstance(processes, Mapping):
        lines.append(f"processes   unknown: {processes.get('error')}")
    elif processes:
        lines.append("")
        lines.append(
            table(
                ("APP", "PID", "STATE", "PUBLIC", "INTERNAL", "RESTARTS", "LAST EXIT"),
                [
                    (
                        p.get("app"),
                        p.get("pid"),
                        "crash-loop"
                        if p.get("crash_loop") and p.get("state") != "failed"
                        else p.get("state"),
                        p.get("public_port"),
                        p.get("internal_port"),
                        p.get("restarts"),
                        p.get("last_exit_code"),
                    )
                    for p in processes
                ],
            )
        )
        lines += _trouble_lines(processes, state.get("data_dir"))
    else:
        lines.append("processes   none on this node")
    placements = state.get("placements") or {}
    if placements:
        lines.append("")
        lines.append(
            table(
                ("APP", "PLACED ON", "FENCE"),
                [(app, _placed_on(p), p.get("fence")) for app, p in sorted(placements.items())],
            )
        )
    lines += _rollout_state_lines(placements)
    unplaced = state.get("unplaced") or []
    if isinstance(unplaced, Mapping):
        # Said once, by the "decisions" line, when the holder's state is reported.
        if "coordination" not in state:
            lines.append(f"unplaced    unknown: {unplaced.get('error')}")
    else:
        for item in unplaced:
            lines.append(f"unplaced    {item.get('message') or item.get('reason')}")
    lines += _held_back_lines(state, now)
    return "\n".join(lines)


def _rollout_state_lines(placements: Mapping[str, Any]) -> list[str]:
    """One line per app whose placement carries a rolling deploy: its target, its
    progress (``rolling 1/3``, ``halted: reason``) and each node's step."""
    lines = []
    for app, placement in sorted(placements.items()):
        rollout = placement.get("rollout") if isinstance(placement, Mapping) else None
        if not isinstance(rollout, Mapping):
            continue
        try:
            record = RolloutRecord.from_json(dict(rollout))
        except (ValueError, TypeError) as exc:
            lines.append(f"rollout     {app}: cannot be read ({exc})")
            continue
        steps = ", ".join(f"{node} {entry.step}" for node, entry in record.nodes.items())
        lines.append(
            f"rollout     {app} to {record.revision[:SHORT_REVISION]}: "
            f"{rollout_status(record)} ({steps or 'no nodes'})"
        )
    return lines


def _mib(count: object) -> str:
    return f"{count / (1024 * 1024):.1f} MiB" if isinstance(count, int | float) else "?"


def _artifact_lines(artifacts: object) -> list[str]:
    """Disk used by artifact copies and unpacked revisions, and fetches that failed."""
    if not isinstance(artifacts, Mapping):
        return []
    if artifacts.get("error"):
        return [f"artifacts   unknown: {artifacts['error']}"]
    revisions = artifacts.get("revisions") or {}
    count = sum(len(v) for v in revisions.values()) if isinstance(revisions, Mapping) else 0
    lines = [
        f"artifacts   {artifacts.get('artifacts')} cop(ies) using "
        f"{_mib(artifacts.get('artifact_bytes'))}, {count} unpacked revision(s) using "
        f"{_mib(artifacts.get('revision_bytes'))}"
        + (f", fetching {len(artifacts['fetching'])}" if artifacts.get("fetching") else "")
    ]
    failed = artifacts.get("failed") or {}
    if isinstance(failed, Mapping):
        for digest, why in sorted(failed.items()):
            lines.append(f"            cannot fetch {str(digest)[:12]}: {why}")
    return lines


def _trouble_lines(processes: Sequence[Mapping[str, Any]], data_dir: object) -> list[str]:
    """One line per process that fails to start or keeps exiting: why, and where its
    output is."""
    lines: list[str] = []
    for p in processes:
        if not (p.get("crash_loop") or p.get("last_error") or p.get("state") == "backoff"):
            continue
        app = p.get("app")
        if p.get("last_error"):
            why = str(p["last_error"])
        else:
            why = f"it exits with code {p.get('last_exit_code')}"
        where = f"{data_dir}/apps/{app}/logs/" if data_dir else f"<data-dir>/apps/{app}/logs/"
        crash = "crash loop" if p.get("crash_loop") else "restarting"
        lines.append(
            f"{crash:<11} {app}: {why} (restarted {p.get('restarts', 0)} times, with backoff); "
            f"its output is in {where}"
        )
    return lines


def _node_state_cell(node: Mapping[str, Any], now: float) -> str:
    """The state, and for a down node how long until its grace lapses."""
    state = str(node.get("state"))
    until = node.get("grace_until")
    if state != "down" or not isinstance(until, int | float):
        return state
    left = float(until) - now
    return f"down (moves in {duration(left)})" if left > 0 else "down (moving)"


def _since_cell(node: Mapping[str, Any], now: float) -> str:
    since = node.get("since")
    if not isinstance(since, int | float):
        return "-"
    return duration(max(0.0, now - float(since)))


def nodes_table(answer: Mapping[str, Any]) -> str:
    """``corral node ls``: one row per node (state, for how long, membership
    incarnation), then who coordinates, and where the states came from."""
    answer = printable_tree(answer)
    nodes = answer.get("nodes") or []
    if not nodes:
        return "no nodes; start one with: corral node run"
    raw_now = answer.get("now")
    now = float(raw_now) if isinstance(raw_now, int | float) else time.time()
    text = table(
        ("NODE", "STATE", "FOR", "INC", "APPS", "LABELS", "RACK", "API", "ALLOC MEM/DISK"),
        [
            (
                n["node"] + (" *" if n.get("coordinator") else ""),
                _node_state_cell(n, now),
                _since_cell(n, now),
                n.get("incarnation"),
                n["serving"],
                _pairs(n.get("labels")) if n.get("labels") else "-",
                n.get("rack"),
                n.get("api_address"),
                _allocatable_cell(n.get("allocatable")),
            )
            for n in nodes
        ],
    )
    holder = answer.get("coordinator")
    footer = (
        f"* coordinator (fence {answer.get('fence')})"
        if any(n.get("coordinator") for n in nodes)
        else f"coordinator: {holder or 'none holds the lease right now'}"
    )
    states = answer.get("states")
    if isinstance(states, Mapping) and states.get("error"):
        footer += (
            "\nstates from the node records: the coordinator could not be asked "
            f"({states['error']})"
        )
    return f"{text}\n{footer}"


def _lag(seconds: object) -> str | None:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return None
    return "0s" if seconds <= 0 else duration(float(seconds))


def _proxy_state(proxy: Mapping[str, Any]) -> str:
    """``serving``, ``down`` (its process died and is not yet started again), or
    ``not reporting for N s`` (its record is no longer refreshed: nothing it says holds)."""
    silent = proxy.get("not_reporting_s")
    if isinstance(silent, int | float) and not isinstance(silent, bool):
        return f"not reporting for {round(silent)} s"
    if proxy.get("since") is None and proxy.get("last_error"):
        return "down"
    return "serving"


def routes_text(answer: Mapping[str, Any]) -> str:
    """``corral routes``: one row per domain and backend, what is held back, the proxies."""
    answer = printable_tree(answer)
    version = answer.get("version")
    if not version:
        return (
            "no routing table yet: the coordinator writes one once an app is deployed with "
            "--domain (corral deploy DIR --name APP --domain shop.test)"
        )
    lines = [f"routing table: fence {version['fence']} revision {version['revision']}"]
    routes = answer.get("routes") or {}
    if routes:
        lines.append(
            table(
                ("DOMAIN", "BACKEND"),
                [(domain, url) for domain in sorted(routes) for url in routes[domain]],
            )
        )
    else:
        lines.append("no domain has a ready backend")
    held = answer.get("held_back") or []
    if held:
        lines.append(f"held back ({len(held)}):")
        lines += [
            f"  {h.get('app') or '-'} on {h.get('node') or '-'}: {h.get('why')}" for h in held
        ]
    proxies = answer.get("proxies") or []
    if proxies:
        lines.append(
            table(
                ("PROXY", "KIND", "LISTEN", "APPLIED", "LAG", "STATE", "RESTARTS", "ERROR"),
                [
                    (
                        p["id"],
                        p["kind"],
                        p.get("listen"),
                        None
                        if not p.get("applied")
                        else f"{p['applied']['fence']}/{p['applied']['revision']}",
                        _lag(p.get("lag_s")),
                        _proxy_state(p),
                        p.get("restarts") or 0,
                        p.get("error") or p.get("last_error"),
                    )
                    for p in proxies
                ],
            )
        )
    else:
        lines.append("no proxy has reported; start one with: corral proxy run --kind haproxy ...")
    return "\n".join(lines)


def _allocatable_cell(value: object) -> str:
    """``7680/90000 MiB``: what the planner can still promise a node (memory/disk)."""
    if not isinstance(value, Mapping):
        return "-"
    return f"{value.get('memory_mb')}/{value.get('disk_mb')} MiB"


def _short(value: object) -> object:
    """A sha256 digest (an app revision) shortened to its first 12 digits, as ps shows it."""
    if isinstance(value, str) and len(value) == 64 and all(c in HEX for c in value):
        return value[:12]
    return value


HEX = frozenset("0123456789abcdef")


def event_line(event: Mapping[str, Any]) -> str:
    """One event as ``HH:MM:SS kind path key=value...``."""
    event = printable_tree(event)
    when = event.get("wall_time")
    stamp = time.strftime("%H:%M:%S", time.localtime(when)) if isinstance(when, float | int) else ""
    fields = event.get("fields") or {}
    details = " ".join(f"{k}={_short(v)}" for k, v in sorted(fields.items()) if v is not None)
    return " ".join(
        p for p in (stamp, str(event.get("kind")), str(event.get("path")), details) if p
    )


ALIAS_HEADERS = ("DOMAIN", "APP", "PREVIOUS", "REVISION")


def aliases_table(answer: Mapping[str, Any]) -> str:
    """``corral alias ls``: one row per alias, then any alias key that cannot be read."""
    answer = printable_tree(answer)
    aliases = answer.get("aliases") or []
    lines = [
        table(
            ALIAS_HEADERS,
            [(a["domain"], a["app"], a.get("previous"), a.get("revision")) for a in aliases],
        )
        if aliases
        else "no aliases; create one with: corral alias set DOMAIN APP"
    ]
    lines += [
        f"unreadable: {u['key']} ({u['reason']}); remove it with corral alias rm"
        for u in answer.get("undecodable") or []
    ]
    return "\n".join(lines)


def alias_message(verb: str, answer: Mapping[str, Any]) -> str:
    """What ``corral alias set | flip | rollback | rm`` prints."""
    answer = printable_tree(answer)
    if verb == "rm":
        return f"{answer['removed']}: alias removed (it pointed at {answer['app']})"
    alias = answer["alias"]
    if verb == "set":
        return f"{alias['domain']} -> {alias['app']}: alias created"
    if not answer.get("flipped"):
        return f"{alias['domain']} -> {alias['app']}: already points there; nothing changed"
    return (
        f"{alias['domain']} -> {alias['app']}: flipped from {alias['previous']} "
        f"(revision {alias['revision']}; corral alias rollback {alias['domain']} undoes it)"
    )
