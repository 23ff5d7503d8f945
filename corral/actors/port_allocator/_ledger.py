"""The port ledger: the pure book plus its I/O (files, bind probes, registry claims).

Local state is durable: each app's pair in ``<data-dir>/apps/<app>/ports.json``, the
quarantine in ``<data-dir>/port-quarantine.json``. Every port given out is also
claimed in the registry as ``ports/<node>/<port>`` by compare-and-swap on the absent
key; a loser learns the holder from the same transaction. Only the holder (this
node, for the app named in the claim) deletes a claim, guarded on its revision.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random as _random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.actors.port_allocator._book import (
    DEFAULT_QUARANTINE_MS,
    FreePorts,
    PortBook,
    PortPair,
    PortRange,
    internal_candidates,
    pair_from_json,
    pair_to_json,
    placement_unavailable,
)
from corral.actors.port_allocator._errors import PortProbeExhausted
from corral.actors.process_supervisor import AppPaths, write_json_atomically
from corral.registry import (
    Compare,
    Delete,
    Get,
    KeyValue,
    PortClaim,
    Put,
    Registry,
    decode_record,
    node_ports_prefix,
    port_key,
    read_records,
)

log = logging.getLogger("corral.actors.port_allocator")

#: How many ports one draw may try (bind probe + registry swap) before giving up.
DEFAULT_MAX_PROBES = 64


def bind_probe(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` right now (bound, then released).

    ``SO_REUSEADDR`` is set as servers set it, so a port in TIME_WAIT counts as free
    while any listener, on any address overlapping ``host``, counts as taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True, slots=True)
class EnsuredPair:
    """The pair an app is to use; ``replaced`` is its previous pair when that one was
    found taken and a new one drawn."""

    app: str
    pair: PortPair
    replaced: PortPair | None = None
    fresh: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "public": self.pair.public,
            "internal": self.pair.internal,
            "replaced": None if self.replaced is None else self.replaced.to_dict(),
            "fresh": self.fresh,
        }


class PortLedger:
    """Gives each app of this node a stable pair of ports.

    Args:
        node_id: this node's id (the ``<node>`` of ``ports/<node>/<port>``).
        data_dir: the node's data directory (local state lives under it).
        registry: where claims are written.
        port_range: the ports to give out.
        quarantine_ms: how long a released port is kept from other apps.
        clock: wall time in seconds (quarantine must survive restarts).
        random: the random source of draws (inject a seeded one in tests).
        bind_host: where ports are probed ("0.0.0.0": any listener on the machine).
        max_probes: how many ports one draw may try before failing.
        probe: ``probe(host, port) -> bool``, default a real bind.
    """

    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        registry: Registry,
        port_range: PortRange | None = None,
        quarantine_ms: int = DEFAULT_QUARANTINE_MS,
        clock: Callable[[], float] = time.time,
        random: _random.Random | None = None,
        bind_host: str = "0.0.0.0",
        max_probes: int = DEFAULT_MAX_PROBES,
        probe: Callable[[str, int], bool] = bind_probe,
    ) -> None:
        if quarantine_ms < 0:
            raise ValueError("quarantine_ms must be >= 0")
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.registry = registry
        self.port_range = port_range or PortRange()
        self.quarantine_ms = quarantine_ms
        self._clock = clock
        self._random = random or _random.Random()
        self.bind_host = bind_host
        self.max_probes = max_probes
        self._probe = probe
        self.book = PortBook()

    @property
    def quarantine_file(self) -> Path:
        return self.data_dir / "port-quarantine.json"

    @property
    def _quarantine_s(self) -> float:
        return self.quarantine_ms / 1000.0

    # ------------------------------------------------------------------ local state

    def load(self) -> None:
        """Read the pairs and the quarantine from the data directory (after a restart).
        Unreadable files are logged and skipped; a port recorded by two apps stays with
        the first (by name) and the other app draws a new pair when it starts."""
        holdings: dict[str, PortPair] = {}
        owners: dict[int, str] = {}
        for path in sorted(AppPaths.apps_root(self.data_dir).glob("*/ports.json")):
            app = path.parent.name
            try:
                pair = pair_from_json(app, json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                log.error("ignoring port state %s: %s", path, exc)
                continue
            clash = [owners[p] for p in pair.ports if p in owners]
            if clash:
                log.error("ignoring pair %s of app %s: app %s holds it", pair, app, clash[0])
                continue
            holdings[app] = pair
            owners.update(dict.fromkeys(pair.ports, app))
        quarantine = {}
        if self.quarantine_file.exists():
            try:
                quarantine = PortBook.quarantine_from_json(
                    json.loads(self.quarantine_file.read_text())
                )
            except (OSError, ValueError) as exc:
                log.error("ignoring port quarantine %s: %s", self.quarantine_file, exc)
        self.book = PortBook(holdings, quarantine).expire(self._clock())

    def _save_pair(self, app: str, pair: PortPair) -> None:
        write_json_atomically(AppPaths.of(self.data_dir, app).ports_file, pair_to_json(app, pair))

    def _save_quarantine(self) -> None:
        write_json_atomically(self.quarantine_file, self.book.quarantine_to_json())

    # ------------------------------------------------------------------ registry claims

    def _claim_value(self, app: str, port: int) -> bytes:
        return PortClaim(self.node_id, port, app, self._clock()).encode()

    async def _claim(self, app: str, port: int) -> bool:
        """Claim ``port`` for ``app`` in the registry; True when it is ours now."""
        key = port_key(self.node_id, port)
        result = await self.registry.txn(
            [Compare.absent(key)], [Put(key, self._claim_value(app, port))], [Get(key)]
        )
        if result.succeeded:
            return True
        found = result.responses[0] if result.responses else None
        current = found[0] if isinstance(found, list) and found else None
        if current is None:
            return False
        holder = decode_record(current.key, current.value)
        if isinstance(holder, PortClaim) and holder.app == app:
            return True
        log.info(
            "port %d for app %s is claimed in the registry by %s",
            port,
            app,
            holder.app if isinstance(holder, PortClaim) else "an undecodable claim",
        )
        return False

    async def _unclaim(self, app: str, port: int) -> None:
        """Delete the claim on ``port`` if it is ``app``'s (only the holder releases)."""
        key = port_key(self.node_id, port)
        current: KeyValue | None = await self.registry.get(key)
        if current is None:
            return
        holder = decode_record(current.key, current.value)
        if isinstance(holder, PortClaim) and holder.node == self.node_id and holder.app == app:
            await self.registry.txn(
                [Compare.mod_revision_is(key, current.mod_revision)], [Delete(key)]
            )

    # ------------------------------------------------------------------ operations

    async def ensure_pair(self, app: str, *, verify: bool = True) -> EnsuredPair:
        """The pair ``app`` is to use: its recorded pair, or a new one.

        Args:
            app: the app.
            verify: probe a recorded pair and claim it again (before a start, when the
                app's own process does not hold the ports). A recorded port found taken
                gets the app a new pair, recorded, logged with both pairs, and returned
                with ``replaced`` set so the caller publishes it.

        Raises:
            PlacementUnavailable: fewer than two ports of the range can be given.
            PortProbeExhausted: ``max_probes`` ports were tried and all were taken.
            RegistryError: the registry could not be reached.
        """
        self._expire()
        pair = self.book.holdings.get(app)
        if pair is not None and not verify:
            return EnsuredPair(app, pair)
        if pair is not None:
            taken = [p for p in pair.ports if not self._probe(self.bind_host, p)]
            if not taken:
                lost = [p for p in pair.ports if not await self._claim(app, p)]
                if not lost:
                    return EnsuredPair(app, pair)
                taken = lost
            new = await self._draw(app, exclude=taken)
            self._assign(app, new)
            await self._release_claims(app, [p for p in pair.ports if p not in new.ports])
            log.warning(
                "app %s: recorded port pair %s found taken (port %s); moved to new pair %s",
                app,
                pair,
                ", ".join(map(str, taken)),
                new,
            )
            return EnsuredPair(app, new, replaced=pair)
        new = await self._draw(app, exclude=())
        self._assign(app, new)
        return EnsuredPair(app, new, fresh=True)

    async def release(self, app: str) -> PortPair | None:
        """Give ``app``'s pair back: every claim of ``app`` on this node is deleted from
        the registry (also one this node's local state lost track of), both ports go
        into quarantine, its ``ports.json`` is removed. Returns the released pair (None
        if it held none here).

        Raises:
            RegistryError: the claims could not be deleted; local state is kept, so
                calling again later finishes the release.
        """
        self._expire()
        pair = self.book.holdings.get(app)
        ports = set(pair.ports if pair is not None else ())
        records, _ = await read_records(self.registry, node_ports_prefix(self.node_id))
        ports.update(r.port for r in records.values() if isinstance(r, PortClaim) and r.app == app)
        await self._release_claims(app, sorted(ports))
        if pair is None:
            return None
        self.book = self.book.release(app, now=self._clock(), quarantine=self._quarantine_s)
        self._save_quarantine()
        AppPaths.of(self.data_dir, app).ports_file.unlink(missing_ok=True)
        log.info("app %s released ports %s into quarantine (%d ms)", app, pair, self.quarantine_ms)
        return pair

    def _assign(self, app: str, pair: PortPair) -> None:
        before = self.book.quarantine
        self.book = self.book.with_pair(app, pair, now=self._clock(), quarantine=self._quarantine_s)
        self._save_pair(app, pair)
        if self.book.quarantine != before:
            self._save_quarantine()

    def _expire(self) -> None:
        expired = self.book.expire(self._clock())
        if expired is not self.book:
            self.book = expired
            with contextlib.suppress(OSError):
                self._save_quarantine()

    async def _release_claims(self, app: str, ports: Sequence[int]) -> None:
        for port in ports:
            await self._unclaim(app, port)

    async def _draw(self, app: str, *, exclude: Sequence[int]) -> PortPair:
        now = self._clock()
        rejected = set(exclude)
        # Each pool is a lazy sequence equal, item by item, to the list of its ports, so
        # a choice over it draws what a choice over that list drew (tests pin seeds).
        candidates = self.book.free_ports(self.port_range, app, now)
        free = len(candidates.without(rejected))
        if free < 2:
            raise self._unavailable(app, now, free, rejected)
        probes = 0
        unfit: set[int] = set()  # free, but no internal port fits beside it as public

        async def take(pool: FreePorts, skip: set[int]) -> int | None:
            nonlocal probes
            while probes < self.max_probes:
                options = pool.without(rejected | skip)
                if not options:
                    return None
                port = self._random.choice(options)
                probes += 1
                if self._probe(self.bind_host, port) and await self._claim(app, port):
                    return port
                rejected.add(port)
            raise PortProbeExhausted(
                f"placement-unavailable: tried {probes} ports of range {self.port_range} for "
                f"app {app!r} and every one was taken (bound on this machine or claimed in "
                "the registry); free ports in the range or widen it with "
                "--port-range-start/--port-range-end"
            )

        while True:
            public = await take(candidates, unfit)
            if public is None:
                raise self._unavailable(app, now, len(candidates.without(rejected)), rejected)
            internal = await take(internal_candidates(candidates, public), set())
            if internal is not None:
                return PortPair(public, internal)
            # No internal port fits beside this public one: give it back, try another.
            await self._unclaim(app, public)
            unfit.add(public)

    def _unavailable(self, app: str, now: float, free: int, rejected: set[int]) -> Exception:
        in_range = self.port_range.__contains__
        return placement_unavailable(
            self.port_range,
            app=app,
            free=free,
            held=sum(1 for p in self.book.held_by_others(app) if in_range(p)),
            quarantined=sum(1 for p in self.book.quarantined_for(app, now) if in_range(p)),
            taken=len(rejected),
        )

    # ------------------------------------------------------------------ queries

    def snapshot(self) -> dict[str, Any]:
        """Holdings and quarantine, JSON-able (for ``GET /v1/state``)."""
        now = self._clock()
        return {
            "range": {"start": self.port_range.start, "end": self.port_range.end},
            "quarantine_ms": self.quarantine_ms,
            "holdings": {app: pair.to_dict() for app, pair in sorted(self.book.holdings.items())},
            "quarantine": {
                str(p): {"app": q.app, "until": q.until}
                for p, q in sorted(self.book.quarantine.items())
                if q.until > now
            },
        }
