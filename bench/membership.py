"""Benchmark: SWIM + Lifeguard membership, on virtual time, for N = 8, 64 and 256.

Runs the pure machines of ``corral.actors.membership`` in the deterministic
simulator (:class:`SwimSimulation`: one virtual clock, one-way latency 0.5-2 ms,
memberlist's LAN defaults) — the trio actor adds nothing to what is measured
here but wall time. Three measures:

* **Detection.** Kill one member of a settled cluster; time until every other
  member has it down. Repeated with different victims (each brought back as a
  new life between trials). The model is SWIM's expected time to the first
  detection, ``e/(e-1) * T``, plus the minimum suspicion timeout
  ``SuspicionMult * max(1, log10 N) * T``: with Lifeguard, independent
  confirmations shrink the timer to that minimum. ``detect_ratio`` is the worst
  N's mean over the model (target <= 1.5).
* **False positives**, the Lifeguard paper's scenario: ``max(2, N // 32)`` members
  are CPU-starved: their message handling stalls in bursts (lengths log-uniform in
  0.5-20 s, every 5-30 s) while their timers keep firing, so their probes miss
  acks they have not read yet. Counted: every time a member's view turns a
  *healthy* member (not one of the slow ones) down, per member-hour of the
  whole cluster, once with Lifeguard off (``plain``) and once on. When Lifeguard
  has none at all, the reduction is a lower bound: plain over one event.
* **Load.** Messages sent per member per second in a settled cluster without
  faults, beside memberlist's expected load: one ping and one ack per member per
  probe interval, plus a push-pull exchange (two messages) per push-pull
  interval (30 s, scaled up above 32 members as memberlist does).

Run: ``python bench/membership.py`` (about a minute); ``--quick`` (seconds) runs N = 8
and 32 with fewer trials and shorter simulated spans.

Figures (the last line, one JSON object): ``detect_ratio``, ``detect_ratio_by_n``,
``fp_per_member_hour_plain``, ``fp_per_member_hour_lifeguard``,
``lifeguard_fp_reduction``, ``lifeguard_fp_reduction_is_lower_bound``,
``msgs_per_member_s``, ``memberlist_msgs_per_member_s``, ``msgs_ratio``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass

from corral.actors.membership import (
    MemberState,
    SwimConfig,
    SwimSimulation,
    suspicion_bounds,
    suspicion_timeout,
)


@dataclass(frozen=True)
class Plan:
    """The cluster sizes measured, and how long or how often at each."""

    sizes: tuple[int, ...]
    detect_trials: dict[int, int]
    fp_seconds: dict[int, float]
    load_seconds: float


FULL = Plan(
    sizes=(8, 64, 256),
    detect_trials={8: 12, 64: 6, 256: 3},
    fp_seconds={8: 1800.0, 64: 600.0, 256: 120.0},
    load_seconds=60.0,
)
QUICK = Plan(
    sizes=(8, 32),
    detect_trials={8: 3, 32: 2},
    fp_seconds={8: 300.0, 32: 120.0},
    load_seconds=20.0,
)
SETTLE = 10.0
E_FACTOR = math.e / (math.e - 1)


def ids(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


def settled(n: int, config: SwimConfig, seed: int) -> SwimSimulation:
    sim = SwimSimulation(ids(n), config, seed=seed)
    sim.start(settled=True)  # every member knows every other: no join burst to wait out
    sim.run_until(SETTLE)
    return sim


def detection(n: int, config: SwimConfig, seed: int, trials: int) -> list[float]:
    """Seconds from each kill until every other member has the victim down."""
    sim = settled(n, config, seed)
    rng = random.Random(seed)
    seeds = ids(n)[:3]
    times: list[float] = []
    for _ in range(trials):
        victim = rng.choice([v for v in sim.live() if v not in seeds])
        sim.kill(victim)
        killed_at = sim.now
        others = [o for o in sim.live() if o != victim]
        deadline = killed_at + 4 * (n * config.probe_interval + suspicion_bounds(config, n)[1])
        pending = set(others)
        while pending and sim.now < deadline:
            sim.run_for(0.05)
            pending = {o for o in pending if sim.state_of(o, victim) is not MemberState.DEAD}
        if pending:
            raise SystemExit(f"N={n}: {len(pending)} members never saw {victim} down")
        times.append(sim.now - killed_at)
        sim.restart(victim, seeds)
        sim.run_for(15.0)
    return times


def false_positives(n: int, config: SwimConfig, seed: int, seconds: float) -> dict[str, float]:
    """Down transitions about healthy members while a few members stall in bursts."""
    sim = settled(n, config, seed)
    rng = random.Random(seed + 1)
    slow = sorted(rng.sample(ids(n), max(2, n // 32)))  # a list: set order varies per run
    start = sim.now
    end = start + seconds
    next_stall = {s: start + rng.uniform(0.0, 10.0) for s in slow}
    first = len(sim.observed)
    while sim.now < end:
        sim.run_for(0.1)
        for s in slow:
            if sim.now >= next_stall[s]:
                length = math.exp(rng.uniform(math.log(0.5), math.log(20.0)))
                sim.stall(s, length)
                next_stall[s] = sim.now + length + rng.uniform(5.0, 30.0)
    downs = [
        o
        for o in sim.observed[first:]
        if o.transition.state is MemberState.DEAD and o.transition.node not in slow
    ]
    declared = sum(1 for o in downs if o.transition.reporter == o.observer)
    hours = n * (end - start) / 3600.0
    slow_downs = sum(
        1
        for o in sim.observed[first:]
        if o.transition.state is MemberState.DEAD and o.transition.node in slow
    )
    return {
        "views": len(downs),
        "declared": declared,
        "member_hours": hours,
        "slow_downs": slow_downs,
        "max_health": max(m.health for m in sim.machines.values()),
    }


def load(n: int, config: SwimConfig, seed: int, seconds: float) -> tuple[float, float]:
    """(messages per member per second, memberlist's expected figure)."""
    sim = settled(n, config, seed)
    before = sim.messages_sent()
    sim.run_for(seconds)
    measured = (sim.messages_sent() - before) / n / seconds
    push_pull = config.push_pull_interval
    if n > 32:
        push_pull *= math.ceil(math.log2(n) - math.log2(32)) + 1
    expected = 2.0 / config.probe_interval + 2.0 / push_pull
    return measured, expected


def main(plan: Plan) -> int:
    wall = time.perf_counter()
    lifeguard = SwimConfig()
    plain = lifeguard.plain()
    rows = []
    fp_plain = {"views": 0.0, "declared": 0.0, "member_hours": 0.0}
    fp_guard = {"views": 0.0, "declared": 0.0, "member_hours": 0.0}
    ratios = []
    loads = []
    for n in plan.sizes:
        times = detection(n, lifeguard, seed=n, trials=plan.detect_trials[n])
        model = E_FACTOR * lifeguard.probe_interval + suspicion_timeout(lifeguard, n)
        mean = sum(times) / len(times)
        ratios.append(mean / model)
        fp_p = false_positives(n, plain, seed=n, seconds=plan.fp_seconds[n])
        fp_l = false_positives(n, lifeguard, seed=n, seconds=plan.fp_seconds[n])
        for total, part in ((fp_plain, fp_p), (fp_guard, fp_l)):
            for key in total:
                total[key] += part[key]
        measured, expected = load(n, lifeguard, seed=n, seconds=plan.load_seconds)
        loads.append((measured, expected))
        rows.append((n, mean, max(times), model, fp_p, fp_l, measured, expected))

    print("membership: SWIM + Lifeguard (memberlist LAN defaults), simulated on virtual time")
    print(
        f"{'N':>4} {'detect s':>9} {'worst s':>8} {'model s':>8} {'ratio':>6} "
        f"{'FP plain':>9} {'FP guard':>9} {'slow-down p/g':>14} {'msg/s':>6} {'mlist':>6}"
    )
    for n, mean, worst, model, fp_p, fp_l, measured, expected in rows:
        print(
            f"{n:>4} {mean:>9.2f} {worst:>8.2f} {model:>8.2f} {mean / model:>6.2f} "
            f"{fp_p['views']:>9.0f} {fp_l['views']:>9.0f} "
            f"{fp_p['slow_downs']:>7.0f}/{fp_l['slow_downs']:<6.0f} "
            f"{measured:>6.2f} {expected:>6.2f}"
        )
    hours = fp_plain["member_hours"]
    per_hour_plain = fp_plain["views"] / hours
    per_hour_guard = fp_guard["views"] / fp_guard["member_hours"]
    lower_bound = fp_guard["views"] == 0
    reduction = fp_plain["views"] / max(fp_guard["views"], 1.0)
    print(
        f"false downs of healthy members: plain {fp_plain['views']:.0f} "
        f"({fp_plain['declared']:.0f} declared by their own timer), Lifeguard "
        f"{fp_guard['views']:.0f} ({fp_guard['declared']:.0f}) in {hours:.1f} member-hours; "
        f"reduction {'>= ' if lower_bound else ''}{reduction:.1f}x (paper: > 50x)"
    )
    measured_load = sum(m for m, _ in loads) / len(loads)
    expected_load = sum(e for _, e in loads) / len(loads)
    print(f"wall time {time.perf_counter() - wall:.1f} s")
    figures = {
        "detect_ratio": round(max(ratios), 3),
        "detect_ratio_by_n": {str(n): round(r, 3) for n, r in zip(plan.sizes, ratios, strict=True)},
        "fp_per_member_hour_plain": round(per_hour_plain, 4),
        "fp_per_member_hour_lifeguard": round(per_hour_guard, 4),
        "lifeguard_fp_reduction": round(reduction, 1),
        "lifeguard_fp_reduction_is_lower_bound": lower_bound,
        "msgs_per_member_s": round(measured_load, 3),
        "memberlist_msgs_per_member_s": round(expected_load, 3),
        "msgs_ratio": round(measured_load / expected_load, 3),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller clusters, seconds")
    sys.exit(main(QUICK if parser.parse_args().quick else FULL))
