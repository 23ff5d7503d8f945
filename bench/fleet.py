"""What a fleet costs the registry and each node, on virtual time.

    python bench/fleet.py                    # 50 nodes x 500 apps, and 5 x 50
    python bench/fleet.py --nodes 100 --apps 1000     # ~16 s CPU
    python bench/fleet.py --nodes 1000 --apps 10000   # ~3 min alone, peak ~1.1 GiB
    python bench/fleet.py --quick                     # 20 x 100, and 2 x 10: seconds

Measured on this 2-core machine shared with other jobs, so read ``cpu_s`` (this
process's CPU seconds) beside ``wall_s``. At 1,000 x 10,000 quiet runs took 190-208 s
wall for 189-201 s of CPU (the same code's CPU time moves by about 8 % from run to run
here), one beside other work 232 s wall for 202 s of CPU; by phase (CPU, the 208 s
run): placing and starting the 10,000 apps 55 s, ten idle virtual minutes 56 s
(about 85 us per node-second), deploying 100 apps 7 s, losing 10 nodes 48 s (126
coordinator passes, the first by a new coordinator that scores every app on every
node afresh), the fault schedule 22 s, and stopping 1,000 nodes
with their 26,000 processes about 13 s. What remains is spread over the nodes'
reconcile passes, trio's scheduling and the coordinator's passes over 10,000 apps;
no one part of it stands out.

N full nodes (registration, coordinator, reconciler, ports, in-memory processes) run
in this process on one memory registry under trio's MockClock, in 10 racks; apps
have replicas 3 (most), 1 (a fifth) and 1 % declare 64 MiB of memory; their
readiness is checked every 60 s (see ``HEALTH``). Scenarios:

* idle for 10 virtual minutes: registry writes (lease renewals included) and reads
  per node per minute,
  full reads (a range over every app or placement), applied coordinator passes;
* deploy 100 apps: virtual seconds until every instance runs, registry
  operations per deployed app;
* lose 10 nodes (killed; a tenth of a fleet under 100): virtual seconds after the grace until their
  apps run elsewhere, instances moved beyond the lost ones, and the coordinator
  passes that took. Replacing an instance lost with its node is a relocation, and
  the policy's ``disruption_budget`` (5) allows that many per pass; the next pass
  comes as the nodes that took the last five publish them, a watch debounce
  (0.25 s) later. So ``loss_converge_s`` is about ``instances_on_lost_nodes`` / 5
  x 0.25 s, less the ~5 s between the grace lapsing and the measurement starting:
  9 s for 301 instances at 100 nodes, 29 s for 553 at 1,000 (10 nodes lost either
  way). It is the budget doing its job (Kubernetes rate-limits evictions off failed
  nodes too), not a stall;
* a randomized fault schedule (seeded): invariant violations.

The baseline is the same fleet at a tenth of the size, run first:
``idle_flat_ratio`` is the per-node idle cost at full size over that at a tenth
(flat = 1.0).

Figures (the last line, one JSON object, the full size's): ``nodes``, ``apps``,
``initial_converge_s``, ``idle_writes_per_node_min``, ``idle_reads_per_node_min``,
``idle_full_reads``, ``idle_applied_passes``, ``deploy_converge_s``,
``deploy_ops_per_app``, ``loss_converge_s``, ``instances_on_lost_nodes``,
``loss_applied_passes``, ``extra_moves``, ``fault_seed``, ``invariant_violations``,
``wall_s``, ``cpu_s`` (and ``wall_<phase>_s``, ``cpu_<phase>_s`` per phase),
``idle_flat_ratio``, ``peak_mib``.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio
import trio.testing

from corral.actors.planner import Policy
from corral.registry import (
    AppRecord,
    Compare,
    Deployment,
    Get,
    HealthSpec,
    KeyValue,
    MemoryRegistry,
    TxnOp,
    TxnResult,
)
from corral.testing import CountingRegistry, open_fleet, random_faults

REVISION = "f" * 64
#: The simulated processes are always ready; at the 2 s default interval the readiness
#: checks alone (local, no registry operation) would be ~15,000 per virtual second at
#: 1,000 nodes x 10,000 apps, most of the wall time.
HEALTH = HealthSpec(interval_ms=60_000)
GRACE = 60.0
LEASE_TTL = 45.0
#: One process holds the state of every node: a heap a thousand nodes' size, which each
#: of CPython's full (generation 2) collections walks whole. At 100 x 1,000 those were
#: 40 % of the run's time (62 collections). A real node's heap is one node's, so the
#: bench takes what the fleet holds at the end of each phase out of the collector
#: (``gc.freeze``): later garbage is still collected, a full collection walks only what
#: is newer. ``--no-freeze`` measures without it.
FREEZE = True
#: The young generations too: a thousand nodes allocate as a thousand processes would,
#: so CPython's default (a young collection every 700 allocations) collects a thousand
#: times as often as one node's would, and each walks whatever large containers the
#: passes of all nodes just made (~25-30 % of an idle fleet's CPU, ~1/3 of its start).
#: The bench collects the youngest generation every 100,000 allocations instead
#: (``--gc-default`` measures with CPython's thresholds).
GC_THRESHOLD: tuple[int, int, int] | None = (100_000, 20, 100)


class Recording(CountingRegistry):
    """Counts calls, and ranges by prefix, alone or inside a transaction (a range over
    apps/ or placement/ is a full read)."""

    def __init__(self) -> None:
        super().__init__(MemoryRegistry())
        self.ranges: Counter[str] = Counter()

    async def range(self, prefix: str) -> list[KeyValue]:
        self.ranges[prefix] += 1
        return await super().range(prefix)

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        result = await super().txn(compares, on_success, on_failure)
        for op in on_success if result.succeeded else on_failure:
            if isinstance(op, Get) and op.prefix:
                self.ranges[op.key] += 1
        return result

    def clear(self) -> None:
        self.reset()
        self.ranges.clear()

    @property
    def full_reads(self) -> int:
        return self.ranges["apps/"] + self.ranges["placement/"]

    @property
    def reads(self) -> int:
        return sum(self.calls[op] for op in ("get", "range", "revision")) + self.calls["txn"]


def app_record(i: int) -> AppRecord:
    replicas = 1 if i % 5 == 0 else 3
    memory = 64 if i % 100 == 7 else 0
    return AppRecord(
        f"app-{i}",
        replicas=replicas,
        memory_mb=memory,
        deployment=Deployment(REVISION, ["python3", "app.py"], health=HEALTH),
    )


def wanted(apps: list[AppRecord], live: int) -> int:
    return sum(min(int(a.replicas), live) for a in apps)


async def until_running(fleet: Any, apps: list[AppRecord], step: float = 1.0) -> float:
    t0 = trio.current_time()
    names = {a.name for a in apps}
    need = wanted(apps, len(fleet.cluster.running))
    while True:
        running = fleet.cluster.instances()
        if sum(len(running.get(n, ())) for n in names) >= need:
            return trio.current_time() - t0
        await trio.sleep(step)


async def applied_passes(fleet: Any) -> int:
    holder = await fleet.cluster.wait_for_coordinator()
    state = await fleet.cluster.coordinator_state(holder)
    return int(state.passes.applied) if state else 0


def phase(out: dict[str, Any], name: str) -> None:
    """Note the wall and CPU time a phase ended at (stderr, ``wall_<phase>_s`` and
    ``cpu_<phase>_s``: on a shared machine the CPU time is the steadier figure), and
    freeze what the fleet holds so far out of the cyclic garbage collector (see
    ``FREEZE``)."""
    if FREEZE:
        gc.freeze()
    wall = round(time.perf_counter() - out["_started"], 1)
    cpu = round(time.process_time() - out["_cpu"], 1)
    out[f"wall_{name}_s"] = wall
    out[f"cpu_{name}_s"] = cpu
    print(
        f"  {out['nodes']} nodes: {name} done at {wall} s wall, {cpu} s CPU",
        file=sys.stderr,
        flush=True,
    )


async def scenario(nodes: int, apps: int, seed: int, out: dict[str, Any]) -> None:
    registry = Recording()
    policy = Policy(grace_period_s=GRACE)
    async with open_fleet(
        nodes, racks=10, lease_ttl=LEASE_TTL, policy=policy, registry=registry
    ) as fleet:
        await fleet.cluster.wait_for_coordinator()
        if FREEZE:
            gc.freeze()  # the nodes as built
        records = [app_record(i) for i in range(apps)]
        for record in records:
            await fleet.put_app(record)
        out["initial_converge_s"] = await until_running(fleet, records, step=5.0)
        phase(out, "start")
        await trio.sleep(60)

        # Idle.
        before = await applied_passes(fleet)
        registry.clear()
        await trio.sleep(600)
        # Lease renewals are writes too (etcd applies each through raft).
        writes = registry.writes + registry.calls["keepalive"]
        out["idle_writes_per_node_min"] = round(writes / nodes / 10, 2)
        out["idle_reads_per_node_min"] = round(registry.reads / nodes / 10, 2)
        out["idle_full_reads"] = registry.full_reads
        out["idle_applied_passes"] = await applied_passes(fleet) - before
        phase(out, "idle")

        # Deploy 100 apps.
        extra = [app_record(apps + i) for i in range(100)]
        registry.clear()
        for record in extra:
            await fleet.put_app(record)
        out["deploy_converge_s"] = await until_running(fleet, extra, step=0.5)
        out["deploy_ops_per_app"] = round(sum(registry.calls.values()) / len(extra), 1)
        records += extra
        await trio.sleep(60)
        phase(out, "deploy")

        # Lose 10 nodes, as the scenario says (a tenth of a smaller fleet).
        lost = sorted(fleet.cluster.running)[: max(1, min(10, nodes // 10))]
        before_map = fleet.cluster.instances()
        on_lost = sum(1 for hosts in before_map.values() for h in hosts if h in lost)
        killed_at = trio.current_time()
        for node in lost:
            await fleet.cluster.kill(node)
        await trio.sleep(GRACE + LEASE_TTL)
        out["loss_converge_s"] = await until_running(fleet, records, step=1.0)
        after_map = fleet.cluster.instances()
        moved = sum(
            len(set(before_map.get(app, ())) - set(hosts) - set(lost))
            for app, hosts in after_map.items()
        )
        out["instances_on_lost_nodes"] = on_lost
        # The relocations go at most disruption_budget per pass (see the docstring).
        # (Counted from every node's events: the lease holder may be among the lost.)
        out["loss_applied_passes"] = sum(
            1
            for _, event in fleet.cluster.events("coordinator.pass")
            if event.time >= killed_at and event.fields.get("outcome") == "applied"
        )
        out["extra_moves"] = moved
        phase(out, "loss")

        # A randomized fault schedule over the survivors.
        faults = random_faults(
            seed,
            fleet.cluster.running,
            count=10,
            span=120,
            max_duration=30,
            kinds=("stall", "partition", "registry-outage"),
        )
        await fleet.run_faults(faults)
        await trio.sleep(180)
        fleet.checker.check_converged()
        out["fault_seed"] = seed
        out["invariant_violations"] = len(fleet.violations)
        for violation in fleet.violations[:5]:
            print(f"  violation (seed {seed}): {violation}", file=sys.stderr)
        phase(out, "faults")


def run(nodes: int, apps: int, seed: int) -> dict[str, Any]:
    if GC_THRESHOLD is not None:
        gc.set_threshold(*GC_THRESHOLD)
    out: dict[str, Any] = {
        "nodes": nodes,
        "apps": apps,
        "_started": time.perf_counter(),
        "_cpu": time.process_time(),
    }
    trio.run(scenario, nodes, apps, seed, out, clock=trio.testing.MockClock(autojump_threshold=0))
    out["wall_s"] = round(time.perf_counter() - out.pop("_started"), 1)
    out["cpu_s"] = round(time.process_time() - out.pop("_cpu"), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=None, help="50 (--quick: 20)")
    parser.add_argument("--apps", type=int, default=None, help="500 (--quick: 100)")
    parser.add_argument("--quick", action="store_true", help="20 nodes x 100 apps: seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-freeze", action="store_true", help="leave the garbage collector as it is"
    )
    parser.add_argument(
        "--gc-default", action="store_true", help="CPython's collection thresholds"
    )
    args = parser.parse_args()
    nodes = args.nodes or (20 if args.quick else 50)
    apps = args.apps or (100 if args.quick else 500)
    global FREEZE, GC_THRESHOLD
    FREEZE = not args.no_freeze
    if args.gc_default:
        GC_THRESHOLD = None

    small = run(max(1, nodes // 10), max(1, apps // 10), args.seed)
    full = run(nodes, apps, args.seed)
    small_cost = small["idle_reads_per_node_min"] + small["idle_writes_per_node_min"]
    full_cost = full["idle_reads_per_node_min"] + full["idle_writes_per_node_min"]
    figures = {key: full[key] for key in full}
    figures["idle_flat_ratio"] = round(full_cost / small_cost, 2) if small_cost else None
    figures["peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

    print(f"{'figure':<28} {small['nodes']:>6} nodes {full['nodes']:>6} nodes")
    for key in full:
        print(f"{key:<28} {small[key]!s:>12} {full[key]!s:>12}")
    print(f"{'idle_flat_ratio':<28} {figures['idle_flat_ratio']!s:>25}")
    print(f"{'peak_mib':<28} {figures['peak_mib']!s:>25}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
