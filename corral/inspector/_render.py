"""Render the actor tree (``GET /v1/actors``) as indented text. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COLUMNS = ("STATE", "MAILBOX", "HANDLED", "RESTARTS", "NOW / LAST ERROR")


def _rows(node: Mapping[str, Any], prefix: str, last: bool, root: bool) -> list[tuple[str, ...]]:
    branch = "" if root else ("└─ " if last else "├─ ")
    name = node.get("name") or node.get("path") or "?"
    if node.get("kind") == "supervisor":
        name = f"{name}/"
    doing = node.get("current_message") or ""
    error = node.get("last_error")
    note = f"{doing}  ! {error}" if error else doing
    rows: list[tuple[str, ...]] = [
        (
            prefix + branch + str(name),
            str(node.get("state", "?")),
            str(node.get("mailbox_depth", "")),
            str(node.get("messages_handled", "")),
            str(node.get("restarts", "")),
            note.strip(),
        )
    ]
    children = list(node.get("children") or [])
    child_prefix = prefix if root else prefix + ("   " if last else "│  ")
    for index, child in enumerate(children):
        rows += _rows(child, child_prefix, index == len(children) - 1, False)
    return rows


def render_tree(tree: Mapping[str, Any]) -> str:
    """The tree as aligned columns: name (indented), state, mailbox, handled, restarts, note."""
    rows = _rows(tree, "", True, True)
    headers = ("ACTOR", *COLUMNS)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)
