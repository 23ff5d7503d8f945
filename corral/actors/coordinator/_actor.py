"""The Coordinator actor: one lease, fenced writes, skipped idle passes, instant hand-back.

Every node runs one. At most one of them holds ``lease/coordinator`` and
coordinates; the others watch the key and campaign the moment it disappears.

The lease
---------
A campaign grants a registry lease of ``lease_ttl`` seconds and puts the lease
key attached to it, guarded on the key being absent. The key's create revision
is the **fence**: every acquisition creates the key anew, so every fence is
larger than any before it. The holder renews at a third of the TTL (the tick).
A renewal that fails — the lease is gone, or the registry cannot be reached —
ends coordinating at once, before anything else is written, and so does a
local deadline: the holder steps down (no pass, no write) ``lease_ttl`` minus a
margin (a tenth of it, at most a second: :func:`step_down_margin`) after the last
renewal was sent, before the registry could let the lease lapse and hand it to
another node. A holder that cannot renew so never acts beside its successor, even
with its clock running a little fast or a write slow on the way.

A pass
------
A pass runs on every tick, and promptly whenever what it decides from
changes: while it holds the lease the coordinator watches ``apps/``,
``nodes/``, ``intent/``, ``placement/`` and ``down/``, gathers the changes of a burst for
``debounce`` seconds after the first one, and then looks once. Changes it has
already read, and its own placement writes, are not news and trigger
nothing. (The node service may still send :class:`KickCoordinator`; the
watch makes it unnecessary.)

A pass decides from ``apps/``, ``nodes/``, ``intent/``, ``placement/`` and
``down/`` as the coordinator's mirror of them holds them (:mod:`._view`): read in
one read-only transaction (one consistent revision) when it takes the lease, then
kept current by that same watch and by its own writes, and read in full again only
after the watch lost changes or a write was refused. It decides every node's
state from the records, its memory of each node's last record and the
membership view (:mod:`._membership`), writes the ``down/<node>`` entries that
changed (under the fence, before anything else: a successor keeps each down
node's grace clock), builds the planner's input (:mod:`._inputs`) and digests
it. When the digest has not moved since the last completed pass, and nothing
in that pass was waiting on time (a deferred move, a down node's grace), the
pass is skipped: the planner would decide what is already decided. Otherwise
the planner decides and the write plan (:mod:`._writes`) says what to write;
each batch is one transaction guarded by "the lease key still carries my
fence" and by the ``mod_revision`` of every record it writes. A failed fence
guard drops the role. A timer runs a pass the moment the earliest grace of a
down node holding work lapses, so that work moves then, not up to a tick
later.

Rollouts
--------
After the placements, every pass (a skipped one too: the digest leaves out what a
rollout moves on) runs each app's rolling deploy (:mod:`._rollout`): from the app's
revision and rollout options, the rollout kept in its placement record, what each
placed node publishes (revision, readiness) and which nodes every registered proxy
has stopped routing to (their instance's URL is absent from a routing table every
``proxies/<id>`` record has applied). A rollout record that changed is written back
into the placement record under the fence (:func:`~._writes.plan_rollout_writes`),
with ``deploy.rolling`` (it began, or a node was told to switch), ``deploy.halted``
(with the reason) and ``deploy.done`` events. The routing table and the proxies are
read, and their changes watched, only while some app rolls; a timer runs a pass when
the earliest wait of a rollout (a drain, the proxies' deadline, a readiness timeout)
ends. A coordinator taking over reads the record and carries on.

Reports
-------
Each pass that runs emits ``placement.pending`` for every app it could not
place (fully), and a pass over new inputs emits ``placement.deferred``,
``placement.stranded`` and ``placement.refused`` for what it held back. A
pass over the same inputs as the last one that decided — a skipped tick, or
a pass run again only because it waits on time (a cooldown, a grace period)
— repeats a report only when it says something new (a pending app's message,
a deferral's kind — cooldown or disruption budget —, a stranded reason or a
refusal changed) or when the policy's ``cooldown_s`` has passed since that
report was last made: at most one repeat per app (and node) per cooldown,
so ``corral events`` stays readable while an operator is still reminded
(:class:`~._reports.ReportLog` decides). The state (:class:`GetCoordinatorState`)
always carries the current lists, the deferred moves with the time each may go
(``until``), and the policy.

Hand-back
---------
``stopping()`` (the node's supervisor stopping the actor: a clean shutdown or
SIGTERM) revokes the lease inside the kernel's shielded cleanup. The key
vanishes in one revision, every other node's watch sees it, and one of them
holds the lease a moment later and runs its first pass straight away.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from corral.actors.coordinator._errors import (
    FenceRejected,
    LeadershipLost,
    LeaseExpired,
)
from corral.actors.coordinator._inputs import (
    INPUT_PREFIXES,
    InputCache,
    RegistryView,
    Section,
    inputs_digest,
    needs_time,
    plan_input_from_view,
    states_from_view,
)
from corral.actors.coordinator._membership import (
    MemberStatus,
    NodeStates,
    NodeStatus,
)
from corral.actors.coordinator._reports import ReportLog
from corral.actors.coordinator._rollout import (
    RolloutDone,
    RolloutHalted,
    RolloutPlan,
    SwitchRevision,
    plan_rollout,
    rollout_inputs,
    rollout_status,
)
from corral.actors.coordinator._state import (
    AppRollout,
    CoordinatorPass,
    CoordinatorState,
    PassCounts,
)
from corral.actors.coordinator._view import ViewStore
from corral.actors.coordinator._writes import (
    DEFAULT_MAX_WRITES,
    WritePlan,
    plan_down_writes,
    plan_rollout_writes,
    plan_writes,
)
from corral.actors.planner import (
    Decisions,
    Deferred,
    Pause,
    PlacementUnavailable,
    PlanInput,
    Policy,
    Refusal,
    ScoreCache,
    Stranded,
    Unplaced,
    decisions_to_json,
    plan,
)
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    PROXIES_PREFIX,
    ROUTING_KEY,
    Compare,
    CoordinatorLease,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    LeaseNotFound,
    NodeRecord,
    ProxyRecord,
    Put,
    Registry,
    RegistryError,
    RevisionCompacted,
    RolloutRecord,
    decode_record,
    down_key,
)
from corral.supervision import Actor, ChildSpec, Restart, TimerHandle
from corral.transport import SchemaError, message

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_WATCH_DEBOUNCE",
    "Coordinator",
    "GetCoordinatorState",
    "KickCoordinator",
    "coordinator_child_spec",
]

#: ``leaseTtlMs`` in seconds (45 000 ms).
DEFAULT_LEASE_TTL = 45.0
#: The step-down margin: a tenth of the lease TTL, at most this many seconds.
_MAX_STEP_DOWN_MARGIN = 1.0


def step_down_margin(lease_ttl: float) -> float:
    """How long before its lease could lapse (``lease_ttl`` after the last renewal was
    sent) a holder that could not renew stops acting: a tenth of the TTL, at most
    :data:`_MAX_STEP_DOWN_MARGIN` seconds (room for clock drift and a write in flight;
    the fence guard still refuses anything that lands later)."""
    return min(lease_ttl / 10, _MAX_STEP_DOWN_MARGIN)


#: How long a burst of registry changes is gathered before one pass looks at them.
DEFAULT_WATCH_DEBOUNCE = 0.25
#: Pause before a broken lease watch is opened again.
_WATCH_RETRY = 1.0
#: Revision standing for "changes were missed" (a compacted watch): always news.
_MISSED = 0
#: Standing for "the mirror of the input prefixes changed" (news if no pass saw it yet).
_STORE_CHANGED = -1
#: What a rollout waits on besides the inputs: the routing table and what each proxy
#: applied. Read every pass; their changes are news only while an app rolls.
_ROLLOUT_PREFIXES = (ROUTING_KEY, PROXIES_PREFIX)
#: The plan of an app with nothing to roll.
_AT_REST = RolloutPlan(None)


@message("coordinator.state")
@dataclass(frozen=True)
class GetCoordinatorState:
    """Ask for the coordinator's state: answered with a :class:`~._state.CoordinatorState`
    (holder, fence, last pass, the policy it plans with, what the last deciding pass
    reported, and the node states of its last pass)."""


@message("coordinator.kick")
@dataclass(frozen=True)
class KickCoordinator:
    """Check the inputs now instead of at the next tick (a pass runs only if they moved)."""

    reason: str = ""


@dataclass(frozen=True)
class _Tick:
    """Timer, every third of the TTL: renew and pass, or campaign."""


@dataclass(frozen=True)
class _GraceLapsed:
    """Timer: the earliest grace of a down node holding work lapses now."""


@dataclass(frozen=True)
class _RolloutDue:
    """Timer: a rollout's earliest wait (a drain, the proxies, readiness) ends now."""


@dataclass(frozen=True)
class _LeaseVacated:
    """The lease key was deleted (revoked, or expired)."""


@dataclass(frozen=True)
class _InputsChanged:
    """A burst of changes under the input prefixes, seen by the watch of ``fence``."""

    fence: int
    revisions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Holding:
    lease: int
    fence: int
    deadline: float  # trio time from which it no longer acts (before the lease may lapse)


class Coordinator(Actor):
    """Campaigns for the coordinator lease and, while holding it, places apps.

    Args:
        node_id: this node's id (the lease holder's name).
        registry: the shared registry.
        policy: the planner's brakes.
        lease_ttl: the lease TTL in seconds (``leaseTtlMs`` / 1000); renewed
            and ticked at a third of it.
        wall_clock: unix time, stamped on placements (``decided_at``,
            ``placed_at``) and handed to the planner as ``now``; timing
            (ticks, deadlines) uses trio's clock.
        max_writes: most writes per transaction.
        membership: returns node id -> :class:`~._membership.MemberStatus` as
            membership (SWIM) sees it, combined with the node records (see
            :mod:`._membership`); None until SWIM is wired in. It is read once per
            pass: tell the actor :class:`KickCoordinator` when the view changes for
            a pass before the next tick.
        debounce: how long changes under the input prefixes are gathered before
            the one pass that looks at them (seconds).
    """

    def __init__(
        self,
        node_id: str,
        registry: Registry,
        policy: Policy | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        wall_clock: Callable[[], float] = time.time,
        *,
        max_writes: int = DEFAULT_MAX_WRITES,
        membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
        debounce: float = DEFAULT_WATCH_DEBOUNCE,
    ) -> None:
        super().__init__()
        if not lease_ttl > 0 or not math.isfinite(lease_ttl):
            raise ValueError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
        if not debounce >= 0 or not math.isfinite(debounce):
            raise ValueError(f"debounce must be a number of seconds >= 0, got {debounce!r}")
        self._node_id = node_id
        self._registry = registry
        self._policy = policy if policy is not None else Policy()
        self._lease_ttl = lease_ttl
        # A renewal sent at t entitles the holder to act until t + this, not t + TTL.
        self._acts_for = lease_ttl - step_down_margin(lease_ttl)
        self._tick = lease_ttl / 3
        self._wall_clock = wall_clock
        self._max_writes = max_writes
        self._membership = membership
        self._debounce = debounce
        self._holding: _Holding | None = None
        # The watch of the input prefixes (while coordinating), which keeps the mirror
        # of them current (see ViewStore), the mirror's change count the last pass saw,
        # and the revision of the routing table and proxies a pass last read.
        self._input_watch: trio.CancelScope | None = None
        self._store = ViewStore()
        self._viewed_changes = -1
        self._read_revision = 0
        # The planner's apps and placements, and the digest's parts, built from those
        # same record objects: a pass rebuilds only what changed (see InputCache).
        self._input_cache = InputCache()
        # Last report per (event kind, app, node): what it said, and when (trio time).
        self._reports = ReportLog(self._policy.cooldown_s)
        self._cache = ScoreCache()
        self._holder: str | None = None
        self._holder_fence: int | None = None
        self._stale_leases: set[int] = set()
        self._last_digest: str | None = None
        self._waiting_on_time = False
        self._unplaced: tuple[Unplaced, ...] = ()
        # What the last deciding pass reported besides unplaced apps (for the state).
        self._stranded: tuple[Stranded, ...] = ()
        self._deferred: tuple[Deferred, ...] = ()
        self._refused: Refusal | None = None
        self._paused: Pause | None = None
        self._last_pass: CoordinatorPass | None = None
        # The last record seen of each node (for nodes whose record lapsed), the node
        # states of the last pass, and the timer of the next grace deadline.
        self._remembered: Mapping[str, NodeRecord] = {}
        self._statuses: tuple[NodeStatus, ...] = ()
        self._grace_timer: TimerHandle | None = None
        self._grace_deadline: float | None = None
        self._counts = {"applied": 0, "skipped": 0, "acquired": 0, "lost": 0}
        # The rollouts in progress (or halted) as last written, by app, and the timer
        # of the next rollout wait.
        self._rollouts: dict[str, RolloutRecord] = {}
        self._rollout_timer: TimerHandle | None = None
        self._rollout_due: float | None = None
        # The apps a rollout pass found nothing to roll for (and no rollout in their
        # placement), with the nodes they are placed on, and the other way round: until
        # their app record, placement or one of those nodes' records changes, they
        # decide nothing again. The view that pass looked at (and whether placements
        # were paused then), and the apps it found not at rest.
        self._at_rest: dict[str, tuple[str, ...]] = {}
        self._rest_on: dict[str, set[str]] = {}
        self._rolled: tuple[RegistryView, bool] | None = None
        self._restless: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    async def started(self) -> None:
        self.ctx.every(self._tick, _Tick())
        self.ctx.start_task(self._watch_lease)
        self.ctx.after(0.0, _Tick())

    async def handle(self, message: object) -> object:
        match message:
            case _Tick():
                await self._on_tick()
                return None
            case _LeaseVacated():
                await self._on_vacated()
                return None
            case _RolloutDue():
                self._rollout_timer, self._rollout_due = None, None
                if self._coordinating():
                    await self._run_pass(trigger="rollout")
                return None
            case _GraceLapsed():
                self._grace_timer, self._grace_deadline = None, None
                if self._coordinating():
                    await self._run_pass(trigger="grace")
                return None
            case KickCoordinator():
                if self._coordinating():
                    await self._run_pass(trigger=message.reason or "kick")
                return None
            case _InputsChanged():
                holding = self._holding
                if (
                    self._coordinating()
                    and holding is not None
                    and holding.fence == message.fence
                    and self._is_news(message.revisions)
                ):
                    await self._run_pass(trigger="watch")
                return None
            case GetCoordinatorState():
                return self._state()
        return await super().handle(message)

    async def stopping(self) -> None:
        holding, self._holding = self._holding, None
        leases = set(self._stale_leases)
        if holding is not None:
            leases.add(holding.lease)
            self.ctx.emit(
                "coordinator.handing-back",
                node=self._node_id,
                fence=holding.fence,
                until=min(trio.current_time(), holding.deadline),
            )
        for lease in sorted(leases):
            try:
                await self._registry.revoke(lease)
            except RegistryError as exc:
                # Cut off: the lease lapses by itself a TTL after the last renewal.
                self.ctx.log.warning("could not hand back coordinator lease %s: %s", lease, exc)

    # ------------------------------------------------------------------ the lease

    def _coordinating(self) -> bool:
        holding = self._holding
        return holding is not None and trio.current_time() < holding.deadline

    def _drop(self, why: str, error: Exception | None = None) -> None:
        holding, self._holding = self._holding, None
        if holding is None:
            return
        self._stale_leases.add(holding.lease)
        self._counts["lost"] += 1
        self._last_digest = None
        self._schedule_grace(None, 0.0)
        self._schedule_rollout(None, 0.0)
        self._rollouts = {}
        self._rolled = None
        self._stop_input_watch()
        self._store.invalidate()
        if self._holder == self._node_id:
            self._holder = None
            self._holder_fence = None
        self.ctx.emit(
            "coordinator.lost",
            node=self._node_id,
            fence=holding.fence,
            why=why,
            error=None if error is None else str(error),
            # The moment it stopped being entitled: now, or earlier if the lease
            # may have lapsed while this actor was busy (a hung registry call).
            until=min(trio.current_time(), holding.deadline),
        )
        self.ctx.log.warning("stopped coordinating (fence %s): %s", holding.fence, why)

    async def _on_tick(self) -> None:
        if self._holding is not None:
            try:
                await self._renew()
            except LeadershipLost as exc:
                self._drop("renewal failed", exc)
            else:
                await self._run_pass(trigger="tick")
                return
        await self._revoke_stale()
        if await self._campaign():
            await self._run_pass(trigger="acquired")

    async def _on_vacated(self) -> None:
        if self._holding is not None:
            # Our key went away under us (expired or revoked by someone): check.
            try:
                kv = await self._registry.get(COORDINATOR_LEASE_KEY)
            except RegistryError as exc:
                self._drop("lease key vanished and could not be checked", exc)
            else:
                if kv is not None and kv.create_revision == self._holding.fence:
                    return
                self._drop("lease key vanished")
        await self._revoke_stale()
        if await self._campaign():
            await self._run_pass(trigger="acquired")

    async def _renew(self) -> None:
        holding = self._holding
        assert holding is not None
        sent_at = trio.current_time()
        if sent_at >= holding.deadline:
            raise LeaseExpired(self._past_deadline())
        try:
            await self._registry.keepalive(holding.lease)
        except LeaseNotFound as exc:
            raise LeaseExpired(str(exc)) from exc
        except RegistryError as exc:
            raise LeaseExpired(f"renewal could not reach the registry: {exc}") from exc
        if self._holding is holding:
            self._holding = _Holding(holding.lease, holding.fence, sent_at + self._acts_for)

    def _past_deadline(self) -> str:
        return (
            f"no renewal for {self._acts_for:g} s: the lease TTL ({self._lease_ttl:g} s) "
            f"less the step-down margin ({self._lease_ttl - self._acts_for:g} s) passed since "
            "the last renewal was sent"
        )

    async def _campaign(self) -> bool:
        """Try to take the lease; True when this node holds it now."""
        lease: Lease | None = None
        try:
            kv = await self._registry.get(COORDINATOR_LEASE_KEY)
            if kv is not None:
                self._note_holder(kv)
                if not await self._reclaim_own(kv):
                    return False
            sent_at = trio.current_time()
            lease = await self._registry.grant(self._lease_ttl)
            value = CoordinatorLease(holder=self._node_id, acquired_at=self._wall_clock())
            result = await self._registry.txn(
                [Compare.absent(COORDINATOR_LEASE_KEY)],
                [
                    Put(COORDINATOR_LEASE_KEY, value.encode(), lease=lease.id),
                    Get(COORDINATOR_LEASE_KEY),
                ],
                [Get(COORDINATOR_LEASE_KEY)],
            )
        except RegistryError as exc:
            if lease is not None:
                # Granted, then lost touch: the txn may even have landed; either
                # way this lease is not ours to use. (A key it holds under our
                # name is reclaimed by the next campaign.)
                self._stale_leases.add(lease.id)
            self.ctx.log.info("campaign for the coordinator lease failed: %s", exc)
            return False
        if not result.succeeded:
            self._stale_leases.add(lease.id)
            await self._revoke_stale()
            current = result.responses[0] if result.responses else None  # the Get
            if isinstance(current, list) and current:
                self._note_holder(current[0])
            return False
        # The key did not exist, so this txn created it: its create revision
        # (the txn's revision) is the fence.
        created = result.responses[1] if len(result.responses) > 1 else None
        fence = (
            created[0].create_revision
            if isinstance(created, list) and created
            else result.revision
        )
        self._holding = _Holding(lease.id, fence, sent_at + self._acts_for)
        self._holder, self._holder_fence = self._node_id, fence
        self._last_digest = None
        # Everything after the acquisition is news; the first pass reads it anyway.
        self._start_input_watch(fence, result.revision + 1)
        self._counts["acquired"] += 1
        self.ctx.emit("coordinator.acquired", node=self._node_id, fence=fence, lease=lease.id)
        self.ctx.log.info("coordinating under fence %s", fence)
        return True

    async def _reclaim_own(self, kv: KeyValue) -> bool:
        """The key names this node but not our current lease: an earlier life of
        this node (crashed, or dropped after a failed renewal) still holds it.
        Hand it back so the cluster need not wait for its TTL. True when freed."""
        if self._holder != self._node_id or kv.lease is None:
            return False
        self._stale_leases.add(kv.lease)
        await self._revoke_stale()
        return kv.lease not in self._stale_leases

    def _note_holder(self, kv: KeyValue) -> None:
        record = decode_record(kv.key, kv.value)
        self._holder = record.holder if isinstance(record, CoordinatorLease) else None
        self._holder_fence = kv.create_revision

    async def _revoke_stale(self) -> None:
        for lease in sorted(self._stale_leases):
            try:
                await self._registry.revoke(lease)
            except RegistryError:
                return
            self._stale_leases.discard(lease)

    async def _watch_lease(self) -> None:
        """Tell the actor whenever the lease key disappears (runs for the actor's life)."""
        while True:
            try:
                await self._watch_once()
            except (RegistryError, RevisionCompacted) as exc:
                self.ctx.log.debug("lease watch broke (%s); watching again", exc)
            except trio.ClosedResourceError:
                return  # the registry was closed under us: nothing more to watch
            await trio.sleep(_WATCH_RETRY)

    async def _watch_once(self) -> None:
        snapshot = await self._registry.txn([], [Get(COORDINATOR_LEASE_KEY)])
        current = snapshot.responses[0]
        if not current:
            await self.ctx.ref.tell(_LeaseVacated())
        async with self._registry.watch(COORDINATOR_LEASE_KEY, snapshot.revision + 1) as events:
            async for event in events:
                if event.kv.key == COORDINATOR_LEASE_KEY and event.type is EventType.DELETE:
                    await self.ctx.ref.tell(_LeaseVacated())

    # ------------------------------------------------------------------ the inputs watch

    def _start_input_watch(self, fence: int, start: int) -> None:
        self._stop_input_watch()
        scope = trio.CancelScope()
        self._input_watch = scope
        self.ctx.start_task(self._watch_inputs, scope, fence, start)

    def _stop_input_watch(self) -> None:
        scope, self._input_watch = self._input_watch, None
        if scope is not None:
            scope.cancel()

    def _is_news(self, revisions: Iterable[int]) -> bool:
        """Whether any of ``revisions`` stands for a change no pass has seen yet: the
        mirror of the inputs changed since the last pass viewed it, changes were missed,
        or the routing table or a proxy moved past what a pass last read."""
        return any(
            revision == _MISSED
            or (
                self._store.changes != self._viewed_changes
                if revision == _STORE_CHANGED
                else revision > self._read_revision
            )
            for revision in revisions
        )

    async def _watch_inputs(self, scope: trio.CancelScope, fence: int, start: int) -> None:
        """While coordinating under ``fence``: tell the actor about each burst of changes
        under the input prefixes, ``debounce`` seconds after its first change."""
        with scope:
            send, receive = trio.open_memory_channel[int](256)
            async with trio.open_nursery() as nursery:
                for prefix in (*INPUT_PREFIXES, *_ROLLOUT_PREFIXES):
                    nursery.start_soon(self._forward_changes, prefix, start, send.clone())
                send.close()
                async with receive:
                    async for first in receive:
                        revisions = {first}
                        with trio.move_on_after(self._debounce):
                            async for revision in receive:
                                revisions.add(revision)
                        await self.ctx.ref.tell(_InputsChanged(fence, tuple(sorted(revisions))))

    async def _forward_changes(
        self, prefix: str, start: int, send: trio.MemorySendChannel[int]
    ) -> None:
        """Send the revision of every change under ``prefix`` from ``start`` on; a broken
        watch is opened again where it left off (a compacted one from now, saying so)."""
        next_revision: int | None = start
        async with send:
            while True:
                try:
                    async with self._registry.watch(prefix, next_revision) as events:
                        async for event in events:
                            kv = event.kv
                            next_revision = kv.mod_revision + 1
                            if prefix in _ROLLOUT_PREFIXES:
                                if self._rollouts:  # they matter only mid-rollout
                                    await send.send(kv.mod_revision)
                                continue
                            put = kv if event.type is EventType.PUT else None
                            if self._store.apply(kv.key, put, kv.mod_revision):
                                await send.send(_STORE_CHANGED)
                except RevisionCompacted as exc:
                    self.ctx.log.info("watch of %s lost changes (%s); looking now", prefix, exc)
                    next_revision = None
                    if prefix not in _ROLLOUT_PREFIXES:
                        self._store.invalidate()
                    await send.send(_MISSED)
                except RegistryError as exc:
                    self.ctx.log.debug("watch of %s broke (%s); watching again", prefix, exc)
                except trio.ClosedResourceError:
                    return  # the registry was closed under us: nothing more to watch
                await trio.sleep(_WATCH_RETRY)

    # ------------------------------------------------------------------ a pass

    async def _run_pass(self, *, trigger: str) -> None:
        started = trio.current_time()
        try:
            await self._pass(trigger, started)
        except LeadershipLost as exc:
            self._record_pass(started, trigger, "lost-lease", error=str(exc))
            self._drop("a write was refused", exc)
        except _Conflict as exc:
            self._last_digest = None
            self._store.invalidate()
            self._record_pass(started, trigger, "conflict", error=str(exc))
        except RegistryError as exc:
            # The registry could not be reached mid-pass: some batches may have
            # landed. Read everything again next tick.
            self._last_digest = None
            self._store.invalidate()
            self._record_pass(started, trigger, "registry-error", error=str(exc))
            self.ctx.log.warning("pass aborted: %s", exc)

    async def _read_view(self) -> RegistryView:
        """The inputs as they stand: the mirror the watch keeps current, read in full
        (one transaction, one revision) only when it holds no snapshot."""
        store = self._store
        if not store.loaded:
            reads = [Get(prefix, prefix=True) for prefix in INPUT_PREFIXES]
            result = await self._registry.txn([], reads)
            kvs: list[KeyValue] = []
            for response in result.responses:
                assert isinstance(response, list)
                kvs.extend(response)
            store.load(kvs, result.revision)
        self._viewed_changes = store.changes
        return store.view()

    async def _read_routing(self) -> tuple[KeyValue, ...]:
        """The routing table and every proxy record, read only while some app rolls
        (the table can be large; an idle pass never reads it). Read after the view: a
        later table is only a newer observation of what the proxies stopped routing."""
        reads = [Get(ROUTING_KEY), Get(PROXIES_PREFIX, prefix=True)]
        result = await self._registry.txn([], reads)
        self._read_revision = max(self._read_revision, result.revision)
        return tuple(
            kv for response in result.responses if isinstance(response, list) for kv in response
        )

    def _states(self, view: RegistryView, now: float) -> NodeStates:
        membership = self._membership() if self._membership is not None else None
        return states_from_view(
            view,
            policy=self._policy,
            now=now,
            membership=membership,
            remembered=self._remembered,
            cache=self._input_cache,
        )

    def _inputs(self, view: RegistryView, now: float, states: NodeStates) -> PlanInput:
        return plan_input_from_view(
            view, policy=self._policy, now=now, states=states, cache=self._input_cache
        )

    def _digest(self, inputs: PlanInput) -> str:
        return inputs_digest(inputs, cache=self._input_cache)

    async def _pass(self, trigger: str, started: float) -> None:
        view = await self._read_view()
        now = self._wall_clock()
        states = self._states(view, now)
        if states.down_writes:
            await self._apply_down(view, states)
            self._viewed_changes = self._store.changes
            view = self._store.view()
        self._remembered = states.remembered
        self._statuses = states.statuses
        self._schedule_grace(states.next_deadline, now)
        view = await self._placement_pass(trigger, started, view, now, states)
        # Every pass, whatever the planner's digest says: a rollout moves on what the
        # digest leaves out (what nodes publish, what proxies applied, the clock).
        await self._rollout_pass(view, now)

    async def _placement_pass(
        self, trigger: str, started: float, view: RegistryView, now: float, states: NodeStates
    ) -> RegistryView:
        """Plan and write the placements (skipped when the inputs did not move); the
        view as it stands after the writes."""
        inputs = self._inputs(view, now, states)
        digest = self._digest(inputs)
        if digest == self._last_digest and not self._waiting_on_time:
            self._counts["skipped"] += 1
            self._record_pass(started, trigger, "skipped", digest=digest)
            self._emit_pending(skipped=True)
            return view
        # Run again over the same inputs only because it waits on time: its reports
        # repeat the last ones and are rate-limited like a skipped tick's.
        same_inputs = digest == self._last_digest
        try:
            decisions = plan(
                inputs.apps,
                inputs.nodes,
                inputs.placements,
                self._policy,
                now,
                undecodable=inputs.undecodable,
                cache=self._cache,
            )
        except PlacementUnavailable as exc:
            self._last_digest = digest
            self._waiting_on_time = False
            self._stranded, self._refused, self._paused = (), None, None
            self._deferred = ()
            self._unplaced = tuple(
                Unplaced(app.name, PlacementUnavailable.code, str(exc))
                for app in inputs.apps
                if not (app.retired or app.blocked)
            )
            self._counts["applied"] += 1
            self._record_pass(started, trigger, PlacementUnavailable.code, digest=digest,
                              error=str(exc))
            self.ctx.emit("placement.unavailable", message=str(exc))
            self._emit_pending(skipped=False)
            return view
        if decisions.paused is not None:
            self._last_digest = digest
            self._waiting_on_time = False
            self._paused = decisions.paused
            self._counts["applied"] += 1
            self._record_pass(started, trigger, "paused", digest=digest, decisions=decisions)
            self.ctx.emit(
                "placement.paused",
                keys=list(decisions.paused.keys),
                message=decisions.paused.message,
            )
            return view
        written_plan, untouched = self._plan_writes(view, inputs, decisions, now)
        await self._apply(written_plan)
        view = self._store.view()
        after = self._inputs(view, now, states)
        # The digest of what this pass decided: its inputs and its own writes. A change
        # the watch brought while it wrote is in the view too, undecided: no digest, so
        # the pass it triggers plans instead of skipping it as decided.
        decided = self._store.changes == self._viewed_changes
        self._last_digest = self._digest(after) if decided else None
        self._waiting_on_time = needs_time(inputs, decisions)
        self._unplaced = decisions.unplaced
        self._stranded = decisions.stranded
        self._deferred = decisions.deferred
        self._refused = decisions.refused
        self._paused = None
        self._counts["applied"] += 1
        self._record_pass(
            started, trigger, "applied", digest=self._last_digest, decisions=decisions,
            written=written_plan,
            untouched=untouched,
        )
        self._emit_outcomes(decisions, repeat=same_inputs)
        return view

    # ------------------------------------------------------------------ rollouts

    async def _rollout_pass(self, view: RegistryView, now: float) -> None:
        """Move every app's rollout on (:func:`~._rollout.plan_rollout`), write the
        records that changed under the fence, report, and time the next wait."""
        holding = self._holding
        if holding is None:
            raise LeaseExpired("the lease was dropped during the pass")
        candidates = self._rollout_candidates(view)
        self._rolled = None  # until this pass is through: a failed one looks at every app
        # The table and the proxies are looked at only when some app rolls: an idle
        # pass looks at nothing but what changed, with nothing decoded.
        rolling = bool(self._rollouts) or any(
            current.record.rollout is not None
            for app in candidates
            if (current := view.placements.get(app)) is not None
        )
        routed = self._routed_urls(await self._read_routing(), now) if rolling else None
        plans: dict[str, RolloutPlan] = {}
        for app in sorted(candidates):
            current = view.placements.get(app)
            record = view.apps.get(app)
            self._unsettle(app)
            if current is None or record is None:
                continue
            placement = current.record
            unrouted = (
                frozenset() if placement.rollout is None else self._unrouted(app, view, routed)
            )
            inputs = rollout_inputs(record, placement, view.nodes, unrouted, now)
            plan = RolloutPlan(None) if inputs is None else plan_rollout(inputs)
            plans[app] = plan
            if placement.rollout is None and plan == _AT_REST:
                # Nothing rolls and nothing started rolling from these very records (the
                # app's, its placement's and its nodes'): the same objects decide the
                # same, whatever the time, so it is not looked at again until one of
                # them changes (only a rollout in progress waits on the time).
                self._settle(app, placement.nodes)
        wanted = {app: plan.record for app, plan in plans.items()}
        paused = self._paused is not None
        batches = plan_rollout_writes(
            wanted,
            view.placements,
            fence=holding.fence,
            max_writes=self._max_writes,
            # The app specs nodes act on move with the placements, so not while paused.
            specs=None if paused else self._input_cache.node_specs(view.apps),
        )
        rollout_writes = 0
        for batch in batches:
            revision = await self._send_fenced(batch.compares, batch.operations)
            for write in batch.writes:
                self._store.record(write.key, write.record, revision)
            rollout_writes += len(batch.writes)
            for write in batch.writes:
                before = view.placements[write.app].record.rollout
                self._report_rollout(write.app, before, plans[write.app], now)
        if rollout_writes and self._last_pass is not None:
            # A pass the planner skipped may still have moved a rollout on: say so.
            last = self._last_pass
            self._last_pass = dataclasses.replace(
                last, counts={**last.counts, "rollout_writes": rollout_writes}
            )
        rollouts = {app: r for app, r in self._rollouts.items() if app not in plans}
        rollouts.update({app: r for app, r in wanted.items() if r is not None})
        self._rollouts = dict(sorted(rollouts.items()))
        self._restless = {app for app in plans if app not in self._at_rest}
        self._rolled = (view, paused)
        due = [plan.wake_at for plan in plans.values() if plan.wake_at is not None]
        self._schedule_rollout(min(due) if due else None, now)

    def _rollout_candidates(self, view: RegistryView) -> set[str]:
        """The apps a rollout pass must look at: those whose app record, placement or
        placed nodes' records changed since the last rollout pass, and those not at rest
        then (rolling, halted, or waiting); every placed app when that is not known."""
        rolled = self._rolled
        if rolled is not None and rolled[1] == (self._paused is not None):
            last = rolled[0]
            apps = _changes_of(view.apps, last.apps)
            placements = _changes_of(view.placements, last.placements)
            nodes = _changes_of(view.nodes, last.nodes)
            if apps is not None and placements is not None and nodes is not None:
                candidates = set(apps | placements) | self._restless | self._rollouts.keys()
                for node in nodes:
                    candidates |= self._rest_on.get(node, set())
                return candidates
        self._at_rest, self._rest_on = {}, {}
        return set(view.placements)

    def _settle(self, app: str, nodes: Iterable[str]) -> None:
        """``app`` is at rest, placed on ``nodes``."""
        hosts = tuple(nodes)
        self._at_rest[app] = hosts
        for node in hosts:
            self._rest_on.setdefault(node, set()).add(app)

    def _unsettle(self, app: str) -> None:
        """``app`` is looked at again: it is at rest no more (until it is found so)."""
        for node in self._at_rest.pop(app, ()):
            apps = self._rest_on.get(node)
            if apps is not None:
                apps.discard(app)
                if not apps:
                    del self._rest_on[node]

    def _routed_urls(self, kvs: Iterable[KeyValue], now: float) -> frozenset[str] | None:
        """Every backend URL of the routing table as read, when every registered proxy
        has applied that table (or a newer one); None when one has not yet (or the
        table does not decode). A proxy whose record is no longer refreshed (its
        ``corral proxy run`` is gone: :meth:`ProxyRecord.not_reporting_for`) is not
        waited for: it would only hold every node a drain longer."""
        # Imported here: the routing package imports this one.
        from corral.actors.routing import TableVersion, decode_table_json

        table = None
        applied: list[TableVersion | None] = []
        for kv in kvs:
            if kv.key == ROUTING_KEY:
                try:
                    table = decode_table_json(kv.value)
                except SchemaError:  # a broken table: nothing is known to be applied
                    return None
                continue
            record = decode_record(kv.key, kv.value)
            if isinstance(record, ProxyRecord) and record.not_reporting_for(now) is None:
                fence, revision = record.applied_fence, record.applied_revision
                applied.append(
                    None if fence is None or revision is None else TableVersion(fence, revision)
                )
        if table is None:
            # No table: no proxy routes to anything yet (an unapplied one still might).
            return frozenset() if all(v is None for v in applied) else None
        if any(v is None or v < table.version for v in applied):
            return None
        return frozenset(url for urls in table.domains.values() for url in urls)

    def _unrouted(
        self, app: str, view: RegistryView, routed: frozenset[str] | None
    ) -> frozenset[str]:
        """The placed nodes of ``app`` no proxy routes to any more: their instance's URL
        is not in a table every proxy applied."""
        if routed is None:
            return frozenset()
        from corral.actors.routing import backend_url

        current = view.placements.get(app)
        out = set()
        for node in () if current is None else current.record.nodes:
            record = view.nodes.get(node)
            entry = None if record is None else record.serving.get(app)
            if record is None or entry is None or not record.advertise_host:
                out.add(node)
            elif backend_url(record.advertise_host, entry.public_port) not in routed:
                out.add(node)
        return frozenset(out)

    def _report_rollout(
        self, app: str, before: RolloutRecord | None, plan: RolloutPlan, now: float
    ) -> None:
        """The events of one app's rollout write: ``deploy.rolling`` when it begins (or
        retargets) and as each node switches, ``deploy.halted``, ``deploy.done``."""
        after = plan.record
        if after is not None and (before is None or before.revision != after.revision):
            self.ctx.emit(
                "deploy.rolling",
                app=app,
                revision=after.revision,
                nodes=len(after.nodes),
                progress=rollout_status(after),
            )
        for action in plan.actions:
            if isinstance(action, SwitchRevision):
                self.ctx.emit(
                    "deploy.rolling",
                    app=app,
                    revision=action.revision,
                    node=action.node,
                    progress=rollout_status(after),
                )
            elif isinstance(action, RolloutHalted):
                self.ctx.emit(
                    "deploy.halted",
                    app=app,
                    revision=None if after is None else after.revision,
                    reason=action.reason,
                )
            elif isinstance(action, RolloutDone):
                self.ctx.emit(
                    "deploy.done",
                    app=app,
                    revision=action.revision,
                    seconds=None if before is None else max(0.0, now - before.started_at),
                )

    def _schedule_rollout(self, due: float | None, now: float) -> None:
        """Run a pass when the earliest rollout wait ends (wall-clock ``due``)."""
        if due == self._rollout_due:
            return
        if self._rollout_timer is not None:
            self._rollout_timer.cancel()
            self._rollout_timer = None
        self._rollout_due = due
        if due is not None:
            self._rollout_timer = self.ctx.after(max(0.0, due - now), _RolloutDue())

    def _rollouts_state(self) -> tuple[AppRollout, ...]:
        """The rollouts in progress or halted, for the state reply (by app)."""
        return tuple(
            AppRollout(app, rollout_status(record) or "", record)
            for app, record in sorted(self._rollouts.items())
        )

    async def _apply_down(self, view: RegistryView, states: NodeStates) -> None:
        """Write the ``down/<node>`` entries that changed, under the fence."""
        holding = self._holding
        if holding is None:
            raise LeaseExpired("the lease was dropped during the pass")
        batches = plan_down_writes(
            states.down_writes,
            {node: current.mod_revision for node, current in view.down.items()},
            fence=holding.fence,
            max_writes=self._max_writes,
        )
        for batch in batches:
            revision = await self._send_fenced(batch.compares, batch.operations)
            for node, entry in batch.entries.items():
                self._store.record(down_key(node), entry, revision)
                before = view.down.get(node)
                was_down = before is not None and before.record.down_since is not None
                if entry is not None and entry.down_since is not None and (
                    before is None or before.record.down_since != entry.down_since
                ):
                    # Down, or down again: a spell after a comeback no pass saw.
                    self.ctx.emit("node.down", node=node, down_since=entry.down_since)
                elif entry is None and was_down and node in view.nodes:
                    self.ctx.emit("node.back", node=node)

    def _schedule_grace(self, deadline: float | None, now: float) -> None:
        """Run a pass when the earliest grace of a down node holding work lapses."""
        if deadline == self._grace_deadline:
            return
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        self._grace_deadline = deadline
        if deadline is not None:
            self._grace_timer = self.ctx.after(max(0.0, deadline - now), _GraceLapsed())

    def _plan_writes(
        self, view: RegistryView, inputs: PlanInput, decisions: Decisions, now: float
    ) -> tuple[WritePlan, int]:
        """The writes of a pass, and how many apps were left out as surely unchanged."""
        holding = self._holding
        if holding is None:
            raise LeaseExpired("the lease was dropped during the pass")
        # Only the apps a write may concern: placed elsewhere than their record says,
        # losing or gaining their record, or with instances a forced drain stopped now
        # or before. Every other app's record already says what was decided (the fence
        # guard of every write still stops a superseded coordinator).
        placed, decided = inputs.placements, decisions.placements
        concerned = {
            app
            for app, nodes in decided.items()
            if (p := placed.get(app)) is None or p.nodes != nodes
        }
        concerned.update(placed.keys() - decided.keys(), decisions.stopped)
        concerned.update(app for app, p in placed.items() if p.stopped)
        # Every instance a pass leaves placed reserves what its app declares: a record
        # that says otherwise (a resource change placed in place) is written too.
        declared = {
            app.name: (app.memory_mb, app.disk_mb)
            for app in inputs.apps
            if app.name in concerned
            or ((p := placed.get(app.name)) is not None and p.reserved is not None)
        }
        concerned.update(
            app
            for app, size in declared.items()
            if app in decided
            and (p := placed.get(app)) is not None
            and p.reserved not in (None, size)
        )
        targets = {app: decided.get(app) for app in sorted(concerned)}
        written = plan_writes(
            targets,
            view.placements,
            fence=holding.fence,
            decided_at=now,
            max_writes=self._max_writes,
            stopped=decisions.stopped,
            specs=self._input_cache.node_specs(view.apps),
            reserved=declared,
        )
        if written.superseded:
            newest = max(view.placements[app].record.fence for app in written.superseded)
            raise FenceRejected(holding.fence, newest)
        return written, len(placed.keys() | decided.keys()) - len(targets)

    async def _send_fenced(
        self, compares: Iterable[Compare], operations: Iterable[Put | Delete]
    ) -> int:
        """Send one guarded transaction; its revision. Raises LeaseExpired /
        FenceRejected when the lease is no longer ours, _Conflict when a record
        changed since it was read."""
        holding = self._holding
        if holding is None or trio.current_time() >= holding.deadline:
            raise LeaseExpired(self._past_deadline())
        result = await self._registry.txn(
            list(compares), list(operations), [Get(COORDINATOR_LEASE_KEY)]
        )
        if not result.succeeded:
            lease_kvs = result.responses[0] if result.responses else None
            lease_kv = lease_kvs[0] if isinstance(lease_kvs, list) and lease_kvs else None
            if lease_kv is None or lease_kv.create_revision != holding.fence:
                raise FenceRejected(
                    holding.fence, None if lease_kv is None else lease_kv.create_revision
                )
            # Still ours: a record changed since it was read. Read again next tick.
            raise _Conflict()
        return result.revision

    async def _apply(self, written_plan: WritePlan) -> None:
        for batch in written_plan.batches:
            revision = await self._send_fenced(batch.compares, batch.operations)
            for write in batch.writes:
                # The mirror holds it at once (the watch brings it again, as old news),
                # as the very object written, so its inputs stay cached.
                self._store.record(write.key, write.record, revision)

    # ------------------------------------------------------------------ reporting

    def _report(
        self, kind: str, subject: tuple[str, str], says: str, fields: Mapping[str, Any], *,
        repeat: bool,
    ) -> None:
        """Emit ``kind`` with ``fields`` about ``subject`` (app, node), as the report log
        (:mod:`._reports`) admits it."""
        app, node = subject
        if self._reports.admit((kind, app, node), says, trio.current_time(), repeat=repeat):
            self.ctx.emit(kind, **fields)

    def _forget_reports(self, kind: str, current: set[tuple[str, str]]) -> None:
        """Drop the memory of ``kind`` reports no longer current: if one comes back, it
        is reported at once."""
        self._reports.keep_only(kind, current)

    def _emit_pending(self, *, skipped: bool) -> None:
        kind = "placement.pending"
        self._forget_reports(kind, {(u.app, "") for u in self._unplaced})
        for u in self._unplaced:
            fields = {"skipped": skipped, "app": u.app, "reason": u.reason, "message": u.message}
            self._report(kind, (u.app, ""), u.message, fields, repeat=skipped)

    def _emit_outcomes(self, decisions: Decisions, *, repeat: bool) -> None:
        self._emit_pending(skipped=False)
        # Each event's fields are the item as ``corral plan`` prints it (of the reports
        # only: the placements of every app are not wanted here).
        doc = decisions_to_json(
            dataclasses.replace(decisions, placements={}, removals=(), additions=(), stopped={})
        )
        kind = "placement.deferred"
        self._forget_reports(kind, {(d.app, d.node) for d in decisions.deferred})
        for d, fields in zip(decisions.deferred, doc["deferred"], strict=True):
            # What it says is its kind (cooldown, disruption budget): the text counts seconds.
            says = d.reason.partition(":")[0]
            self._report(kind, (d.app, d.node), says, fields, repeat=repeat)
        kind = "placement.stranded"
        self._forget_reports(kind, {(s.app, s.node) for s in decisions.stranded})
        for s, fields in zip(decisions.stranded, doc["stranded"], strict=True):
            self._report(kind, (s.app, s.node), s.reason, fields, repeat=repeat)
        kind = "placement.refused"
        refused = decisions.refused
        self._forget_reports(kind, set() if refused is None else {("", "")})
        if refused is not None:
            self._report(kind, ("", ""), refused.message, doc["refused"], repeat=repeat)

    def _record_pass(
        self,
        started: float,
        trigger: str,
        outcome: str,
        *,
        digest: str | None = None,
        decisions: Decisions | None = None,
        written: WritePlan | None = None,
        untouched: int = 0,
        error: str | None = None,
    ) -> None:
        counts: dict[str, int] = {}
        if written is not None:
            counts.update(
                writes=len(written.writes),
                batches=len(written.batches),
                removals=written.removals,
                placements=written.placements,
                unchanged=len(written.unchanged) + untouched,
            )
        if decisions is not None:
            counts.update(
                placed=len(decisions.placements),
                unplaced=len(decisions.unplaced),
                deferred=len(decisions.deferred),
                stranded=len(decisions.stranded),
            )
        holding = self._holding
        self._last_pass = CoordinatorPass(
            time=started,
            duration=trio.current_time() - started,
            wall_time=self._wall_clock(),
            trigger=trigger,
            outcome=outcome,
            skipped=outcome == "skipped",
            digest=digest,
            fence=None if holding is None else holding.fence,
            counts=counts,
            error=error,
        )
        if outcome != "skipped":
            self.ctx.emit(
                "coordinator.pass",
                outcome=outcome,
                trigger=trigger,
                writes=counts.get("writes", 0),
                error=error,
                duration=self._last_pass.duration,
            )

    def _state(self) -> CoordinatorState:
        coordinating = self._coordinating()
        holding = self._holding
        return CoordinatorState(
            node=self._node_id,
            coordinating=coordinating,
            holder=self._holder,
            fence=holding.fence if holding is not None else self._holder_fence,
            lease_ttl=self._lease_ttl,
            policy=self._policy,
            last_pass=self._last_pass,
            passes=PassCounts(**self._counts),
            unplaced=self._unplaced,
            deferred=self._deferred,
            stranded=self._stranded,
            refused=self._refused,
            paused=self._paused,
            membership=self._membership is not None,
            node_states=self._statuses if coordinating else (),
            rollouts=self._rollouts_state() if coordinating else (),
        )


def _changes_of(current: Mapping[str, object], last: Mapping[str, object]) -> frozenset[str] | None:
    """The keys that differ between two sections of the view's line; None when unknown."""
    if current is last:
        return frozenset()
    return current.changes_since(last) if isinstance(current, Section) else None


class _Conflict(RegistryError):
    """A record written by someone else since the pass read it; retry next tick."""

    def __init__(self) -> None:
        super().__init__(
            "a placement record changed after this pass read it; its writes were not applied "
            "and the next tick reads everything again"
        )


def coordinator_child_spec(
    node_id: str,
    registry: Registry,
    policy: Policy | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    wall_clock: Callable[[], float] = time.time,
    *,
    max_writes: int = DEFAULT_MAX_WRITES,
    membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
    debounce: float = DEFAULT_WATCH_DEBOUNCE,
    name: str = "coordinator",
    shutdown_grace: float = 5.0,
) -> ChildSpec:
    """A ChildSpec running :class:`Coordinator` (PERMANENT) for the node assembly.

    ``shutdown_grace`` bounds the hand-back (one revoke) on shutdown.
    """

    def factory() -> Coordinator:
        return Coordinator(
            node_id,
            registry,
            policy,
            lease_ttl,
            wall_clock,
            max_writes=max_writes,
            membership=membership,
            debounce=debounce,
        )

    return ChildSpec(
        name=name, factory=factory, restart=Restart.PERMANENT, shutdown_grace=shutdown_grace
    )
