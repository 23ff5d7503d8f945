"""What ``corral routes`` shows: the table, what it holds back, and each proxy (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.actors.routing._render import RouteTable, TableVersion
from corral.registry import ProxyRecord

__all__ = ["newly_silent", "proxy_lag", "routes_answer"]


def proxy_lag(proxy: ProxyRecord, current: TableVersion | None, now: float) -> float | None:
    """How far behind the current table ``proxy`` is, in seconds.

    None while it never applied a table; 0 when it serves the current table (or
    a newer one); else the seconds since it last applied one.
    """
    if proxy.applied_fence is None or proxy.applied_revision is None:
        return None
    applied = TableVersion(proxy.applied_fence, proxy.applied_revision)
    if current is None or applied >= current:
        return 0.0
    if proxy.applied_at is None:
        return None
    return round(max(0.0, now - proxy.applied_at), 3)


def newly_silent(
    proxies: Iterable[ProxyRecord], *, now: float, flagged: frozenset[str]
) -> tuple[list[tuple[ProxyRecord, float]], frozenset[str]]:
    """Which proxies just stopped reporting (:meth:`ProxyRecord.not_reporting_for`).

    Args:
        proxies: every ``proxies/<id>`` record.
        now: wall-clock seconds.
        flagged: the ids already told as not reporting.

    Returns:
        The proxies (with their seconds of silence) not yet told, by id, and the
        ids to remember as told: a proxy is told once per silence, again only
        after it reported in between (or its record went and came back).
    """
    silent = {p.id: (p, s) for p in proxies if (s := p.not_reporting_for(now)) is not None}
    fresh = [silent[i] for i in sorted(silent) if i not in flagged]
    return fresh, frozenset(silent)


def routes_answer(
    table: RouteTable | None, proxies: Iterable[ProxyRecord], *, now: float
) -> dict[str, Any]:
    """The ``GET /v1/routes`` answer (and ``corral routes --json``).

    ``{"version": {"fence", "revision"} | null, "routes": {domain: [urls]},
    "held_back": [{"app", "node", "why"}], "proxies": [{"id", "kind", "listen",
    "applied": {"fence", "revision"} | null, "applied_at", "lag_s", "error", "restarts",
    "last_error", "since", "not_reporting_s"}]}``, proxies sorted by id.
    ``not_reporting_s`` is the seconds since a proxy's record was last refreshed,
    once it missed several reports (its ``corral proxy run`` is gone: its lag and
    state are then no longer true); else null.
    """
    current = None if table is None else table.version
    rows = []
    for proxy in sorted(proxies, key=lambda p: p.id):
        applied = (
            None
            if proxy.applied_fence is None or proxy.applied_revision is None
            else {"fence": proxy.applied_fence, "revision": proxy.applied_revision}
        )
        rows.append(
            {
                "id": proxy.id,
                "kind": proxy.kind,
                "listen": proxy.listen,
                "applied": applied,
                "applied_at": proxy.applied_at,
                "lag_s": proxy_lag(proxy, current, now),
                "error": proxy.error,
                "restarts": proxy.restarts,
                "last_error": proxy.last_error,
                "since": proxy.since,
                "not_reporting_s": proxy.not_reporting_for(now),
            }
        )
    return {
        "version": None if table is None else {"fence": table.fence, "revision": table.revision},
        "routes": {} if table is None else {d: list(urls) for d, urls in table.domains.items()},
        "held_back": []
        if table is None
        else [{"app": h.app, "node": h.node, "why": h.why} for h in table.held_back],
        "proxies": rows,
    }
