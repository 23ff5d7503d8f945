"""SwimMembership: the thin actor driving the pure SWIM machine over the node's transport.

It feeds the :class:`~._swim.Swim` machine with trio's clock
(``trio.current_time``), the SWIM messages that arrive from the membership
actors of other nodes, and the seeds a :data:`SeedSource` names (the node ids
found in the registry's node records, by default). What the machine returns it
carries out: each message goes out from its own short task, so a dial to an
unreachable peer never delays a probe (and at most ``max_in_flight`` wait at
once; beyond that a message is dropped, as a full UDP buffer would), the next
wake-up becomes a timer, and each transition becomes an event —
``member.alive``, ``member.suspect``, ``member.down``, ``member.left`` — naming
the member, its incarnation and who reported it.

The view is answered to :class:`GetMembership` and handed to the optional
``on_view`` hook after every change, and each local actor named in ``notify``
is then told its message (without waiting: a full mailbox already holds a
nudge). On stop the node leaves gracefully: every member hears it left, so
none waits out a suspicion.

With a seed source, its answer is also the set of node ids the machine admits
(:meth:`~._swim.Swim.admit`): a node id without a registry record never becomes
a member. A message from a node not yet admitted, or word from a member that
such a node is alive, makes the actor ask the seed source again within a second
(it may just have registered: nodes started at once miss each other's records). Each life of the
node starts at :func:`~._swim.life_incarnation` of the wall clock, above every
incarnation of the lives before it, so a restarted node is alive at once.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from corral.actors.membership._messages import (
    Ack,
    Gossip,
    Nack,
    Ping,
    PingReq,
    StateSync,
    SwimMessage,
    UpdateState,
)
from corral.actors.membership._swim import (
    NEVER,
    MemberState,
    Step,
    Swim,
    SwimConfig,
    Transition,
    incarnation_ceiling,
    life_incarnation,
    wire_state,
)
from corral.registry import NodeRecord, Registry, RegistryError, read_records
from corral.supervision import (
    Actor,
    ActorNotFound,
    ActorStopped,
    ChildSpec,
    MailboxFull,
    Restart,
    SupervisionError,
    TimerHandle,
)
from corral.transport import TransportError, message

__all__ = [
    "DEFAULT_REJOIN_INTERVAL",
    "MEMBERSHIP",
    "GetMembership",
    "Leave",
    "MemberInfo",
    "MembershipView",
    "SeedSource",
    "SwimMembership",
    "membership_child_spec",
    "registry_seeds",
]

#: The actor's name on every node: peers address ``<node>/membership``.
MEMBERSHIP: Final = "membership"
#: Seconds between asking the seed source for nodes we do not know alive.
DEFAULT_REJOIN_INTERVAL: Final = 10.0
#: Seconds a graceful leave waits for its goodbyes to go out.
_LEAVE_WAIT: Final = 1.0
#: Seconds between early asks of the seed source, made when a node not yet
#: admitted talks to us (it may have registered since the last ask).
_EARLY_SEEDS_INTERVAL: Final = 1.0

#: Returns the ids of nodes to join through (this node's own id is skipped).
SeedSource = Callable[[], Awaitable[Iterable[str]]]

_EVENTS: Final = {
    MemberState.ALIVE: "member.alive",
    MemberState.SUSPECT: "member.suspect",
    MemberState.DEAD: "member.down",
    MemberState.LEFT: "member.left",
}
_SWIM_MESSAGES: Final = (Ping, Ack, PingReq, Nack, Gossip, StateSync)


@message("membership.get-view")
@dataclass(frozen=True)
class GetMembership:
    """Ask for the current view: answered with a :class:`MembershipView`."""


@message("membership.leave")
@dataclass(frozen=True)
class Leave:
    """Leave the cluster gracefully now (a drain); the node answers nothing more."""


@message("membership.member-info")
@dataclass(frozen=True)
class MemberInfo:
    """One member as this node sees it.

    Attributes:
        since: unix time at which it entered this state (as seen here).
        reporter: the node whose claim put it in this state.
    """

    node: str
    state: UpdateState
    incarnation: int
    since: float
    reporter: str


@message("membership.view-reply")
@dataclass(frozen=True)
class MembershipView:
    """A node's view of the cluster.

    Attributes:
        node: the node that holds this view.
        incarnation: that node's own incarnation.
        health: its Lifeguard local health multiplier (0 is healthy).
        members: every known member, itself included, sorted by id.
    """

    node: str
    incarnation: int
    health: int
    members: tuple[MemberInfo, ...]

    def state_of(self, node: str) -> UpdateState | None:
        """The state of ``node`` in this view, or None when unknown."""
        for member in self.members:
            if member.node == node:
                return member.state
        return None


@dataclass(frozen=True)
class _Tick:
    """Timer: the machine has work due."""


@dataclass(frozen=True)
class _Seeds:
    """The seed source answered."""

    nodes: tuple[str, ...]


def registry_seeds(registry: Registry) -> SeedSource:
    """A seed source naming every node with a record under ``nodes/`` in ``registry``.

    Raises (from the returned function):
        RegistryError: the registry could not be read.
    """

    async def seeds() -> list[str]:
        records, _ = await read_records(registry, "nodes/")
        return sorted(r.id for r in records.values() if isinstance(r, NodeRecord))

    return seeds


class SwimMembership(Actor):
    """SWIM + Lifeguard membership of this node.

    Args:
        seeds: where to find nodes to join through; asked at start and every
            ``rejoin_interval`` (only nodes not known alive are contacted).
            None: join nobody (others may still join us).
        config: the SWIM settings.
        rejoin_interval: seconds between asks of ``seeds``.
        rng: the machine's randomness (a fresh, OS-seeded one by default).
        wall_clock: unix time, for the ``since`` of each member in the view.
        on_view: called with the view after every change.
        max_in_flight: messages waiting to be sent at once, at most.
        notify: (local actor path, message) pairs: each actor is told its message
            after every change of the view (a coordinator's nudge, say).
    """

    mailbox_size = 256

    def __init__(
        self,
        *,
        seeds: SeedSource | None = None,
        config: SwimConfig | None = None,
        rejoin_interval: float = DEFAULT_REJOIN_INTERVAL,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        on_view: Callable[[MembershipView], None] | None = None,
        max_in_flight: int = 64,
        notify: Sequence[tuple[str, object]] = (),
    ) -> None:
        super().__init__()
        if not (rejoin_interval > 0 and math.isfinite(rejoin_interval)):
            raise ValueError(f"rejoin_interval must be positive seconds, not {rejoin_interval!r}")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._seeds = seeds
        self._config = config if config is not None else SwimConfig()
        self._rejoin_interval = rejoin_interval
        self._rng = rng if rng is not None else random.Random()
        self._wall_clock = wall_clock
        self._on_view = on_view
        self._max_in_flight = max_in_flight
        self._notify = tuple(notify)
        self._swim: Swim | None = None
        self._timer: TimerHandle | None = None
        self._timer_at = NEVER
        self._in_flight = 0
        self._seeds_wanted = trio.Event()
        self._not_admitted = 0
        #: messages that could not be sent, by reason
        self.lost: dict[str, int] = {}

    @property
    def machine(self) -> Swim:
        """The state machine (available from ``started`` on)."""
        if self._swim is None:
            raise RuntimeError("the membership machine exists once the actor has started")
        return self._swim

    async def started(self) -> None:
        # Each life starts above every incarnation of the lives before it: alive at once.
        start = life_incarnation(self._wall_clock())
        self._swim = Swim(
            self.ctx.node_id, self._config, self._rng, trio.current_time(), incarnation=start
        )
        self._apply(Step((), (), self._swim.next_deadline))
        if self._seeds is not None:
            # Members are the nodes with a registry record: none until the first read.
            self._swim.admit(())
            self.ctx.start_task(self._follow_seeds, self._seeds)

    async def handle(self, message: object) -> object:
        swim = self.machine
        if isinstance(message, _SWIM_MESSAGES):
            swim.ceiling = incarnation_ceiling(self._wall_clock())
            self._apply(swim.receive(message, trio.current_time()))
            # Heard from, or of, a node not admitted: it may have registered since.
            refused = swim.stats.get("not admitted", 0) + swim.stats.get("hearsay not admitted", 0)
            if refused != self._not_admitted:
                self._not_admitted = refused
                self._seeds_wanted.set()  # it may have registered since the last read
            return None
        match message:
            case _Tick():
                self._timer, self._timer_at = None, NEVER
                self._apply(swim.tick(trio.current_time()))
                return None
            case _Seeds(nodes=nodes):
                swim.admit(nodes)
                self._apply(swim.join(nodes, trio.current_time()))
                return None
            case GetMembership():
                return self.view()
            case Leave():
                await self._leave()
                return None
        return await super().handle(message)

    async def stopping(self) -> None:
        if self._swim is not None and not self._swim.leaving:
            await self._leave()

    # ------------------------------------------------------------------ reading

    def view(self) -> MembershipView:
        """This node's view now."""
        swim = self.machine
        now, wall = trio.current_time(), self._wall_clock()
        members = tuple(
            MemberInfo(
                v.node, wire_state(v.state), v.incarnation, wall - (now - v.since), v.reporter
            )
            for v in swim.view()
        )
        return MembershipView(self.ctx.node_id, swim.incarnation, swim.health, members)

    # ------------------------------------------------------------------ acting

    def _apply(self, step: Step) -> None:
        for send in step.sends:
            if self._in_flight >= self._max_in_flight:
                self._note_lost("too many messages in flight")
                continue
            self._in_flight += 1
            self.ctx.start_task(self._send, send.to, send.message)
        for transition in step.transitions:
            self._emit(transition)
        if step.transitions:
            self._publish()
        self._schedule(step.wake_at)

    def _publish(self) -> None:
        """Hand the view to ``on_view`` and nudge every actor of ``notify``."""
        if self._on_view is not None:
            self._on_view(self.view())
        for path, note in self._notify:
            try:
                self.ctx.system.ref(path).tell_nowait(note)
            except MailboxFull:
                pass  # a nudge is already waiting there
            except (ActorNotFound, ActorStopped) as exc:
                self.ctx.log.debug("cannot nudge %s about the view: %s", path, exc)

    def _schedule(self, wake_at: float) -> None:
        if wake_at >= self._timer_at or wake_at == NEVER:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake_at
        self._timer = self.ctx.after(wake_at - trio.current_time(), _Tick())

    def _emit(self, transition: Transition) -> None:
        previous = transition.previous
        self.ctx.emit(
            _EVENTS[transition.state],
            member=transition.node,
            incarnation=transition.incarnation,
            reporter=transition.reporter,
            previous=None if previous is None else previous.value,
        )

    async def _send(self, to: str, msg: SwimMessage) -> None:
        try:
            await self.ctx.system.ref(self.ctx.path, node=to).tell(msg)
        except (TransportError, SupervisionError) as exc:
            self._note_lost(type(exc).__name__)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._note_lost("transport closed")
        finally:
            self._in_flight -= 1

    def _note_lost(self, reason: str) -> None:
        self.lost[reason] = self.lost.get(reason, 0) + 1

    async def _leave(self) -> None:
        step = self.machine.leave(trio.current_time())
        for transition in step.transitions:
            self._emit(transition)
        if step.transitions:
            self._publish()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, NEVER
        self.ctx.emit("member.leaving", member=self.ctx.node_id, told=len(step.sends))
        with trio.move_on_after(_LEAVE_WAIT):
            async with trio.open_nursery() as nursery:
                for send in step.sends:
                    self._in_flight += 1
                    nursery.start_soon(self._send, send.to, send.message)

    async def _follow_seeds(self, seeds: SeedSource) -> None:
        while True:
            self._seeds_wanted = trio.Event()
            try:
                nodes = tuple(sorted(set(await seeds())))
            except RegistryError as exc:
                self.ctx.log.warning("cannot read the seed nodes to join through: %s", exc)
            else:
                await self.ctx.ref.tell(_Seeds(nodes))
            with trio.move_on_after(self._rejoin_interval):
                await trio.sleep(_EARLY_SEEDS_INTERVAL)
                await self._seeds_wanted.wait()


def membership_child_spec(
    *,
    seeds: SeedSource | None,
    config: SwimConfig | None = None,
    rejoin_interval: float = DEFAULT_REJOIN_INTERVAL,
    on_view: Callable[[MembershipView], None] | None = None,
    rng_factory: Callable[[], random.Random] = random.Random,
    name: str = MEMBERSHIP,
    shutdown_grace: float = 2.0,
    notify: Sequence[tuple[str, object]] = (),
    wall_clock: Callable[[], float] = time.time,
) -> ChildSpec:
    """A ChildSpec running :class:`SwimMembership` (PERMANENT) for the node assembly.

    Every node must use the same ``name``: peers send to ``<node>/<name>``.
    Wire it with ``membership_child_spec(seeds=registry_seeds(registry))``.
    """

    def factory() -> SwimMembership:
        return SwimMembership(
            seeds=seeds,
            config=config,
            rejoin_interval=rejoin_interval,
            rng=rng_factory(),
            on_view=on_view,
            notify=notify,
            wall_clock=wall_clock,
        )

    return ChildSpec(
        name=name, factory=factory, restart=Restart.PERMANENT, shutdown_grace=shutdown_grace
    )
