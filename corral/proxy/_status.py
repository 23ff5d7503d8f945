"""Which table a proxy takes, and what it records about it (pure).

Theory of operation
-------------------
A proxy applies tables in version order. A table's version is ``(fence,
revision)``, compared as a pair: a larger fence (a newer coordinator) always
wins, and within one fence a larger revision does. :func:`verdict` says what to
do with an offered table: apply it, or skip it because it is the one already
applied, older than it, or written under a fence smaller than the smallest one
still trusted (a coordinator that has since lost its lease).

:class:`ProxyStatus` is the shape of the ``proxies/<id>`` record: which version
the proxy serves, since when, the newest version it saw, and the last error.

Supervision: when the proxy process dies it is started again with the table it
served. :func:`restart_delay` says how long to wait first, from the times of the
process's exits alone: the first exit after a stable period restarts at once;
each further exit within ``stable`` seconds of the one before doubles the wait,
from ``base`` up to ``cap`` (a crash loop costs little CPU and fills no log),
and a process that stays up for ``stable`` seconds starts the count over.

Ownership: one ``corral proxy run`` owns an id. :func:`claim_refusal` says
whether an existing ``proxies/<id>`` record belongs to another live process
(refuse to start) or to none (a record left by a dead or stopped one: take it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from corral.actors.routing import TableVersion
from corral.registry import ProxyRecord
from corral.transport import SchemaError

__all__ = [
    "ProxyKind",
    "ProxyStatus",
    "RestartPolicy",
    "Verdict",
    "claim_refusal",
    "restart_delay",
    "verdict",
]

ProxyKind = Literal["haproxy", "caddy"]

_SCHEMA_VERSION: Final = 1


class Verdict(enum.StrEnum):
    """What to do with an offered table."""

    APPLY = "apply"
    ALREADY_APPLIED = "already-applied"
    OLDER = "older"
    STALE_FENCE = "stale-fence"


def verdict(applied: TableVersion | None, offered: TableVersion, *, min_fence: int = 0) -> Verdict:
    """Whether to apply a table of version ``offered``.

    Args:
        applied: the version the proxy serves (None: none yet).
        offered: the version of the table offered.
        min_fence: the smallest fence still trusted (e.g. the current
            coordinator lease's); a table under a smaller one is stale.

    Returns:
        :attr:`Verdict.APPLY` only for a table newer than ``applied`` and not
        under a stale fence.
    """
    if offered.fence < min_fence:
        return Verdict.STALE_FENCE
    if applied is None or offered > applied:
        return Verdict.APPLY
    if offered == applied:
        return Verdict.ALREADY_APPLIED
    return Verdict.OLDER


@dataclass(frozen=True, slots=True)
class ProxyStatus(ProxyRecord):
    """The ``proxies/<id>`` record (:class:`corral.registry.ProxyRecord`) as the
    engine keeps it, with the applied version as a :class:`TableVersion`."""

    @property
    def applied(self) -> TableVersion | None:
        if self.applied_fence is None or self.applied_revision is None:
            return None
        return TableVersion(self.applied_fence, self.applied_revision)

    @classmethod
    def decode(cls, data: bytes) -> ProxyStatus:
        """Read a record written by :meth:`encode`.

        Raises:
            SchemaError: naming the field that does not fit.
        """
        try:
            obj: Any = json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise SchemaError(f"proxy status: not UTF-8 JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.pop("v", None) != _SCHEMA_VERSION:
            raise SchemaError("proxy status: not a v=1 JSON object")
        try:
            record = ProxyRecord.from_json(obj)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"proxy status: {exc}") from None
        return cls(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How fast a dead proxy process is started again (see :func:`restart_delay`)."""

    base: float = 0.5
    cap: float = 30.0
    stable: float = 60.0


def restart_delay(exits: Sequence[float], policy: RestartPolicy) -> float:
    """Seconds to wait before starting the proxy process again.

    Args:
        exits: the times (any one clock, oldest first) at which the process exited
            or failed to start, the latest last.
        policy: the base wait, its cap and the stable period.

    Returns:
        0 for the first exit after a stable period (or ever); for the n-th exit in
        a row, each within ``policy.stable`` of the one before, ``base * 2**(n-2)``
        capped at ``policy.cap``.
    """
    streak = 1 if exits else 0
    for later, earlier in zip(reversed(exits), list(reversed(exits))[1:], strict=False):
        if later - earlier >= policy.stable:
            break
        streak += 1
    if streak <= 1:
        return 0.0
    # 2**64 already dwarfs any cap; the bound keeps the float finite.
    return float(min(policy.cap, policy.base * 2 ** min(streak - 2, 64)))


def claim_refusal(
    record: ProxyRecord | None,
    *,
    host: str,
    now: float,
    owner_alive: bool | None,
) -> str | None:
    """Whether ``proxies/<id>`` belongs to another live ``corral proxy run``.

    Args:
        record: the record found (None: no record).
        host: this machine's name.
        now: wall-clock seconds.
        owner_alive: on this host, whether the process the record names (pid and
            create time) still runs; None when it cannot be checked (another host).

    Returns:
        None when the id is free to take: no record, a record naming no owner
        (written by an older version), an owner on this host that no longer
        runs, or one on another host whose record is no longer refreshed. Else
        the one-line reason, naming the owner's pid and listen address.
    """
    if record is None or record.pid is None:
        return None
    if record.host == host:
        if not owner_alive:
            return None
    elif owner_alive is False or record.not_reporting_for(now) is not None:
        return None
    where = f"pid {record.pid}" + ("" if record.host == host else f" on host {record.host}")
    return (
        f"proxy id {record.id!r} is in use by corral proxy run {where} "
        f"(listening on {record.listen}); stop it first, or pass another --id"
    )
