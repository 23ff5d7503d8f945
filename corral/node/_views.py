"""What ``corral ps`` shows: one row per app instance, from registry records.

Theory of operation: the registry says what each app wants (``apps/``), where
the coordinator put it (``placement/``), what each node serves (``nodes/`` —
the ``serving`` map the Reconciler publishes) and what the operator intends for
each node (``intent/``). A row is an (app, node) pair that is placed there or
served there; its state is the serving state, or ``pending`` (no placement yet:
the coordinator has not decided, or cannot place it — ``corral state`` says
why), ``starting`` (placed, not serving yet), ``stopping`` (serving, no longer
placed) or ``node-gone`` (placed on a node with no live record). The RELOC
column says whether the instance could be moved elsewhere if its node went
away, or why not. Pure: no I/O.
"""

from __future__ import annotations

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
) -> str:
    """``yes``, or ``no (<why>)``: could this instance move off ``node``?"""
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
    return "yes"


def ps_rows(
    apps: Mapping[str, AppRecord],
    placements: Mapping[str, PlacementRecord],
    nodes: Mapping[str, NodeRecord],
    intents: Mapping[str, NodeIntent],
) -> list[PsRow]:
    """Rows sorted by app then node. Keys of every mapping are names (not registry keys)."""
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
                    reloc=relocation(app, node_id, placed_on, nodes, intents),
                )
            )
    return rows
