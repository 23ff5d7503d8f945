"""When the coordinator repeats a report: a pure rate limit over its events.

Theory of operation: a report is about a subject — an event kind, an app and a
node, the :data:`ReportKey` — and says something (a pending app's message, a
deferral's kind, a stranded reason, a refusal's message). A pass over new inputs
reports everything it found. A pass over the same inputs as the last one (a
skipped tick, or a pass run again only because it waits on time) repeats a
report only when it says something new, or when ``cooldown_s`` has passed since
that subject was last reported: at most one repeat per subject per cooldown, so
``corral events`` stays readable while an operator is still reminded.

A subject no longer current is forgotten (:meth:`ReportLog.keep_only`): if it
comes back, it is reported at once. Pure: the time is given, nothing is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ReportKey", "ReportLog"]

#: (event kind, app, node); app or node is ``""`` when the report is not about one.
ReportKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class _Said:
    says: str
    at: float


class ReportLog:
    """The last report made about each subject, and whether another may go out.

    Args:
        cooldown_s: the least time between two reports about one subject that say
            the same thing, when the inputs have not changed.
    """

    def __init__(self, cooldown_s: float) -> None:
        if not cooldown_s >= 0:
            raise ValueError(f"cooldown_s must be a number of seconds >= 0, got {cooldown_s!r}")
        self._cooldown = cooldown_s
        self._last: dict[ReportKey, _Said] = {}

    def admit(self, key: ReportKey, says: str, now: float, *, repeat: bool = True) -> bool:
        """May a report about ``key`` that ``says`` this go out at ``now``? If so, it
        is remembered as the subject's last report.

        Args:
            key: the subject.
            says: what the report says (reports that say the same are repeats).
            now: the time, on any clock that only moves forward.
            repeat: the pass decided from the same inputs as the last one; False
                (new inputs) admits every report.

        Returns:
            True when the report goes out: the inputs are new, the subject was never
            reported (or was forgotten), it says something new, or ``cooldown_s`` has
            passed since its last report.
        """
        last = self._last.get(key)
        if repeat and last is not None and last.says == says and now - last.at < self._cooldown:
            return False
        self._last[key] = _Said(says, now)
        return True

    def keep_only(self, kind: str, current: Iterable[tuple[str, str]]) -> None:
        """Forget the ``kind`` reports whose (app, node) is not in ``current``."""
        keep = set(current)
        for key in [k for k in self._last if k[0] == kind and (k[1], k[2]) not in keep]:
            del self._last[key]

    def __len__(self) -> int:
        return len(self._last)
