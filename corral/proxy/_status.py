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

import enum
import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from corral.actors.routing import TableVersion
from corral.transport import SchemaError, decode_message, encode_message, message

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


@message("proxy.status")
@dataclass(frozen=True, slots=True)
class ProxyStatus:
    """The ``proxies/<id>`` record: what one proxy serves and how it went.

    ``applied_fence``/``applied_revision`` are None until a table was applied;
    ``applied_at`` is wall-clock seconds; ``error`` is the last apply's failure
    (None once a later apply succeeds); ``seen_*`` is the newest version offered.
    """

    id: str
    kind: str
    listen: str
    applied_fence: int | None = None
    applied_revision: int | None = None
    applied_at: float | None = None
    seen_fence: int | None = None
    seen_revision: int | None = None
    error: str | None = None
    apply_s: float | None = None
    reloads: int = 0

    @property
    def applied(self) -> TableVersion | None:
        if self.applied_fence is None or self.applied_revision is None:
            return None
        return TableVersion(self.applied_fence, self.applied_revision)

    def encode(self) -> bytes:
        """UTF-8 JSON with ``"v": 1``, as the registry stores it."""
        _, body = encode_message(self)
        return json.dumps(
            {"v": _SCHEMA_VERSION, **body}, separators=(",", ":"), sort_keys=True
        ).encode()

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
        status = decode_message("proxy.status", obj)
        assert isinstance(status, ProxyStatus)
        return status
