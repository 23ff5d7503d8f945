"""What ``corral ps`` shows: one row per app instance, from registry records.

Theory of operation: the registry says what each app wants (``apps/``), where
the coordinator put it (``placement/``), what each node serves (``nodes/`` —
the ``serving`` map the Reconciler publishes) and what the operator intends for
each node (``intent/``). A row is an (app, node) pair that is placed there or
served there; its state is the serving state, or ``pending`` (no placement yet:
the coordinator has not decided, or cannot place it — ``corral state`` says
why), ``starting`` (placed, not serving yet), ``stopping`` (serving, no longer
placed) or ``node-gone`` (placed on a node with no live record). The RELOC
column says whether the instance could be moved elsewhere, or why not: it is
pinned, it runs everywhere it may (``replicas all``), or no other node could
take it. An instance placed less than the coordinator's cooldown ago moves
only if its node is lost (drained, stopped, dead), never to rebalance, and
RELOC says how long that lasts. :func:`node_rows` is the node list
(``corral node ls``): each node's record with the operator's intent on top.
Pure: no I/O, no clock (``now`` is given).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from corral.registry import AppRecord, NodeIntent, NodeRecord, PlacementRecord


@dataclass(frozen=True)
class PsRow:
    app: str
    node: str
    state: str
    public_port: int | None
    internal_port: int | None
    restarts: int
    revision: str | None
    reloc: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _duration(seconds: float) -> str:
    """``9m 12s``, ``45s``: a short human duration (whole seconds, rounded up)."""
    whole = max(1, math.ceil(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _takes_work(node: NodeRecord, intent: NodeIntent | None) -> bool:
    if node.state != "alive":
        return False
    return intent is None or not (intent.cordoned or intent.draining)


def relocation(
    app: AppRecord,
    node: str,
    placed_on: frozenset[str],
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    *,
    placed_at: float | None = None,
    now: float | None = None,
    cooldown_s: float = 0.0,
) -> str:
    """``yes``, ``yes (<limit>)`` or ``no (<why>)``: could this instance move off ``node``?

    Args:
        app, node: the instance.
        placed_on: every node the app is placed on.
        nodes, intents: node records and operator intents, by node id.
        placed_at: when the coordinator placed this instance (wall-clock), if known.
        now: the wall-clock time to judge the cooldown at.
        cooldown_s: the coordinator's cooldown after a placement.
    """
    if app.pinned:
        return "no (pinned)"
    if app.replicas == "all":
        return "no (replicas all: runs on every eligible node)"
    others = [
        record
        for node_id, record in nodes.items()
        if node_id != node
        and node_id not in placed_on
        and _takes_work(record, intents.get(node_id))
        and all(record.labels.get(k) == v for k, v in app.selector.items())
    ]
    if not others:
        why = "no other node matches the selector" if app.selector else "no other node takes work"
        return f"no ({why})"
    if placed_at is not None and now is not None and now - placed_at < cooldown_s:
        left = _duration(cooldown_s - (now - placed_at))
        return f"yes (only if its node is lost: cooldown, {left} left)"
    return "yes"


def ps_rows(
    apps: Mapping[str, AppRecord],
    placements: Mapping[str, PlacementRecord],
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    *,
    now: float | None = None,
    cooldown_s: float = 0.0,
) -> list[PsRow]:
    """Rows sorted by app then node. Keys of every mapping are names (not registry keys).

    ``now`` (wall-clock) and ``cooldown_s`` let RELOC tell an instance still in its
    cooldown; without ``now`` the cooldown is not shown.
    """
    rows: list[PsRow] = []
    for name in sorted(apps):
        app = apps[name]
        placement = placements.get(name)
        placed_on = frozenset(placement.nodes if placement else ())
        serving_on = {node_id for node_id, record in nodes.items() if name in record.serving}
        if not placed_on and not serving_on:
            state = (
                "retired"
                if app.retired
                else ("undeployed" if app.deployment is None else "pending")
            )
            rows.append(PsRow(name, "-", state, None, None, 0, None, "-"))
            continue
        for node_id in sorted(placed_on | serving_on):
            record = nodes.get(node_id)
            entry = record.serving.get(name) if record else None
            if entry is not None:
                state = entry.state if node_id in placed_on else "stopping"
            elif record is None:
                state = "node-gone"
            else:
                state = "starting"
            rows.append(
                PsRow(
                    app=name,
                    node=node_id,
                    state=state,
                    public_port=entry.public_port if entry else None,
                    internal_port=entry.internal_port if entry else None,
                    restarts=entry.restarts if entry else 0,
                    revision=entry.revision if entry else None,
                    reloc=relocation(
                        app,
                        node_id,
                        placed_on,
                        nodes,
                        intents,
                        placed_at=placement.placed_at.get(node_id) if placement else None,
                        now=now,
                        cooldown_s=cooldown_s,
                    ),
                )
            )
    return rows


@dataclass(frozen=True)
class NodeRow:
    """One node as ``corral node ls`` shows it."""

    node: str
    state: str
    serving: int
    labels: dict[str, str]
    rack: str | None
    datacenter: str | None
    api_address: str | None
    coordinator: bool

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def node_state(record: NodeRecord | None, intent: NodeIntent | None) -> str:
    """The node's state with the operator's intent on top, as the operator reads it.

    ``draining`` (``draining, forced`` for a forced drain) and ``cordoned`` come from
    the intent; otherwise the record's own state; ``gone`` when there is no live
    record (the node stopped or its lease lapsed) but an intent is still kept.
    """
    if record is None:
        base = "gone"
    else:
        base = record.state
    if intent is not None and intent.draining:
        text = "draining, forced" if intent.force else "draining"
        return text if record is not None else f"gone ({text})"
    if intent is not None and intent.cordoned:
        return "cordoned" if record is not None else "gone (cordoned)"
    return base


def node_rows(
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
    coordinator: str | None,
) -> list[NodeRow]:
    """Every node with a live record or an operator intent, sorted by id."""
    rows: list[NodeRow] = []
    for node_id in sorted(set(nodes) | set(intents)):
        record = nodes.get(node_id)
        rows.append(
            NodeRow(
                node=node_id,
                state=node_state(record, intents.get(node_id)),
                serving=len(record.serving) if record else 0,
                labels=dict(record.labels) if record else {},
                rack=record.rack if record else None,
                datacenter=record.datacenter if record else None,
                api_address=(record.api_address or None) if record else None,
                coordinator=node_id == coordinator,
            )
        )
    return rows
