"""Which lines of a flood of similar warnings to write.

A peer that sends a stream of bad frames must not turn into a stream of log
lines. :class:`LogBudget` keeps, per key (say, a peer), a window of
``interval`` seconds that opens at the first event: the first ``burst`` events
in the window are written, the rest only counted. The first event after the
window closes opens a new one, is written, and carries the count of events
held back in the window before, so the log says how many it did not show.

Pure: the caller passes the time; no clock, no I/O. Memory is bounded: at most
``max_keys`` windows are kept, expired ones first to go.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LogBudget", "LogVerdict"]


@dataclass(frozen=True, slots=True)
class LogVerdict:
    """What to do with one event.

    Attributes:
        write: write this event's line.
        held_back: events of this key not written since the last written one
            (mention them in this line).
        last: this is the last line written in the current window (say that
            more will be counted, not written).
    """

    write: bool
    held_back: int = 0
    last: bool = False


class _Window:
    __slots__ = ("held_back", "opened_at", "written")

    def __init__(self, opened_at: float) -> None:
        self.opened_at = opened_at
        self.written = 1
        self.held_back = 0


class LogBudget:
    """Allows ``burst`` lines per key per ``interval`` seconds, and counts the rest.

    Args:
        burst: lines written per key per window (at least 1).
        interval: window length in seconds (more than 0).
        max_keys: windows kept at most; beyond, the oldest are forgotten.
    """

    def __init__(self, burst: int = 5, interval: float = 60.0, max_keys: int = 1024) -> None:
        if burst < 1 or interval <= 0 or max_keys < 1:
            raise ValueError("a log budget needs burst >= 1, interval > 0 and max_keys >= 1")
        self.burst = burst
        self.interval = interval
        self.max_keys = max_keys
        self._windows: dict[str, _Window] = {}

    def admit(self, key: str, now: float) -> LogVerdict:
        """Account for one event of ``key`` at time ``now`` and say whether to write it."""
        window = self._windows.get(key)
        if window is None or now - window.opened_at >= self.interval:
            held = window.held_back if window is not None else 0
            if window is not None:
                del self._windows[key]  # re-inserted last: the dict stays in age order
            self._windows[key] = _Window(now)
            self._forget_old(now)
            return LogVerdict(True, held, self.burst == 1)
        if window.written < self.burst:
            window.written += 1
            return LogVerdict(True, 0, window.written == self.burst)
        window.held_back += 1
        return LogVerdict(False)

    def _forget_old(self, now: float) -> None:
        if len(self._windows) <= self.max_keys:
            return
        for key in [k for k, w in self._windows.items() if now - w.opened_at >= self.interval]:
            del self._windows[key]
        while len(self._windows) > self.max_keys:
            del self._windows[next(iter(self._windows))]
