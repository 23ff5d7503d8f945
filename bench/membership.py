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

Run: ``python bench/membership.py`` (about a minute). The last line is one JSON
object of the figures.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time

from corral.actors.membership import (
    MemberState,
    SwimConfig,
    SwimSimulation,
    suspicion_bounds,
    suspicion_timeout,
)

SIZES = (8, 64, 256)
DETECT_TRIALS = {8: 12, 64: 6, 256: 3}
FP_SECONDS = {8: 1800.0, 64: 600.0, 256: 120.0}
LOAD_SECONDS = 60.0
SETTLE = 10.0
E_FACTOR = math.e / (math.e - 1)


def ids(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


def settled(n: int, config: SwimConfig, seed: int) -> SwimSimulation:
    sim = SwimSimulation(ids(n), config, seed=seed)
    sim.start(settled=True)  # every member knows every other: no join burst to wait out
    sim.run_until(SETTLE)
    return sim


def detection(n: int, config: SwimConfig, seed: int) -> list[float]:
    """Seconds from each kill until every other member has the victim down."""
    sim = settled(n, config, seed)
    rng = random.Random(seed)
    seeds = ids(n)[:3]
    times: list[float] = []
    for _ in range(DETECT_TRIALS[n]):
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


def false_positives(n: int, config: SwimConfig, seed: int) -> dict[str, float]:
    """Down transitions about healthy members while a few members stall in bursts."""
    sim = settled(n, config, seed)
    rng = random.Random(seed + 1)
    slow = sorted(rng.sample(ids(n), max(2, n // 32)))  # a list: set order varies per run
    start = sim.now
    end = start + FP_SECONDS[n]
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


def load(n: int, config: SwimConfig, seed: int) -> tuple[float, float]:
    """(messages per member per second, memberlist's expected figure)."""
    sim = settled(n, config, seed)
    before = sim.messages_sent()
    sim.run_for(LOAD_SECONDS)
    measured = (sim.messages_sent() - before) / n / LOAD_SECONDS
    push_pull = config.push_pull_interval
    if n > 32:
        push_pull *= math.ceil(math.log2(n) - math.log2(32)) + 1
    expected = 2.0 / config.probe_interval + 2.0 / push_pull
    return measured, expected


def main() -> int:
    wall = time.perf_counter()
    lifeguard = SwimConfig()
    plain = lifeguard.plain()
    rows = []
    fp_plain = {"views": 0.0, "declared": 0.0, "member_hours": 0.0}
    fp_guard = {"views": 0.0, "declared": 0.0, "member_hours": 0.0}
    ratios = []
    loads = []
    for n in SIZES:
        times = detection(n, lifeguard, seed=n)
        model = E_FACTOR * lifeguard.probe_interval + suspicion_timeout(lifeguard, n)
        mean = sum(times) / len(times)
        ratios.append(mean / model)
        fp_p = false_positives(n, plain, seed=n)
        fp_l = false_positives(n, lifeguard, seed=n)
        for total, part in ((fp_plain, fp_p), (fp_guard, fp_l)):
            for key in total:
                total[key] += part[key]
        measured, expected = load(n, lifeguard, seed=n)
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
        "detect_ratio_by_n": {str(n): round(r, 3) for n, r in zip(SIZES, ratios, strict=True)},
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
    sys.exit(main())
