"""The node's event log as the API serves it: numbered, with wall-clock times.

The actor system keeps recent :class:`~corral.supervision.Event` objects with
trio-clock times. :class:`EventLog` copies them into JSON-able dicts with a
strictly increasing ``seq`` (so a follower knows what it has seen) and a
``wall_time`` (unix seconds, for people).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import trio

from corral.supervision import ActorSystem, Event

DEFAULT_SIZE = 1000


def jsonable(value: Any) -> Any:
    """``value`` if JSON can carry it, else its ``str``; containers converted recursively."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


class EventLog:
    """Recent events, numbered, oldest first."""

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        *,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = trio.current_time,
        listeners: Sequence[Callable[[Event], None]] = (),
    ) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=size)
        #: each called with every event as it is logged (metrics, the JSON log).
        self._listeners = tuple(listeners)
        self._seq = itertools.count(1)
        self._wall_clock = wall_clock
        self._clock = clock

    def add(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)
        age = max(0.0, self._clock() - event.time)
        self._events.append(
            {
                "seq": next(self._seq),
                "time": event.time,
                "wall_time": round(self._wall_clock() - age, 3),
                "kind": event.kind,
                "path": event.path,
                "fields": jsonable(event.fields),
            }
        )

    def recent(self) -> list[dict[str, Any]]:
        return list(self._events)

    async def follow(self, system: ActorSystem) -> None:
        """Copy the system's events in, from those already logged on; runs until cancelled."""
        async with system.subscribe_events() as live:
            backlog = system.events()
            seen = {id(event) for event in backlog}
            for event in backlog:
                self.add(event)
            async for event in live:
                if id(event) in seen:
                    seen.discard(id(event))
                    continue
                self.add(event)


def _seq(event: dict[str, Any]) -> int:
    seq: int = event["seq"]
    return seq


class EventLines:
    """The events after a given ``seq`` as NDJSON, for the API's event streams.

    Every open stream polls for what is new; each event is encoded once for all of
    them (64 streams each encoding every event was most of a node's CPU while
    events flowed), found by bisection rather than a scan of the whole log, and sent
    in one chunk per poll rather than one per event.

    Args:
        events: the recent events, oldest first, with strictly increasing ``seq``
            (:meth:`EventLog.recent`); an event never changes once listed.
    """

    def __init__(self, events: Callable[[], list[dict[str, Any]]]) -> None:
        self._events = events
        self._encoded: dict[int, bytes] = {}

    def after(self, last: int, most: float = math.inf) -> tuple[bytes, int, int]:
        """The events with ``seq > last``, at most ``most`` of them, oldest first:
        ``(their NDJSON lines, the seq of the last one or last, how many)``."""
        events = self._events()
        start = bisect.bisect_right(events, last, key=_seq)
        end = len(events) if most >= len(events) - start else start + int(most)
        chosen = events[start:end]
        if not chosen:
            return b"", last, 0
        lines = []
        for event in chosen:
            line = self._encoded.get(event["seq"])
            if line is None:
                line = self._encoded[event["seq"]] = (json.dumps(event) + "\n").encode()
            lines.append(line)
        if len(self._encoded) > 2 * len(events):  # forget what the log itself dropped
            oldest = events[0]["seq"]
            self._encoded = {seq: line for seq, line in self._encoded.items() if seq >= oldest}
        return b"".join(lines), chosen[-1]["seq"], len(chosen)
