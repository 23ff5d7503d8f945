"""The text of a Textual screen, from its public SVG export (one line per terminal row)."""

from __future__ import annotations

import html
import re

_TEXT = re.compile(
    r'<text[^>]*\bx="(?P<x>[0-9.]+)"[^>]*clip-path="url\(#[^)]*-line-(?P<line>\d+)\)"[^>]*>'
    r"(?P<body>[^<]*)</text>"
)
#: Rich's SVG export draws each cell this many units wide.
CELL = 12.2


def screen_text(svg: str) -> str:
    rows: dict[int, dict[int, str]] = {}
    for match in _TEXT.finditer(svg):
        column = round(float(match["x"]) / CELL)
        rows.setdefault(int(match["line"]), {})[column] = html.unescape(match["body"]).replace(
            "\xa0", " "
        )
    lines = []
    for index in range(max(rows, default=-1) + 1):
        line = ""
        for column, body in sorted(rows.get(index, {}).items()):
            line = line.ljust(column) + body
        lines.append(line.rstrip())
    return "\n".join(lines).rstrip()
