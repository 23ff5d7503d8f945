"""A revision this node cannot get onto disk: tried again with a growing, capped wait
(never in a tight loop), shown failed with its reason meanwhile."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from corral.actors.process_supervisor import AppPaths
from corral.actors.reconciler import LastPass, RunPass
from corral.actors.reconciler._backoff import (
    FailedRevision,
    forget_settled,
    record_failure,
    retry_delay,
)
from corral.actors.reconciler._plan import serving_set
from corral.registry import Deployment

from .test_reconciler import NODE, R1, R2, deploy, place, running_agent


class RefusedArtifact(Exception):
    pass


class Materializer:
    """Refuses the revisions in ``refused`` (as a bomb would be), records each call."""

    def __init__(self, data_dir: Path, refused: set[str]) -> None:
        self.data_dir = data_dir
        self.refused = refused
        self.calls: list[tuple[float, str]] = []

    async def __call__(self, app: str, deployment: Deployment) -> Path:
        self.calls.append((trio.current_time(), deployment.revision))
        if deployment.revision in self.refused:
            raise RefusedArtifact("artifact: refused: too large (member 'zeros')")
        directory = AppPaths.of(self.data_dir, app).revision_dir(deployment.revision)
        directory.mkdir(parents=True, exist_ok=True)
        return directory


def agent_options(materializer: Materializer) -> dict[str, Any]:
    # Timer passes far apart, so every try below is one the backoff scheduled.
    return {"materialize": materializer, "interval": 10_000.0, "full_pass_every": 100_000.0}


async def test_a_refused_revision_is_retried_at_exact_growing_then_capped_waits(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    materializer = Materializer(tmp_path, {R1})
    async with running_agent(tmp_path, **agent_options(materializer)) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await trio.sleep(1)
        published = (await agent.node_record()).change_token
        await trio.sleep(1299)
        times = [t for t, _ in materializer.calls]
        gaps = [round(later - earlier, 6) for earlier, later in itertools.pairwise(times)]
        # each try comes at its wait plus the pass's 0.05 s debounce, not every 5 s pass
        assert gaps == [5.05, 10.05, 20.05, 40.05, 80.05, 160.05, 300.05, 300.05, 300.05]
        failures = [e for e in agent.system.events() if e.kind == "reconcile.unpack_failed"]
        assert [e.fields["attempts"] for e in failures] == list(range(1, 11))
        assert agent.launcher.spawned == []
        last = await agent.reconciler.ask(LastPass())
        (failed,) = last["failed"]
        assert failed["app"] == "hello"
        assert failed["revision"] == R1
        assert failed["attempts"] == 10
        assert "too large (member 'zeros')" in failed["reason"]
        assert 0 < failed["retry_in"] <= 300
        # published in the node record, so every node's ps shows it
        record = await agent.node_record()
        assert record.change_token == published  # retries change nothing to publish
        entry = record.serving["hello"]
        assert (entry.state, entry.revision, entry.public_port) == ("failed", R1, 0)
        assert entry.reason == (
            f"cannot get revision {R1[:12]} onto disk: "
            "artifact: refused: too large (member 'zeros')"
        )


async def test_a_pass_in_between_holds_the_start_back_and_reports_it_failed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    materializer = Materializer(tmp_path, {R1})
    async with running_agent(tmp_path, **agent_options(materializer)) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await trio.sleep(1)
        assert len(materializer.calls) == 1
        summary = await agent.reconciler.ask(RunPass(force=True))
        assert len(materializer.calls) == 1  # not tried again
        (action,) = summary["actions"]
        assert action["deferred"] is True
        assert action["ok"] is False
        assert "failed to get onto disk 1 time(s) in a row" in action["error"]
        assert "too large (member 'zeros')" in action["error"]
        assert summary["errors"] == []
        assert [f["app"] for f in summary["failed"]] == ["hello"]


async def test_a_new_revision_is_tried_at_once_and_success_forgets_the_failure(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    materializer = Materializer(tmp_path, {R1})
    async with running_agent(tmp_path, **agent_options(materializer)) as agent:
        await deploy(agent.registry, "hello")
        await place(agent.registry, "hello", NODE)
        await trio.sleep(1)
        await deploy(agent.registry, "hello", R2)  # the fix, deployed within the wait
        await trio.sleep(1)
        assert [revision for _, revision in materializer.calls] == [R1, R2]
        assert len(agent.launcher.alive()) == 1
        assert (await agent.reconciler.ask(LastPass()))["failed"] == []
        entry = (await agent.node_record()).serving["hello"]
        assert (entry.revision, entry.state, entry.reason) == (R2, "running", "")


async def test_an_app_that_fails_does_not_hold_back_another(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    materializer = Materializer(tmp_path, {R1})
    async with running_agent(tmp_path, **agent_options(materializer)) as agent:
        await deploy(agent.registry, "bomb")
        await deploy(agent.registry, "good", R2)
        await place(agent.registry, "bomb", NODE)
        await place(agent.registry, "good", NODE)
        await trio.sleep(30)
        (running,) = agent.launcher.alive()
        assert running.spec.app == "good"
        assert [f["app"] for f in (await agent.reconciler.ask(LastPass()))["failed"]] == ["bomb"]


# --------------------------------------------------------------------------- pure


@given(base=st.floats(0.1, 60), cap=st.floats(1, 3600), attempts=st.integers(1, 10_000))
def test_retry_delay_starts_at_base_doubles_and_never_passes_the_cap(
    base: float, cap: float, attempts: int
) -> None:
    delay = retry_delay(attempts, base, cap)
    assert delay <= cap
    assert retry_delay(1, base, cap) == min(base, cap)
    assert retry_delay(attempts + 1, base, cap) >= delay
    if attempts < 60:
        assert delay == min(cap, base * 2 ** (attempts - 1))


@given(
    revisions=st.lists(st.sampled_from([R1, R2]), min_size=1, max_size=20),
    now=st.floats(0, 1e6),
)
def test_attempts_count_failures_in_a_row_of_one_revision(revisions: list[str], now: float) -> None:
    record: FailedRevision | None = None
    run = 0
    for index, revision in enumerate(revisions):
        run = run + 1 if index and revisions[index - 1] == revision else 1
        record = record_failure(record, "app", revision, "refused", now)
        assert record.attempts == run
        assert record.retry_at == now + retry_delay(run)
        assert record.waiting(revision, now)
        assert not record.waiting(revision, record.retry_at)


def test_forget_settled_keeps_only_failures_still_wanted_here() -> None:
    one = record_failure(None, "a", R1, "x", 0.0)
    two = record_failure(None, "b", R1, "x", 0.0)
    three = record_failure(None, "c", R1, "x", 0.0)
    kept = forget_settled({"a": one, "b": two, "c": three}, {"a": R1, "b": R2})
    assert kept == {"a": one}  # b was redeployed, c is no longer to run here


def test_retry_delay_refuses_a_zeroth_attempt() -> None:
    with pytest.raises(ValueError, match="from 1"):
        retry_delay(0)


def test_the_serving_set_shows_an_unpack_failure_unless_a_process_still_runs() -> None:
    failures = [record_failure(None, "new", R1, "refused", 0.0)]
    old = record_failure(None, "old", R2, "refused", 0.0)
    running = {
        "app": "old",
        "revision": R1,
        "state": "running",
        "public_port": 24001,
        "internal_port": 24002,
    }
    serving = serving_set([running], [*failures, old])
    assert serving["new"].state == "failed"
    assert (serving["new"].public_port, serving["new"].internal_port) == (0, 0)
    assert serving["new"].reason == f"cannot get revision {R1[:12]} onto disk: refused"
    # the old revision keeps serving while the new one cannot be unpacked
    assert (serving["old"].state, serving["old"].revision) == ("running", R1)
