"""ScoreCache: the optional memo is an optimisation only, and it does save work."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

import corral.actors.planner as planner
from corral.actors.planner import (
    AppSpec,
    NodeCapacity,
    NodeInfo,
    Policy,
    ScoreCache,
    next_placements,
    plan,
)
from corral.actors.planner import _planner as planner_module
from corral.actors.planner._rank import rendezvous_score

NOW = 50_000.0


def fleet(count: int) -> list[NodeInfo]:
    return [
        NodeInfo(
            f"node-{i:03d}",
            labels={"region": "eu" if i % 2 else "us"},
            rack=f"r{i % 5}",
            datacenter=f"d{i % 3}",
            capacity=NodeCapacity(16384, 8000 + 37 * i, 102_400, 60_000),
        )
        for i in range(count)
    ]


def workload(count: int) -> list[AppSpec]:
    apps = []
    for i in range(count):
        selector = {"region": "eu"} if i % 3 == 0 else {}
        if i % 7 == 0:
            apps.append(AppSpec(f"app-{i:03d}", replicas="all", selector=selector))
        elif i % 5 == 0:
            apps.append(AppSpec(f"app-{i:03d}", replicas=1 + i % 3, memory_mb=256))
        else:
            apps.append(AppSpec(f"app-{i:03d}", replicas=1 + i % 3, selector=selector))
    return apps


def test_a_sequence_of_passes_decides_the_same_with_and_without_the_memo() -> None:
    apps, nodes = workload(120), fleet(30)
    cache = ScoreCache()
    placements: dict[str, Any] = {}
    sequence = [
        nodes,
        [*nodes, NodeInfo("node-new", labels={"region": "eu"}, rack="r9")],
        nodes[1:],
        [NodeInfo(n.id, state="suspect") if n.id == "node-007" else n for n in nodes[1:]],
        nodes[1:],
    ]
    for step, current in enumerate(sequence):
        now = NOW + 1000 * step
        with_memo = plan(apps, current, placements, Policy(), now, cache=cache)
        without = plan(apps, current, placements, Policy(), now)
        assert with_memo == without
        placements = next_placements(placements, without, now)
    assert len(cache) > 0


def test_after_one_node_joins_about_one_score_per_app_is_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    apps = [AppSpec(f"app-{i:03d}", replicas=2) for i in range(200)]
    nodes = fleet(40)
    cache = ScoreCache()
    first = plan(apps, nodes, {}, Policy(), NOW, cache=cache)
    placements = next_placements({}, first, NOW)

    calls = 0

    class Counting:
        """A sha256 that counts the digests taken: one per score, however it is hashed."""

        def __init__(self, state: Any) -> None:
            self.state = state

        def copy(self) -> Counting:
            return Counting(self.state.copy())

        def update(self, data: bytes) -> None:
            self.state.update(data)

        def digest(self) -> bytes:
            nonlocal calls
            calls += 1
            return bytes(self.state.digest())

    def counting_sha256(data: bytes = b"") -> Any:
        return Counting(hashlib.sha256(data))

    monkeypatch.setattr(planner_module, "_sha256", counting_sha256)
    joined = [*nodes, NodeInfo("node-new", rack="r1")]
    second = plan(apps, joined, placements, Policy(), NOW + 3600, cache=cache)
    # One score per app for the new node, plus a full ranking only for the few apps
    # that now rank it in their top two (40 scores each at most).
    moved = {app for app, node in second.additions}
    assert calls <= len(apps) + 41 * len(moved)
    assert calls < 200 * 41 / 4
    monkeypatch.undo()
    assert second == plan(apps, joined, placements, Policy(), NOW + 3600)


def test_a_low_scoring_node_in_a_new_rack_still_takes_its_place_with_the_memo() -> None:
    # Thirty nodes in one rack: the second replica's spread key is (1, 1). A node joining
    # in a rack of its own offers (0, 1) and must be chosen even though its score is far
    # below the top scores the memo keeps.
    nodes = [NodeInfo(f"n{i:02d}", rack="r1") for i in range(30)]
    app = AppSpec("web", replicas=2)
    ids = [n.id for n in nodes]
    joining = next(
        f"x{i}"
        for i in range(1000)
        if sorted([*ids, f"x{i}"], key=lambda n: rendezvous_score("web", n), reverse=True).index(
            f"x{i}"
        )
        > 20
    )
    cache = ScoreCache()
    first = plan([app], nodes, {}, Policy(), NOW, cache=cache)
    placements = next_placements({}, first, NOW)
    joined = [*nodes, NodeInfo(joining, rack="r2")]
    second = plan([app], joined, placements, Policy(), NOW + 3600, cache=cache)
    assert joining in second.placements["web"]
    assert second == plan([app], joined, placements, Policy(), NOW + 3600)


def test_a_copy_is_independent() -> None:
    apps, nodes = workload(40), fleet(12)
    cache = ScoreCache()
    first = plan(apps, nodes, {}, Policy(), NOW, cache=cache)
    placements = next_placements({}, first, NOW)
    twin = cache.copy()
    # A dry run on the copy, over a very different cluster...
    plan(apps, nodes[:3], placements, Policy(), NOW, cache=twin)
    # ...leaves the original memo as it was: it still answers like a fresh pass.
    joined = [*nodes, NodeInfo("node-new")]
    assert plan(apps, joined, placements, Policy(), NOW + 10, cache=cache) == plan(
        apps, joined, placements, Policy(), NOW + 10
    )


def test_clear_empties_the_memo() -> None:
    cache = ScoreCache()
    plan(workload(10), fleet(5), {}, Policy(), NOW, cache=cache)
    assert len(cache) > 0
    cache.clear()
    assert len(cache) == 0


def test_public_names_are_exported_sorted() -> None:
    expected = {
        "NODE_STATES", "AppSpec", "NodeCapacity", "Decisions", "Deferred", "InvalidPlanInput",
        "NodeInfo", "NodeState", "Pause", "Placement", "PlacementUnavailable", "PlanInput",
        "PlannerError", "Policy", "Refusal", "ScoreCache", "Stranded", "Unplaced", "allocatable",
        "decisions_to_json", "next_placements", "parse_plan_document", "plan", "plan_input",
        "reserved_by_placements",
    }  # fmt: skip
    assert set(planner.__all__) == expected
    assert all(hasattr(planner, name) for name in planner.__all__)

    # Sorted the way ruff's RUF022 sorts: CONSTANTS, then Classes, then functions.
    def kind(name: str) -> int:
        return 0 if name.isupper() else 1 if name[0].isupper() else 2

    assert planner.__all__ == sorted(planner.__all__, key=lambda n: (kind(n), n))


def test_errors_are_rooted_at_corral_error() -> None:
    from corral._errors import CorralError

    assert issubclass(planner.PlacementUnavailable, CorralError)
    assert issubclass(planner.InvalidPlanInput, planner.PlannerError)
    assert issubclass(planner.PlannerError, CorralError)
