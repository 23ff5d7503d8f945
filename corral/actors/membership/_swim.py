"""SWIM failure detection with the Lifeguard refinements, as a pure state machine.

Theory of operation
-------------------
One :class:`Swim` object is one node's view of the cluster. It never reads a
clock, draws its own randomness, or touches the network: every call passes
``now`` (seconds on any monotonic clock), randomness comes from the injected
``random.Random``, and every call returns a :class:`Step` — the messages to
send, the transitions it made, and ``wake_at``, the time by which the driver
must call :meth:`Swim.tick` again. A driver (the actor, or the simulator)
loops: deliver what arrives to :meth:`Swim.receive`, call :meth:`Swim.tick` at
``wake_at``, send what comes out.

**Members.** Each member has a state (alive, suspect, dead, left) and an
incarnation, a number only the member itself raises. Claims are ordered by
incarnation; at equal incarnation suspect beats alive and dead beats both:

========================  =======================================================
claim about X at inc i     taken when our record of X is
========================  =======================================================
alive(i)                   unknown, or any state at inc < i
suspect(i)                 alive at inc <= i (already suspect: a confirmation)
dead(i)                    alive or suspect at inc <= i
left(i)                    anything but left, at inc <= i
========================  =======================================================

A claim that X is suspect or dead, received by X itself, is *refuted*: X
raises its incarnation past the claim's and spreads alive at the new one. A
claim about an incarnation X has already refuted means someone missed the
refutation: X spreads its current alive again (no new incarnation).

**Who may say what.** Each message's ``source`` is the node the transport
authenticated (the kernel refuses any other), and each message carries the
sender's own incarnation. So a node tells a member's own word about itself
(*first-hand*: sent by X about X) from *hearsay* (a third node relaying a claim
about X), and keeps for each member the highest incarnation it *announced*
first-hand:

* only X raises X's incarnation: hearsay above what X announced is not
  believed and not spread, and a claim about this node above its own
  incarnation is refuted past only while it is near this life's start (an
  earlier life's, started moments before): no claim drives a node to the cap;
* only X says X left: hearsay of a leave is not believed;
* hearsay not believed is checked with X itself: a direct ping (one per probe
  interval per member), whose ack carries X's incarnation first-hand;
* a member first known by hearsay is alive at incarnation 0 until it speaks;
* a member's own word above :attr:`Swim.ceiling` (:func:`incarnation_ceiling`
  of the wall clock, set by the shell) is not believed either: a node id's
  impostor cannot push it out of reach of that node's next life;
* with :meth:`Swim.admit`, a node id outside the admitted set (the registry's
  node records) never becomes a member, and its messages are dropped (counted
  in :attr:`Swim.stats` as ``not admitted``; word of it alive from an admitted
  node as ``hearsay not admitted``), so the shell can read the registry again.

Suspect and dead from others at or below what X announced are ordinary SWIM,
as is our own verdict after our suspicion timer. A new life of a node starts
at :func:`life_incarnation` of its start time, above every incarnation an
earlier life reached, so it is alive at once and no claim about an earlier
life binds it (incarnations cannot be capped out by others).

**Probing.** Every probe interval the node pings the next member of a
shuffled round-robin list (memberlist's order: reshuffled at each wrap, a new
member inserted at a random place). No ack within the probe timeout: it asks
``indirect_checks`` random alive members to ping the target for it
(ping-req). No ack by the end of the interval: the target becomes suspect.

**Suspicion.** A suspect member is declared dead when its suspicion timer
ends, unless it refutes first. The timer's minimum is
``SuspicionMult * max(1, log10 N) * interval``.

**Dissemination.** Every change is queued as an update, one per member (a
newer one replaces the older), and piggybacked on pings, acks and ping-reqs,
fewest-sent first, each at most ``RetransmitMult * ceil(log10(N + 1))``
times. A gossip tick also sends queued updates to ``gossip_nodes`` random
members. A periodic push-pull exchanges full views with one alive member, and
a reconnect tick offers ours to one dead member, so views converge again after
a partition heals. A member we hold dead that sends us anything (it was paused,
not dead) is told at once that we hold it dead, so it refutes without waiting
for a push-pull. Joining sends our view to each seed, which answers with its.

**Lifeguard** (Dadgar et al., DSN 2018), on unless ``lifeguard=False``:

* *Local health* (0 .. ``awareness_max - 1``) multiplies the probe interval
  and timeout by ``health + 1``. It grows with each nack we expected and did
  not get (or by one for a failed probe with no relay to nack), and when we
  refute a claim about ourselves; it shrinks by one per successful probe.
* *Nacks*: a relay answers a ping-req with a nack when the target stayed
  silent for 80 % of its probe timeout, so a prober that hears neither ack nor
  nack learns that it is itself the slow one.
* *Dynamic suspicion*: the timer starts at ``SuspicionMaxTimeoutMult * min``
  and shrinks toward ``min`` logarithmically as independent reporters confirm
  the suspicion, reaching it after ``SuspicionMult - 2`` of them.
* *Buddy system*: a ping to a suspect member carries the suspicion, so the
  member hears first that it is suspected and can refute at once.

Without Lifeguard the suspicion timer is ``min``, fixed; there are no nacks,
no local health and no buddy piggyback.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from corral.actors.membership._messages import (
    MAX_INCARNATION,
    MAX_MEMBERS_PER_MESSAGE,
    MAX_UPDATES_PER_MESSAGE,
    Ack,
    Gossip,
    Nack,
    Ping,
    PingReq,
    StateSync,
    SwimMessage,
    Update,
    UpdateState,
    refusal,
)

__all__ = [
    "NEVER",
    "MemberState",
    "MemberView",
    "Send",
    "Step",
    "Swim",
    "SwimConfig",
    "Transition",
    "incarnation_ceiling",
    "life_incarnation",
    "retransmit_limit",
    "suspicion_bounds",
    "suspicion_timeout",
    "wire_state",
]

#: ``wake_at`` when nothing is scheduled (a machine always has a probe timer, so rare).
NEVER: Final = math.inf
#: A relay sends its nack after this share of its probe timeout (the Lifeguard paper's 80 %).
_NACK_SHARE: Final = 0.8
#: Push-pull slows down above this many members (memberlist's threshold).
_PUSH_PULL_SCALE_THRESHOLD: Final = 32


class MemberState(Enum):
    """What a node believes about a member."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True)
class SwimConfig:
    """SWIM and Lifeguard settings; the defaults are memberlist's LAN profile.

    Times are seconds.

    Attributes:
        probe_interval: time between probes (before local health stretches it).
        probe_timeout: wait for a direct ack before asking relays.
        indirect_checks: relays asked to probe for us (ping-req).
        suspicion_mult: scales the minimum suspicion timeout.
        suspicion_max_timeout_mult: maximum suspicion timeout over the minimum.
        awareness_max: local health stays in ``0 .. awareness_max - 1``.
        gossip_interval: time between gossip ticks.
        gossip_nodes: members each gossip tick sends to.
        retransmit_mult: scales how often one update is sent.
        max_piggyback: updates carried by one message (bounded by the wire's 64).
        push_pull_interval: time between full state exchanges (scaled up above 32 members).
        reconnect_interval: time between offers of our view to a dead member.
        gossip_to_the_dead: dead members still get gossip this long after dying.
        reap_after: dead and left members are forgotten this long after the change.
        lifeguard: local health, nacks, dynamic suspicion and the buddy system.
    """

    probe_interval: float = 1.0
    probe_timeout: float = 0.5
    indirect_checks: int = 3
    suspicion_mult: int = 4
    suspicion_max_timeout_mult: int = 6
    awareness_max: int = 8
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    retransmit_mult: int = 4
    max_piggyback: int = 16
    push_pull_interval: float = 30.0
    reconnect_interval: float = 30.0
    gossip_to_the_dead: float = 30.0
    reap_after: float = 86400.0
    lifeguard: bool = True

    def __post_init__(self) -> None:
        times = {
            "probe_interval": self.probe_interval,
            "probe_timeout": self.probe_timeout,
            "gossip_interval": self.gossip_interval,
            "push_pull_interval": self.push_pull_interval,
            "reconnect_interval": self.reconnect_interval,
            "reap_after": self.reap_after,
        }
        for name, value in times.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.probe_timeout >= self.probe_interval:
            raise ValueError(
                f"probe_timeout ({self.probe_timeout} s) must be shorter than probe_interval "
                f"({self.probe_interval} s): the indirect probe needs the rest of the interval"
            )
        counts = {
            "indirect_checks": (self.indirect_checks, 0),
            "suspicion_mult": (self.suspicion_mult, 1),
            "suspicion_max_timeout_mult": (self.suspicion_max_timeout_mult, 1),
            "awareness_max": (self.awareness_max, 1),
            "gossip_nodes": (self.gossip_nodes, 0),
            "retransmit_mult": (self.retransmit_mult, 1),
        }
        for name, (value, least) in counts.items():
            if type(value) is not int or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
        if not 1 <= self.max_piggyback <= MAX_UPDATES_PER_MESSAGE:
            raise ValueError(f"max_piggyback must be in 1..{MAX_UPDATES_PER_MESSAGE}")
        if self.gossip_to_the_dead < 0:
            raise ValueError("gossip_to_the_dead must be zero or more seconds")

    def plain(self) -> SwimConfig:
        """The same settings with Lifeguard switched off (SWIM as published)."""
        return dataclasses.replace(self, lifeguard=False)


def suspicion_timeout(config: SwimConfig, members: int) -> float:
    """The minimum suspicion timeout: ``SuspicionMult * max(1, log10 N) * interval``."""
    scale = max(1.0, math.log10(max(1, members)))
    return config.suspicion_mult * scale * config.probe_interval


def suspicion_bounds(config: SwimConfig, members: int) -> tuple[float, float, int]:
    """``(min, max, k)`` of a new suspicion timer among ``members`` (ourselves included).

    ``k`` is how many independent confirmations drive the timer to ``min``:
    ``SuspicionMult - 2``, or 0 when fewer members than that could confirm
    (then, and without Lifeguard, the timer is simply ``min``).
    """
    low = suspicion_timeout(config, members)
    k = config.suspicion_mult - 2
    if not config.lifeguard or members - 2 < k or k < 1:
        return low, low, 0
    return low, config.suspicion_max_timeout_mult * low, k


#: Incarnations a life may use per millisecond it lived before the next life's start.
_LIFE_STEP: Final = 1024
#: A claim about this node above its incarnation but within this much of its life's
#: start (about 25 days of lives) is taken for an earlier life's and refuted past;
#: beyond it, the claim is nobody's to make. Claims cannot drive a node further than
#: this above its start: far from MAX_INCARNATION (2**53 - 1).
_EARLIER_LIVES: Final = 2**41
#: Clocks of two nodes may disagree by this much (seconds) for incarnation_ceiling.
_CLOCK_SKEW: Final = 86400.0
#: Refutations one life may make, for incarnation_ceiling (skew + this < _EARLIER_LIVES).
_REFUTATIONS: Final = 2**40


def life_incarnation(unix_time: float) -> int:
    """The first incarnation of a life that starts at ``unix_time`` (seconds).

    Each life starts above every incarnation an earlier life reached (unless that
    one refuted more than 1024 times per millisecond it ran), so a restarted node
    is alive at once. Fits ``MAX_INCARNATION`` until the year 2248.
    """
    return min(MAX_INCARNATION, max(0, int(unix_time * 1000)) * _LIFE_STEP)


def incarnation_ceiling(unix_time: float) -> int:
    """The highest incarnation an honest node can announce at ``unix_time``.

    Its life started before now (a day of clock skew allowed) and it refuted fewer
    than 2**40 times since. A node that claims more for itself (an impostor holding
    the secret, under its id) is not believed, so no claim outlives the next
    restart of the node it names: that life refutes past it
    (``_EARLIER_LIVES`` > skew + ``_REFUTATIONS``).
    """
    return min(MAX_INCARNATION, life_incarnation(unix_time + _CLOCK_SKEW) + _REFUTATIONS)


def retransmit_limit(config: SwimConfig, members: int) -> int:
    """How often one update is sent: ``RetransmitMult * ceil(log10(N + 1))``."""
    return config.retransmit_mult * math.ceil(math.log10(members + 1))


def _remaining(confirmations: int, k: int, elapsed: float, low: float, high: float) -> float:
    """Lifeguard's shrinking timer: seconds left after ``confirmations`` of ``k``."""
    if k < 1:
        return low - elapsed
    fraction = math.log(confirmations + 1) / math.log(k + 1)
    return max(low, high - fraction * (high - low)) - elapsed


@dataclass(frozen=True)
class MemberView:
    """One member as this node sees it.

    Attributes:
        since: when it entered this state (the caller's clock).
        reporter: who made the claim that put it there.
    """

    node: str
    state: MemberState
    incarnation: int
    since: float
    reporter: str


@dataclass(frozen=True)
class Transition:
    """A member changed state in this node's view (``previous`` None: newly known)."""

    node: str
    previous: MemberState | None
    state: MemberState
    incarnation: int
    reporter: str
    at: float


@dataclass(frozen=True)
class Send:
    """Send ``message`` to the membership actor of node ``to``."""

    to: str
    message: SwimMessage


@dataclass(frozen=True)
class Step:
    """What one call produced: messages, transitions, and when to call ``tick`` next."""

    sends: tuple[Send, ...]
    transitions: tuple[Transition, ...]
    wake_at: float


class _IdSet:
    """Node ids with O(1) add and discard, in a list ready for ``random.sample``."""

    __slots__ = ("_at", "ids")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._at: dict[str, int] = {}

    def add(self, node: str) -> None:
        if node not in self._at:
            self._at[node] = len(self.ids)
            self.ids.append(node)

    def discard(self, node: str) -> None:
        at = self._at.pop(node, None)
        if at is None:
            return
        last = self.ids.pop()
        if at < len(self.ids):
            self.ids[at] = last
            self._at[last] = at


@dataclass
class _Member:
    state: MemberState
    incarnation: int
    since: float
    reporter: str
    #: the highest incarnation the member said itself (-1: it never spoke to us yet)
    announced: int = -1


@dataclass
class _Suspicion:
    start: float
    low: float
    high: float
    k: int
    deadline: float
    confirmed: set[str] = field(default_factory=set)
    n: int = 0


@dataclass
class _Probe:
    seq: int
    target: str
    timeout_at: float
    deadline: float
    acked: bool = False
    indirect: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass
class _Relay:
    origin: str
    origin_seq: int
    nack_at: float | None
    expires_at: float


@dataclass
class _Broadcast:
    update: Update
    transmits: int


class Swim:
    """One node's SWIM + Lifeguard state machine.

    Args:
        me: this node's id.
        config: the settings.
        rng: the only source of randomness (seed it for repeatable runs).
        now: the current time, on the caller's clock.
        incarnation: start at this incarnation (a new life passes
            :func:`life_incarnation` of its start time).
        known: members assumed alive at incarnation 0 from the start, without
            transitions or broadcasts (a cluster that settled long ago; simulations).

    Every method that takes ``now`` returns a :class:`Step`.
    """

    def __init__(
        self,
        me: str,
        config: SwimConfig,
        rng: random.Random,
        now: float,
        *,
        incarnation: int = 0,
        known: Iterable[str] = (),
    ) -> None:
        self.me = me
        self.config = config
        self._rng = rng
        self._members: dict[str, _Member] = {
            me: _Member(MemberState.ALIVE, incarnation, now, me, incarnation)
        }
        self._life_start = incarnation
        #: first-hand announcements above this are not believed (the shell sets
        #: :func:`incarnation_ceiling` of its wall clock; MAX_INCARNATION: no limit)
        self.ceiling = MAX_INCARNATION
        # Node ids that may become members (None: any); see admit().
        self._admitted: frozenset[str] | None = None
        # Members asked directly about hearsay we did not believe: until when we wait.
        self._verifying: dict[str, float] = {}
        self._suspicions: dict[str, _Suspicion] = {}
        self._order: list[str] = []
        self._index = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        # Queued updates by subject, and the same by how often each was sent.
        self._queue: dict[str, _Broadcast] = {}
        self._sent_times: dict[int, dict[str, _Broadcast]] = {}
        self._seq = 0
        self._health = 0
        self._leaving = False
        # First ticks at a random offset into their interval, so nodes do not march in step.
        self._next_probe = now + rng.random() * config.probe_interval
        self._next_gossip = now + rng.random() * config.gossip_interval
        self._next_push_pull = now + rng.random() * config.push_pull_interval
        self._next_reconnect = now + rng.random() * config.reconnect_interval
        self._sends: list[Send] = []
        self._transitions: list[Transition] = []
        # Other members' ids by state, kept as each changes (sampled every gossip tick).
        self._groups: dict[MemberState, _IdSet] = {state: _IdSet() for state in MemberState}
        for node in sorted(set(known) - {me}):
            self._members[node] = _Member(MemberState.ALIVE, 0, now, node, 0)
            self._groups[MemberState.ALIVE].add(node)
        #: messages sent and refused, by kind (for the node's state and the bench)
        self.stats: dict[str, int] = {}

    # ------------------------------------------------------------------ reading

    @property
    def incarnation(self) -> int:
        """This node's own incarnation."""
        return self._members[self.me].incarnation

    @property
    def health(self) -> int:
        """Lifeguard's local health multiplier: 0 is healthy, ``awareness_max - 1`` the worst."""
        return self._health

    @property
    def leaving(self) -> bool:
        """Whether :meth:`leave` was called."""
        return self._leaving

    def member(self, node: str) -> MemberView | None:
        """This node's view of one member, or None when unknown."""
        m = self._members.get(node)
        return None if m is None else MemberView(node, m.state, m.incarnation, m.since, m.reporter)

    def view(self) -> tuple[MemberView, ...]:
        """Every known member (this node included), sorted by node id."""
        return tuple(
            MemberView(node, m.state, m.incarnation, m.since, m.reporter)
            for node, m in sorted(self._members.items())
        )

    def live_count(self) -> int:
        """Alive and suspect members, this node included: the N of the formulas."""
        groups = self._groups
        return 1 + len(groups[MemberState.ALIVE].ids) + len(groups[MemberState.SUSPECT].ids)

    def _by_state(self) -> dict[MemberState, list[str]]:
        return {state: group.ids for state, group in self._groups.items()}

    def probe_interval(self) -> float:
        """The current probe interval (stretched by local health under Lifeguard)."""
        return self.config.probe_interval * (self._health + 1)

    def probe_timeout(self) -> float:
        """The current probe timeout (stretched by local health under Lifeguard)."""
        return self.config.probe_timeout * (self._health + 1)

    def suspicion_deadline(self, node: str) -> float | None:
        """When the suspicion of ``node`` ends (None: not suspected)."""
        s = self._suspicions.get(node)
        return None if s is None else s.deadline

    @property
    def next_deadline(self) -> float:
        """The earliest time :meth:`tick` has work to do."""
        times = [self._next_probe, self._next_gossip, self._next_push_pull, self._next_reconnect]
        probe = self._probe
        if probe is not None and not probe.acked:
            times.append(probe.deadline if probe.indirect else probe.timeout_at)
        elif probe is not None:
            times.append(probe.deadline)
        times.extend(s.deadline for s in self._suspicions.values())
        for relay in self._relays.values():
            times.append(relay.expires_at if relay.nack_at is None else relay.nack_at)
        return min(times)

    # ------------------------------------------------------------------ inputs

    def join(self, seeds: Iterable[str], now: float) -> Step:
        """Offer our view to each seed we do not know as alive; each answers with its own.

        Seeds that are this node, known alive or suspect, or left are skipped
        (a member that left comes back only by joining itself).
        """
        for seed in sorted(set(seeds)):
            if not seed or seed == self.me:
                continue
            m = self._members.get(seed)
            if m is not None and m.state is not MemberState.DEAD:
                continue
            self._send(seed, StateSync(self.me, self._state_entries(), reply=True))
        return self._step(now)

    def admit(self, nodes: Iterable[str] | None) -> None:
        """Only these node ids may become members from now on (None: any).

        The shell passes the ids that have a record in the registry: a node id
        without one is not admitted, whoever vouches for it, and messages from a
        node that is neither a member nor admitted are dropped unread. Members
        already known stay (a record that lapses in a registry blip evicts nobody).
        """
        self._admitted = None if nodes is None else frozenset(nodes)

    def leave(self, now: float) -> Step:
        """Leave gracefully: tell every alive and suspect member at once, then go quiet."""
        me = self._members[self.me]
        if not self._leaving:
            self._leaving = True
            me.incarnation = min(MAX_INCARNATION, me.incarnation + 1)
            me.state, me.since, me.reporter = MemberState.LEFT, now, self.me
            goodbye = Update(self.me, "left", me.incarnation, self.me)
            groups = self._by_state()
            for node in sorted(groups[MemberState.ALIVE] + groups[MemberState.SUSPECT]):
                self._send(node, Gossip(self.me, (goodbye,), me.incarnation))
        self._probe = None
        self._relays.clear()
        return self._step(now)

    def receive(self, msg: SwimMessage, now: float) -> Step:
        """Handle one message from another node's membership actor.

        A message that breaks a bound (see :func:`refusal`) is counted and dropped.
        """
        if self._leaving:
            return self._step(now)
        why = refusal(msg)
        if why is not None:
            self._count("refused")
            return self._step(now)
        source = msg.source
        if source == self.me or (source not in self._members and not self._admits(source)):
            self._count("not admitted")
            return self._step(now)
        match msg:
            case Ping():
                self._merge(msg.updates, source, now)
                if msg.target == self.me:
                    self._send(
                        msg.source,
                        Ack(msg.seq, self.me, self._piggyback(msg.source), self.incarnation),
                    )
            case Ack():
                self._merge(msg.updates, source, now)
                self._on_ack(msg.seq, now)
            case PingReq():
                self._merge(msg.updates, source, now)
                self._on_ping_req(msg, now)
            case Nack():
                probe = self._probe
                if probe is not None and probe.seq == msg.seq and probe.indirect:
                    probe.nacks += 1
            case Gossip():
                self._merge(msg.updates, source, now)
            case StateSync():
                self._merge_state(msg.members, source, now)
                if msg.reply:
                    self._send(msg.source, StateSync(self.me, self._state_entries(), reply=False))
        if not isinstance(msg, StateSync):
            # Whatever a member sends says first-hand that it lives, at this incarnation.
            self._apply(Update(source, "alive", msg.incarnation, source), now, source)
        self._tell_the_dead(source)
        return self._step(now)

    def _tell_the_dead(self, source: str) -> None:
        """A member we hold dead is talking to us: it was paused or cut off, not dead,
        and may not know. Tell it now, so it refutes at once instead of at the next
        push-pull (one short gossip per message it sends while we hold it dead)."""
        m = self._members.get(source)
        if source != self.me and m is not None and m.state is MemberState.DEAD:
            told = Update(source, "dead", m.incarnation, self.me)
            self._send(source, Gossip(self.me, (told,), self.incarnation))

    def tick(self, now: float) -> Step:
        """Run every timer that is due at ``now``."""
        if self._leaving:
            return self._step(now)
        self._tick_probe(now)
        self._tick_relays(now)
        for node in sorted(n for n, s in self._suspicions.items() if s.deadline <= now):
            self._suspicion_expired(node, now)
        if now >= self._next_gossip:
            self._next_gossip = _next_after(self._next_gossip, self.config.gossip_interval, now)
            self._gossip(now)
        if now >= self._next_push_pull:
            interval = _push_pull_scale(self.config.push_pull_interval, self.live_count())
            self._next_push_pull = _next_after(self._next_push_pull, interval, now)
            self._push_pull()
        if now >= self._next_reconnect:
            self._next_reconnect = _next_after(
                self._next_reconnect, self.config.reconnect_interval, now
            )
            self._reconnect()
        return self._step(now)

    # ------------------------------------------------------------------ probing

    def _tick_probe(self, now: float) -> None:
        probe = self._probe
        if probe is not None:
            if not probe.acked and not probe.indirect and now >= probe.timeout_at:
                self._ask_relays(probe)
            if now >= probe.deadline:
                self._probe = None
                self._finish_probe(probe, now)
        if self._probe is None and now >= self._next_probe:
            self._start_probe(now)

    def _start_probe(self, now: float) -> None:
        interval, timeout = self.probe_interval(), self.probe_timeout()
        self._next_probe = now + interval
        target = self._next_target(now)
        if target is None:
            return
        self._seq += 1
        self._probe = _Probe(self._seq, target, now + timeout, now + interval)
        updates = self._piggyback(target)
        m = self._members[target]
        if self.config.lifeguard and m.state is MemberState.SUSPECT:
            # The buddy system: tell the suspect first, so it can refute at once.
            told = Update(target, "suspect", m.incarnation, m.reporter)
            updates = (told, *(u for u in updates if u.node != target))[: self.config.max_piggyback]
        self._send(target, Ping(self._seq, self.me, target, updates, self.incarnation))

    def _next_target(self, now: float) -> str | None:
        checked = 0
        while checked <= len(self._order):
            if self._index >= len(self._order):
                self._reset_order(now)
                checked += 1
                if not self._order:
                    return None
            node = self._order[self._index]
            self._index += 1
            m = self._members.get(node)
            if m is not None and m.state in (MemberState.ALIVE, MemberState.SUSPECT):
                return node
            checked += 1
        return None

    def _reset_order(self, now: float) -> None:
        reap = [
            node
            for node, m in self._members.items()
            if node != self.me
            and m.state in (MemberState.DEAD, MemberState.LEFT)
            and now - m.since >= self.config.reap_after
        ]
        for node in reap:
            self._groups[self._members.pop(node).state].discard(node)
            self._drop_broadcast(node)
            self._verifying.pop(node, None)
        groups = self._by_state()
        self._order = sorted(groups[MemberState.ALIVE] + groups[MemberState.SUSPECT])
        self._rng.shuffle(self._order)
        self._index = 0

    def _ask_relays(self, probe: _Probe) -> None:
        probe.indirect = True
        candidates = [n for n in self._by_state()[MemberState.ALIVE] if n != probe.target]
        relays = self._rng.sample(candidates, min(self.config.indirect_checks, len(candidates)))
        nack = self.config.lifeguard
        probe.expected_nacks = len(relays) if nack else 0
        for relay in relays:
            self._send(
                relay,
                PingReq(
                    probe.seq,
                    self.me,
                    probe.target,
                    nack,
                    self._piggyback(relay),
                    self.incarnation,
                ),
            )

    def _on_ack(self, seq: int, now: float) -> None:
        probe = self._probe
        if probe is not None and probe.seq == seq:
            probe.acked = True
            return
        relay = self._relays.pop(seq, None)
        if relay is not None and now <= relay.expires_at:
            updates = self._piggyback(relay.origin)
            self._send(relay.origin, Ack(relay.origin_seq, self.me, updates, self.incarnation))

    def _finish_probe(self, probe: _Probe, now: float) -> None:
        if probe.acked:
            self._adjust_health(-1)
            return
        if probe.expected_nacks:
            self._adjust_health(max(0, probe.expected_nacks - probe.nacks))
        else:
            self._adjust_health(1)
        m = self._members.get(probe.target)
        if m is not None and m.state in (MemberState.ALIVE, MemberState.SUSPECT):
            # On a suspect member, our failed probe is an independent confirmation.
            self._apply(Update(probe.target, "suspect", m.incarnation, self.me), now, self.me)

    def _on_ping_req(self, req: PingReq, now: float) -> None:
        if req.target == self.me:
            updates = self._piggyback(req.source)
            self._send(req.source, Ack(req.seq, self.me, updates, self.incarnation))
            return
        self._seq += 1
        timeout = self.config.probe_timeout
        nack_at = now + _NACK_SHARE * timeout if req.nack else None
        self._relays[self._seq] = _Relay(req.source, req.seq, nack_at, now + timeout)
        updates = self._piggyback(req.target)
        self._send(req.target, Ping(self._seq, self.me, req.target, updates, self.incarnation))

    def _tick_relays(self, now: float) -> None:
        for seq in sorted(self._relays):
            relay = self._relays[seq]
            if relay.nack_at is not None and now >= relay.nack_at:
                relay.nack_at = None
                self._send(relay.origin, Nack(relay.origin_seq, self.me, self.incarnation))
            if now >= relay.expires_at:
                del self._relays[seq]

    def _adjust_health(self, delta: int) -> None:
        if self.config.lifeguard:
            self._health = min(self.config.awareness_max - 1, max(0, self._health + delta))

    # ------------------------------------------------------------------ suspicion

    def _start_suspicion(self, node: str, reporter: str, now: float) -> None:
        low, high, k = suspicion_bounds(self.config, self.live_count())
        deadline = now + (high if k >= 1 else low)
        self._suspicions[node] = _Suspicion(now, low, high, k, deadline, {reporter})

    def _confirm(self, node: str, reporter: str, now: float) -> bool:
        s = self._suspicions[node]
        if s.n >= s.k or reporter in s.confirmed:
            return False
        s.confirmed.add(reporter)
        s.n += 1
        s.deadline = now + _remaining(s.n, s.k, now - s.start, s.low, s.high)
        return True

    def _suspicion_expired(self, node: str, now: float) -> None:
        self._suspicions.pop(node, None)
        m = self._members.get(node)
        if m is not None and m.state is MemberState.SUSPECT:
            self._apply(Update(node, "dead", m.incarnation, self.me), now, self.me)

    # ------------------------------------------------------------------ updates

    def _merge(self, updates: Sequence[Update], source: str, now: float) -> None:
        for update in updates:
            self._apply(update, now, source)

    def _merge_state(self, entries: Sequence[Update], source: str, now: float) -> None:
        """A full view from ``source``: alive and left as said; dead only suspected.

        Another node's verdict of death is not ours to copy: we suspect, and our
        own timer (or the member's refutation) decides.
        """
        for entry in entries:
            if entry.state in ("dead", "suspect") and entry.node != self.me:
                update = Update(entry.node, "suspect", entry.incarnation, self.me)
                self._apply(update, now, source)
            else:
                self._apply(entry, now, source)

    def _admits(self, node: str) -> bool:
        return self._admitted is None or node in self._admitted

    def _apply(self, update: Update, now: float, said_by: str) -> None:
        """Take ``update`` if it is believed: ``said_by`` is who said it to us (the
        authenticated sender, or this node for its own verdicts).

        A member's word about itself (first-hand) sets the highest incarnation it
        announced. Hearsay (a third node's word) is believed only at or below that
        incarnation and never for ``left``: only the member raises its incarnation
        and only the member says it left. Hearsay not believed is not spread; we ask
        the member itself instead (:meth:`_verify`).
        """
        node, inc = update.node, update.incarnation
        if node == self.me:
            self._apply_about_me(update)
            return
        m = self._members.get(node)
        if said_by == node:
            if update.state in ("suspect", "dead"):
                return  # no member says that of itself
            if inc > self.ceiling:
                self._count("incarnation above the ceiling")
                return
            if m is None and not (update.state == "alive" and self._admits(node)):
                return
            if m is not None and inc > m.announced:
                m.announced = inc
        elif said_by != self.me:
            if m is None:
                if update.state == "alive" and self._admits(node):
                    # Known by hearsay: alive, at no incarnation it announced to us yet.
                    self._add_member(node, Update(node, "alive", 0, update.reporter), now, -1)
                elif update.state == "alive":
                    # Counted so the shell reads the registry again: the node may have
                    # registered since (a first read that missed it is not redone for
                    # the whole rejoin interval otherwise).
                    self._count("hearsay not admitted")
                return
            if update.state == "left" or inc > m.announced:
                self._count("hearsay not believed")
                self._verify(node, now)
                return
        if update.state == "alive":
            self._apply_alive(update, m, now)
            return
        if m is None or inc < m.incarnation:
            return
        if update.state == "suspect":
            if node in self._suspicions:
                if self._confirm(node, update.reporter, now):
                    self._enqueue(update)
                return
            if m.state is not MemberState.ALIVE:
                return
            self._change(node, m, MemberState.SUSPECT, inc, update.reporter, now)
            self._enqueue(update)
            self._start_suspicion(node, update.reporter, now)
            return
        # dead or left
        target = MemberState.LEFT if update.state == "left" else MemberState.DEAD
        if m.state is MemberState.LEFT or m.state is target:
            return
        self._suspicions.pop(node, None)
        self._change(node, m, target, inc, update.reporter, now)
        self._enqueue(update)

    def _apply_about_me(self, update: Update) -> None:
        """A claim about this node: refute an accusation of our current incarnation.

        A claim above our incarnation can only be about an earlier life that started
        moments before this one (:func:`life_incarnation`): within
        ``_EARLIER_LIVES`` of our start we move past it; beyond, it is nobody's to
        make (only we raise our incarnation) and moves nothing.
        """
        me = self._members[self.me]
        if update.incarnation > me.incarnation:
            if update.incarnation - self._life_start >= _EARLIER_LIVES or self._leaving:
                self._count("claim above own incarnation")
                return
            self._refute(update.incarnation)
            return
        if update.state == "alive" or self._leaving:
            return
        if update.incarnation < me.incarnation:
            # A stale accusation still travels: someone missed our refutation.
            # Repeat it (same incarnation); the ack to a buddy ping carries it home.
            self._enqueue(Update(self.me, "alive", me.incarnation, self.me))
            return
        self._refute(update.incarnation)

    def _verify(self, node: str, now: float) -> None:
        """Ping ``node`` directly (once per probe interval at most): its ack says
        first-hand which incarnation it is at, and that it is alive."""
        until = self._verifying.get(node)
        if until is not None and now < until:
            return
        self._verifying[node] = now + self.config.probe_interval
        self._seq += 1
        updates = self._piggyback(node)
        self._send(node, Ping(self._seq, self.me, node, updates, self.incarnation))

    def _add_member(self, node: str, update: Update, now: float, announced: int) -> None:
        inc = update.incarnation
        self._members[node] = _Member(MemberState.ALIVE, inc, now, update.reporter, announced)
        self._groups[MemberState.ALIVE].add(node)
        self._insert_in_order(node)
        born = Transition(node, None, MemberState.ALIVE, inc, update.reporter, now)
        self._transitions.append(born)
        self._enqueue(update)

    def _apply_alive(self, update: Update, m: _Member | None, now: float) -> None:
        node, inc = update.node, update.incarnation
        if m is None:
            self._add_member(node, update, now, inc)
            return
        if inc <= m.incarnation:
            return
        self._suspicions.pop(node, None)
        if m.state is MemberState.ALIVE:
            m.incarnation = inc
        else:
            if m.state in (MemberState.DEAD, MemberState.LEFT):
                self._insert_in_order(node)
            self._change(node, m, MemberState.ALIVE, inc, update.reporter, now)
        self._enqueue(update)

    def _insert_in_order(self, node: str) -> None:
        # At a random place, so a newcomer is probed within one round on average.
        if node in self._order[self._index :]:
            return
        place = self._index + self._rng.randint(0, len(self._order) - self._index)
        self._order.insert(place, node)

    def _change(
        self, node: str, m: _Member, state: MemberState, inc: int, reporter: str, now: float
    ) -> None:
        previous = m.state
        m.state, m.incarnation, m.since, m.reporter = state, inc, now, reporter
        if node != self.me:
            self._groups[previous].discard(node)
            self._groups[state].add(node)
        self._transitions.append(Transition(node, previous, state, inc, reporter, now))

    def _refute(self, accused: int) -> None:
        me = self._members[self.me]
        me.incarnation = min(MAX_INCARNATION, max(me.incarnation + 1, accused + 1))
        self._adjust_health(1)
        self._enqueue(Update(self.me, "alive", me.incarnation, self.me))

    # ------------------------------------------------------------------ dissemination

    def _enqueue(self, update: Update) -> None:
        self._drop_broadcast(update.node)
        self._queue[update.node] = b = _Broadcast(update, 0)
        self._sent_times.setdefault(0, {})[update.node] = b

    def _drop_broadcast(self, node: str) -> None:
        old = self._queue.pop(node, None)
        if old is not None:
            bucket = self._sent_times[old.transmits]
            del bucket[node]
            if not bucket:
                del self._sent_times[old.transmits]

    def _piggyback(self, to: str) -> tuple[Update, ...]:
        """Take the least-sent updates (newest first among equals) for one message.

        An update sent the retransmit limit's number of times leaves the queue.
        """
        if not self._queue:
            return ()
        slots = self.config.max_piggyback
        taken: list[_Broadcast] = []
        for transmits in sorted(self._sent_times):
            for node in reversed(self._sent_times[transmits]):
                b = self._sent_times[transmits][node]
                if node == to and b.update.state == "alive" and to != self.me:
                    continue  # telling a member it is alive is no news to it
                taken.append(b)
                if len(taken) >= slots:
                    break
            if len(taken) >= slots:
                break
        limit = retransmit_limit(self.config, len(self._members))
        for b in taken:
            node = b.update.node
            self._drop_broadcast(node)
            b.transmits += 1
            if b.transmits < limit:
                self._queue[node] = b
                self._sent_times.setdefault(b.transmits, {})[node] = b
        return tuple(b.update for b in taken)

    def _gossip(self, now: float) -> None:
        if not self._queue or self.config.gossip_nodes < 1:
            return
        # Dead members keep hearing gossip a while: they may be alive and refute.
        groups = self._by_state()
        recently_dead = [
            n
            for n in groups[MemberState.DEAD]
            if now - self._members[n].since < self.config.gossip_to_the_dead
        ]
        candidates = groups[MemberState.ALIVE] + groups[MemberState.SUSPECT] + recently_dead
        for node in self._rng.sample(candidates, min(self.config.gossip_nodes, len(candidates))):
            updates = self._piggyback(node)
            if not updates:
                return
            self._send(node, Gossip(self.me, updates, self.incarnation))

    def _state_entries(self) -> tuple[Update, ...]:
        entries = [
            Update(node, wire_state(m.state), m.incarnation, m.reporter)
            for node, m in sorted(self._members.items())
            if node != self.me
        ]
        me = self._members[self.me]
        own = Update(self.me, wire_state(me.state), me.incarnation, self.me)
        return (own, *entries[: MAX_MEMBERS_PER_MESSAGE - 1])

    def _push_pull(self) -> None:
        candidates = self._by_state()[MemberState.ALIVE]
        if candidates:
            peer = self._rng.choice(candidates)
            self._send(peer, StateSync(self.me, self._state_entries(), reply=True))

    def _reconnect(self) -> None:
        candidates = self._by_state()[MemberState.DEAD]
        if candidates:
            peer = self._rng.choice(candidates)
            self._send(peer, StateSync(self.me, self._state_entries(), reply=True))

    # ------------------------------------------------------------------ output

    def _send(self, to: str, msg: SwimMessage) -> None:
        self._sends.append(Send(to, msg))
        kind = type(msg).__name__
        self.stats[kind] = self.stats.get(kind, 0) + 1

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _step(self, now: float) -> Step:
        sends, self._sends = tuple(self._sends), []
        transitions, self._transitions = tuple(self._transitions), []
        wake = NEVER if self._leaving else self.next_deadline
        return Step(sends, transitions, wake)


def wire_state(state: MemberState) -> UpdateState:
    """The wire spelling of a member state."""
    match state:
        case MemberState.ALIVE:
            return "alive"
        case MemberState.SUSPECT:
            return "suspect"
        case MemberState.DEAD:
            return "dead"
        case MemberState.LEFT:
            return "left"


def _next_after(scheduled: float, interval: float, now: float) -> float:
    """The next tick of a fixed-rate timer after ``now`` (missed ticks are skipped)."""
    nxt = scheduled + interval
    if nxt <= now:
        nxt = now + interval
    return nxt


def _push_pull_scale(interval: float, members: int) -> float:
    if members <= _PUSH_PULL_SCALE_THRESHOLD:
        return interval
    return interval * (math.ceil(math.log2(members) - math.log2(_PUSH_PULL_SCALE_THRESHOLD)) + 1)
