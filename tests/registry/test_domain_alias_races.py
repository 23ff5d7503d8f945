"""Domain claims and aliases on every registry backend (memory, SQLite, etcd).

The races are made certain, not hoped for: :class:`ReadBarrier` holds every
reader of one key until all the racers have read it, so each has observed the
same state before any of them writes, and then exactly one transaction can win.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
import trio

from corral.node import Conflict, NotFound, OperationRefused
from corral.node._requests import DeployRequest
from corral.node.artifacts import Manifest
from corral.node.server import _operations as ops
from corral.registry import (
    AliasRecord,
    AppRecord,
    Compare,
    Deployment,
    DomainClaim,
    KeyValue,
    Registry,
    TxnOp,
    TxnResult,
    alias_key,
    alias_previous_key,
    app_key,
    decode_record,
    domain_key,
)
from corral.testing import RegistryGate, RegistryHarness

DOMAIN = "shop.example"
#: Bounds a test whose racers would otherwise wait on each other forever.
RACE_TIMEOUT_S = 30


class ReadBarrier(RegistryGate):
    """A registry whose ``get`` of ``key`` returns to no reader until ``parties``
    readers have read it (later reads, and every other call, pass straight through)."""

    def __init__(self, inner: Registry, key: str, parties: int) -> None:
        super().__init__(inner, name="racer")
        self._key = key
        self._parties = parties
        self._readers = 0
        self._all_read = trio.Event()

    async def get(self, key: str) -> KeyValue | None:
        kv = await self.inner.get(key)
        if key == self._key and not self._all_read.is_set():
            self._readers += 1
            if self._readers >= self._parties:
                self._all_read.set()
            await self._all_read.wait()
        return kv


async def store(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def inspect(data: bytes) -> Manifest:
    return Manifest(command=("python3", "server.py"))


def deploy_request(name: str, domains: Sequence[str] | None) -> DeployRequest:
    return DeployRequest(
        name=name,
        artifact=f"artifact of {name}".encode(),
        domains=None if domains is None else tuple(domains),
    )


async def put_app(registry: Registry, name: str, domains: Sequence[str] = ()) -> None:
    deployment = Deployment(revision="0" * 64, command=["true"])
    await registry.put(
        app_key(name), AppRecord(name=name, domains=list(domains), deployment=deployment).encode()
    )


async def read(registry: Registry, key: str) -> object:
    kv = await registry.get(key)
    return None if kv is None else decode_record(kv.key, kv.value)


async def race(*calls: object) -> tuple[object, BaseException]:
    """Run the zero-argument async callables concurrently; exactly one must return
    and exactly one be refused: ``(what the winner returned, the loser's error)``."""
    outcomes: list[BaseException | object] = [None] * len(calls)

    async def one(index: int, call: object) -> None:
        try:
            outcomes[index] = await call()  # type: ignore[operator]
        except (Conflict, NotFound, OperationRefused) as exc:
            outcomes[index] = exc

    with trio.fail_after(RACE_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for index, call in enumerate(calls):
                nursery.start_soon(one, index, call)
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert (len(won), len(lost)) == (1, 1), outcomes
    return won[0], lost[0]


# --------------------------------------------------------------------------- races


async def test_of_two_concurrent_flips_exactly_one_wins_and_the_loser_names_it(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    for name in ("blue", "green", "red"):
        await put_app(registry, name)
    await ops.set_alias(registry, DOMAIN, "blue")
    racing = ReadBarrier(registry, alias_key(DOMAIN), parties=2)

    winner, loser = await race(
        lambda: ops.flip_alias(racing, DOMAIN, "green"),
        lambda: ops.flip_alias(racing, DOMAIN, "red"),
    )

    assert isinstance(winner, ops.FlipResult)
    assert winner.flipped
    assert isinstance(loser, Conflict)
    assert f"flipped to app {winner.alias.app} by another writer" in str(loser)
    assert await read(registry, alias_key(DOMAIN)) == AliasRecord(winner.alias.app)
    assert await read(registry, alias_previous_key(DOMAIN)) == AliasRecord("blue")


async def test_of_two_deploys_claiming_one_domain_exactly_one_wins(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    racing = ReadBarrier(registry, domain_key(DOMAIN), parties=2)

    winner, loser = await race(
        lambda: ops.deploy(racing, deploy_request("shop", [DOMAIN]), store, 1.0, inspect=inspect),
        lambda: ops.deploy(racing, deploy_request("store", [DOMAIN]), store, 1.0, inspect=inspect),
    )

    assert isinstance(winner, ops.DeployResult)
    loser_name = "store" if winner.app.name == "shop" else "shop"
    assert isinstance(loser, OperationRefused)
    assert f"domain {DOMAIN} already belongs to app {winner.app.name}" in str(loser)
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim(winner.app.name)
    assert await registry.get(app_key(loser_name)) is None  # the losing deploy wrote nothing


async def test_of_two_apps_adding_one_domain_exactly_one_wins(backend: RegistryHarness) -> None:
    registry = backend.registry
    await put_app(registry, "shop")
    await put_app(registry, "store")
    racing = ReadBarrier(registry, domain_key(DOMAIN), parties=2)

    winner, loser = await race(
        lambda: ops.set_domains(racing, "shop", add=[DOMAIN]),
        lambda: ops.set_domains(racing, "store", add=[DOMAIN]),
    )

    assert isinstance(winner, AppRecord)
    assert winner.domains == [DOMAIN]
    assert f"already belongs to app {winner.name}" in str(loser)
    owners = [
        name
        for name in ("shop", "store")
        if DOMAIN in (await ops._read_app(registry, name))[0].domains  # type: ignore[union-attr]
    ]
    assert owners == [winner.name]


async def test_of_two_concurrent_alias_sets_exactly_one_wins(backend: RegistryHarness) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await put_app(registry, "green")
    racing = ReadBarrier(registry, alias_key(DOMAIN), parties=2)

    winner, loser = await race(
        lambda: ops.set_alias(racing, DOMAIN, "blue"),
        lambda: ops.set_alias(racing, DOMAIN, "green"),
    )

    assert isinstance(winner, ops.AliasView)
    assert isinstance(loser, OperationRefused)
    assert f"already exists and points at app {winner.app}" in str(loser)


async def test_an_alias_and_an_app_racing_for_one_domain_cannot_both_win(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await put_app(registry, "shop")
    # Both read the claim key: the alias's set and the app's claim.
    racing = ReadBarrier(registry, domain_key(DOMAIN), parties=2)

    winner, loser = await race(
        lambda: ops.set_alias(racing, DOMAIN, "blue"),
        lambda: ops.set_domains(racing, "shop", add=[DOMAIN]),
    )

    alias = await read(registry, alias_key(DOMAIN))
    claim = await read(registry, domain_key(DOMAIN))
    if isinstance(winner, ops.AliasView):
        assert (alias, claim) == (AliasRecord("blue"), None)
    else:
        assert isinstance(winner, AppRecord)
        assert winner.domains == [DOMAIN]
        assert (alias, claim) == (None, DomainClaim("shop"))
    assert isinstance(loser, OperationRefused)
    assert "a domain is one app's or one alias's" in str(loser)


# --------------------------------------------------------------------------- aliases


async def test_alias_set_on_an_existing_alias_is_refused_naming_its_target(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await put_app(registry, "green")
    created = await ops.set_alias(registry, DOMAIN, "blue")
    assert created == ops.AliasView(DOMAIN, "blue", None, created.revision)
    with pytest.raises(OperationRefused, match="already exists and points at app blue"):
        await ops.set_alias(registry, DOMAIN, "green")
    assert await read(registry, alias_key(DOMAIN)) == AliasRecord("blue")


async def test_a_set_or_flip_to_an_app_that_does_not_exist_is_refused(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    with pytest.raises(NotFound, match="no app named 'ghost'"):
        await ops.set_alias(registry, DOMAIN, "ghost")
    assert await registry.get(alias_key(DOMAIN)) is None
    await put_app(registry, "blue")
    await ops.set_alias(registry, DOMAIN, "blue")
    with pytest.raises(NotFound, match="no app named 'ghost'"):
        await ops.flip_alias(registry, DOMAIN, "ghost")
    assert await read(registry, alias_key(DOMAIN)) == AliasRecord("blue")
    assert await registry.get(alias_previous_key(DOMAIN)) is None
    with pytest.raises(NotFound, match=r"no alias other\.example"):
        await ops.flip_alias(registry, "other.example", "blue")


async def test_rollback_flips_to_previous_and_back(backend: RegistryHarness) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await put_app(registry, "green")
    await ops.set_alias(registry, DOMAIN, "blue")
    with pytest.raises(OperationRefused, match="no previous app to roll back to"):
        await ops.rollback_alias(registry, DOMAIN)

    flipped = await ops.flip_alias(registry, DOMAIN, "green")
    assert (flipped.alias.app, flipped.alias.previous, flipped.flipped) == ("green", "blue", True)
    back = await ops.rollback_alias(registry, DOMAIN)
    assert (back.alias.app, back.alias.previous) == ("blue", "green")
    assert await read(registry, alias_key(DOMAIN)) == AliasRecord("blue")
    assert await read(registry, alias_previous_key(DOMAIN)) == AliasRecord("green")
    again = await ops.rollback_alias(registry, DOMAIN)
    assert (again.alias.app, again.alias.previous) == ("green", "blue")

    same = await ops.flip_alias(registry, DOMAIN, "green")
    assert not same.flipped  # already there: nothing written
    assert same.alias.revision == again.alias.revision


async def test_a_flip_guarded_on_a_stale_revision_is_refused_naming_the_target(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    for name in ("blue", "green", "red"):
        await put_app(registry, name)
    seen = await ops.set_alias(registry, DOMAIN, "blue")
    await ops.flip_alias(registry, DOMAIN, "green", expect=seen.revision)
    with pytest.raises(Conflict, match="it now points at app green"):
        await ops.flip_alias(registry, DOMAIN, "red", expect=seen.revision)
    assert await read(registry, alias_key(DOMAIN)) == AliasRecord("green")


async def test_remove_and_list_aliases(backend: RegistryHarness) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await put_app(registry, "green")
    await ops.set_alias(registry, "a.example", "blue")
    await ops.set_alias(registry, DOMAIN, "blue")
    flipped = await ops.flip_alias(registry, DOMAIN, "green")
    views, undecodable = await ops.list_aliases(registry)
    assert undecodable == []
    assert [(v.domain, v.app, v.previous) for v in views] == [
        ("a.example", "blue", None),
        (DOMAIN, "green", "blue"),
    ]
    assert views[1].revision == flipped.alias.revision

    assert await ops.remove_alias(registry, DOMAIN) == "green"
    assert await registry.get(alias_key(DOMAIN)) is None
    assert await registry.get(alias_previous_key(DOMAIN)) is None
    with pytest.raises(NotFound, match=f"no alias {DOMAIN}"):
        await ops.remove_alias(registry, DOMAIN)
    # Set again after a remove: a fresh alias, with no previous from its former life.
    again = await ops.set_alias(registry, DOMAIN, "green")
    assert again.previous is None
    assert again.revision > flipped.alias.revision


# --------------------------------------------------------------------------- domains


async def test_a_redeploy_without_domains_keeps_them_and_with_domains_replaces_them(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    first = await ops.deploy(
        registry, deploy_request("shop", [DOMAIN, "a.example"]), store, 1.0, inspect=inspect
    )
    assert first.app.domains == ["a.example", DOMAIN]
    kept = await ops.deploy(registry, deploy_request("shop", None), store, 2.0, inspect=inspect)
    assert kept.app.domains == ["a.example", DOMAIN]
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim("shop")

    replaced = await ops.deploy(
        registry, deploy_request("shop", ["b.example"]), store, 3.0, inspect=inspect
    )
    assert replaced.app.domains == ["b.example"]
    assert await registry.get(domain_key(DOMAIN)) is None  # released
    assert await registry.get(domain_key("a.example")) is None
    assert await read(registry, domain_key("b.example")) == DomainClaim("shop")


async def test_a_claimed_domain_is_refused_naming_the_owner_until_released(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    await put_app(registry, "store")
    await ops.deploy(registry, deploy_request("shop", [DOMAIN]), store, 1.0, inspect=inspect)
    with pytest.raises(OperationRefused, match=f"domain {DOMAIN} already belongs to app shop"):
        await ops.set_domains(registry, "store", add=[DOMAIN])
    with pytest.raises(OperationRefused, match="already belongs to app shop"):
        await ops.deploy(registry, deploy_request("store", [DOMAIN]), store, 1.0, inspect=inspect)
    with pytest.raises(OperationRefused, match="is app shop's own domain"):
        await ops.set_alias(registry, DOMAIN, "store")

    with pytest.raises(NotFound, match=r"app shop has no domain x\.example"):
        await ops.set_domains(registry, "shop", remove=["x.example"])
    assert (await ops.set_domains(registry, "shop", remove=[DOMAIN])).domains == []
    assert (await ops.set_domains(registry, "store", add=[DOMAIN])).domains == [DOMAIN]
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim("store")

    await ops.delete_app(registry, "store")  # deleting the app releases its domains
    assert await registry.get(domain_key(DOMAIN)) is None
    assert (await ops.set_domains(registry, "shop", add=[DOMAIN])).domains == [DOMAIN]
    assert (await ops.set_domains(registry, "shop", clear=True)).domains == []
    assert await registry.get(domain_key(DOMAIN)) is None


async def test_an_alias_domain_cannot_become_an_apps_domain(backend: RegistryHarness) -> None:
    registry = backend.registry
    await put_app(registry, "blue")
    await ops.set_alias(registry, DOMAIN, "blue")
    with pytest.raises(OperationRefused, match=f"domain {DOMAIN} is an alias pointing at app blue"):
        await ops.deploy(registry, deploy_request("shop", [DOMAIN]), store, 1.0, inspect=inspect)
    assert await registry.get(app_key("shop")) is None
    assert await registry.get(domain_key(DOMAIN)) is None


async def test_a_stale_claim_is_replaced_by_the_next_claimant(backend: RegistryHarness) -> None:
    """A claim naming an app that no longer lists the domain (written by hand, or
    left by an older build) does not lock the domain forever."""
    registry = backend.registry
    await put_app(registry, "gone-owner")  # exists, but does not list the domain
    await registry.put(domain_key(DOMAIN), DomainClaim("gone-owner").encode())
    await registry.put(domain_key("a.example"), DomainClaim("never-was").encode())
    await registry.put(domain_key("b.example"), b"not json")
    result = await ops.deploy(
        registry,
        deploy_request("shop", [DOMAIN, "a.example", "b.example"]),
        store,
        1.0,
        inspect=inspect,
    )
    assert result.app.domains == ["a.example", "b.example", DOMAIN]
    for domain in result.app.domains:
        assert await read(registry, domain_key(domain)) == DomainClaim("shop")
    await put_app(registry, "blue")
    await registry.put(domain_key("c.example"), DomainClaim("never-was").encode())
    await ops.set_alias(registry, "c.example", "blue")
    assert await registry.get(domain_key("c.example")) is None


async def test_claims_left_by_another_app_are_kept_while_it_lists_them(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    await put_app(registry, "shop", [DOMAIN])
    await registry.put(domain_key(DOMAIN), DomainClaim("shop").encode())
    await put_app(registry, "store")
    with pytest.raises(OperationRefused, match="already belongs to app shop"):
        await ops.set_domains(registry, "store", add=[DOMAIN])
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim("shop")
    # An unrelated write that leaves the domain in place touches no claim.
    assert (await ops.set_replicas(registry, "shop", 2)).domains == [DOMAIN]
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim("shop")


async def test_the_claim_and_the_record_are_one_transaction(backend: RegistryHarness) -> None:
    """A deploy that loses its app-record guard writes no claim either."""
    registry = backend.registry
    await put_app(registry, "shop")

    class OneRacingWrite(ReadBarrier):
        """Before the first txn, someone else rewrites apps/shop (bumping its version)."""

        raced = False

        async def txn(
            self,
            compares: Sequence[Compare],
            on_success: Sequence[TxnOp],
            on_failure: Sequence[TxnOp] = (),
        ) -> TxnResult:
            if not self.raced:
                self.raced = True
                kv = await registry.get(app_key("shop"))
                assert kv is not None
                await registry.put(app_key("shop"), kv.value)
                result = await registry.txn(compares, on_success, on_failure)
                assert not result.succeeded
                assert await registry.get(domain_key(DOMAIN)) is None
                return result
            return await registry.txn(compares, on_success, on_failure)

    racing = OneRacingWrite(registry, "", parties=1)
    app = await ops.set_domains(racing, "shop", add=[DOMAIN])
    assert racing.raced
    assert app.domains == [DOMAIN]
    assert await read(registry, domain_key(DOMAIN)) == DomainClaim("shop")


async def test_a_record_listing_a_non_domain_can_still_be_cleared_and_deleted(
    backend: RegistryHarness,
) -> None:
    registry = backend.registry
    await put_app(registry, "shop", ["Not A Domain", DOMAIN])
    assert (await ops.set_domains(registry, "shop", clear=True)).domains == []
    await put_app(registry, "shop", ["Not A Domain"])
    await ops.delete_app(registry, "shop")
    assert await registry.get(app_key("shop")) is None
