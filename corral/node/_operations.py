"""Operator operations on the registry: deploy, app changes, node intent.

Every change is one guarded transaction: read the record and its version,
compute the new record (pure), write it only if the version is still the one
read, and retry from the read when someone else wrote in between. So a request
either applies whole or not at all, and two operators never blend.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import trio

from corral.node._artifacts import DEFAULT_LIMITS, Manifest, inspect_artifact
from corral.node._errors import Conflict, NotFound, OperationRefused
from corral.node._requests import DeployRequest, Replicas
from corral.registry import (
    AppRecord,
    Compare,
    Delete,
    Deployment,
    NodeIntent,
    PlacementRecord,
    Put,
    Registry,
    Undecodable,
    app_key,
    decode_record,
    intent_key,
    node_key,
    placement_key,
    read_records,
)

GUARDED_WRITE_ATTEMPTS = 8

StoreArtifact = Callable[[bytes], Awaitable[str]]
InspectArtifact = Callable[[bytes], Awaitable[Manifest]]


async def inspect_with_default_limits(data: bytes) -> Manifest:
    """Check an artifact against the default limits in a worker thread."""
    return await trio.to_thread.run_sync(inspect_artifact, data, DEFAULT_LIMITS)


@dataclass(frozen=True)
class DeployResult:
    app: AppRecord
    created: bool
    artifact_size: int


async def _read_app(registry: Registry, name: str) -> tuple[AppRecord | None, int]:
    kv = await registry.get(app_key(name))
    if kv is None:
        return None, 0
    record = decode_record(kv.key, kv.value)
    if isinstance(record, Undecodable) or not isinstance(record, AppRecord):
        reason = record.reason if isinstance(record, Undecodable) else "not an app record"
        raise OperationRefused(
            f"apps/{name} holds a value this build cannot read ({reason}); "
            f"remove it with `corral app delete --name {name}` or upgrade this node"
        )
    return record, kv.version


async def _guarded_update(
    registry: Registry,
    name: str,
    change: Callable[[AppRecord | None], AppRecord | None],
) -> AppRecord | None:
    """Apply ``change`` to ``apps/<name>`` under a version guard, retrying on races.

    ``change`` gets the current record (None when absent) and returns the new one
    (None = delete). Returns what was written.
    """
    key = app_key(name)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        current, version = await _read_app(registry, name)
        new = change(current)
        op: Put | Delete = Delete(key) if new is None else Put(key, new.encode())
        result = await registry.txn([Compare.version_is(key, version)], [op])
        if result.succeeded:
            return new
    raise Conflict(
        f"apps/{name} kept changing while this request tried to write it "
        f"({GUARDED_WRITE_ATTEMPTS} attempts); try again"
    )


def _require(name: str, current: AppRecord | None) -> AppRecord:
    if current is None:
        raise NotFound(
            f"no app named {name!r}; deploy it first with corral deploy DIR --name {name}"
        )
    return current


def apply_deploy(
    current: AppRecord | None, request: DeployRequest, deployment: Deployment
) -> AppRecord:
    """The app record a deploy leaves (pure).

    A field the request does not name keeps the app's current value (or the default
    for a new app: replicas all, no selector). A deploy makes a retired app active.
    """
    base = current or AppRecord(name=request.name, replicas="all")
    return replace(
        base,
        replicas=base.replicas if request.replicas is None else request.replicas,
        selector=dict(base.selector if request.selector is None else request.selector),
        memory_mb=base.memory_mb if request.memory_mb is None else request.memory_mb,
        disk_mb=base.disk_mb if request.disk_mb is None else request.disk_mb,
        pinned=base.pinned if request.pinned is None else request.pinned,
        retired=False,
        deployment=deployment,
    )


async def deploy(
    registry: Registry,
    request: DeployRequest,
    store_artifact: StoreArtifact,
    now: float,
    *,
    inspect: InspectArtifact = inspect_with_default_limits,
) -> DeployResult:
    """Check the artifact, store it and point ``apps/<name>`` at it in one guarded write.

    Every member of the archive is checked by ``inspect`` (off the event loop: an
    archive can take seconds to read) with the very rules a node unpacks by, before
    anything is written to the registry or to disk, so an artifact no node would
    unpack is refused here rather than left ``starting`` forever.

    Args:
        inspect: checks the artifact bytes and returns its manifest (e.g.
            :meth:`ArtifactStore.inspect`, with the node's ``--max-artifact-mb``).

    Raises:
        ArtifactInvalid: (field ``artifact``) the archive breaks a rule, named in the
            message; (``command``, ``env``) its manifest is invalid. Nothing is written.
        OperationRefused, Conflict: as :func:`_guarded_update`.
    """
    manifest = await inspect(request.artifact)
    await _read_app(registry, request.name)  # refuse an unreadable record before storing
    digest = await store_artifact(request.artifact)
    env = {**manifest.env, **(request.env or {})}
    deployment = Deployment(
        revision=digest,
        command=list(manifest.command),
        env=env,
        deployed_at=now,
        health=manifest.health,
    )
    created = False

    def change(current: AppRecord | None) -> AppRecord:
        nonlocal created
        created = current is None
        return apply_deploy(current, request, deployment)

    app = await _guarded_update(registry, request.name, change)
    assert app is not None
    return DeployResult(app=app, created=created, artifact_size=len(request.artifact))


async def set_selector(
    registry: Registry, name: str, selector: Mapping[str, str] | None
) -> AppRecord:
    """Replace the app's selector; None (or empty) clears it."""

    def change(current: AppRecord | None) -> AppRecord:
        return replace(_require(name, current), selector=dict(selector or {}))

    app = await _guarded_update(registry, name, change)
    assert app is not None
    return app


async def set_replicas(registry: Registry, name: str, replicas: Replicas) -> AppRecord:
    def change(current: AppRecord | None) -> AppRecord:
        return replace(_require(name, current), replicas=replicas)

    app = await _guarded_update(registry, name, change)
    assert app is not None
    return app


async def retire(registry: Registry, name: str) -> AppRecord:
    """Mark the app retired: every instance stops, the record stays."""

    def change(current: AppRecord | None) -> AppRecord:
        return replace(_require(name, current), retired=True)

    app = await _guarded_update(registry, name, change)
    assert app is not None
    return app


async def delete_app(registry: Registry, name: str) -> None:
    """Remove ``apps/<name>``; nodes stop its instances and clear its state."""
    key = app_key(name)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        kv = await registry.get(key)
        if kv is None:
            raise NotFound(f"no app named {name!r}; `corral ps` lists the apps there are")
        result = await registry.txn([Compare.version_is(key, kv.version)], [Delete(key)])
        if result.succeeded:
            return
    raise Conflict(f"apps/{name} kept changing while this request tried to delete it; try again")


async def _require_node(registry: Registry, node: str) -> None:
    if await registry.get(node_key(node)) is None and await registry.get(intent_key(node)) is None:
        records, _ = await read_records(registry, "nodes/")
        known = ", ".join(sorted(key.removeprefix("nodes/") for key in records)) or "none"
        raise NotFound(f"no node named {node!r} is known (live nodes: {known})")


async def pinned_apps_on(registry: Registry, node: str) -> list[str]:
    """Pinned apps currently placed on ``node``, sorted."""
    apps, _ = await read_records(registry, "apps/")
    pinned: list[str] = []
    for record in apps.values():
        if not isinstance(record, AppRecord) or not record.pinned:
            continue
        kv = await registry.get(placement_key(record.name))
        placement = None if kv is None else decode_record(kv.key, kv.value)
        if isinstance(placement, PlacementRecord) and node in placement.nodes:
            pinned.append(record.name)
    return sorted(pinned)


async def write_intent(registry: Registry, node: str, intent: NodeIntent) -> NodeIntent:
    await registry.put(intent_key(node), intent.encode())
    return intent


async def cordon(registry: Registry, node: str) -> NodeIntent:
    """The node keeps its work but takes no new work."""
    await _require_node(registry, node)
    return await write_intent(registry, node, NodeIntent(cordoned=True))


async def uncordon(registry: Registry, node: str) -> NodeIntent:
    """The node takes work again (also ends a drain)."""
    await _require_node(registry, node)
    await registry.delete(intent_key(node))
    return NodeIntent()


async def drain(registry: Registry, node: str, *, force: bool) -> tuple[NodeIntent, list[str]]:
    """Move the node's work elsewhere; refuse while pinned work sits there unless forced.

    Returns:
        The intent written and the pinned apps it interrupts (forced drains only).

    Raises:
        OperationRefused: naming the pinned apps, when not forced.
    """
    await _require_node(registry, node)
    pinned = await pinned_apps_on(registry, node)
    if pinned and not force:
        raise OperationRefused(
            f"drain of {node} refused: it runs pinned app(s) {', '.join(pinned)}, which are "
            "never moved and would stop; drain with --force to stop them anyway"
        )
    intent = NodeIntent(cordoned=True, draining=True, force=force)
    await write_intent(registry, node, intent)
    return intent, pinned
