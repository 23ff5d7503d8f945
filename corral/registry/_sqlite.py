"""The SQLite backend (in progress)."""

from __future__ import annotations

from collections.abc import Callable

from corral.registry._base import Registry


class SQLiteRegistry(Registry):  # pragma: no cover - replaced by the real backend
    @classmethod
    async def open(
        cls,
        path: str,
        *,
        clock: Callable[[], float] | None = None,
        poll_interval: float | None = None,
        synchronous: str | None = None,
    ) -> Registry:
        raise NotImplementedError("the SQLite backend lands in the next commit")
