"""``corral inspect``: the actor tree, redrawn every interval until Ctrl-C."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from corral.inspector._render import render_tree

CLEAR = "\x1b[H\x1b[2J"


def run_inspector(
    fetch: Callable[[], dict[str, Any]],
    stdout: TextIO,
    *,
    interval: float = 1.0,
    once: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the tree from ``fetch()``; unless ``once``, clear and redraw every ``interval``.

    Returns the exit status (0; Ctrl-C ends the view normally).
    """
    try:
        while True:
            text = render_tree(fetch())
            if once:
                print(text, file=stdout)
                return 0
            stdout.write(CLEAR + time.strftime("%H:%M:%S") + "  (Ctrl-C to leave)\n\n")
            stdout.write(text + "\n")
            stdout.flush()
            sleep(interval)
    except KeyboardInterrupt:
        return 0
