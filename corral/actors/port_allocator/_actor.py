"""The PortAllocator actor: a thin shell around :class:`PortLedger`."""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.actors.port_allocator._book import (
    DEFAULT_QUARANTINE_MS,
    DEFAULT_RANGE_END,
    DEFAULT_RANGE_START,
    PortRange,
)
from corral.actors.port_allocator._errors import PlacementUnavailable, PortAllocatorError
from corral.actors.port_allocator._ledger import DEFAULT_MAX_PROBES, PortLedger, bind_probe
from corral.registry import Registry, RegistryError
from corral.supervision import Actor, UnhandledMessage
from corral.transport import message


@message("port_allocator.ensure")
@dataclass(frozen=True)
class EnsurePair:
    """The pair ``app`` is to use (see ``PortLedger.ensure_pair``).

    Replies ``{"ok": True, "app", "public", "internal", "replaced", "fresh"}`` or
    ``{"ok": False, "error": code, "message": text}`` with code
    ``placement-unavailable`` or ``registry-unavailable``.
    """

    app: str
    verify: bool = True


@message("port_allocator.release")
@dataclass(frozen=True)
class ReleasePorts:
    """Release ``app``'s pair into quarantine. Replies ``{"ok": True, "released": pair or
    None}`` or an error reply as for :class:`EnsurePair`."""

    app: str


@message("port_allocator.list")
@dataclass(frozen=True)
class ListPorts:
    """Replies with the range, holdings and live quarantine (JSON-able)."""


def _error(exc: Exception) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    if not isinstance(code, str):
        code = "registry-unavailable" if isinstance(exc, RegistryError) else "port-error"
    return {"ok": False, "error": code, "message": str(exc)}


class PortAllocator(Actor):
    """Gives each app of this node a stable (public, internal) port pair.

    Args:
        node_id: this node's id.
        data_dir: the node's data directory (pairs and quarantine are kept there).
        registry: where port claims are written.
        port_range_start, port_range_end: the range, both ends included.
        quarantine_ms: how long a released port is kept from other apps.
        clock: wall time (quarantine survives restarts).
        random: the random source of draws.
        bind_host: where ports are probed.
        max_probes: how many ports one draw may try.
        probe: ``probe(host, port) -> bool`` (default: a real bind).
    """

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        registry: Registry,
        port_range_start: int = DEFAULT_RANGE_START,
        port_range_end: int = DEFAULT_RANGE_END,
        quarantine_ms: int = DEFAULT_QUARANTINE_MS,
        clock: Callable[[], float] = time.time,
        random: _random.Random | None = None,
        bind_host: str = "0.0.0.0",
        max_probes: int = DEFAULT_MAX_PROBES,
        probe: Callable[[str, int], bool] = bind_probe,
    ) -> None:
        super().__init__()
        self.ledger = PortLedger(
            node_id=node_id,
            data_dir=data_dir,
            registry=registry,
            port_range=PortRange(port_range_start, port_range_end),
            quarantine_ms=quarantine_ms,
            clock=clock,
            random=random,
            bind_host=bind_host,
            max_probes=max_probes,
            probe=probe,
        )

    async def started(self) -> None:
        self.ledger.load()

    async def handle(self, message: object) -> object:
        match message:
            case EnsurePair():
                try:
                    ensured = await self.ledger.ensure_pair(message.app, verify=message.verify)
                except (PlacementUnavailable, PortAllocatorError, RegistryError) as exc:
                    self.ctx.emit("ports.unavailable", app=message.app, error=str(exc))
                    return _error(exc)
                if ensured.replaced is not None:
                    self.ctx.emit(
                        "ports.replaced",
                        app=message.app,
                        old=ensured.replaced.to_dict(),
                        new=ensured.pair.to_dict(),
                    )
                elif ensured.fresh:
                    self.ctx.emit("ports.assigned", app=message.app, **ensured.pair.to_dict())
                return {"ok": True, **ensured.to_dict()}
            case ReleasePorts():
                try:
                    pair = await self.ledger.release(message.app)
                except RegistryError as exc:
                    return _error(exc)
                if pair is not None:
                    self.ctx.emit("ports.released", app=message.app, **pair.to_dict())
                return {"ok": True, "released": None if pair is None else pair.to_dict()}
            case ListPorts():
                return self.ledger.snapshot()
        raise UnhandledMessage(message)
