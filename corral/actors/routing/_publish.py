"""One RoutingRenderer pass against the registry: read, render, write only on change.

The thin I/O shell around :func:`render_routes`: the lease holder calls
:func:`publish_routes` after its passes (and whenever node records, aliases or
domains change). It reads every input in one transaction (one consistent
revision), renders, and writes ``routing`` only when the table changed, in a
transaction guarded on the coordinator's fence and on the ``routing`` key being
as it was read, so a stale coordinator and a concurrent writer both write
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.actors.routing._hold import (
    DEFAULT_SETTLE,
    awaited_nodes,
    decide_publish,
    incomplete_records,
)
from corral.actors.routing._render import (
    NodeRoutes,
    Rendered,
    RoutesChanged,
    RouteTable,
    RoutingInputs,
    changed,
    decode_table_json,
    encode_table_json,
    next_table,
    node_routes_from_record,
    render_routes,
)
from corral.actors.routing._view import routes_answer
from corral.registry import (
    ALIAS_PREFIX,
    APPS_PREFIX,
    NODES_PREFIX,
    PLACEMENT_PREFIX,
    PROXIES_PREFIX,
    ROUTING_KEY,
    AliasRecord,
    AppRecord,
    Compare,
    Get,
    InvalidKey,
    KeyKind,
    KeyValue,
    NodeRecord,
    PlacementRecord,
    ProxyRecord,
    Put,
    Registry,
    decode_record,
    parse_key,
    read_records,
)
from corral.transport import SchemaError

__all__ = ["Published", "inputs_from_records", "publish_routes", "read_routes_answer"]

log = logging.getLogger("corral.actors.routing")


def inputs_from_records(
    apps: Mapping[str, AppRecord],
    placements: Mapping[str, PlacementRecord],
    nodes: Mapping[str, NodeRecord],
    aliases: Mapping[str, AliasRecord],
    *,
    ready: Mapping[str, Mapping[str, bool]] | None = None,
    member_states: Mapping[str, str] | None = None,
) -> RoutingInputs:
    """Routing inputs from decoded registry records (pure).

    Args:
        apps: app name -> ``apps/<name>``.
        placements: app name -> ``placement/<name>``.
        nodes: node id -> ``nodes/<id>``.
        aliases: domain -> ``alias/<domain>`` (not the ``previous`` records).
        ready: node id -> app -> readiness, when known apart from the record
            (see :func:`node_routes_from_record`).
        member_states: node id -> state in the lease holder's SWIM view (see
            :class:`RoutingInputs`).
    """
    node_routes: dict[str, NodeRoutes] = {}
    for node_id, record in nodes.items():
        told = None if ready is None else ready.get(node_id, {})
        node_routes[node_id] = node_routes_from_record(record, ready=told)
    return RoutingInputs(
        app_domains={name: list(app.domains) for name, app in apps.items()},
        aliases={domain: alias.app for domain, alias in aliases.items()},
        placements={name: list(p.nodes) for name, p in placements.items()},
        nodes=node_routes,
        out_of_table={
            name: p.out_of_table() for name, p in placements.items() if p.rollout is not None
        },
        member_states=dict(member_states or {}),
    )


@dataclass(frozen=True, slots=True)
class Published:
    """The outcome of one pass.

    ``written`` is the table written (None: nothing was); ``diff`` what it
    changed; ``rendered`` the render itself; ``why`` says why nothing was
    written (``"unchanged"``, ``"fence lost"``, ``"guard failed..."``, or
    ``"held: ..."`` when the render would drop served domains while node records
    are still awaited, see :func:`~corral.actors.routing._hold.decide_publish`);
    ``undecodable`` names input keys that were skipped; ``missing`` the placed
    nodes whose record was missing or named no instance of an app placed on them
    (the caller remembers since when).
    """

    rendered: Rendered
    written: RouteTable | None = None
    diff: RoutesChanged | None = None
    why: str = ""
    undecodable: tuple[str, ...] = field(default_factory=tuple)
    missing: frozenset[str] = frozenset()

    @property
    def held(self) -> bool:
        """The render was not published: inputs it would need are still arriving."""
        return self.why.startswith("held:")


def _kind(key: str) -> KeyKind | None:
    try:
        return parse_key(key)[0]
    except InvalidKey:
        return None


def _previous_table(kv: KeyValue | None) -> RouteTable | None:
    if kv is None:
        return None
    try:
        return decode_table_json(kv.value)
    except SchemaError as exc:
        # Revisions must keep growing for proxies: start past every write the key saw.
        log.warning("routing key does not decode (%s); the next table replaces it", exc)
        return RouteTable(0, kv.version)


async def publish_routes(
    registry: Registry,
    *,
    fence: int,
    ready: Mapping[str, Mapping[str, bool]] | None = None,
    member_states: Mapping[str, str] | None = None,
    missing_since: Mapping[str, float] | None = None,
    now: float = 0.0,
    settle: float = DEFAULT_SETTLE,
) -> Published:
    """Render the routing table from the registry and write it if it changed.

    Args:
        registry: the shared registry.
        fence: the caller's coordinator fence (``lease/coordinator``'s create revision).
        ready: optional readiness per node and app (see :func:`inputs_from_records`).
        member_states: node id -> state in this node's SWIM view (instances on a
            suspect node leave the table, see :class:`RoutingInputs`).
        missing_since: node id -> when the caller first saw its record missing or
            incomplete (None: records are taken as complete, as before).
        now: the caller's clock, in the same unit as ``missing_since``.
        settle: seconds after which a missing node record counts as gone.

    Returns:
        What was rendered and written.

    Raises:
        RegistryUnavailable: the registry could not be read or written.
    """
    snapshot = await registry.txn(
        [],
        [
            Get(APPS_PREFIX, prefix=True),
            Get(PLACEMENT_PREFIX, prefix=True),
            Get(NODES_PREFIX, prefix=True),
            Get(ALIAS_PREFIX, prefix=True),
            Get(ROUTING_KEY),
        ],
        [],
    )
    responses = [r if isinstance(r, list) else [] for r in snapshot.responses]
    apps: dict[str, AppRecord] = {}
    placements: dict[str, PlacementRecord] = {}
    nodes: dict[str, NodeRecord] = {}
    aliases: dict[str, AliasRecord] = {}
    undecodable: list[str] = []
    for kv in (kv for batch in responses[:4] for kv in batch):
        record = decode_record(kv.key, kv.value)
        kind = _kind(kv.key)
        if isinstance(record, AppRecord):
            apps[record.name] = record
        elif isinstance(record, PlacementRecord):
            placements[kv.key.removeprefix(PLACEMENT_PREFIX)] = record
        elif isinstance(record, NodeRecord):
            nodes[record.id] = record
        elif isinstance(record, AliasRecord) and kind is KeyKind.ALIAS:
            aliases[kv.key.removeprefix(ALIAS_PREFIX)] = record
        elif kind is not KeyKind.ALIAS_PREVIOUS:
            undecodable.append(kv.key)
    current = responses[4][0] if responses[4] else None
    previous = _previous_table(current)
    inputs = inputs_from_records(
        apps, placements, nodes, aliases, ready=ready, member_states=member_states
    )
    rendered = render_routes(inputs)
    missing = incomplete_records(inputs)
    table = next_table(previous, rendered, fence)
    if table is None:
        why = "unchanged" if previous is None or previous.fence <= fence else "fence lost"
        return Published(rendered, why=why, undecodable=tuple(undecodable), missing=missing)
    if missing_since is not None:
        awaited = awaited_nodes(inputs, missing_since=missing_since, now=now, settle=settle)
        decision = decide_publish(previous, inputs, rendered, awaited)
        if not decision.publish:
            return Published(
                rendered, why=decision.why, undecodable=tuple(undecodable), missing=missing
            )
    guard = (
        Compare.absent(ROUTING_KEY)
        if current is None
        else Compare.mod_revision_is(ROUTING_KEY, current.mod_revision)
    )
    # Imported here: the coordinator, which calls this, may import this module.
    from corral.actors.coordinator import fence_guard

    result = await registry.txn(
        [fence_guard(fence), guard], [Put(ROUTING_KEY, encode_table_json(table))], []
    )
    if not result.succeeded:
        return Published(
            rendered,
            why="guard failed: the fence was lost, or routing changed since it was read",
            undecodable=tuple(undecodable),
            missing=missing,
        )
    old = None if previous is None or not previous.domains else previous
    return Published(
        rendered,
        written=table,
        diff=changed(old, table),
        undecodable=tuple(undecodable),
        missing=missing,
    )


async def read_routes_answer(registry: Registry, now: float) -> dict[str, Any]:
    """What ``corral routes`` shows (:func:`routes_answer`), read from the registry: the
    ``routing`` key and every ``proxies/<id>`` record. A table that does not decode is
    logged and shown as none; the proxies are still listed.

    Raises:
        RegistryError: the registry cannot be read.
    """
    kv = await registry.get(ROUTING_KEY)
    table = None
    if kv is not None:
        try:
            table = decode_table_json(kv.value)
        except SchemaError as exc:
            log.warning("the routing key does not decode: %s", exc)
    records, _ = await read_records(registry, PROXIES_PREFIX)
    proxies = [r for _, r in sorted(records.items()) if isinstance(r, ProxyRecord)]
    return routes_answer(table, proxies, now=now)
