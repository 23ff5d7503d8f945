"""The actor tree view."""

from __future__ import annotations

import io
from typing import Any

import corral.inspector
from corral.inspector import run_inspector
from corral.inspector._render import render_tree

TREE: dict[str, Any] = {
    "path": "/",
    "name": "node",
    "kind": "supervisor",
    "state": "running",
    "mailbox_depth": 0,
    "messages_handled": 0,
    "restarts": 0,
    "last_error": None,
    "current_message": None,
    "children": [
        {
            "name": "coordinator",
            "kind": "actor",
            "state": "running",
            "mailbox_depth": 1,
            "messages_handled": 42,
            "restarts": 0,
            "current_message": "coordinator.tick",
            "children": [],
        },
        {
            "name": "agent",
            "kind": "supervisor",
            "state": "running",
            "children": [
                {
                    "name": "reconciler",
                    "kind": "actor",
                    "state": "crashed",
                    "restarts": 2,
                    "last_error": "boom",
                    "children": [],
                },
            ],
        },
    ],
}


def test_all_is_sorted() -> None:
    assert corral.inspector.__all__ == sorted(corral.inspector.__all__)


def test_render_tree_indents_children_and_shows_errors() -> None:
    lines = render_tree(TREE).splitlines()
    assert lines[0].split() == [
        "ACTOR",
        "STATE",
        "MAILBOX",
        "HANDLED",
        "RESTARTS",
        "NOW",
        "/",
        "LAST",
        "ERROR",
    ]
    assert lines[1].startswith("node/")
    assert lines[2].startswith("├─ coordinator")
    assert "coordinator.tick" in lines[2]
    assert lines[3].startswith("└─ agent/")
    assert lines[4].startswith("   └─ reconciler")
    assert "! boom" in lines[4]


def test_live_view_redraws_until_interrupted() -> None:
    out = io.StringIO()
    calls = 0

    def sleep(seconds: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt

    assert run_inspector(lambda: TREE, out, interval=0.5, sleep=sleep) == 0
    assert out.getvalue().count("├─ coordinator") == 2
    once = io.StringIO()
    run_inspector(lambda: TREE, once, once=True)
    assert "\x1b" not in once.getvalue()
