"""Playing the coordinator in a test: placements written the way it writes them.

A node's reconciler watches only its assignment index (``assign/<node>``), which the
coordinator writes in the same transaction as every placement change the node acts
on. A test that runs the agent without a coordinator writes its placements, and
tells the nodes of an app record it changed, with these helpers; they use the
coordinator's own write plan (:func:`~corral.actors.coordinator.plan_writes`,
:func:`~corral.actors.coordinator.plan_rollout_writes`), without its fence guards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from corral.actors.coordinator import (
    CurrentPlacement,
    WriteBatch,
    plan_rollout_writes,
    plan_writes,
)
from corral.registry import (
    APPS_PREFIX,
    PLACEMENT_PREFIX,
    AppRecord,
    PlacementRecord,
    Registry,
    RolloutRecord,
    decode_record,
)

__all__ = ["sync_app_specs", "write_placement"]

_KEEP = object()


async def _read(registry: Registry) -> tuple[dict[str, CurrentPlacement], dict[str, AppRecord]]:
    current: dict[str, CurrentPlacement] = {}
    for kv in await registry.range(PLACEMENT_PREFIX):
        record = decode_record(kv.key, kv.value)
        if isinstance(record, PlacementRecord):
            current[kv.key[len(PLACEMENT_PREFIX) :]] = CurrentPlacement(record, kv.mod_revision)
    apps: dict[str, AppRecord] = {}
    for kv in await registry.range(APPS_PREFIX):
        record = decode_record(kv.key, kv.value)
        if isinstance(record, AppRecord):
            apps[record.name] = record
    return current, apps


def _fence(current: Mapping[str, CurrentPlacement]) -> int:
    return max((c.record.fence for c in current.values()), default=1)


async def _apply(registry: Registry, batches: Iterable[WriteBatch]) -> None:
    for batch in batches:
        await registry.txn([], list(batch.operations))


async def write_placement(
    registry: Registry,
    app: str,
    nodes: Sequence[str],
    *,
    rollout: RolloutRecord | object | None = _KEEP,
    decided_at: float = 0.0,
) -> None:
    """Place ``app`` on ``nodes`` (none: delete its placement) as the coordinator would:
    the placement record with the app's spec, and the assignment index of every node
    whose part in it moved, in one transaction.

    Args:
        registry: the registry the nodes watch.
        app: the app's name.
        nodes: the nodes to serve it.
        rollout: the rollout to keep in the placement (None: none); left out, the
            record keeps the one it has.
        decided_at: the decision time stamped on the record.
    """
    current, apps = await _read(registry)
    fence = _fence(current)
    targets = {app: tuple(nodes) if nodes else None}
    await _apply(
        registry,
        plan_writes(targets, current, fence=fence, decided_at=decided_at, apps=apps).batches,
    )
    if rollout is not _KEEP and nodes:
        assert rollout is None or isinstance(rollout, RolloutRecord)
        current, apps = await _read(registry)
        await _apply(registry, plan_rollout_writes({app: rollout}, current, fence=fence, apps=apps))


async def sync_app_specs(registry: Registry) -> None:
    """After a test changed app records: what the coordinator's next pass writes for it,
    each changed app's spec into its placement and the assignment index of its nodes,
    so they read the record again (rollouts are left as they are)."""
    current, apps = await _read(registry)
    rollouts = {app: c.record.rollout for app, c in current.items()}
    await _apply(
        registry, plan_rollout_writes(rollouts, current, fence=_fence(current), apps=apps)
    )
