"""PeerDirectory: teaches the peer transport where the other nodes listen.

Every node publishes its peer address in ``nodes/<id>``. This actor reads the
node records now and then and adds each other node's address to the
WebSocket transport (and forgets nodes whose record has been gone for
``forget_after`` seconds: a record that lapses in a registry blip leaves the
node reachable, so membership still sees it alive), so actors can
``ask`` an actor on another node by its id. When a node appears or goes, it
calls the optional ``on_change`` hook (for embedders that want to know); the
coordinator needs no such nudge: it watches ``nodes/`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import trio

from corral.registry import NodeRecord, Registry, RegistryError, read_records
from corral.supervision import Actor

DEFAULT_INTERVAL = 2.0


class PeerBook(Protocol):
    def add_peer(self, node_id: str, address: str) -> None: ...

    def remove_peer(self, node_id: str) -> None: ...


@dataclass(frozen=True)
class _Refresh:
    pass


def peer_changes(
    known: Mapping[str, str], records: Mapping[str, NodeRecord], me: str
) -> tuple[dict[str, str], list[str]]:
    """(peers to add or re-address, peers to forget), from the node records. Pure."""
    wanted = {
        record.id: record.peer_address
        for record in records.values()
        if record.id != me and record.peer_address
    }
    add = {node: address for node, address in wanted.items() if known.get(node) != address}
    remove = sorted(node for node in known if node not in wanted)
    return add, remove


class PeerDirectory(Actor):
    def __init__(
        self,
        registry: Registry,
        peers: PeerBook,
        *,
        interval: float = DEFAULT_INTERVAL,
        on_change: Callable[[str], None] | None = None,
        forget_after: float = 0.0,
    ) -> None:
        super().__init__()
        self._registry = registry
        self._peers = peers
        self._interval = interval
        self._on_change = on_change
        self._known: dict[str, str] = {}
        self._forget_after = forget_after
        # Known nodes without a record now: since when (trio time).
        self._gone: dict[str, float] = {}

    async def started(self) -> None:
        await self._refresh()
        self.ctx.every(self._interval, _Refresh())

    async def handle(self, message: object) -> object:
        if isinstance(message, _Refresh):
            await self._refresh()
            return None
        return await super().handle(message)

    async def _refresh(self) -> None:
        try:
            records, _ = await read_records(self._registry, "nodes/")
        except RegistryError as exc:
            self.ctx.log.warning("cannot read node records for peer addresses: %s", exc)
            return
        nodes = {key: r for key, r in records.items() if isinstance(r, NodeRecord)}
        add, remove = peer_changes(self._known, nodes, self.ctx.node_id)
        for node, address in sorted(add.items()):
            try:
                self._peers.add_peer(node, address)
            except ValueError as exc:
                self.ctx.log.warning("node %s publishes a bad peer address: %s", node, exc)
                continue
            self._known[node] = address
        now = trio.current_time()
        for node in list(self._gone):
            if node not in remove:
                del self._gone[node]
        kept = [n for n in remove if now - self._gone.setdefault(n, now) < self._forget_after]
        remove = [n for n in remove if n not in kept]
        for node in remove:
            self._peers.remove_peer(node)
            del self._known[node]
            del self._gone[node]
        joined = sorted(node for node in add if node in self._known)
        if (joined or remove) and self._on_change is not None:
            self._on_change(describe_change(joined, remove))


def describe_change(joined: list[str], left: list[str]) -> str:
    """``node b joined, node c left``: the reason a kick carries. Pure."""
    parts = [f"node {n} joined" for n in joined] + [f"node {n} left" for n in left]
    return ", ".join(parts)
