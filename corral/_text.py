"""Plain-text helpers shared by layers that must not import each other.

The node's command line (``corral.node.cli``), its API views
(``corral.node.server``) and the inspector (``corral.inspector``) all show
durations the same way; this module sits below all of them so the inspector
need not import the node to do it. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """``9m 12s``, ``45s``, ``2h 5m``: a short human duration (whole seconds, rounded up)."""
    whole = max(1, math.ceil(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"
