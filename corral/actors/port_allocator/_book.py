"""Pure port bookkeeping: who holds which pair, what sits in quarantine.

Theory of operation
-------------------
Each app this node has ever run (and not yet forgotten) holds one
:class:`PortPair` — ``public`` (dialled by the ingress) and ``internal`` —
recorded in a :class:`PortBook`. A port belongs to its app for as long as the
node knows the app, because traffic meant for it may keep arriving after a
routing change; so:

* a port another app holds is never a candidate;
* a released port (its app's local state was removed, or its pair was replaced
  because something else took it) goes into **quarantine** until
  ``released_at + quarantine``; during it only the app that released it may get
  it back;
* both ports of a pair are drawn independently from the free candidates; the
  internal port is never the public one, nor the public one plus one (so a stale
  public port cannot name an internal listener by accident).

The book is a value: every operation returns a new book. Time is passed in
(``now``, seconds on the caller's clock), and randomness is a ``choose``
function the caller supplies; probing a port on the machine and claiming it in
the registry are the caller's I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from corral.actors.port_allocator._errors import InvalidPortRange, PlacementUnavailable

DEFAULT_RANGE_START = 24000
DEFAULT_RANGE_END = 24998
DEFAULT_QUARANTINE_MS = 600_000


@dataclass(frozen=True, slots=True, order=True)
class PortPair:
    """The two ports of one app on one node."""

    public: int
    internal: int

    @property
    def ports(self) -> tuple[int, int]:
        return (self.public, self.internal)

    def to_dict(self) -> dict[str, int]:
        return {"public": self.public, "internal": self.internal}

    def __str__(self) -> str:
        return f"{self.public}/{self.internal}"


@dataclass(frozen=True, slots=True)
class PortRange:
    """The ports a node gives out, both ends included.

    Raises:
        InvalidPortRange: unless ``1 <= start <= end <= 65535``.
    """

    start: int = DEFAULT_RANGE_START
    end: int = DEFAULT_RANGE_END

    def __post_init__(self) -> None:
        if not (1 <= self.start <= self.end <= 65535):
            raise InvalidPortRange(
                f"port range {self.start}-{self.end} is invalid: it needs "
                "1 <= start <= end <= 65535 (set --port-range-start/--port-range-end or "
                "CORRAL_PORT_RANGE_START/CORRAL_PORT_RANGE_END)"
            )

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.start <= port <= self.end

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


class FreePorts(Sequence[int]):
    """The ports of a range that are not ``excluded``, ascending, as a sequence.

    It equals ``[p for p in range if p not in excluded]`` item by item (so a random
    choice over it picks what a choice over that list would), but costs O(excluded) to
    make and O(log excluded) per item, not O(range): a draw looks at the range a few
    times per port it tries, and listing a thousand ports each time was most of the
    cost of starting an instance.
    """

    __slots__ = ("_below", "_excluded", "_len", "_range")

    def __init__(self, port_range: PortRange, excluded: Iterable[int] = ()) -> None:
        start, end = port_range.start, port_range.end
        gaps = sorted({p for p in excluded if start <= p <= end})
        self._range = port_range
        self._excluded = frozenset(gaps)
        self._len = port_range.size - len(gaps)
        # How many free ports lie below each excluded one: the i-th free port is
        # start + i + (the number of excluded ports with at most i free ports below).
        self._below = [port - start - n for n, port in enumerate(gaps)]

    @property
    def port_range(self) -> PortRange:
        return self._range

    def without(self, ports: Iterable[int]) -> FreePorts:
        """These free ports less ``ports`` (``self`` when that excludes nothing more)."""
        more = [p for p in ports if p in self]
        if not more:
            return self
        return FreePorts(self._range, self._excluded.union(more))

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"index {index} out of {self._len} free ports")
        return self._range.start + index + bisect_right(self._below, index)

    def __contains__(self, port: object) -> bool:
        return port in self._range and port not in self._excluded

    def __iter__(self) -> Iterator[int]:
        excluded = self._excluded
        return (p for p in range(self._range.start, self._range.end + 1) if p not in excluded)

    def __repr__(self) -> str:
        return f"FreePorts({self._range}, excluded={sorted(self._excluded)})"


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A released port: ``app`` released it; nobody else gets it before ``until``."""

    app: str
    until: float


@dataclass(frozen=True, slots=True)
class PortBook:
    """Holdings (app -> pair) and quarantine (port -> who released it, until when).

    Treat as immutable: operations return new books.
    """

    holdings: Mapping[str, PortPair] = field(default_factory=dict)
    quarantine: Mapping[int, Quarantined] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries

    def holder(self, port: int) -> str | None:
        """The app holding ``port``, or None."""
        for app, pair in self.holdings.items():
            if port in pair.ports:
                return app
        return None

    def held_by_others(self, app: str) -> set[int]:
        return {p for other, pair in self.holdings.items() if other != app for p in pair.ports}

    def quarantined_for(self, app: str, now: float) -> set[int]:
        """Ports ``app`` may not have now because another app released them recently."""
        return {p for p, q in self.quarantine.items() if q.app != app and q.until > now}

    def candidates(
        self, port_range: PortRange, app: str, now: float, exclude: Iterable[int] = ()
    ) -> list[int]:
        """The ports of ``port_range`` that may be drawn for ``app`` (sorted): not held by
        another app, not in another app's quarantine, not ``app``'s current pair, and
        not in ``exclude`` (ports found taken)."""
        return list(self.free_ports(port_range, app, now, exclude))

    def free_ports(
        self, port_range: PortRange, app: str, now: float, exclude: Iterable[int] = ()
    ) -> FreePorts:
        """:meth:`candidates` as a :class:`FreePorts` sequence (equal item by item,
        without listing the range)."""
        blocked = self.held_by_others(app) | self.quarantined_for(app, now) | set(exclude)
        own = self.holdings.get(app)
        if own is not None:
            blocked.update(own.ports)
        return FreePorts(port_range, blocked)

    # ------------------------------------------------------------------ transitions

    def with_pair(self, app: str, pair: PortPair, *, now: float, quarantine: float) -> PortBook:
        """Give ``pair`` to ``app``. Ports of ``app``'s previous pair that the new one
        does not reuse go into quarantine for ``quarantine`` seconds.

        Raises:
            ValueError: the pair repeats a port, or another app holds or has
                quarantined one of its ports (a caller bug: draw from ``candidates``).
        """
        if pair.public == pair.internal:
            raise ValueError(f"pair {pair} uses one port twice")
        taken = (self.held_by_others(app) | self.quarantined_for(app, now)) & set(pair.ports)
        if taken:
            raise ValueError(f"ports {sorted(taken)} are not free for app {app!r}")
        holdings = dict(self.holdings)
        previous = holdings.get(app)
        holdings[app] = pair
        book = PortBook(holdings, self.quarantine)
        if previous is not None:
            dropped = [p for p in previous.ports if p not in pair.ports]
            book = book._quarantined(app, dropped, now + quarantine)
        return book

    def release(self, app: str, *, now: float, quarantine: float) -> PortBook:
        """``app`` gives its pair back: both ports sit in quarantine until
        ``now + quarantine``."""
        pair = self.holdings.get(app)
        if pair is None:
            return self
        holdings = {a: p for a, p in self.holdings.items() if a != app}
        return PortBook(holdings, self.quarantine)._quarantined(app, pair.ports, now + quarantine)

    def expire(self, now: float) -> PortBook:
        """Drop quarantine entries that ended at or before ``now``."""
        if all(q.until > now for q in self.quarantine.values()):
            return self
        return PortBook(self.holdings, {p: q for p, q in self.quarantine.items() if q.until > now})

    def _quarantined(self, app: str, ports: Iterable[int], until: float) -> PortBook:
        quarantine = dict(self.quarantine)
        for port in ports:
            quarantine[port] = Quarantined(app, until)
        return PortBook(self.holdings, quarantine)

    # ------------------------------------------------------------------ persistence

    def quarantine_to_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "ports": {
                str(p): {"app": q.app, "until": q.until} for p, q in sorted(self.quarantine.items())
            },
        }

    @staticmethod
    def quarantine_from_json(obj: object) -> dict[int, Quarantined]:
        """The quarantine saved by :meth:`quarantine_to_json`; entries that do not parse
        are skipped.

        Raises:
            ValueError: ``obj`` is not a quarantine document of version 1.
        """
        if not isinstance(obj, dict) or obj.get("v") != 1 or not isinstance(obj.get("ports"), dict):
            raise ValueError("not a port quarantine document (v=1)")
        quarantine: dict[int, Quarantined] = {}
        for port, entry in obj["ports"].items():
            if (
                isinstance(port, str)
                and port.isdigit()
                and isinstance(entry, dict)
                and isinstance(entry.get("app"), str)
                and isinstance(entry.get("until"), int | float)
                and not isinstance(entry.get("until"), bool)
            ):
                quarantine[int(port)] = Quarantined(entry["app"], float(entry["until"]))
        return quarantine


def pair_to_json(app: str, pair: PortPair) -> dict[str, Any]:
    return {"v": 1, "app": app, "public": pair.public, "internal": pair.internal}


def pair_from_json(app: str, obj: object) -> PortPair:
    """The pair saved by :func:`pair_to_json` for ``app``.

    Raises:
        ValueError: not a pair document of version 1 for ``app``.
    """
    if not isinstance(obj, dict) or obj.get("v") != 1 or obj.get("app") != app:
        raise ValueError(f"not a port pair document (v=1) of app {app!r}")
    public, internal = obj.get("public"), obj.get("internal")
    for port in (public, internal):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port pair of app {app!r} holds an invalid port {port!r}")
    assert isinstance(public, int)
    assert isinstance(internal, int)
    if public == internal:
        raise ValueError(f"port pair of app {app!r} uses port {public} twice")
    return PortPair(public, internal)


@overload
def internal_candidates(  # type: ignore[overload-overlap]  # a FreePorts stays one
    candidates: FreePorts, public: int
) -> FreePorts: ...


@overload
def internal_candidates(candidates: Sequence[int], public: int) -> list[int]: ...


def internal_candidates(candidates: Sequence[int], public: int) -> Sequence[int]:
    """The candidates for the internal port once ``public`` is drawn: neither it nor
    the port just above it (a :class:`FreePorts` when ``candidates`` is one)."""
    if isinstance(candidates, FreePorts):
        return candidates.without((public, public + 1))
    return [p for p in candidates if p != public and p != public + 1]


def draw_pair(candidates: Sequence[int], choose: Callable[[Sequence[int]], int]) -> PortPair:
    """Draw a pair from ``candidates`` with no probing (both independent, uniform).

    Args:
        candidates: free ports, at least two of them.
        choose: picks one element of a non-empty sequence (``random.Random.choice``).

    Raises:
        ValueError: no valid pair exists among ``candidates``.
    """
    publics = [p for p in candidates if internal_candidates(candidates, p)]
    if not publics:
        raise ValueError("no two ports among the candidates can form a pair")
    public = choose(publics)
    return PortPair(public, choose(internal_candidates(candidates, public)))


def placement_unavailable(
    port_range: PortRange,
    *,
    free: int,
    held: int,
    quarantined: int,
    taken: int,
    app: str | None = None,
) -> PlacementUnavailable:
    """The error for a range that cannot give a pair (to ``app``, when named), with the
    counts that explain why."""
    for_app = "" if app is None else f" for app {app!r}"
    return PlacementUnavailable(
        f"placement-unavailable: port range {port_range} has {free} free port(s){for_app}, "
        "a pair needs "
        f"2 ({held} held by apps of this node, {quarantined} in quarantine, {taken} found "
        "taken on this machine or in the registry); widen the range with "
        "--port-range-start/--port-range-end or delete apps this node no longer needs"
    )
