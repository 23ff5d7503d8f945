"""The planner's frozen inputs and its output.

Inputs are validated when they are built, so :func:`~corral.actors.planner.plan` only ever
sees well-formed values: a replica count is ``"all"`` or a whole number of at least one, a
node state is one of :data:`NODE_STATES`, sizes are non-negative whole MiB. Mappings
(labels, selectors, ``placed_at``) are copied into read-only views, so a caller mutating its
own dict afterwards cannot change an input behind the planner's back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from corral.actors._errors import PLACEMENT_UNAVAILABLE
from corral.actors.planner._errors import InvalidPlanInput

__all__ = [
    "NODE_STATES",
    "PLACEMENT_UNAVAILABLE",
    "AppSpec",
    "Decisions",
    "Deferred",
    "NodeCapacity",
    "NodeInfo",
    "NodeState",
    "Pause",
    "Placement",
    "PlanInput",
    "Policy",
    "Refusal",
    "RefusedDrain",
    "Replicas",
    "Stranded",
    "Unplaced",
    "next_placements",
]

NodeState = Literal["alive", "suspect", "down", "cordoned", "left"]
"""How membership sees a node. See the module docstring of the planner for what each means."""

NODE_STATES: Final[tuple[NodeState, ...]] = ("alive", "suspect", "down", "cordoned", "left")

Replicas = int | Literal["all"]
"""``"all"`` (every eligible node) or a whole number of at least one."""

# PLACEMENT_UNAVAILABLE: the reason every unplaced application carries (defined once,
# with the error of the same name, in corral.actors._errors).

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def is_replicas(value: object) -> bool:
    """Whether ``value`` is a replica count: ``"all"`` or a whole number >= 1."""
    if value == "all":
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def replicas_problem(shown: str) -> str:
    """What is wrong with a replica count that is not one (``shown``: how to name it)."""
    return (
        f'must be "all" or a whole number >= 1, got {shown} '
        "(an app nothing runs is retired or deleted instead)"
    )


def _frozen_str_map(value: Mapping[str, str], where: str) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidPlanInput(where, f"must be a mapping of strings to strings, got {value!r}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidPlanInput(where, f"must map strings to strings, got {key!r}: {item!r}")
    return MappingProxyType(dict(sorted(value.items())))


def _check_count(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidPlanInput(where, f"must be a whole number >= 0, got {value!r}")


def _check_finite(value: object, where: str, *, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPlanInput(where, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidPlanInput(where, f"must be >= {minimum:g}, got {value!r}")


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What a node reported about its resources, in MiB, as the planner weighs them
    (the record the node publishes is :class:`corral.registry.MeasuredCapacity`).

    A node reporting ``disk_mb == 0`` could not read its disk and is given no work.
    """

    memory_mb: int
    memory_free_mb: int
    disk_mb: int
    disk_free_mb: int

    def __post_init__(self) -> None:
        for name in ("memory_mb", "memory_free_mb", "disk_mb", "disk_free_mb"):
            _check_count(getattr(self, name), f"capacity.{name}")

    @property
    def disk_floor_x10(self) -> int:
        """Ten times the free-disk floor: 10 % of the disk, at most 10 GiB (kept exact)."""
        return min(self.disk_mb, 102400)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as the planner sees it.

    Args:
        id: the node id; ties between otherwise equal nodes always end on it.
        state: ``alive`` takes and keeps work; ``suspect`` and ``cordoned`` keep but take
            none; ``down`` keeps until ``grace_period_s`` after ``down_since`` lapses;
            ``left`` keeps nothing.
        labels: exact-value labels that selectors match.
        rack, datacenter: where the node stands, for spreading replicas. Nodes without a
            rack are counted as one unnamed rack (likewise datacenters).
        down_since: when the node was marked down (``None``: unknown, so its grace never
            lapses in this pass).
        capacity: ``None`` when the node has not reported any; such a node takes only
            applications that declare no resources.
        drain_forced: the node is being drained with ``--force`` (only a ``left`` node can
            be): its pinned instances are stopped rather than the drain refused, and are
            not started elsewhere (see :class:`Placement`, ``stopped``).
    """

    id: str
    state: NodeState = "alive"
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    rack: str | None = None
    datacenter: str | None = None
    down_since: float | None = None
    capacity: NodeCapacity | None = None
    drain_forced: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidPlanInput("node.id", f"must be a non-empty string, got {self.id!r}")
        where = f"nodes[{self.id}]"
        if self.state not in NODE_STATES:
            raise InvalidPlanInput(
                f"{where}.state",
                f"unknown node state {self.state!r} (expected one of {', '.join(NODE_STATES)})",
            )
        object.__setattr__(self, "labels", _frozen_str_map(self.labels, f"{where}.labels"))
        for name in ("rack", "datacenter"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidPlanInput(
                    f"{where}.{name}", f"must be a string or null, got {value!r}"
                )
        if self.down_since is not None:
            _check_finite(self.down_since, f"{where}.down_since")
        if self.capacity is not None and not isinstance(self.capacity, NodeCapacity):
            raise InvalidPlanInput(f"{where}.capacity", "must be a NodeCapacity or None")
        if not isinstance(self.drain_forced, bool):
            raise InvalidPlanInput(f"{where}.drain_forced", "must be true or false")
        if self.drain_forced and self.state != "left":
            raise InvalidPlanInput(
                f"{where}.drain_forced",
                f'a drained node has left: its state must be "left", got {self.state!r}',
            )


@dataclass(frozen=True, slots=True)
class AppSpec:
    """One application as the planner sees it.

    Args:
        name: the application name; its rendezvous score on a node is
            ``sha256("<name>\\n<nodeId>")``.
        replicas: ``"all"`` or a whole number >= 1 (0 is refused: retire the app instead).
        selector: AND over exact label values; empty selects every node.
        memory_mb, disk_mb: what one instance needs (0 = not declared). An app declaring
            either is ranked by best fit; one declaring neither by rendezvous score.
        pinned: never moved by the planner; its instances on nodes that are gone are
            reported ``stranded``, and a drain that would interrupt it is refused unless
            forced (a forced drain stops it, and it is not started elsewhere).
        retired, blocked: the app has no placement at all.
    """

    name: str
    replicas: Replicas = "all"
    selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    memory_mb: int = 0
    disk_mb: int = 0
    pinned: bool = False
    retired: bool = False
    blocked: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidPlanInput("app.name", f"must be a non-empty string, got {self.name!r}")
        where = f"apps[{self.name}]"
        if not is_replicas(self.replicas):
            raise InvalidPlanInput(f"{where}.replicas", replicas_problem(repr(self.replicas)))
        object.__setattr__(self, "selector", _frozen_str_map(self.selector, f"{where}.selector"))
        _check_count(self.memory_mb, f"{where}.memory_mb")
        _check_count(self.disk_mb, f"{where}.disk_mb")
        for name in ("pinned", "retired", "blocked"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidPlanInput(f"{where}.{name}", "must be true or false")

    @property
    def declares_resources(self) -> bool:
        """True when the app declares memory or disk (and is ranked by best fit)."""
        return self.memory_mb > 0 or self.disk_mb > 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an application's instances are now.

    ``nodes`` is kept sorted; a node listed twice is refused (one instance per node).
    ``placed_at`` maps a node to when the instance there was placed; it drives the cooldown.
    A node missing from ``placed_at`` counts as placed long ago.

    ``stopped`` (sorted, none of them in ``nodes``) lists the nodes where a forced drain
    stopped an instance of this pinned app. The instance belongs to that node (pinned work
    is never started elsewhere): it counts towards the replica count, is reported
    stranded, and starts there again once the node takes work. An app no longer pinned
    forgets them (its missing replicas are then placed as usual).

    ``reserved`` is ``(memory_mb, disk_mb)`` each instance in ``nodes`` reserves: the
    app's declared resources when it was placed there, or last resized in place. When
    the app now declares other resources the pass places the change like a new app (see
    the planner's theory of operation). None: not recorded (the instances reserve what
    the app declares now).
    """

    nodes: tuple[str, ...] = ()
    placed_at: Mapping[str, float] = field(default_factory=dict, hash=False)
    stopped: tuple[str, ...] = ()
    reserved: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        nodes = tuple(sorted(self.nodes))
        for node in nodes:
            if not isinstance(node, str) or not node:
                raise InvalidPlanInput("placement.nodes", f"node ids are strings, got {node!r}")
        if len(set(nodes)) != len(nodes):
            raise InvalidPlanInput(
                "placement.nodes", f"lists a node twice ({', '.join(nodes)}): one instance per node"
            )
        object.__setattr__(self, "nodes", nodes)
        if not isinstance(self.placed_at, Mapping):
            raise InvalidPlanInput("placement.placed_at", "must be a mapping of node to time")
        for node, when in self.placed_at.items():
            _check_finite(when, f"placement.placed_at.{node}")
        placed_at = MappingProxyType(dict(sorted(self.placed_at.items())))
        object.__setattr__(self, "placed_at", placed_at)
        for node in self.stopped:
            if not isinstance(node, str) or not node:
                raise InvalidPlanInput("placement.stopped", f"node ids are strings, got {node!r}")
        stopped = tuple(sorted(self.stopped))
        if len(set(stopped)) != len(stopped) or set(stopped) & set(nodes):
            raise InvalidPlanInput(
                "placement.stopped",
                f"lists a node twice or one that also serves ({', '.join(stopped)}): "
                "a stopped instance is not running anywhere",
            )
        object.__setattr__(self, "stopped", stopped)
        if self.reserved is not None:
            if not isinstance(self.reserved, tuple) or len(self.reserved) != 2:
                raise InvalidPlanInput(
                    "placement.reserved", f"must be (memory_mb, disk_mb), got {self.reserved!r}"
                )
            _check_count(self.reserved[0], "placement.reserved.memory_mb")
            _check_count(self.reserved[1], "placement.reserved.disk_mb")


@dataclass(frozen=True, slots=True)
class Policy:
    """The brakes of a pass.

    Args:
        grace_period_s: how long a ``down`` node keeps its work after ``down_since``.
        cooldown_s: an instance placed less than this long ago is not moved by rank.
        disruption_budget: at most this many relocations per pass; the rest are deferred.
        min_usable_fraction: when fewer than this share of the known nodes are usable,
            relocations are refused for the whole pass (new work is still placed).
    """

    grace_period_s: float = 300.0
    cooldown_s: float = 600.0
    disruption_budget: int = 5
    min_usable_fraction: float = 0.5

    def __post_init__(self) -> None:
        _check_finite(self.grace_period_s, "policy.grace_period_s", minimum=0)
        _check_finite(self.cooldown_s, "policy.cooldown_s", minimum=0)
        _check_count(self.disruption_budget, "policy.disruption_budget")
        _check_finite(self.min_usable_fraction, "policy.min_usable_fraction", minimum=0)
        if self.min_usable_fraction > 1:
            raise InvalidPlanInput(
                "policy.min_usable_fraction",
                f"must be between 0 and 1, got {self.min_usable_fraction!r}",
            )


@dataclass(frozen=True, slots=True)
class PlanInput:
    """Everything one pass decides from; what a dry-run document parses into."""

    apps: tuple[AppSpec, ...]
    nodes: tuple[NodeInfo, ...]
    placements: Mapping[str, Placement]
    policy: Policy
    now: float
    undecodable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Deferred:
    """A relocation the pass wanted and held back (cooldown or disruption budget).

    ``node`` is where the instance stays for now. Deferred moves are not failures.
    ``until`` is when a cooldown ends (the clock of ``now``), or ``None`` for a move held
    by the disruption budget (it goes on a later pass).
    """

    app: str
    node: str
    reason: str
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Unplaced:
    """An application with no placement, or fewer instances than it asked for.

    ``reason`` is always :data:`PLACEMENT_UNAVAILABLE`; ``message`` names the cause with
    counts per resource. An app that is also in ``Decisions.placements`` is short of its
    replica count (the message says how many could not be placed).
    """

    app: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Stranded:
    """An instance kept on a node that is gone (pinned app, or relocations refused), or a
    pinned instance a forced drain stopped (not started elsewhere)."""

    app: str
    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class RefusedDrain:
    """A node that left (was drained) while running pinned apps: the drain is refused."""

    node: str
    apps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the pass refused.

    ``reason`` is ``"too-few-usable-nodes"`` when relocations were refused for the whole
    pass (``drains`` may list refused drains too), else ``"drain-would-interrupt-pinned"``.
    """

    reason: str
    message: str
    drains: tuple[RefusedDrain, ...] = ()


@dataclass(frozen=True, slots=True)
class Pause:
    """The pass decided nothing because these registry keys could not be decoded."""

    keys: tuple[str, ...]
    message: str


@dataclass(frozen=True, slots=True)
class Decisions:
    """What one pass decided. Nothing has been written: the caller applies it.

    Attributes:
        placements: per application (sorted by name), the sorted nodes that should serve
            it, whether or not they changed. Apps retired, blocked, deleted or unplaced
            are absent: their placement record should not exist.
        removals: ``(app, node)`` instances to stop, to be applied before ``additions``.
        additions: ``(app, node)`` instances to start.
        deferred: moves held back this pass (the instance stays on ``node``).
        unplaced: apps placed nowhere or short of their replica count.
        stranded: instances kept on nodes that are gone, and pinned instances a forced
            drain stopped.
        refused: relocations refused for the pass, and/or drains refused.
        paused: set when undecodable keys paused the pass; then nothing else is decided
            and ``placements`` repeats the input placements unchanged.
        stopped: per pinned application (sorted by name), the sorted nodes where a forced
            drain stopped its instance (:attr:`Placement.stopped` of the next pass). An app
            whose every instance is stopped is absent from ``placements`` but its record
            should still exist, to remember them.
    """

    placements: Mapping[str, tuple[str, ...]]
    removals: tuple[tuple[str, str], ...] = ()
    additions: tuple[tuple[str, str], ...] = ()
    deferred: tuple[Deferred, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    stranded: tuple[Stranded, ...] = ()
    refused: Refusal | None = None
    paused: Pause | None = None
    stopped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """True when applying these decisions would start or stop anything."""
        return bool(self.removals or self.additions)


def next_placements(
    previous: Mapping[str, Placement],
    decisions: Decisions,
    now: float,
    apps: Iterable[AppSpec] | None = None,
) -> dict[str, Placement]:
    """The placements after applying ``decisions``: what the next pass should be given.

    Kept instances keep their ``placed_at``; added ones are stamped ``now``. Apps absent
    from ``decisions.placements`` and ``decisions.stopped`` have no placement any more. A
    paused pass changes nothing, so ``previous`` comes back as it was.

    Args:
        previous: the placements the pass was given.
        decisions: what the pass returned.
        now: the time the decisions are applied (the pass's ``now``).
        apps: the apps the pass was given; when named, each placement records what its
            instances reserve (``reserved``: every instance a pass leaves placed
            reserves what its app declares). Without them, ``reserved`` is kept as it
            was.

    Returns:
        A new mapping, app name to :class:`Placement`, sorted by name.
    """
    if decisions.paused is not None:
        return dict(sorted(previous.items()))
    declared = {} if apps is None else {a.name: (a.memory_mb, a.disk_mb) for a in apps}
    result: dict[str, Placement] = {}
    for app in sorted(set(decisions.placements) | set(decisions.stopped)):
        nodes = decisions.placements.get(app, ())
        before = previous.get(app)
        kept_since: Mapping[str, float] = before.placed_at if before is not None else _EMPTY
        was = set(before.nodes) if before is not None else set()
        placed_at: dict[str, float] = {}
        for node in nodes:
            if node not in was:
                placed_at[node] = now
            elif node in kept_since:
                placed_at[node] = kept_since[node]
        reserved = declared.get(app, None if before is None else before.reserved)
        result[app] = Placement(
            nodes=nodes,
            placed_at=placed_at,
            stopped=decisions.stopped.get(app, ()),
            reserved=reserved,
        )
    return result
