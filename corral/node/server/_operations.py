"""Operator operations on the registry: deploy, app changes, node intent.

Every change is one guarded transaction: read the record and its version,
compute the new record (pure), write it only if the version is still the one
read, and retry from the read when someone else wrote in between. So a request
either applies whole or not at all, and two operators never blend.

Domains: an app's domains are listed in its record, and each one is also claimed
by a ``domain/<domain>`` key naming the app, written in the same transaction as the
record and guarded on the claim being absent and on no ``alias/<domain>``. So of two
deploys racing for one domain exactly one commits; the other reads the winner's
claim on its retry and is refused, naming it. An alias is created guarded on
``alias/<domain>`` and ``domain/<domain>`` both absent, so a domain is one app's or
one alias's, never both.

Aliases: ``alias/<domain>`` points a domain at an app, ``alias/<domain>/previous``
at the one before. A flip is guarded on the alias's revision as observed (its
``mod_revision``, which, unlike its version, never repeats after a remove and
set), and is not retried: of two concurrent flips one commits and the other is
told which app won.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import trio

from corral.node._errors import Conflict, NotFound, OperationRefused, RequestInvalid
from corral.node._requests import MAX_APP_DOMAINS, DeployRequest, Replicas
from corral.node.artifacts import DEFAULT_LIMITS, Manifest, inspect_artifact
from corral.registry import (
    ALIAS_PREFIX,
    DOMAIN_PREFIX,
    AliasRecord,
    AppRecord,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    Deployment,
    DomainClaim,
    KeyKind,
    KeyValue,
    NodeIntent,
    PlacementRecord,
    Put,
    Registry,
    TxnOp,
    Undecodable,
    alias_key,
    alias_previous_key,
    app_key,
    decode_record,
    domain_key,
    intent_key,
    is_valid_key,
    node_key,
    parse_key,
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


def _decoded(kv: KeyValue) -> Any:
    """The record under ``kv`` (an :class:`Undecodable` when it breaks its schema)."""
    return decode_record(kv.key, kv.value)


async def _domain_owner(registry: Registry, domain: str) -> tuple[str | None, KeyValue | None]:
    """Who holds ``domain/<domain>``: ``(app, claim)``; app is None when the claim is
    absent or stale (unreadable, or naming an app whose record no longer lists the
    domain: a leftover, which the next claimant replaces under a revision guard)."""
    kv = await registry.get(domain_key(domain))
    if kv is None:
        return None, None
    claim = _decoded(kv)
    if not isinstance(claim, DomainClaim):
        return None, kv
    owner_kv = await registry.get(app_key(claim.app))
    owner = None if owner_kv is None else _decoded(owner_kv)
    if not isinstance(owner, AppRecord) or domain not in owner.domains:
        return None, kv
    return claim.app, kv


def _alias_target(kv: KeyValue) -> str:
    record = _decoded(kv)
    return record.app if isinstance(record, AliasRecord) else "(an unreadable value)"


def _guard_as_seen(key: str, kv: KeyValue | None) -> Compare:
    """The key still is as read: absent, or not written since."""
    return Compare.absent(key) if kv is None else Compare.mod_revision_is(key, kv.mod_revision)


def _app_exists(key: str) -> Compare:
    return Compare(key, CompareTarget.VERSION, CompareOp.GREATER, 0)


async def _domain_changes(
    registry: Registry, name: str, old: Sequence[str], new: Sequence[str]
) -> tuple[list[Compare], list[TxnOp]]:
    """The guards and writes that claim the domains ``new`` adds for app ``name``
    and release the ones it drops.

    Raises:
        OperationRefused: an added domain belongs to another app or is an alias,
            naming the owner.
    """
    compares: list[Compare] = []
    ops: list[TxnOp] = []
    for domain in sorted(set(new) - set(old)):
        alias = await registry.get(alias_key(domain))
        if alias is not None:
            raise OperationRefused(
                f"domain {domain} is an alias pointing at app {_alias_target(alias)}; a domain "
                f"is one app's or one alias's: remove the alias first (corral alias rm {domain})"
            )
        owner, claim = await _domain_owner(registry, domain)
        if owner is not None and owner != name:
            raise OperationRefused(
                f"domain {domain} already belongs to app {owner}; remove it there first "
                f"(corral app domains --name {owner} --remove {domain})"
            )
        compares += [Compare.absent(alias_key(domain)), _guard_as_seen(domain_key(domain), claim)]
        ops.append(Put(domain_key(domain), DomainClaim(name).encode()))
    for domain in sorted(set(old) - set(new)):
        if not is_valid_key(f"{DOMAIN_PREFIX}{domain}"):
            continue  # a record written by hand may list a non-domain: nothing to release
        kv = await registry.get(domain_key(domain))
        claim = None if kv is None else _decoded(kv)
        if kv is not None and isinstance(claim, DomainClaim) and claim.app == name:
            compares.append(_guard_as_seen(kv.key, kv))
            ops.append(Delete(kv.key))
    return compares, ops


async def _guarded_update(
    registry: Registry,
    name: str,
    change: Callable[[AppRecord | None], AppRecord | None],
) -> AppRecord | None:
    """Apply ``change`` to ``apps/<name>`` under a version guard, retrying on races.

    ``change`` gets the current record (None when absent) and returns the new one
    (None = delete). Returns what was written. The domains the change adds are
    claimed and the ones it drops released in the same transaction.

    Raises:
        OperationRefused: the record is unreadable, or an added domain is taken.
        Conflict: the record kept changing for :data:`GUARDED_WRITE_ATTEMPTS` tries.
    """
    key = app_key(name)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        current, version = await _read_app(registry, name)
        new = change(current)
        old_domains = [] if current is None else current.domains
        new_domains = [] if new is None else new.domains
        compares, ops = await _domain_changes(registry, name, old_domains, new_domains)
        op: Put | Delete = Delete(key) if new is None else Put(key, new.encode())
        result = await registry.txn([Compare.version_is(key, version), *compares], [op, *ops])
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


def deploy_selector(
    name: str, current: Mapping[str, str], requested: Mapping[str, str] | None
) -> dict[str, str]:
    """The selector a deploy leaves (pure): the app's, with the requested pairs added.

    A deploy only adds constraints (a key the selector lacks narrows where the app
    runs) or repeats them; it never lifts one, so a key it does not name is kept.
    Changing the value of a key the selector has is neither: that is
    ``corral app selector``'s job, where the operator says so.

    Raises:
        RequestInvalid: (field ``selector``) a requested key has another value in the
            app's selector, naming both and the command that changes it.
    """
    if requested is None:
        return dict(current)
    changed = sorted(k for k, v in requested.items() if k in current and current[k] != v)
    if changed:
        pairs = ", ".join(f"{k}={current[k]} (the deploy says {k}={requested[k]})" for k in changed)
        given = " ".join(f"--set {k}={v}" for k, v in sorted({**current, **requested}.items()))
        raise RequestInvalid(
            "selector",
            f"app {name} is constrained to {pairs}; a deploy only adds selector keys, it "
            f"does not change one: to change it run `corral app selector --name {name} "
            f"{given}`, then deploy",
        )
    return {**current, **requested}


def apply_deploy(
    current: AppRecord | None, request: DeployRequest, deployment: Deployment
) -> AppRecord:
    """The app record a deploy leaves (pure).

    A field the request does not name keeps the app's current value (or the default
    for a new app: replicas all, no selector, no domains); named domains replace the
    app's; so do the rollout options (max-parallel, drain, ready timeout), which are
    kept with the app. A named selector is merged into the app's
    (:func:`deploy_selector`): a deploy narrows where an app runs, never widens it. A
    deploy makes a retired app active.

    The deployment's revision is computed here, from ``deployment``'s digest,
    command and env and the resources the app ends with (see
    :func:`~corral.registry._records.deployment_revision`): a redeploy that changes only the
    env, the command or the resources is a new revision, and one that changes
    nothing keeps the revision the nodes run. The deployment a new revision replaces
    is kept as ``previous_deployment`` (for a rollback, and for the nodes a rollout
    has not reached yet).
    """
    base = current or AppRecord(name=request.name, replicas="all")
    memory_mb = base.memory_mb if request.memory_mb is None else request.memory_mb
    disk_mb = base.disk_mb if request.disk_mb is None else request.disk_mb
    new = Deployment.of(
        deployment.digest,
        deployment.command,
        deployment.env,
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        deployed_at=deployment.deployed_at,
        health=deployment.health,
    )
    previous = base.previous_deployment
    if base.deployment is not None and base.deployment.revision != new.revision:
        previous = base.deployment
    return replace(
        base,
        replicas=base.replicas if request.replicas is None else request.replicas,
        selector=deploy_selector(base.name, base.selector, request.selector),
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        pinned=base.pinned if request.pinned is None else request.pinned,
        domains=list(base.domains) if request.domains is None else sorted(set(request.domains)),
        retired=False,
        rollout=replace(
            base.rollout,
            max_parallel=base.rollout.max_parallel
            if request.max_parallel is None
            else request.max_parallel,
            drain_ms=base.rollout.drain_ms if request.drain_ms is None else request.drain_ms,
            ready_timeout_ms=base.rollout.ready_timeout_ms
            if request.ready_timeout_ms is None
            else request.ready_timeout_ms,
        ),
        deployment=new,
        previous_deployment=previous,
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
        RequestInvalid: (``selector``) as :func:`deploy_selector`. Nothing is written.
        OperationRefused, Conflict: as :func:`_guarded_update`.
    """
    manifest = await inspect(request.artifact)
    # Refuse an unreadable record, or a selector the deploy may not change, before storing.
    current, _ = await _read_app(registry, request.name)
    if current is not None:
        deploy_selector(request.name, current.selector, request.selector)
    digest = await store_artifact(request.artifact)
    env = {**manifest.env, **(request.env or {})}
    deployment = Deployment.of(
        digest, manifest.command, env, deployed_at=now, health=manifest.health
    )
    created = False

    def change(current: AppRecord | None) -> AppRecord:
        nonlocal created
        created = current is None
        return apply_deploy(current, request, deployment)

    app = await _guarded_update(registry, request.name, change)
    assert app is not None
    return DeployResult(app=app, created=created, artifact_size=len(request.artifact))


def apply_rollback(current: AppRecord) -> AppRecord:
    """The app record a rollback leaves (pure): the previous deployment is current
    again (with the resources it was deployed with) and the current one becomes the
    previous, so a second rollback undoes the first. The revision comes back as it
    was, so nodes roll to it like to any other.

    Raises:
        OperationRefused: the app has no previous deployment.
    """
    previous = current.previous_deployment
    if previous is None or current.deployment is None:
        raise OperationRefused(
            f"app {current.name} has no previous revision to roll back to: it was "
            "deployed once (or only with identical inputs since)"
        )
    return replace(
        current,
        deployment=previous,
        previous_deployment=current.deployment,
        memory_mb=previous.memory_mb,
        disk_mb=previous.disk_mb,
        retired=False,
    )


async def rollback(registry: Registry, name: str) -> AppRecord:
    """Point ``apps/<name>`` back at its previous deployment (see :func:`apply_rollback`).

    Raises:
        NotFound: no such app.
        OperationRefused: it has no previous deployment, or its record is unreadable.
    """

    def change(current: AppRecord | None) -> AppRecord:
        return apply_rollback(_require(name, current))

    app = await _guarded_update(registry, name, change)
    assert app is not None
    return app


def selector_without(name: str, current: Mapping[str, str], keys: Sequence[str]) -> dict[str, str]:
    """The app's selector with ``keys`` removed (pure).

    Raises:
        NotFound: a key is not in the selector, naming the ones it has.
    """
    missing = sorted(set(keys) - set(current))
    if missing:
        has = ", ".join(f"{k}={v}" for k, v in sorted(current.items())) or "none"
        raise NotFound(
            f"app {name}'s selector has no key {', '.join(missing)} (its selector: {has})"
        )
    return {k: v for k, v in current.items() if k not in keys}


async def set_selector(
    registry: Registry,
    name: str,
    selector: Mapping[str, str] | None,
    *,
    unset: Sequence[str] = (),
) -> AppRecord:
    """Replace the app's selector (None or empty: clear it), or, with ``unset``, remove
    those keys from it and keep the rest.

    Raises:
        NotFound: no such app, or a key to unset is not in its selector.
    """

    def change(current: AppRecord | None) -> AppRecord:
        app = _require(name, current)
        if unset:
            return replace(app, selector=selector_without(name, app.selector, unset))
        return replace(app, selector=dict(selector or {}))

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
    """Remove ``apps/<name>`` (and release its domains); nodes stop its instances and
    clear its state."""
    key = app_key(name)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        kv = await registry.get(key)
        if kv is None:
            raise NotFound(f"no app named {name!r}; `corral ps` lists the apps there are")
        record = _decoded(kv)
        domains = record.domains if isinstance(record, AppRecord) else []
        compares, ops = await _domain_changes(registry, name, domains, [])
        result = await registry.txn(
            [Compare.version_is(key, kv.version), *compares], [Delete(key), *ops]
        )
        if result.succeeded:
            return
    raise Conflict(f"apps/{name} kept changing while this request tried to delete it; try again")


async def set_domains(
    registry: Registry,
    name: str,
    *,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
    clear: bool = False,
) -> AppRecord:
    """Add domains to the app, remove some, or clear them all (domains already
    checked by :func:`corral.node._requests.check_domain`).

    Raises:
        NotFound: no such app, or a domain to remove is not the app's.
        OperationRefused: a domain to add belongs to another app or is an alias.
        RequestInvalid: (field ``add``) the app would own more than
            :data:`MAX_APP_DOMAINS` domains.
    """

    def change(current: AppRecord | None) -> AppRecord:
        app = _require(name, current)
        missing = sorted(set(remove) - set(app.domains) - set(add))
        if missing:
            owned = ", ".join(app.domains) or "none"
            raise NotFound(f"app {name} has no domain {', '.join(missing)} (its domains: {owned})")
        domains = [] if clear else sorted((set(app.domains) | set(add)) - set(remove))
        if len(domains) > MAX_APP_DOMAINS:
            raise RequestInvalid(
                "add",
                f"app {name} would own {len(domains)} domains, more than the "
                f"{MAX_APP_DOMAINS} allowed",
            )
        return replace(app, domains=domains)

    app = await _guarded_update(registry, name, change)
    assert app is not None
    return app


# --------------------------------------------------------------------------- aliases


@dataclass(frozen=True)
class AliasView:
    """One alias: its domain, the app it points at, the one before (None: never
    flipped), and its revision (what ``flip --expect`` guards on)."""

    domain: str
    app: str
    previous: str | None
    revision: int

    def to_json(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "app": self.app,
            "previous": self.previous,
            "revision": self.revision,
        }


@dataclass(frozen=True)
class FlipResult:
    """What a flip did: the alias now, and whether it wrote (False: it already
    pointed at the app asked for)."""

    alias: AliasView
    flipped: bool


async def _read_alias(registry: Registry, domain: str) -> tuple[AliasView, KeyValue]:
    """The alias and its raw key.

    Raises:
        NotFound: there is no such alias.
        OperationRefused: its value is unreadable.
    """
    kv = await registry.get(alias_key(domain))
    if kv is None:
        raise NotFound(
            f"no alias {domain}; create it with corral alias set {domain} APP "
            "(corral alias ls lists the aliases there are)"
        )
    record = _decoded(kv)
    previous_kv = await registry.get(alias_previous_key(domain))
    previous = None if previous_kv is None else _decoded(previous_kv)
    if not isinstance(record, AliasRecord):
        raise OperationRefused(
            f"alias/{domain} holds a value this build cannot read ({record.reason}); "
            f"remove it with corral alias rm {domain}"
        )
    return (
        AliasView(
            domain,
            record.app,
            previous.app if isinstance(previous, AliasRecord) else None,
            kv.mod_revision,
        ),
        kv,
    )


async def _require_app_guard(registry: Registry, app: str) -> Compare:
    """A txn guard that the app still exists, once it is known to.

    Raises:
        NotFound: no app of that name.
    """
    key = app_key(app)
    if await registry.get(key) is None:
        raise NotFound(
            f"no app named {app!r}; an alias points at a deployed app "
            f"(corral deploy DIR --name {app}, or corral ps for the apps there are)"
        )
    return _app_exists(key)


async def set_alias(registry: Registry, domain: str, app: str) -> AliasView:
    """Create ``alias/<domain>`` -> ``app``, guarded on the alias and any app's claim
    on the domain being absent.

    Raises:
        OperationRefused: the alias exists (naming its target), or the domain is an
            app's.
        NotFound: no such app.
    """
    akey, pkey, ckey = alias_key(domain), alias_previous_key(domain), domain_key(domain)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        existing = await registry.get(akey)
        if existing is not None:
            raise OperationRefused(
                f"alias {domain} already exists and points at app {_alias_target(existing)}; "
                f"repoint it with corral alias flip {domain} {app}"
            )
        owner, claim = await _domain_owner(registry, domain)
        if owner is not None:
            raise OperationRefused(
                f"domain {domain} is app {owner}'s own domain; a domain is one app's or one "
                f"alias's: remove it there first (corral app domains --name {owner} "
                f"--remove {domain})"
            )
        guard = await _require_app_guard(registry, app)
        ops: list[TxnOp] = [Put(akey, AliasRecord(app).encode()), Delete(pkey)]
        if claim is not None:
            ops.append(Delete(ckey))  # a stale claim (see _domain_owner)
        result = await registry.txn([Compare.absent(akey), _guard_as_seen(ckey, claim), guard], ops)
        if result.succeeded:
            return AliasView(domain, app, None, result.revision)
    raise Conflict(f"alias/{domain} kept changing while this request tried to create it; try again")


async def flip_alias(
    registry: Registry, domain: str, app: str, *, expect: int | None = None
) -> FlipResult:
    """Point the alias at ``app`` and its ``previous`` at the app it pointed at, in
    one transaction guarded on the alias's revision as read (or as ``expect``
    says the caller saw it). Not retried: a lost race is reported.

    Raises:
        NotFound: no such alias, or no such app.
        Conflict: the alias changed since it was observed; the message names the
            app it points at now (the winner).
    """
    view, kv = await _read_alias(registry, domain)
    if expect is not None and view.revision != expect:
        raise Conflict(
            f"alias {domain} changed since revision {expect}: it now points at app "
            f"{view.app} (revision {view.revision}); nothing was written; look again "
            "(corral alias ls) and flip again if need be"
        )
    guard = await _require_app_guard(registry, app)
    if view.app == app:
        return FlipResult(view, flipped=False)
    result = await registry.txn(
        [Compare.mod_revision_is(kv.key, kv.mod_revision), guard],
        [Put(kv.key, AliasRecord(app).encode()), Put(alias_previous_key(domain), kv.value)],
    )
    if result.succeeded:
        return FlipResult(AliasView(domain, app, view.app, result.revision), flipped=True)
    now = await registry.get(kv.key)
    if now is None:
        raise NotFound(f"alias {domain} was removed while this flip ran; nothing was written")
    if now.mod_revision != kv.mod_revision:
        raise Conflict(
            f"alias {domain} was flipped to app {_alias_target(now)} by another writer while "
            f"this flip to {app} ran (it pointed at {view.app}); nothing was written; flip "
            f"again if {app} should still win"
        )
    await _require_app_guard(registry, app)  # the app went away meanwhile
    raise Conflict(f"alias {domain} changed while this flip ran; nothing was written; try again")


async def rollback_alias(
    registry: Registry, domain: str, *, expect: int | None = None
) -> FlipResult:
    """Flip the alias back to its ``previous`` app (which then becomes the previous).

    Raises:
        OperationRefused: the alias was never flipped, so it has no previous app.
        NotFound, Conflict: as :func:`flip_alias`.
    """
    view, _ = await _read_alias(registry, domain)
    if view.previous is None:
        raise OperationRefused(
            f"alias {domain} has no previous app to roll back to: it was set and never "
            f"flipped (it points at {view.app})"
        )
    return await flip_alias(
        registry, domain, view.previous, expect=view.revision if expect is None else expect
    )


async def remove_alias(registry: Registry, domain: str) -> str:
    """Remove ``alias/<domain>`` and its ``previous``; returns the app it pointed at.

    Raises:
        NotFound: there is no such alias.
    """
    akey = alias_key(domain)
    for _ in range(GUARDED_WRITE_ATTEMPTS):
        kv = await registry.get(akey)
        if kv is None:
            raise NotFound(f"no alias {domain}; corral alias ls lists the aliases there are")
        result = await registry.txn(
            [Compare.mod_revision_is(akey, kv.mod_revision)],
            [Delete(akey), Delete(alias_previous_key(domain))],
        )
        if result.succeeded:
            return _alias_target(kv)
    raise Conflict(f"alias/{domain} kept changing while this request tried to remove it; try again")


async def list_aliases(registry: Registry) -> tuple[list[AliasView], list[Undecodable]]:
    """Every alias, sorted by domain, and the alias keys whose value is unreadable."""
    targets: dict[str, tuple[str, int]] = {}
    previous: dict[str, str] = {}
    undecodable: list[Undecodable] = []
    for kv in await registry.range(ALIAS_PREFIX):
        record = _decoded(kv)
        if not isinstance(record, AliasRecord):
            undecodable.append(
                record if isinstance(record, Undecodable) else Undecodable(kv.key, "not an alias")
            )
            continue
        kind, parts = parse_key(kv.key)
        if kind is KeyKind.ALIAS:
            targets[parts[0]] = (record.app, kv.mod_revision)
        else:
            previous[parts[0]] = record.app
    views = [
        AliasView(domain, app, previous.get(domain), revision)
        for domain, (app, revision) in sorted(targets.items())
    ]
    return views, undecodable


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
