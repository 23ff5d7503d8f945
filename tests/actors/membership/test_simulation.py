"""Whole-cluster properties of the pure machine, on the deterministic simulator."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.membership import MemberState, SwimConfig, SwimSimulation, suspicion_bounds

LAN = SwimConfig()
_configs = st.sampled_from([LAN, LAN.plain()])


def cluster(n: int, config: SwimConfig, seed: int, **kwargs: object) -> SwimSimulation:
    sim = SwimSimulation([f"n{i:02d}" for i in range(n)], config, seed=seed, **kwargs)  # type: ignore[arg-type]
    sim.start(spread=1.0)
    return sim


def all_alive(sim: SwimSimulation) -> bool:
    live = set(sim.live())
    return all(
        {n for n, s in view.items() if s is MemberState.ALIVE} >= live
        for view in sim.views().values()
    )


@settings(max_examples=12)
@given(st.integers(2, 16), _configs, st.integers(0, 2**16))
def test_with_no_faults_no_member_is_ever_suspected(n: int, config: SwimConfig, seed: int) -> None:
    sim = cluster(n, config, seed, wire=True)
    sim.run_until(90.0)
    assert [o for o in sim.observed if o.transition.state is not MemberState.ALIVE] == []
    assert all_alive(sim)
    assert all(machine.health == 0 for machine in sim.machines.values())


@settings(max_examples=10)
@given(st.integers(3, 20), _configs, st.integers(0, 2**16), st.data())
def test_a_killed_member_is_declared_down_by_every_live_member_within_the_bound(
    n: int, config: SwimConfig, seed: int, data: st.DataObject
) -> None:
    sim = cluster(n, config, seed)
    sim.run_until(20.0)
    # Gossip alone may miss a member now and then (seed 319, n=5: n01 had not heard
    # of n03 at 20 s); the periodic push-pull completes every view. Only then does
    # every member know the victim, and so can declare it down.
    deadline = sim.now + 2 * config.push_pull_interval
    while not all_alive(sim) and sim.now < deadline:
        sim.run_for(1.0)
    assert all_alive(sim), "views never completed through push-pull"
    victim = data.draw(st.sampled_from(sim.live()))
    sim.kill(victim)
    killed_at = sim.now
    # Every live member probes the victim within one round (n - 1 periods); its
    # suspicion then lasts at most the maximum timeout; gossip adds a little.
    _, longest, _ = suspicion_bounds(config, n)
    bound = (n + 1) * config.probe_interval + longest + 5.0
    sim.run_until(killed_at + bound)
    for observer in sim.live():
        assert sim.state_of(observer, victim) is MemberState.DEAD, observer
    downs = [
        o
        for o in sim.observed
        if o.transition.node == victim and o.transition.state is MemberState.DEAD
    ]
    assert {o.observer for o in downs} == set(sim.live())
    assert max(o.transition.at for o in downs) - killed_at <= bound
    # Nobody else was declared down.
    assert {o.transition.node for o in sim.observed if o.transition.state is MemberState.DEAD} == {
        victim
    }


@settings(max_examples=6)
@given(st.integers(4, 12), _configs, st.integers(0, 2**16))
def test_views_converge_after_a_partition_heals(n: int, config: SwimConfig, seed: int) -> None:
    sim = cluster(n, config, seed)
    sim.run_until(15.0)
    nodes = sim.live()
    left, right = nodes[: n // 2], nodes[n // 2 :]
    sim.partition(left, right)
    sim.run_for(120.0)
    # Each side has declared the other down.
    assert sim.state_of(left[0], right[0]) is MemberState.DEAD
    assert sim.state_of(right[0], left[0]) is MemberState.DEAD
    sim.heal()
    sim.run_for(2 * config.reconnect_interval + 30.0)
    assert all_alive(sim)


def test_a_member_that_restarts_comes_back_alive_past_its_old_incarnation() -> None:
    sim = cluster(6, LAN, seed=3)
    sim.run_until(15.0)
    sim.kill("n03")
    sim.run_for(60.0)
    assert sim.state_of("n00", "n03") is MemberState.DEAD
    sim.restart("n03", ["n00"])
    sim.run_for(30.0)
    assert all_alive(sim)
    view = sim.machines["n00"].member("n03")
    assert view is not None
    assert view.incarnation >= 1


def test_a_short_stall_makes_a_member_at_most_suspect() -> None:
    sim = cluster(8, LAN, seed=5)
    sim.run_until(20.0)
    low, _, _ = suspicion_bounds(LAN, 8)
    sim.stall("n04", low / 2)
    sim.run_for(60.0)
    assert all_alive(sim)
    assert not [o for o in sim.observed if o.transition.state is MemberState.DEAD]


def healthy_downs(sim: SwimSimulation, slow: str) -> int:
    return sum(
        1
        for o in sim.observed
        if o.transition.state is MemberState.DEAD and o.transition.node != slow
    )


def test_a_stalled_prober_declares_healthy_members_down_only_without_lifeguard() -> None:
    # The stall outlasts plain SWIM's fixed suspicion timeout (4 s at N = 8) but
    # not Lifeguard's (24 s until confirmed): the stalled member's own probes fail
    # because it reads no acks, and only plain SWIM lets those suspicions expire.
    for seed in (1, 2, 3):
        outcomes = {}
        for config in (LAN, LAN.plain()):
            sim = SwimSimulation([f"n{i}" for i in range(8)], config, seed=seed)
            sim.start(settled=True)
            sim.run_until(10.0)
            sim.stall("n5", 9.0)
            sim.run_for(40.0)
            outcomes[config.lifeguard] = healthy_downs(sim, "n5")
            assert all(
                {n for n, s in view.items() if s is MemberState.ALIVE} >= set(sim.live())
                for view in sim.views().values()
            ), "every healthy member is alive again after the stall"
        assert outcomes[True] == 0, seed
        assert outcomes[False] >= 1, seed


def test_a_settled_start_knows_everyone_without_a_single_transition() -> None:
    sim = SwimSimulation(["a", "b", "c"], LAN, seed=0)
    sim.start(settled=True)
    assert all_alive(sim)
    sim.run_until(30.0)
    assert sim.observed == []
    assert sim.stats["sent"] > 0
