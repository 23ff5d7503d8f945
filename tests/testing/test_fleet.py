"""The fleet simulator: full nodes on virtual time, seeded fault schedules, and an
invariant checker that stays quiet on a healthy fleet and speaks on a broken one."""

from __future__ import annotations

import itertools
import os
from typing import Literal

import pytest
import trio

from corral.actors.planner import Policy
from corral.registry import AppRecord, Deployment, PlacementRecord, placement_key
from corral.testing import Fault, FaultKind, open_fleet, random_faults

R1 = "1" * 64
SURVIVABLE: tuple[FaultKind, ...] = ("kill", "stall", "partition", "registry-outage")
SEEDS = [int(s) for s in os.environ.get("CORRAL_FLEET_SEEDS", "1,2").split(",")]


def app(name: str, replicas: int | Literal["all"]) -> AppRecord:
    return AppRecord(name, replicas=replicas, deployment=Deployment(R1, ["python3", "app.py"]))


def test_a_schedule_is_a_function_of_its_seed() -> None:
    nodes = [f"n{i}" for i in range(9)]
    first = random_faults(7, nodes, count=8)
    assert first == random_faults(7, nodes, count=8)
    assert first != random_faults(8, nodes, count=8)
    assert len({f.node for f in first}) <= 3  # a third of the nodes at most
    by_node: dict[str, list[Fault]] = {}
    for fault in first:
        by_node.setdefault(fault.node, []).append(fault)
    for faults in by_node.values():  # never two faults at once on one node
        for a, b in itertools.pairwise(faults):
            assert a.at + a.duration <= b.at
    with pytest.raises(ValueError, match="at least one node"):
        random_faults(1, [])


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_fault_schedule_breaks_no_invariant(
    autojump_clock: trio.testing.MockClock, seed: int
) -> None:
    # A short grace: nodes down for longer have their work relocated mid-schedule.
    policy = Policy(grace_period_s=10.0)
    async with open_fleet(6, racks=3, lease_ttl=15.0, policy=policy) as fleet:
        await fleet.cluster.wait_for_coordinator()
        for i in range(8):
            await fleet.put_app(app(f"app-{i}", 1 if i % 3 == 0 else 2))
        await fleet.put_app(app("everywhere", "all"))
        await trio.sleep(30)
        nodes = sorted(fleet.cluster.nodes)
        faults = random_faults(seed, nodes, count=6, span=120, max_duration=40, kinds=SURVIVABLE)
        assert faults
        await fleet.run_faults(faults)
        await trio.sleep(120)  # healed: let the fleet settle
        missing = fleet.checker.check_converged()
        assert not fleet.violations, (
            f"seed {seed} (replay with CORRAL_FLEET_SEEDS={seed}): "
            + "; ".join(str(v) for v in fleet.violations)
            + f"; faults {faults}"
        )
        assert not missing


async def test_the_checker_reports_a_write_under_a_stale_fence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_fleet(3) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", 1))
        await trio.sleep(20)
        placement = await fleet.cluster.placement("web")
        assert placement is not None
        # A coordinator that lost its lease long ago writes anyway.
        stale = PlacementRecord(placement.nodes, 0.0, fence=0)
        await fleet.cluster.registry.put(placement_key("web"), stale.encode())
        await trio.sleep(1)
        assert [v.invariant for v in fleet.violations] == ["fence"]


async def test_the_checker_reports_an_app_on_too_many_nodes_too_long(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_fleet(3, lease_ttl=15.0, overlap_window=5.0) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", 3))
        await trio.sleep(20)
        assert len(fleet.cluster.instances()["web"]) == 3
        # Tell the checker the app wants one replica: running on three is too many.
        fleet.checker.expect(app("web", 1))
        await trio.sleep(10)
        assert [v.invariant for v in fleet.violations] == ["overlap"]


async def test_a_node_killed_and_restarted_within_its_lease_runs_its_apps_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Policy(grace_period_s=10.0)
    async with open_fleet(6, racks=3, lease_ttl=15.0, policy=policy) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("everywhere", "all"))
        await trio.sleep(30)
        await fleet.run_faults([Fault(0.0, "kill", "n4", 9.2)])
        await trio.sleep(120)
        assert fleet.checker.check_converged() == []


async def test_the_checker_reports_a_restart_that_neither_moved_nor_crashed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_fleet(3) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", 1))
        await trio.sleep(20)
        [host] = fleet.cluster.instances()["web"]
        launcher = fleet.cluster.node(host).launcher
        # A crash is a reason: the supervisor starts it again, and that is no violation.
        [first] = launcher.alive()
        first.exit(1)
        await trio.sleep(20)
        [second] = launcher.alive()
        assert second.pid != first.pid
        assert fleet.violations == []
        # Stopped by SIGTERM, as only corral stops it, with nothing moved or redeployed.
        await second.stop(5.0)
        await trio.sleep(20)
        assert len(launcher.alive()) == 1
        assert [v.invariant for v in fleet.violations] == ["restart"]


async def test_a_redeploy_and_a_move_are_no_restart_violation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_fleet(3, lease_ttl=15.0) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", "all"))
        await trio.sleep(20)
        await fleet.put_app(
            AppRecord("web", replicas="all", deployment=Deployment("2" * 64, ["python3", "v2"]))
        )
        await trio.sleep(30)
        revisions = {
            p.spec.revision for node in fleet.cluster.nodes.values() for p in node.launcher.alive()
        }
        assert len(revisions) == 1
        assert len(fleet.cluster.instances()["web"]) == 3
        assert fleet.violations == []


async def test_the_checker_reports_a_relocation_within_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The coordinator relocates as soon as a record lapses (grace 0), while the operator
    # (the checker) expects a down node to keep its work for 60 s.
    policy = Policy(grace_period_s=0.0)
    async with open_fleet(3, lease_ttl=15.0, policy=policy, grace=60.0) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", 1))
        await trio.sleep(20)
        [host] = fleet.cluster.instances()["web"]
        await fleet.run_faults([Fault(0.0, "kill", host, 40.0)])
        assert [v.invariant for v in fleet.violations] == ["relocation"]
        assert host in fleet.violations[0].detail


async def test_a_relocation_after_the_grace_is_no_violation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Policy(grace_period_s=10.0)
    async with open_fleet(3, lease_ttl=15.0, policy=policy) as fleet:
        await fleet.cluster.wait_for_coordinator()
        await fleet.put_app(app("web", 1))
        await trio.sleep(20)
        [host] = fleet.cluster.instances()["web"]
        await fleet.run_faults([Fault(0.0, "kill", host, 60.0)])
        placement = await fleet.cluster.placement("web")
        assert placement is not None
        assert host not in placement.nodes
        assert fleet.violations == []
