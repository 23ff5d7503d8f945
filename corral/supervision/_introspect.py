"""What the kernel reports about itself: actor snapshots and events (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ActorSnapshot", "ActorState", "Event"]

ActorState = Literal["starting", "running", "stopping", "stopped", "crashed", "restarting"]


@dataclass(frozen=True, slots=True)
class ActorSnapshot:
    """One actor (or supervisor) at the moment ``system.tree()`` was called."""

    path: str
    name: str
    kind: Literal["actor", "supervisor"]
    state: ActorState
    mailbox_depth: int
    messages_handled: int
    restarts: int
    last_error: str | None
    current_message: str | None
    children: tuple[ActorSnapshot, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data, children included."""
        return {
            "path": self.path,
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "mailbox_depth": self.mailbox_depth,
            "messages_handled": self.messages_handled,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "current_message": self.current_message,
            "children": [c.to_dict() for c in self.children],
        }

    def find(self, path: str) -> ActorSnapshot | None:
        """The snapshot at ``path`` in this subtree, or None."""
        stack = [self]
        while stack:
            snap = stack.pop()
            if snap.path == path:
                return snap
            stack.extend(snap.children)
        return None

    def walk(self) -> list[ActorSnapshot]:
        """This snapshot and every descendant, depth first in start order."""
        out: list[ActorSnapshot] = []
        stack = [self]
        while stack:
            snap = stack.pop()
            out.append(snap)
            stack.extend(reversed(snap.children))
        return out


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened, as recorded in the system's event log.

    Attributes:
        time: trio clock time.
        kind: dotted name, e.g. ``"actor.crashed"``, ``"placement.pending"``.
        path: the actor it is about (``"/"`` for the system itself).
        fields: extra data (JSON-able by convention).
    """

    time: float
    kind: str
    path: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data."""
        return {"time": self.time, "kind": self.kind, "path": self.path, "fields": self.fields}
