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
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from corral.actors.routing import TableVersion
from corral.registry import ProxyRecord
from corral.transport import SchemaError

__all__ = ["ProxyKind", "ProxyStatus", "Verdict", "verdict"]

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
