"""A deterministic in-process network of :class:`~._swim.Swim` machines, on virtual time.

For the property tests and ``bench/membership.py``: thousands of protocol
periods of hundreds of nodes in seconds of wall time, with no trio. One event
queue orders everything: timer wake-ups, message deliveries (each after a
latency drawn from the seeded ``random.Random``), and the end of stalls.

Faults:

* :meth:`SwimSimulation.kill` — the node neither sends, receives nor ticks;
* :meth:`SwimSimulation.partition` / :meth:`SwimSimulation.heal` — links cut
  both ways (a message in flight on a cut link is lost);
* a drop rate for every message;
* :meth:`SwimSimulation.stall` — the node's message handling stops until a
  time: what arrives waits in a bounded buffer (overflow is lost) and is handled
  when the stall ends, while the node's timers keep firing and its sends keep
  leaving. That is a CPU-starved host whose receive loop falls behind, the
  Lifeguard paper's slow member.

Pure: no trio, no clock, no I/O.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import cbor2

from corral.actors.membership._messages import SwimMessage
from corral.actors.membership._swim import (
    MemberState,
    Step,
    Swim,
    SwimConfig,
    Transition,
    life_incarnation,
)
from corral.transport import decode_message, encode_message

__all__ = ["Observed", "SwimSimulation"]

_WAKE: Final = 0
_DELIVER: Final = 1
_UNSTALL: Final = 2


@dataclass(frozen=True)
class Observed:
    """A transition seen by ``observer``."""

    observer: str
    transition: Transition


class SwimSimulation:
    """A cluster of SWIM machines on one virtual clock.

    Args:
        nodes: the node ids.
        config: every node's settings.
        seed: seeds the network's and every machine's randomness.
        latency: one-way delay, drawn uniformly from ``(low, high)`` seconds.
        drop_rate: probability that a message is lost.
        wire: encode and decode every message as the transport would (slower; tests).
        stall_buffer: messages a stalled node keeps; later ones are lost.
        on_transition: called with every transition as it happens.
    """

    def __init__(
        self,
        nodes: Sequence[str],
        config: SwimConfig,
        *,
        seed: int = 0,
        latency: tuple[float, float] = (0.0005, 0.002),
        drop_rate: float = 0.0,
        wire: bool = False,
        stall_buffer: int = 1024,
        on_transition: Callable[[Observed], None] | None = None,
    ) -> None:
        self.config = config
        self.now = 0.0
        self.drop_rate = drop_rate
        self._rng = random.Random(seed)
        self._latency = latency
        self._wire = wire
        self._stall_buffer = stall_buffer
        self._on_transition = on_transition
        self._events: list[tuple[float, int, int, str, object]] = []
        self._counter = 0
        self._wake: dict[str, tuple[float, int]] = {}
        self.machines: dict[str, Swim] = {}
        self._ids = list(nodes)
        self.killed: set[str] = set()
        self._cuts: set[frozenset[str]] = set()
        self._stalled: dict[str, float] = {}
        self._buffers: dict[str, list[tuple[str, SwimMessage]]] = {}
        #: every transition, in order
        self.observed: list[Observed] = []
        #: messages sent (accepted by the network), dropped, and lost to stalls
        self.stats = {"sent": 0, "dropped": 0, "stall_lost": 0}

    # ------------------------------------------------------------------ control

    def start(
        self, seeds: Iterable[str] | None = None, *, spread: float = 0.0, settled: bool = False
    ) -> None:
        """Create every machine and have it join ``seeds`` (default: the first node).

        Args:
            spread: the nodes join at random times within this many seconds.
            settled: every machine starts knowing every node alive (no joining).
        """
        seed_list = list(seeds) if seeds is not None else self._ids[:1]
        known = self._ids if settled else ()
        for node in self._ids:
            self.machines[node] = Swim(
                node, self.config, random.Random(self._rng.random()), self.now, known=known
            )
        if settled:
            for node in self._ids:
                self._apply(node, Step((), (), self.machines[node].next_deadline))
            return
        for node in self._ids:
            at = self.now + (self._rng.random() * spread if spread else 0.0)
            self._push(at, _WAKE, node, ("join", seed_list))

    def restart(self, node: str, seeds: Iterable[str]) -> None:
        """Bring a killed node back as a new life joining ``seeds`` (its incarnation
        starts at :func:`~._swim.life_incarnation` of the virtual time)."""
        self.killed.discard(node)
        self._create(node, list(seeds))

    def kill(self, node: str) -> None:
        """Stop a node dead: no sends, no receives, no timers."""
        self.killed.add(node)
        self._buffers.pop(node, None)
        self._stalled.pop(node, None)

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every link between nodes of different groups."""
        sets = [set(g) for g in groups]
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                self._cuts.update(frozenset((a, b)) for a in left for b in right if a != b)

    def heal(self) -> None:
        """Remove every cut."""
        self._cuts.clear()

    def stall(self, node: str, seconds: float) -> None:
        """Stop ``node`` handling messages for ``seconds`` from now (its timers still run)."""
        until = self.now + seconds
        if self._stalled.get(node, 0.0) < until:
            self._stalled[node] = until
            self._push(until, _UNSTALL, node, None)

    def stalled(self, node: str) -> bool:
        """Whether ``node`` is stalled now."""
        return self._stalled.get(node, 0.0) > self.now

    def run_until(self, until: float) -> None:
        """Process every event up to ``until`` and leave the clock there."""
        events = self._events
        while events and events[0][0] <= until:
            at, _, kind, node, data = heapq.heappop(events)
            self.now = at
            if node in self.killed:
                continue
            if kind == _WAKE:
                self._on_wake(node, data)
            elif kind == _DELIVER:
                assert isinstance(data, tuple)
                self._on_deliver(node, data[0], data[1])
            else:
                self._on_unstall(node)
        self.now = max(self.now, until)

    def run_for(self, seconds: float) -> None:
        """Run ``seconds`` of virtual time."""
        self.run_until(self.now + seconds)

    # ------------------------------------------------------------------ reading

    def live(self) -> list[str]:
        """Nodes running now (not killed), sorted."""
        return sorted(n for n in self.machines if n not in self.killed)

    def state_of(self, observer: str, node: str) -> MemberState | None:
        """What ``observer`` believes about ``node`` (None: unknown)."""
        view = self.machines[observer].member(node)
        return None if view is None else view.state

    def views(self) -> dict[str, dict[str, MemberState]]:
        """Each live node's view: member -> state."""
        return {n: {v.node: v.state for v in self.machines[n].view()} for n in self.live()}

    def messages_sent(self) -> int:
        """Messages every machine handed to the network, lost or not."""
        return sum(
            count
            for machine in self.machines.values()
            for kind, count in machine.stats.items()
            if kind != "refused"
        )

    # ------------------------------------------------------------------ internals

    def _push(self, at: float, kind: int, node: str, data: object) -> None:
        self._counter += 1
        heapq.heappush(self._events, (at, self._counter, kind, node, data))

    def _create(self, node: str, seeds: list[str]) -> None:
        machine = Swim(
            node,
            self.config,
            random.Random(self._rng.random()),
            self.now,
            incarnation=life_incarnation(self.now),
        )
        self.machines[node] = machine
        self._wake.pop(node, None)
        self._apply(node, machine.join(seeds, self.now))

    def _on_wake(self, node: str, data: object) -> None:
        if isinstance(data, tuple):
            machine = self.machines[node]
            self._apply(node, machine.join(list(data[1]), self.now))
            return
        scheduled = self._wake.get(node)
        if scheduled is None or scheduled[1] != data:
            return  # superseded by an earlier wake-up
        del self._wake[node]
        machine = self.machines[node]
        self._apply(node, machine.tick(self.now))

    def _on_deliver(self, node: str, sender: str, msg: SwimMessage) -> None:
        if frozenset((sender, node)) in self._cuts:
            self.stats["dropped"] += 1
            return
        if self._stalled.get(node, 0.0) > self.now:
            buffer = self._buffers.setdefault(node, [])
            if len(buffer) >= self._stall_buffer:
                self.stats["stall_lost"] += 1
            else:
                buffer.append((sender, msg))
            return
        machine = self.machines.get(node)
        if machine is not None:
            self._apply(node, machine.receive(msg, self.now))

    def _on_unstall(self, node: str) -> None:
        if self._stalled.get(node, 0.0) > self.now:
            return
        self._stalled.pop(node, None)
        machine = self.machines[node]
        for _sender, msg in self._buffers.pop(node, []):
            self._apply(node, machine.receive(msg, self.now))

    def _apply(self, node: str, step: Step) -> None:
        for transition in step.transitions:
            seen = Observed(node, transition)
            self.observed.append(seen)
            if self._on_transition is not None:
                self._on_transition(seen)
        for send in step.sends:
            self._transmit(node, send.to, send.message)
        wake = step.wake_at
        scheduled = self._wake.get(node)
        if wake != float("inf") and (scheduled is None or wake < scheduled[0]):
            self._counter += 1
            token = self._counter
            self._wake[node] = (wake, token)
            heapq.heappush(self._events, (max(wake, self.now), token, _WAKE, node, token))

    def _transmit(self, sender: str, to: str, msg: SwimMessage) -> None:
        if to in self.killed or to not in self.machines or frozenset((sender, to)) in self._cuts:
            self.stats["dropped"] += 1
            return
        if self.drop_rate and self._rng.random() < self.drop_rate:
            self.stats["dropped"] += 1
            return
        if self._wire:
            kind, body = encode_message(msg)
            decoded = decode_message(kind, cbor2.loads(cbor2.dumps(body)))
            assert isinstance(decoded, type(msg))
            msg = decoded
        low, high = self._latency
        self.stats["sent"] += 1
        self._push(self.now + low + self._rng.random() * (high - low), _DELIVER, to, (sender, msg))
