"""What a deploy and a rollback leave in the app record: the revision, the previous
deployment, and the rollout options (pure, and one guarded write)."""

from __future__ import annotations

import pytest

from corral.node import NotFound, OperationRefused
from corral.node._requests import DeployRequest
from corral.node.server._operations import apply_deploy, apply_rollback, rollback
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    RolloutOptions,
    app_key,
    decode_record,
)
from corral.registry._records import deployment_revision

A, B = "a" * 64, "b" * 64


def deploy(
    current: AppRecord | None,
    digest: str = A,
    *,
    env: dict[str, str] | None = None,
    memory_mb: int | None = None,
    max_parallel: int | None = None,
    drain_ms: int | None = None,
) -> AppRecord:
    request = DeployRequest(
        name="shop",
        artifact=b"",
        env=env,
        memory_mb=memory_mb,
        max_parallel=max_parallel,
        drain_ms=drain_ms,
    )
    return apply_deploy(current, request, Deployment.of(digest, ["run"], env or {}))


def test_the_revision_covers_the_resources_the_app_ends_with() -> None:
    first = deploy(None, memory_mb=64)
    assert first.deployment is not None
    assert first.deployment.revision == deployment_revision(A, ["run"], {}, memory_mb=64)
    assert (first.deployment.memory_mb, first.deployment.digest) == (64, A)
    # a redeploy that names no resources keeps the app's, so the same revision
    again = deploy(first)
    assert again.deployment is not None
    assert again.deployment.revision == first.deployment.revision
    assert again.previous_deployment is None  # an identical redeploy replaces nothing


def test_a_new_revision_keeps_the_one_it_replaces_and_a_rollback_swaps_them() -> None:
    first = deploy(None, env={"GREETING": "hello"})
    second = deploy(first, env={"GREETING": "hi"}, memory_mb=32)
    assert second.previous_deployment == first.deployment
    back = apply_rollback(second)
    assert back.deployment == first.deployment
    assert back.previous_deployment == second.deployment
    assert back.memory_mb == 0  # the resources the previous revision ran with
    assert apply_rollback(back) == second
    assert first.deployment is not None
    assert second.deployment is not None
    assert second.deployment_at(first.deployment.revision) == first.deployment
    assert second.deployment_at(second.deployment.revision) == second.deployment
    assert second.deployment_at(B) is None


def test_a_rollback_with_nothing_to_go_back_to_is_refused() -> None:
    with pytest.raises(OperationRefused, match="no previous revision"):
        apply_rollback(deploy(None))


def test_rollout_options_named_replace_the_others_stay() -> None:
    first = deploy(None, max_parallel=3)
    assert first.rollout == RolloutOptions(max_parallel=3)
    second = deploy(first, drain_ms=0)
    assert second.rollout == RolloutOptions(max_parallel=3, drain_ms=0)
    assert second.deployment == first.deployment  # not a new revision


async def test_rollback_writes_the_swap_and_refuses_an_unknown_app() -> None:
    registry = MemoryRegistry()
    second = deploy(deploy(None), B)
    await registry.put(app_key("shop"), second.encode())
    written = await rollback(registry, "shop")
    kv = await registry.get(app_key("shop"))
    assert kv is not None
    assert decode_record(kv.key, kv.value) == written
    assert written.deployment is not None
    assert written.deployment.digest == A
    with pytest.raises(NotFound):
        await rollback(registry, "nope")
