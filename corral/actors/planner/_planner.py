"""The placement planner: ``plan(apps, nodes, placements, policy, now) -> Decisions``.

Theory of operation
-------------------
A pass is a pure function of its inputs: no I/O, no clock, no randomness. Every iteration
runs in a sorted order and every tie ends on the node id, so the same inputs give the same
decisions in any order they are listed.

**Before anything.** An input marked undecodable pauses the pass: it decides nothing and
names the keys (a record written by a newer build is not a deleted record). Then, if no
node is live (``alive``, ``suspect`` or ``cordoned``), the pass raises
:class:`PlacementUnavailable`.

**Node states.** ``alive`` takes and keeps work; ``suspect`` and ``cordoned`` keep but take
none; ``down`` keeps until ``grace_period_s`` after ``down_since`` has passed, then loses
it; ``left`` keeps nothing. A node that left while running a pinned app is a drain that
would interrupt pinned work: that drain is refused, and for this pass the node counts as
cordoned (it keeps everything, takes nothing) — unless the drain is forced
(``NodeInfo.drain_forced``): then the node is emptied, its pinned instances included (see
below). A node named by a placement but absent from the input is gone.

**Usable nodes.** ``alive``, ``suspect`` and ``cordoned`` nodes are usable; every node of
the input but one that left is known, and so is every node absent from the input that the
placement of a served app names (a node whose leased record lapsed is far more often out of
sight than dead). When usable / known < ``min_usable_fraction``, the planner has most
likely lost sight of the cluster, so relocations are refused for the whole pass: every
instance stays where it is (those on gone nodes are reported stranded) and only new work
(new apps, missing replicas) is placed.

**Eligibility to take an app.** The node is alive; its labels carry every selector entry
with the same value; it has no instance of the app yet; and it has room. A node that
reports capacity keeps a free-disk floor of 10 % of its disk, at most 10 GiB, for every
app. Room is counted the way Kubernetes counts requests: a node's *allocatable* memory is
its total minus the declared ``memory_mb`` of every instance placed on it (running or not
yet started), and its allocatable disk is its total minus the declared ``disk_mb`` of those
instances minus the floor; this pass's reservations come off as it goes. Measured free
memory and free disk above the floor are a second check, so a node under outside pressure
takes nothing: the app fits when its ``memory_mb`` and ``disk_mb`` fit in both. A node
reporting a zero-sized disk takes nothing; one that has not reported capacity takes only
apps declaring no resources.

**Ranking.** Spread first (fewest instances of this app already in the node's rack, then
datacenter), then best fit (least room left; memory first, then disk) for apps declaring
resources, or the rendezvous score ``sha256("<name>\\n<nodeId>")`` (highest first) for apps
declaring none, then the node id. See :mod:`._rank`.

**Targets.** ``replicas: "all"`` is every node that keeps the app's instance or can take
it. ``N`` for a rendezvous app is the top ``N`` of the candidates (nodes that keep an
instance of it and match its selector, plus nodes that can take it): an instance moves only
when the node is gone, the selector excludes it, or a better-ranked node exists, which is
what makes rendezvous hashing stable. An app declaring resources keeps its instances where
they are (best fit is a packing rule, not a reason to move) and fills what is missing.
Scale-downs remove the worst-ranked instances.

**Brakes.** A relocation is an instance removed and replaced elsewhere in the same pass;
new placements and scale-ups are not relocations. An instance a better-ranked node would
take, placed less than ``cooldown_s`` ago, stays (deferred, reason cooldown). At most
``disruption_budget`` relocations happen per pass, granted in this order: replacing
instances lost to gone nodes or excluded by selectors (rendezvous apps by name, then
resource apps in the order they are placed), then rank moves (by name). A deferred move
keeps the instance where it is and drops its replacement; it is reported, not failed.

**Order within a pass.** Apps declaring no resources are planned first, by name: they
reserve nothing, so each is independent of the others. Then apps declaring resources,
largest memory first (then disk, then name), each reserving what its new instances take so
that later apps see it. Before the first of them is placed, every instance the pass is sure
to remove gives its allocatable room back (an "all" app's instance its selector excludes, a
scale-down's surplus, an excluded instance whose relocation the budget is sure to grant),
so a larger app planned early sees the room a smaller one planned later frees: applying the
output and planning again then places nothing more.

**Resource changes.** A placement records what its instances reserve
(:attr:`Placement.reserved`: the app's declared resources when they were placed), and
reservations are counted at that size. An app declaring other resources now (a redeploy
with another ``--memory-mb`` or ``--disk-mb``) is placed like a new app, before anything
else is released or placed (apps largest first): each instance on a node it may keep
stays if what grows fits there (allocatable and measured free room, its own reservation
counted as its own; what shrinks always fits), and is counted at the new size from then
on; otherwise it gives its room back and is removed, and its replacement is placed as
new work wherever the new size fits, or the app is reported unplaced with the reason.
That replacement is not a relocation: the instance cannot stay at a size its node cannot
hold, so neither the cooldown nor the disruption budget holds it back. A pinned app's
instance is stopped on its node instead (as a forced drain's is), and starts there again
once the new size fits. So the nodes never commit more than they have. Every instance a
pass leaves placed reserves what its app declares: that is what the caller records.

**Pinned, retired, blocked, deleted.** A pinned app never loses an instance to the planner;
its instances on gone nodes are reported stranded. The one exception is the operator's: a
forced drain stops the pinned instances on its node. Such an instance is removed from the
node but not started elsewhere (its state lives on that node): it is listed in
``Decisions.stopped`` (the next pass's ``Placement.stopped``), still counts towards the
replica count, is reported stranded with a reason naming the forced drain, and starts on
its node again once that node takes work and has room for it. Unpinning the app forgets
those instances, and its missing replicas are placed as usual. Retired and blocked apps
have no placement: all their instances are removed. A placement of an app not in the input
(a deleted app) is removed.

**Unplaced.** An app that ends with no node, or fewer than its replica count, is reported
with reason ``placement-unavailable`` and a message naming the cause with counts.

**Output.** Per app the sorted target nodes; removals and additions (removals are applied
first); deferred moves (a cooldown says until when); unplaced apps; stranded instances;
pinned instances stopped by forced drains; the pass's refusal or pause.
Applying the output and planning again with nothing else changed changes nothing.

**Memo.** :class:`ScoreCache` is an optional memo carried from one pass to the next. It
holds the top rendezvous scores per app and the last clean outcome per app, and is
updated from the difference between the node sets of two passes, so the pass after one
node joins scores one node per app instead of all of them. It never changes a result:
anything it cannot prove unchanged is computed again.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from corral.actors.planner._errors import InvalidPlanInput, PlacementUnavailable
from corral.actors.planner._rank import Group, spread_select
from corral.actors.planner._types import (
    NODE_STATES,
    PLACEMENT_UNAVAILABLE,
    AppSpec,
    Decisions,
    Deferred,
    NodeCapacity,
    NodeInfo,
    Pause,
    Placement,
    PlanInput,
    Policy,
    Refusal,
    RefusedDrain,
    Stranded,
    Unplaced,
)

__all__ = ["ScoreCache", "allocatable", "plan", "plan_input", "reserved_by_placements"]

_sha256 = hashlib.sha256
_USABLE: Final = frozenset({"alive", "suspect", "cordoned"})
_LIVE: Final = _USABLE
_PREFIX_MARGIN: Final = 8
_FULL_RANKING_KEPT: Final = 64
_MAX_DELTA: Final = 32
_EMPTY_SET: Final[frozenset[str]] = frozenset()
_FLOOR: Final = "10% of the disk, at most 10 GiB"
_COOLDOWN: Final = "cooldown"
#: Test hook: False makes every pass take the straightforward path where a shortcut
#: provably decides the same, so that tests can check it does.
_SHORTCUTS = True

Selector = tuple[tuple[str, str], ...]
Signature = tuple[object, ...]
Ranked = list[tuple[bytes, str]]

# What a kept memo outcome was.
_RENDEZVOUS_N: Final = 1
_RENDEZVOUS_ALL: Final = 2
_RESOURCE_N: Final = 3


class _Node:
    """One node as this pass sees it (effective state after drain refusals)."""

    __slots__ = (
        "cap",
        "dc",
        "forced",
        "gone",
        "group",
        "id",
        "id_b",
        "keeps",
        "labels",
        "plain",
        "rack",
        "sig",
        "state",
        "takes",
    )

    def __init__(self, info: NodeInfo, state: str, gone: str | None) -> None:
        self.id = info.id
        self.id_b = info.id.encode()
        self.state = state
        self.gone = gone
        self.forced = info.drain_forced
        self.keeps = gone is None
        self.takes = state == "alive"
        self.cap: NodeCapacity | None = info.capacity
        self.rack = info.rack
        self.dc = info.datacenter
        self.group: Group = (info.rack, info.datacenter)
        self.labels: Mapping[str, str] = info.labels
        cap = info.capacity
        # Takes an app that declares no resources (the floor still applies).
        self.plain = self.takes and (
            cap is None or (cap.disk_mb > 0 and 10 * cap.disk_free_mb >= min(cap.disk_mb, 102400))
        )
        self.sig: Signature = (
            tuple(info.labels.items()),
            info.rack,
            info.datacenter,
            state,
            self.keeps,
            self.plain,
        )


def _matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    for key, value in selector:
        if labels.get(key) != value:
            return False
    return True


class _View:
    """The nodes whose labels carry a selector (any state), and what is derived from them."""

    __slots__ = ("_groups", "_measured", "_measured_set", "_plain", "ids", "ids_b", "selector")

    def __init__(self, selector: Selector, ids: list[str], ids_b: list[bytes]) -> None:
        self.selector = selector
        self.ids = ids
        self.ids_b = ids_b
        self._plain: list[str] | None = None
        self._groups: dict[Group, int] | None = None
        self._measured: list[str] | None = None
        self._measured_set: frozenset[str] | None = None

    def measured(self, avail: Mapping[str, int]) -> list[str]:
        """Nodes of the view that are alive and report capacity with a readable disk."""
        if self._measured is None:
            self._measured = [i for i in self.ids if i in avail]
        return self._measured

    def measured_outside(self, avail: Mapping[str, int], hosts: Iterable[str]) -> int:
        """How many nodes of :meth:`measured` are not in ``hosts`` (distinct ids)."""
        if self._measured_set is None:
            self._measured_set = frozenset(self.measured(avail))
        inside = self._measured_set
        return len(inside) - sum(1 for h in hosts if h in inside)

    def plain(self, nodes: Mapping[str, _Node]) -> list[str]:
        """Nodes of the view that take an app declaring no resources, sorted."""
        if self._plain is None:
            self._plain = [i for i in self.ids if nodes[i].plain]
        return self._plain

    def groups(self, nodes: Mapping[str, _Node]) -> dict[Group, int]:
        """How many of :meth:`plain` each (rack, datacenter) group holds."""
        if self._groups is None:
            counts: dict[Group, int] = {}
            for i in self.plain(nodes):
                group = nodes[i].group
                counts[group] = counts.get(group, 0) + 1
            self._groups = counts
        return self._groups


class _Entry:
    """What the memo keeps about one app between passes."""

    __slots__ = (
        "app",
        "checks",
        "clean",
        "complete",
        "kind",
        "name_b",
        "ranking",
        "selector",
        "target",
        "target_set",
    )

    def __init__(self, app: AppSpec, selector: Selector) -> None:
        self.app = app
        self.selector = selector
        self.name_b = app.name.encode() + b"\n"
        self.ranking: Ranked | None = None
        self.complete = False
        self.clean = False
        self.kind = 0
        self.target: tuple[str, ...] = ()
        self.target_set: frozenset[str] = _EMPTY_SET
        # For each step of the last walk whose spread key was not (0, 0): that key and
        # how many picks each rack and datacenter held before the step.
        self.checks: list[tuple[tuple[int, int], dict[str | None, int], dict[str | None, int]]]
        self.checks = []

    def settle(self, kind: int, target: Iterable[str]) -> None:
        """Remember a clean outcome of ``kind``: the app ends on exactly ``target``."""
        self.kind = kind
        self.clean = True
        self.target = tuple(sorted(target))
        self.target_set = frozenset(self.target)

    def copy(self) -> _Entry:
        twin = _Entry.__new__(_Entry)
        for name in _Entry.__slots__:
            setattr(twin, name, getattr(self, name))
        if self.ranking is not None:
            twin.ranking = list(self.ranking)
        return twin


class ScoreCache:
    """An optional memo for :func:`plan`, carried from one pass to the next.

    It is purely an optimisation: ``plan(..., cache=c)`` returns exactly what
    ``plan(...)`` returns, for any sequence of inputs. It keeps, per app, the top
    rendezvous scores and the last outcome when that outcome was clean, and the node
    signatures of the last pass, so the next pass recomputes only what a changed node
    could affect. The pass after one node joins then costs one score per app.

    One cache serves one sequence of passes (one coordinator). It is not thread-safe;
    :meth:`clear` empties it.
    """

    def __init__(self) -> None:
        self._signatures: dict[str, Signature] | None = None
        self._epoch: tuple[object, ...] | None = None
        self._entries: dict[str, _Entry] = {}

    def clear(self) -> None:
        """Forget everything; the next pass computes from scratch."""
        self._signatures = None
        self._epoch = None
        self._entries = {}

    def __len__(self) -> int:
        return len(self._entries)

    def copy(self) -> ScoreCache:
        """An independent copy: passes run with it leave this cache as it is.

        Useful to ask "what would happen" (a dry run) without disturbing the memo the
        live sequence of passes relies on.
        """
        twin = ScoreCache()
        twin._signatures = None if self._signatures is None else dict(self._signatures)
        twin._epoch = self._epoch
        twin._entries = {name: entry.copy() for name, entry in self._entries.items()}
        return twin


class _Result:
    """One app's decision while the pass is being made."""

    __slots__ = (
        "adds",
        "app",
        "deferred",
        "displaced_moves",
        "entry",
        "held",
        "hosts",
        "keep",
        "lost_moves",
        "stopped",
        "stranded",
        "target",
        "unplaced",
    )

    def __init__(self, app: AppSpec, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.hosts = hosts
        self.keep: list[str] = []
        self.adds: list[str] = []
        self.lost_moves: list[str] = []
        self.displaced_moves: list[str] = []
        self.deferred: list[tuple[str, str]] = []
        self.stranded: list[tuple[str, str]] = []
        # Pinned apps: nodes where a forced drain stopped an instance, as the pass was
        # given them (``held``) and as it leaves them (``stopped``).
        self.held: tuple[str, ...] = ()
        self.stopped: list[str] = []
        self.unplaced: str | None = None
        self.entry: _Entry | None = None
        # Set when the target is known to be ``hosts`` plus ``adds`` (sorted).
        self.target: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Change:
    node: str
    node_b: bytes
    old: Mapping[str, str] | None
    new: Mapping[str, str] | None
    new_plain: bool
    new_group: Group | None


def plan_input(data: PlanInput, *, cache: ScoreCache | None = None) -> Decisions:
    """:func:`plan` over a :class:`PlanInput` (what :func:`parse_plan_document` returns)."""
    return plan(
        data.apps,
        data.nodes,
        data.placements,
        data.policy,
        data.now,
        undecodable=data.undecodable,
        cache=cache,
    )


def plan(
    apps: Iterable[AppSpec],
    nodes: Iterable[NodeInfo],
    placements: Mapping[str, Placement],
    policy: Policy,
    now: float,
    *,
    undecodable: Iterable[str] = (),
    cache: ScoreCache | None = None,
) -> Decisions:
    """Decide where every application runs. Pure: reads no clock, writes nothing.

    Args:
        apps: every application (any order; names unique).
        nodes: every node membership knows of (any order; ids unique).
        placements: where each app's instances are now, by app name. Entries for apps
            not in ``apps`` are deleted apps: their instances are removed.
        policy: grace period, cooldown, disruption budget, usable-node guard.
        now: the time of the pass, in the same clock as ``down_since`` and ``placed_at``.
        undecodable: registry keys that could not be decoded; any pauses the pass.
        cache: optional memo from the previous pass (see :class:`ScoreCache`); it never
            changes the result.

    Returns:
        The :class:`Decisions` of the pass.

    Raises:
        PlacementUnavailable: no node is live at all (and the pass is not paused).
        InvalidPlanInput: two apps share a name or two nodes share an id.
    """
    app_list = sorted(apps, key=_name_of)
    node_list = sorted(nodes, key=_id_of)
    if len(set(map(_name_of, app_list))) != len(app_list):
        for i in range(1, len(app_list)):
            if app_list[i].name == app_list[i - 1].name:
                raise InvalidPlanInput("apps", f"duplicate app name {app_list[i].name!r}")
    if len(set(map(_id_of, node_list))) != len(node_list):
        for i in range(1, len(node_list)):
            if node_list[i].id == node_list[i - 1].id:
                raise InvalidPlanInput("nodes", f"duplicate node id {node_list[i].id!r}")

    paused_keys = tuple(sorted(set(undecodable)))
    if paused_keys:
        return _paused(placements, paused_keys)
    if not any(n.state in _LIVE for n in node_list):
        by_state = ", ".join(
            f"{count} {state}"
            for state in NODE_STATES
            if (count := sum(1 for n in node_list if n.state == state))
        )
        raise PlacementUnavailable(
            f"{PLACEMENT_UNAVAILABLE}: no live node at all ({len(node_list)} known node(s)"
            f"{': ' + by_state if by_state else ''}; none alive, suspect or cordoned); "
            "nothing can be placed until a node is up"
        )
    return _Pass(app_list, node_list, placements, policy, now, cache).run()


def _labels_of(signature: Signature) -> dict[str, str]:
    items: tuple[tuple[str, str], ...] = signature[0]  # type: ignore[assignment]
    return dict(items)


_name_of: Final[Callable[[AppSpec], str]] = attrgetter("name")
_id_of: Final[Callable[[NodeInfo], str]] = attrgetter("id")


def _paused(placements: Mapping[str, Placement], keys: tuple[str, ...]) -> Decisions:
    echoed = {app: placements[app].nodes for app in sorted(placements) if placements[app].nodes}
    stopped = {
        app: placements[app].stopped for app in sorted(placements) if placements[app].stopped
    }
    message = (
        f"paused: {len(keys)} registry key(s) could not be decoded ({', '.join(keys)}); "
        "nothing is decided until every key can be read (upgrade this node or fix the records)"
    )
    return Decisions(placements=echoed, stopped=stopped, paused=Pause(keys=keys, message=message))


def _fmt(value: float) -> str:
    return f"{value:g}"


class _Pass:
    """One planning pass. Built, run once, dropped."""

    def __init__(
        self,
        apps: list[AppSpec],
        node_list: list[NodeInfo],
        placements: Mapping[str, Placement],
        policy: Policy,
        now: float,
        cache: ScoreCache | None,
    ) -> None:
        self.apps = apps
        self.placements = placements
        self.policy = policy
        self.now = now
        self.cache = cache
        self.budget = policy.disruption_budget
        # What is left on each alive node that reports capacity (with a readable disk):
        # free memory, and ten times the free disk above the floor (exact in integers).
        # Reservations made during the pass are taken off as it goes.
        self.avail_mem: dict[str, int] = {}
        self.avail_disk10: dict[str, int] = {}
        # The two figures avail_* is the smaller of: allocatable (total less what
        # placements reserve) and measured free room. A removal gives back allocatable
        # only: its process still runs while the pass decides.
        self.alloc_mem: dict[str, int] = {}
        self.alloc_disk10: dict[str, int] = {}
        self.free_mem: dict[str, int] = {}
        self.free_disk10: dict[str, int] = {}
        # Per resource app, the instances whose room was given back before the app was
        # planned (by release_certain, or because a resource change does not fit there).
        self.released: dict[str, frozenset[str]] = {}
        # Resource changes (see resize): per app, its instances the new size does not
        # fit, and the size each of its instances is counted at when it differs from
        # what its placement recorded.
        self.misfits: dict[str, frozenset[str]] = {}
        self.counted: dict[tuple[str, str], tuple[int, int]] = {}
        self.resized: set[str] = set()
        self.views: dict[Selector, _View] = {}

        # Drains that would interrupt pinned work are refused: the node keeps its work.
        pinned_on: dict[str, list[str]] = {}
        left = {n.id for n in node_list if n.state == "left" and not n.drain_forced}
        if left:
            for app in apps:
                if app.pinned and not app.retired and not app.blocked:
                    placement = placements.get(app.name)
                    if placement is None:
                        continue
                    for host in placement.nodes:
                        if host in left:
                            pinned_on.setdefault(host, []).append(app.name)
        self.refused_drains = tuple(
            RefusedDrain(node=node, apps=tuple(pinned_on[node])) for node in sorted(pinned_on)
        )

        grace = policy.grace_period_s
        self.nodes: dict[str, _Node] = {}
        for info in node_list:
            state: str = info.state
            gone: str | None = None
            if state == "left":
                if info.id in pinned_on:
                    state = "cordoned"
                elif info.drain_forced:
                    gone = f"node {info.id} is being drained with --force"
                else:
                    gone = f"node {info.id} has left the cluster"
            elif state == "down" and info.down_since is not None and now >= info.down_since + grace:
                gone = (
                    f"node {info.id} has been down since {_fmt(info.down_since)}, "
                    f"past the {_fmt(grace)} s grace period"
                )
            self.nodes[info.id] = _Node(info, state, gone)
        reserved_mem, reserved_disk = reserved_by_placements(apps, placements)
        for node_id, node in self.nodes.items():
            cap = node.cap
            if node.takes and cap is not None and cap.disk_mb > 0:
                mem, disk10 = allocatable(
                    cap, reserved_mem.get(node_id, 0), reserved_disk.get(node_id, 0)
                )
                # Measured free room is the second check: outside pressure takes work away.
                floor10 = cap.disk_floor_x10
                self.alloc_mem[node_id], self.alloc_disk10[node_id] = mem, disk10
                self.free_mem[node_id] = cap.memory_free_mb
                self.free_disk10[node_id] = 10 * cap.disk_free_mb - floor10
                self.avail_mem[node_id] = min(mem, cap.memory_free_mb)
                self.avail_disk10[node_id] = min(disk10, 10 * cap.disk_free_mb - floor10)
        self.group_of: dict[str, Group] = {i: n.group for i, n in self.nodes.items()}
        self.plain_set: set[str] = {i for i, n in self.nodes.items() if n.plain}
        self.all_ids: list[str] = list(self.nodes)
        self.all_ids_b: list[bytes] = [n.id_b for n in self.nodes.values()]
        self.label_index: dict[tuple[str, str], set[str]] | None = None

        usable = sum(1 for n in self.nodes.values() if n.state in _USABLE)
        known = sum(1 for n in self.nodes.values() if n.state != "left")
        # Nodes that vanished from the input while served apps' placements still name them
        # (not those of retired, blocked or deleted apps: the pass removes those, and the
        # next pass must decide the same).
        named: set[str] = set()
        for app in apps:
            placement = placements.get(app.name)
            if placement is not None and not (app.retired or app.blocked):
                named.update(placement.nodes)
        known += len(named - self.nodes.keys())
        self.usable, self.known = usable, known
        self.refuse = known > 0 and usable < policy.min_usable_fraction * known

        # The memo: which nodes changed since the pass it remembers.
        self.delta: list[_Change] = []
        self.old_entries: dict[str, _Entry] = {}
        self.outcomes_valid = False
        if cache is not None:
            signatures = {i: n.sig for i, n in self.nodes.items()}
            epoch: tuple[object, ...] = (policy, self.refuse)
            old = cache._signatures
            if old is not None:
                delta: list[_Change] = []
                for node_id in sorted(old.keys() | signatures.keys()):
                    before, after = old.get(node_id), signatures.get(node_id)
                    if before != after:
                        now_node = self.nodes.get(node_id)
                        delta.append(
                            _Change(
                                node=node_id,
                                node_b=node_id.encode(),
                                old=None if before is None else _labels_of(before),
                                new=None if after is None else _labels_of(after),
                                new_plain=now_node is not None and now_node.plain,
                                new_group=now_node.group if now_node is not None else None,
                            )
                        )
                        if len(delta) > _MAX_DELTA:
                            break
                if len(delta) <= _MAX_DELTA:
                    self.delta = delta
                    self.old_entries = cache._entries
                    self.outcomes_valid = cache._epoch == epoch
            cache._signatures = signatures
            cache._epoch = epoch
        self.new_entries: dict[str, _Entry] = {}

    # ----------------------------------------------------------------- helpers

    def view(self, selector: Selector) -> _View:
        view = self.views.get(selector)
        if view is None:
            if not selector:
                view = _View(selector, self.all_ids, self.all_ids_b)
            else:
                index = self.label_index
                if index is None:
                    index = {}
                    for node_id, node in self.nodes.items():
                        for pair in node.labels.items():
                            index.setdefault(pair, set()).add(node_id)
                    self.label_index = index
                sets = sorted((index.get(pair, set()) for pair in selector), key=len)
                common = set(sets[0]).intersection(*sets[1:])
                ids = sorted(common)
                view = _View(selector, ids, [self.nodes[i].id_b for i in ids])
            self.views[selector] = view
        return view

    def gone_reason(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        if node is None:
            return f"node {node_id} is absent from the nodes this pass sees"
        return node.gone

    def classify(
        self, hosts: Sequence[str], selector: Selector
    ) -> tuple[list[str], list[str], list[str]]:
        """Split hosts into (keepable, lost, excluded)."""
        keepable: list[str] = []
        lost: list[str] = []
        excluded: list[str] = []
        for host in hosts:
            node = self.nodes.get(host)
            if node is None or not node.keeps:
                lost.append(host)
            elif selector and not _matches(selector, node.labels):
                excluded.append(host)
            else:
                keepable.append(host)
        return keepable, lost, excluded

    def in_cooldown(self, placement: Placement | None, node: str) -> float | None:
        """How long ago the instance on ``node`` was placed, when within the cooldown."""
        if placement is None:
            return None
        when = placement.placed_at.get(node)
        if when is None:
            return None
        age = self.now - when
        return age if age < self.policy.cooldown_s else None

    def hold(self, result: _Result, lost: Sequence[str]) -> list[str]:
        """Keep every instance where it stands (a pinned app, or relocations refused);
        those on nodes that are gone are reported stranded, with the reason.

        A pinned app's instances on force-drained nodes are stopped instead (removed, not
        replaced); instances stopped earlier stay stopped, or start again on their own
        node once it can take them. Returns those starting again (not yet in ``adds``).
        """
        app = result.app
        lost_set = set(lost)
        misfits = self.misfits.get(app.name, _EMPTY_SET)
        keep: list[str] = []
        for host in result.hosts:
            node = self.nodes.get(host)
            if app.pinned and node is not None and node.forced:
                result.stopped.append(host)
                result.stranded.append((host, self.forced_stop_reason(app, host)))
                continue
            if host in misfits:
                # The resource change does not fit where it runs: a pinned instance
                # stops there (and starts again once it fits); any other is removed.
                if app.pinned:
                    result.stopped.append(host)
                    result.stranded.append((host, self.forced_stop_reason(app, host)))
                continue
            keep.append(host)
            if host in lost_set:
                result.stranded.append((host, self.stranded_reason(app, host)))
        result.keep = keep
        restarted: list[str] = []
        if app.pinned:
            for host in result.held:
                if self.can_take(app, host):
                    restarted.append(host)
                else:
                    result.stopped.append(host)
                    result.stranded.append((host, self.forced_stop_reason(app, host)))
        result.stopped.sort()
        return restarted

    def can_take(self, app: AppSpec, node_id: str) -> bool:
        """Whether the node could take an instance of ``app`` now (selector, state, room)."""
        node = self.nodes.get(node_id)
        if node is None or not node.takes or not _matches(tuple(app.selector.items()), node.labels):
            return False
        if not app.declares_resources:
            return node.plain
        return (
            node_id in self.avail_mem
            and self.avail_mem[node_id] >= app.memory_mb
            and self.avail_disk10[node_id] >= 10 * app.disk_mb
        )

    def forced_stop_reason(self, app: AppSpec, node_id: str) -> str:
        """Why a pinned instance is stopped on its node (a forced drain, or a resource
        change that does not fit there), and what starts it again."""
        node = self.nodes.get(node_id)
        if node is not None and node.forced:
            return (
                f"the forced drain of {node_id} stopped it; {app.name} is pinned, "
                "so it is not started elsewhere"
                f" (end the drain to start it on {node_id} again, or unpin {app.name} "
                "to have it placed elsewhere)"
            )
        text = f"stopped on {node_id}; {app.name} is pinned, so it is not started elsewhere"
        if node is None:
            status = f"{node_id} is absent from the nodes this pass sees"
        elif not node.takes:
            status = f"{node_id} is {node.state} and takes no work"
        elif not _matches(tuple(app.selector.items()), node.labels):
            status = f"{node_id} no longer carries the labels {app.name} requires"
        else:
            status = f"{node_id} lacks the room {app.name} needs ({self.room_text(app, node_id)})"
        return text + f"; it starts there again once it can, but {status}"

    def room_text(self, app: AppSpec, node_id: str) -> str:
        """What ``app`` asks and what ``node_id`` can still promise, in words."""
        asks = []
        if app.memory_mb:
            left = self.avail_mem.get(node_id, 0)
            asks.append(f"{app.memory_mb} MiB of memory, {max(left, 0)} MiB left")
        if app.disk_mb:
            left10 = self.avail_disk10.get(node_id, 0)
            asks.append(
                f"{app.disk_mb} MiB of disk, {max(left10, 0) // 10} MiB left above its "
                f"free-disk floor ({_FLOOR})"
            )
        return "; ".join(asks) or "it has not reported its capacity"

    def stranded_reason(self, app: AppSpec, node_id: str) -> str:
        gone = self.gone_reason(node_id) or f"node {node_id} is gone"
        if app.pinned:
            return f"{gone}; {app.name} is pinned, so the planner never moves it"
        return f"{gone}; relocations are refused this pass, so it is kept"

    def spend(self, result: _Result, sources: list[str]) -> None:
        """Grant relocations from the disruption budget; defer the rest."""
        for source in sources:
            if self.budget > 0:
                self.budget -= 1
                continue
            result.deferred.append(
                (
                    source,
                    f"disruption budget: the {self.policy.disruption_budget} relocation(s) "
                    "allowed per pass are used; it moves on a later pass",
                )
            )
            result.keep.append(source)
            result.adds.pop()

    # ------------------------------------------------------------------ ranking

    def full_ranking(self, name_b: bytes, view: _View) -> Ranked:
        keyed = _keyed_scores(name_b, view.ids_b)
        keyed.sort(reverse=True)
        return [(key[:32], key[32:].decode()) for key in keyed]

    def prefix_ranking(self, name_b: bytes, view: _View, want: int) -> tuple[Ranked, bool]:
        size = want + _PREFIX_MARGIN
        keyed = _keyed_scores(name_b, view.ids_b)
        complete = len(keyed) <= size
        if complete:
            keyed.sort(reverse=True)
        else:
            keyed = heapq.nlargest(size, keyed)
        return [(key[:32], key[32:].decode()) for key in keyed], complete

    def ranked_select(
        self,
        entry: _Entry,
        view: _View,
        *,
        extra: set[str] | frozenset[str],
        preselected: Sequence[str],
        want: int,
    ) -> tuple[list[str], list[tuple[int, int]]]:
        """Spread-first top ``want`` by rendezvous score, from the memo prefix if it can."""
        if entry.ranking is None:
            entry.ranking, entry.complete = self.prefix_ranking(
                entry.name_b, view, want + len(preselected)
            )
        nodes = self.nodes

        def groups() -> dict[Group, int]:
            base = view.groups(nodes)
            if not extra:
                return base
            merged = dict(base)
            for node in extra:
                if node not in self.plain_set:
                    group = nodes[node].group
                    merged[group] = merged.get(group, 0) + 1
            return merged

        order = [node for _, node in entry.ranking]
        chosen = spread_select(
            order,
            complete=entry.complete,
            candidates=self.plain_set,
            extra=extra,
            group_of=self.group_of,
            preselected=preselected,
            want=want,
            groups=groups,
        )
        if chosen is None:
            ranking = self.full_ranking(entry.name_b, view)
            chosen = spread_select(
                [node for _, node in ranking],
                complete=True,
                candidates=self.plain_set,
                extra=extra,
                group_of=self.group_of,
                preselected=preselected,
                want=want,
                groups=None,
            )
            assert chosen is not None
            if len(ranking) <= _FULL_RANKING_KEPT:
                entry.ranking, entry.complete = ranking, True
            else:
                entry.ranking = ranking[: max(_FULL_RANKING_KEPT, 2 * want)]
                entry.complete = False
        return chosen

    # ---------------------------------------------------------------- the memo

    def memo_entry(self, app: AppSpec, hosts: tuple[str, ...]) -> tuple[_Entry, list[str] | None]:
        """This pass's memo entry for a rendezvous app, brought up to date with the delta.

        Returns the entry and, when the last outcome provably still holds, the nodes to add
        to it (empty: the target is ``hosts``, unchanged); ``None`` when it must be computed.
        """
        old = self.old_entries.get(app.name)
        if old is None:
            return self.fresh_entry(app, tuple(app.selector.items())), None
        if old.app is app:
            selector = old.selector
            same_app = True
        else:
            selector = tuple(app.selector.items())
            if selector != old.selector:
                return self.fresh_entry(app, selector), None
            same_app = old.app == app
        reusable = self.outcomes_valid and old.clean and same_app and hosts == old.target
        adds: list[str] = []
        ranking = old.ranking
        target_set = old.target_set
        for change in self.delta:
            node = change.node
            if reusable and node in target_set:
                reusable = False
            if selector:
                old_in = change.old is not None and _matches(selector, change.old)
                new_in = change.new is not None and _matches(selector, change.new)
                if not old_in and not new_in:
                    continue
            else:
                old_in = change.old is not None
                new_in = change.new is not None
            inserted = False
            if ranking is not None:
                if old_in:
                    for i, item in enumerate(ranking):
                        if item[1] == node:
                            del ranking[i]
                            break
                if new_in:
                    digest = _sha256(old.name_b + change.node_b).digest()
                    if old.complete or (ranking and digest > ranking[-1][0]):
                        _insert_ranked(ranking, digest, node)
                        inserted = True
            if reusable and new_in and change.new_plain:
                if old.kind == _RENDEZVOUS_ALL:
                    adds.append(node)
                elif old.kind != _RENDEZVOUS_N or ranking is None or inserted:
                    reusable = False
                elif not _below_every_pick(old, change):
                    reusable = False
        old.app = app
        old.clean = reusable
        self.new_entries[app.name] = old
        return old, adds if reusable else None

    def fresh_entry(self, app: AppSpec, selector: Selector) -> _Entry:
        entry = _Entry(app, selector)
        self.new_entries[app.name] = entry
        return entry

    # ------------------------------------------------------------ rendezvous apps

    def plan_rendezvous(
        self, app: AppSpec, placement: Placement | None, hosts: tuple[str, ...]
    ) -> _Result | None:
        """Plan an app declaring no resources; ``None`` when its target is ``hosts``."""
        entry, memo_adds = self.memo_entry(app, hosts)
        if memo_adds is not None:
            if not memo_adds:
                return None
            # "all": the last outcome stands, plus the nodes that can now take it.
            result = _Result(app, hosts)
            result.entry = entry
            result.keep = list(hosts)
            result.adds = memo_adds
            merged = list(hosts)
            for node in memo_adds:
                bisect.insort(merged, node)
            result.target = entry.target = tuple(merged)
            entry.target_set = entry.target_set.union(memo_adds)
            return result
        result = _Result(app, hosts)
        result.entry = entry
        if app.pinned and placement is not None:
            result.held = placement.stopped
        entry.clean = False
        selector = entry.selector
        view = self.view(selector)
        holding = app.pinned or self.refuse
        if app.replicas == "all":
            self.rendezvous_all(result, view, selector, holding)
        else:
            self.rendezvous_n(result, entry, view, selector, placement, holding)
        return result

    def rendezvous_all(
        self, result: _Result, view: _View, selector: Selector, holding: bool
    ) -> None:
        hosts = result.hosts
        # Instances on nodes that are gone or no longer selected are simply removed:
        # with "all", each node stands on its own, so nothing is relocated.
        keepable, lost, _excluded = self.classify(hosts, selector)
        hosts_set = set(hosts)
        adds = [n for n in view.plain(self.nodes) if n not in hosts_set]
        self.place_all(result, view, adds, keepable, lost, holding)
        if result.unplaced is None and not holding and result.entry is not None:
            result.entry.settle(_RENDEZVOUS_ALL, result.keep + result.adds)

    def place_all(
        self,
        result: _Result,
        view: _View,
        adds: list[str],
        keepable: list[str],
        lost: list[str],
        holding: bool,
    ) -> None:
        """The "all" outcome: every node of ``adds`` takes the app; the
        instances standing are held where they are (pinned, or relocations refused)
        or, otherwise, the ``keepable`` ones kept; none at all is diagnosed."""
        result.adds = adds
        if holding:
            restarted = self.hold(result, lost)
            if restarted:  # each is also a node that takes it, so already in adds
                result.adds = sorted(set(adds).union(restarted))
        else:
            result.keep = keepable
        if not result.keep and not result.adds and not result.stopped:
            result.unplaced = self.diagnose(result.app, view, set(), 0)

    def rendezvous_n(
        self,
        result: _Result,
        entry: _Entry,
        view: _View,
        selector: Selector,
        placement: Placement | None,
        holding: bool,
    ) -> None:
        app, hosts = result.app, result.hosts
        want = app.replicas
        assert isinstance(want, int)
        keepable, lost, excluded = self.classify(hosts, selector)
        if holding:
            result.adds = self.hold(result, lost)
            need = want - len(result.keep) - len(result.adds) - len(result.stopped)
            if need > 0:
                chosen, _ = self.ranked_select(
                    entry,
                    view,
                    extra=_EMPTY_SET,
                    preselected=[h for h in (*result.keep, *result.adds) if h in self.nodes],
                    want=need,
                )
                result.adds.extend(chosen)
            placed = len(result.keep) + len(result.adds) + len(result.stopped)
            if placed < want:
                result.unplaced = self.diagnose(app, view, set(result.keep), want - placed)
            return

        keep_set = set(keepable)
        chosen, keys = self.ranked_select(entry, view, extra=keep_set, preselected=(), want=want)
        chosen_set = set(chosen)
        hosts_set = set(hosts)
        result.adds = [n for n in chosen if n not in hosts_set]
        result.keep = [h for h in keepable if h in chosen_set]
        displaced = [h for h in keepable if h not in chosen_set]
        if len(displaced) > 1:
            name = app.name
            displaced.sort(key=lambda h: (_score(name, h), h), reverse=True)
        lost_and_excluded = lost + excluded
        paired = min(len(lost_and_excluded), len(result.adds))
        result.lost_moves = lost_and_excluded[:paired]
        moving = displaced[: len(result.adds) - paired]
        for host in moving:
            age = self.in_cooldown(placement, host)
            if age is None:
                result.displaced_moves.append(host)
                continue
            result.keep.append(host)
            result.adds.pop()
            result.deferred.append(
                (
                    host,
                    f"{_COOLDOWN}: placed {_fmt(age)} s ago, less than the "
                    f"{_fmt(self.policy.cooldown_s)} s cooldown; it stays for now",
                )
            )
        if len(chosen) < want:
            result.unplaced = self.diagnose(app, view, chosen_set, want - len(chosen))
        elif not lost_and_excluded and not result.deferred:
            entry.settle(_RENDEZVOUS_N, chosen)  # clean until the budget defers a move
            checks: list[tuple[tuple[int, int], dict[str | None, int], dict[str | None, int]]]
            checks = []
            racks: dict[str | None, int] = {}
            dcs: dict[str | None, int] = {}
            for node, key in zip(chosen, keys, strict=True):
                if key != (0, 0):
                    checks.append((key, dict(racks), dict(dcs)))
                rack, dc = self.group_of[node]
                racks[rack] = racks.get(rack, 0) + 1
                dcs[dc] = dcs.get(dc, 0) + 1
            entry.checks = checks

    # -------------------------------------------------------------- resource apps

    def reserve(self, app: AppSpec, nodes: Iterable[str]) -> None:
        """Count what new instances of ``app`` take, so later apps in the pass see it."""
        self._adjust(app, nodes, taken=1, freed=1)

    def release(self, app: AppSpec, result: _Result) -> None:
        """Give back the allocatable room of the instances of ``app`` this pass removes
        that :meth:`release_certain` has not given back already."""
        final = set(result.target if result.target is not None else (*result.keep, *result.adds))
        early = self.released.get(app.name, _EMPTY_SET)
        self._adjust(
            app, [h for h in result.hosts if h not in final and h not in early], taken=-1, freed=0
        )

    def resize(
        self, resource_apps: Sequence[tuple[AppSpec, Placement | None, tuple[str, ...]]]
    ) -> None:
        """Place every resource change like a new app, where each instance runs.

        An app whose placement recorded other resources than it declares now (a redeploy
        with another ``--memory-mb`` or ``--disk-mb``) has each instance on a node it
        may keep checked first, in planning order (largest first): what grows must fit
        in that node's allocatable room and its measured free room, with the instance's
        own reservation counted as its own (what shrinks always fits). An instance that
        fits is counted at its new size from then on and stays where it is. One that
        does not gives its room back and is removed; the pass then places its
        replacement like a new instance, wherever the new size fits, or reports the app
        unplaced with the reason. The replacement is new work, not a relocation: the
        instance cannot stay at a size its node cannot hold, so neither the cooldown nor
        the disruption budget holds it back (deferring it would only leave the app short
        for a pass). A pinned app's instance is stopped on its node instead and starts
        there again once the new size fits.
        """
        for app, placement, hosts in resource_apps:
            if placement is None or placement.reserved is None or not hosts:
                continue
            was_mem, was_disk = placement.reserved
            grow_mem, grow_disk10 = app.memory_mb - was_mem, 10 * (app.disk_mb - was_disk)
            if not (grow_mem or grow_disk10):
                continue
            self.resized.add(app.name)
            keepable, _lost, excluded = self.classify(hosts, tuple(app.selector.items()))
            misfits: list[str] = []
            # An instance the selector now excludes may stay too (pinned, relocations
            # refused, a move deferred): it is checked like the others.
            for host in keepable + excluded:
                if self.grows_in_place(host, grow_mem, grow_disk10):
                    self.counted[(app.name, host)] = (app.memory_mb, app.disk_mb)
                    self._adjust_size(grow_mem, grow_disk10, (host,), taken=1, freed=1)
                else:
                    misfits.append(host)
            if misfits:
                self.misfits[app.name] = frozenset(misfits)
                self.released[app.name] = self.released.get(app.name, _EMPTY_SET).union(misfits)
                self._adjust(app, misfits, taken=-1, freed=0)

    def grows_in_place(self, node: str, grow_mem: int, grow_disk10: int) -> bool:
        """Whether ``node`` holds an instance ``grow_mem`` MiB of memory and
        ``grow_disk10`` tenths of a MiB of disk larger (either may be negative)."""
        if grow_mem <= 0 and grow_disk10 <= 0:
            return True
        if node not in self.avail_mem:
            return False  # takes no work, or reports no capacity
        if grow_mem > 0 and min(self.alloc_mem[node], self.free_mem[node]) < grow_mem:
            return False
        return grow_disk10 <= 0 or min(self.alloc_disk10[node], self.free_disk10[node]) >= (
            grow_disk10
        )

    def release_certain(
        self, resource_apps: Sequence[tuple[AppSpec, Placement | None, tuple[str, ...]]]
    ) -> None:
        """Before any resource app is placed, give back the allocatable room of every
        instance the pass removes whatever it places: those of "all" apps the selector
        now excludes, the surplus of a scale-down, and the excluded instances of N apps
        that either get no replacement or whose relocation the remaining disruption budget
        is sure to grant.

        Apps are planned largest first, so a removal counted only once its own app is
        planned would free room for the smaller apps after it but not for the larger
        ones before it; the next pass would then give that room to those, and planning
        the applied output again would change it. ``resource_apps`` is in planning order.
        """
        budget_left = self.budget
        for app, _placement, hosts in resource_apps:
            if app.pinned or self.refuse or not hosts:
                continue
            selector: Selector = tuple(app.selector.items())
            keepable, lost, excluded = self.classify(hosts, selector)
            misfits = self.misfits.get(app.name, _EMPTY_SET)
            if misfits:
                keepable = [h for h in keepable if h not in misfits]
                excluded = [h for h in excluded if h not in misfits]
            certain: list[str] = []
            if app.replicas == "all":
                certain = excluded
            else:
                want = app.replicas
                assert isinstance(want, int)
                # plan_resource pairs the first of lost + excluded with its adds and asks
                # the budget for those pairs only, in this same order of apps; the rest are
                # removed unasked. At most ``most`` pairs: no more than the replicas
                # missing, nor than the nodes of the selector that could take one.
                gone = lost + excluded
                view = self.view(selector)
                candidates = view.measured_outside(self.avail_mem, set(hosts))
                most = min(len(gone), want - min(len(keepable), want), candidates)
                granted = max(budget_left, 0)
                certain = [h for i, h in enumerate(gone) if i >= most or i < granted]
                budget_left -= most
                if len(keepable) > want:
                    kept = set(self.scale_down(app, keepable, want))
                    certain.extend(h for h in keepable if h not in kept)
            if certain:
                self.released[app.name] = self.released.get(app.name, _EMPTY_SET).union(certain)
                self._adjust(app, certain, taken=-1, freed=0)

    def scale_down(self, app: AppSpec, keepable: Sequence[str], want: int) -> list[str]:
        """The ``want`` instances a scale-down keeps: the best spread by rendezvous score."""
        name = app.name
        by_score = sorted(keepable, key=lambda h: (_score(name, h), h), reverse=True)
        chosen = spread_select(
            by_score,
            complete=True,
            candidates=set(keepable),
            extra=_EMPTY_SET,
            group_of=self.group_of,
            preselected=(),
            want=want,
            groups=None,
        )
        assert chosen is not None
        return chosen[0]

    def _adjust(self, app: AppSpec, nodes: Iterable[str], *, taken: int, freed: int) -> None:
        """Count ``taken`` (allocatable) and ``freed`` (measured free room) instances of
        ``app`` more on each node: new ones at the size it declares, existing ones
        (``taken`` < 0) at the size they are counted at."""
        if taken < 0:
            for node in nodes:
                mem, disk = self.counted_size(app, node)
                self._adjust_size(mem, 10 * disk, (node,), taken=taken, freed=freed)
        else:
            self._adjust_size(app.memory_mb, 10 * app.disk_mb, nodes, taken=taken, freed=freed)

    def counted_size(self, app: AppSpec, node: str) -> tuple[int, int]:
        """The size the instance of ``app`` on ``node`` is counted at in this pass."""
        size = self.counted.get((app.name, node))
        return _held(app, self.placements.get(app.name)) if size is None else size

    def _adjust_size(
        self, mem: int, disk10: int, nodes: Iterable[str], *, taken: int, freed: int
    ) -> None:
        if not (mem or disk10):
            return
        for node in nodes:
            if node not in self.avail_mem:
                continue
            self.alloc_mem[node] -= taken * mem
            self.alloc_disk10[node] -= taken * disk10
            self.free_mem[node] -= freed * mem
            self.free_disk10[node] -= freed * disk10
            self.avail_mem[node] = min(self.alloc_mem[node], self.free_mem[node])
            self.avail_disk10[node] = min(self.alloc_disk10[node], self.free_disk10[node])

    def best_fit_order(self, app: AppSpec, view: _View, hosts: set[str]) -> list[str]:
        """Nodes that can take ``app`` now, least room left first, then node id."""
        ranked: list[tuple[int, int, str]] = []
        mem, disk10 = app.memory_mb, 10 * app.disk_mb
        avail_mem, avail_disk10 = self.avail_mem, self.avail_disk10
        for node_id in view.measured(self.avail_mem):
            mem_room = avail_mem[node_id] - mem
            if mem_room < 0:
                continue
            disk_room = avail_disk10[node_id] - disk10
            if disk_room < 0 or node_id in hosts:
                continue
            ranked.append((mem_room if mem else 0, disk_room if disk10 else 0, node_id))
        ranked.sort()
        return [node_id for _, _, node_id in ranked]

    def first_fitting(
        self, app: AppSpec, view: _View, hosts: set[str], most: int | None = None
    ) -> list[str]:
        """The nodes :meth:`best_fit_order` lists, in node id order (not best fit first):
        all of them, or the first ``most``."""
        found: list[str] = []
        mem, disk10 = app.memory_mb, 10 * app.disk_mb
        avail_mem, avail_disk10 = self.avail_mem, self.avail_disk10
        for node_id in view.measured(avail_mem):
            if avail_mem[node_id] >= mem and avail_disk10[node_id] >= disk10:
                if node_id not in hosts:
                    found.append(node_id)
                    if len(found) == most:
                        break
        return found

    def plan_resource(
        self, app: AppSpec, placement: Placement | None, hosts: tuple[str, ...]
    ) -> _Result | None:
        """Plan an app declaring resources; ``None`` when its target is ``hosts``."""
        holding = app.pinned or self.refuse
        if app.replicas != "all" and not holding:
            old = self.old_entries.get(app.name)
            if (
                old is not None
                and self.outcomes_valid
                and old.clean
                and hosts == old.target
                and (old.app is app or old.app == app)
                and app.name not in self.resized
                and not any(c.node in old.target_set for c in self.delta)
            ):
                # Every instance stands where it stood and the app is full: keeping them
                # reads no capacity, so nothing this pass changed can matter.
                old.app = app
                self.new_entries[app.name] = old
                return None
        result = _Result(app, hosts)
        if app.pinned and placement is not None:
            result.held = placement.stopped
        selector: Selector = tuple(app.selector.items())
        view = self.view(selector)
        keepable, lost, excluded = self.classify(hosts, selector)
        misfits = self.misfits.get(app.name, _EMPTY_SET)
        if misfits:
            keepable = [h for h in keepable if h not in misfits]
            excluded = [h for h in excluded if h not in misfits]
        hosts_set = set(hosts)
        if app.replicas == "all":
            if _SHORTCUTS:
                adds = self.first_fitting(app, view, hosts_set)  # view.measured is sorted
            else:
                adds = sorted(self.best_fit_order(app, view, hosts_set))
            self.place_all(result, view, adds, keepable, lost, holding)
            self.reserve(app, result.adds)
            self.release(app, result)
            return result

        want = app.replicas
        restarted: list[str] = []
        if holding:
            restarted = self.hold(result, lost)
            lost_and_excluded: list[str] = []
        elif len(keepable) > want:
            # Scale down: keep the best spread by rendezvous score; the rest are removed.
            result.keep = self.scale_down(app, keepable, want)
            lost_and_excluded = lost + excluded
        else:
            result.keep = keepable
            lost_and_excluded = lost + excluded
        need = want - len(result.keep) - len(restarted) - len(result.stopped)
        if need > 0 and self.budget <= 0 and need <= len(lost_and_excluded) and _SHORTCUTS:
            # The budget is spent, so each node chosen below would replace an instance of
            # lost_and_excluded and be dropped again, its move deferred (see spend): which
            # nodes they are does not matter, only how many there are. The walk takes one
            # per step while any can take the app, so it would choose that many.
            result.adds = self.first_fitting(app, view, hosts_set, need)
        elif need > 0:
            order = self.best_fit_order(app, view, hosts_set.union(restarted))
            chosen = spread_select(
                order,
                complete=True,
                candidates=set(order),
                extra=_EMPTY_SET,
                group_of=self.group_of,
                preselected=[h for h in (*result.keep, *restarted) if h in self.nodes],
                want=need,
                groups=None,
            )
            assert chosen is not None
            result.adds = restarted + chosen[0]
        else:
            result.adds = restarted
        paired = min(len(lost_and_excluded), len(result.adds))
        self.spend(result, lost_and_excluded[:paired])
        placed = len(result.keep) + len(result.adds) + len(result.stopped)
        if placed < want:
            result.unplaced = self.diagnose(app, view, set(result.keep), want - placed)
        self.reserve(app, result.adds)
        self.release(app, result)
        if not holding and placed == want and not lost_and_excluded and not result.deferred:
            entry = _Entry(app, selector)
            entry.settle(_RESOURCE_N, result.keep + result.adds)
            self.new_entries[app.name] = entry
        return result

    # ---------------------------------------------------------------- diagnosis

    def diagnose(self, app: AppSpec, view: _View, running: set[str], missing: int) -> str:
        """Why ``app`` could not be placed (``missing`` = 0: not at all), with counts."""
        if missing and app.replicas != "all" and missing < app.replicas:
            head = f"cannot place {missing} of {app.replicas} replica(s) of {app.name}: "
        else:
            head = f"cannot place {app.name}: "
        selector = tuple(app.selector.items())
        labels = ",".join(f"{k}={v}" for k, v in selector)
        matching = [self.nodes[i] for i in view.ids if self.nodes[i].state in _USABLE]
        if not matching:
            if not view.ids:
                return head + f"no node carries the required labels {labels}"
            return head + (
                f"no usable node carries the required labels {labels} "
                f"({len(view.ids)} that do are down or have left)"
            )
        already = memory = disk = zero_disk = unreported = cordoned = suspect = other = 0
        for node in matching:
            if node.id in running:
                already += 1
            elif node.state == "cordoned":
                cordoned += 1
            elif node.state == "suspect":
                suspect += 1
            elif node.cap is None:
                if app.declares_resources:
                    unreported += 1
                else:
                    other += 1
            elif node.cap.disk_mb == 0:
                zero_disk += 1
            else:
                short = False
                if app.memory_mb > self.avail_mem[node.id]:
                    memory += 1
                    short = True
                if 10 * app.disk_mb > self.avail_disk10[node.id]:
                    disk += 1
                    short = True
                if not short:
                    other += 1
        if not (already or memory or disk or zero_disk or other):
            where = f"every usable node carrying {labels}" if selector else "every usable node"
            return head + f"{where} is cordoned, suspect, or has not reported its capacity"
        parts: list[str] = []
        if already:
            parts.append(f"{already} already run it")
        if memory:
            parts.append(f"{memory} lack {app.memory_mb} MiB of free memory")
        if disk:
            if app.disk_mb:
                parts.append(
                    f"{disk} would fall below their free-disk floor ({_FLOOR}) "
                    f"after reserving {app.disk_mb} MiB"
                )
            else:
                parts.append(f"{disk} are at their free-disk floor ({_FLOOR})")
        if zero_disk:
            parts.append(f"{zero_disk} report a zero-sized disk")
        if unreported:
            parts.append(f"{unreported} have not reported their capacity")
        if cordoned:
            parts.append(f"{cordoned} are cordoned")
        if suspect:
            parts.append(f"{suspect} are suspect")
        if other:
            parts.append(f"{other} were not chosen")
        return head + f"of {len(matching)} matching node(s): " + "; ".join(parts)

    # --------------------------------------------------------------------- run

    def run(self) -> Decisions:
        placements = self.placements
        # Every app gets its current nodes as target first (which keeps the mapping in
        # name order); the ones planned below overwrite theirs.
        target_of: dict[str, tuple[str, ...]] = {}
        results: list[_Result] = []
        rendezvous: list[_Result] = []
        resource_apps: list[tuple[AppSpec, Placement | None, tuple[str, ...]]] = []
        removals: list[tuple[str, str]] = []
        with_placement = 0
        for app in self.apps:
            name = app.name
            placement = placements.get(name)
            if placement is None:
                hosts: tuple[str, ...] = ()
            else:
                hosts = placement.nodes
                with_placement += 1
            if app.retired or app.blocked:
                removals.extend((name, h) for h in hosts)
                continue
            target_of[name] = hosts
            if app.memory_mb or app.disk_mb:
                resource_apps.append((app, placement, hosts))
                continue
            result = self.plan_rendezvous(app, placement, hosts)
            if result is not None:
                rendezvous.append(result)
                results.append(result)

        # Relocations replacing lost or excluded instances come first...
        for result in rendezvous:
            if result.lost_moves:
                self.spend(result, result.lost_moves)
        # ...then apps declaring resources, largest first, each reserving what it takes...
        resource_apps.sort(key=lambda r: (-r[0].memory_mb, -r[0].disk_mb, r[0].name))
        self.resize(resource_apps)
        self.release_certain(resource_apps)
        for app, placement, hosts in resource_apps:
            planned = self.plan_resource(app, placement, hosts)
            if planned is not None:
                results.append(planned)
        # ...then moves that only follow the rendezvous rank.
        for result in rendezvous:
            if result.displaced_moves:
                self.spend(result, result.displaced_moves)

        if len(results) > len(rendezvous):
            results.sort(key=lambda r: r.app.name)
        additions: list[tuple[str, str]] = []
        deferred: list[Deferred] = []
        unplaced: list[Unplaced] = []
        stranded: list[Stranded] = []
        stopped_of: dict[str, tuple[str, ...]] = {}
        for result in results:
            name = result.app.name
            if result.target is not None:
                target = result.target
                additions.extend((name, n) for n in result.adds)
            elif not result.adds and len(result.keep) == len(result.hosts):
                target = result.hosts
            else:
                target = tuple(sorted(set(result.keep).union(result.adds)))
                hosts_set = set(result.hosts)
                target_set = set(target)
                removals.extend((name, h) for h in result.hosts if h not in target_set)
                additions.extend((name, n) for n in target if n not in hosts_set)
            target_of[name] = target
            entry = result.entry
            if entry is not None and entry.clean and (result.deferred or entry.target != target):
                entry.clean = False
            for node, reason in result.deferred:
                until = self.cooldown_until(placements.get(name), node, reason)
                deferred.append(Deferred(app=name, node=node, reason=reason, until=until))
            if result.stopped:
                stopped_of[name] = tuple(result.stopped)
            for node, reason in result.stranded:
                stranded.append(Stranded(app=name, node=node, reason=reason))
            if result.unplaced is not None:
                unplaced.append(
                    Unplaced(app=name, reason=PLACEMENT_UNAVAILABLE, message=result.unplaced)
                )
        for name in [name for name, target in target_of.items() if not target]:
            del target_of[name]
        if len(placements) > with_placement:
            # Placements of apps that no longer exist: their instances stop.
            known_apps = {app.name for app in self.apps}
            for name in sorted(placements):
                if name not in known_apps:
                    removals.extend((name, h) for h in placements[name].nodes)
        if self.cache is not None:
            self.cache._entries = self.new_entries
        return Decisions(
            placements=target_of,
            removals=tuple(sorted(removals)),
            additions=tuple(sorted(additions)),
            deferred=tuple(sorted(deferred, key=lambda d: (d.app, d.node))),
            unplaced=tuple(unplaced),
            stranded=tuple(sorted(stranded, key=lambda s: (s.app, s.node))),
            refused=self.refusal(),
            stopped=dict(sorted(stopped_of.items())),
        )

    def cooldown_until(self, placement: Placement | None, node: str, reason: str) -> float | None:
        """When a move deferred by the cooldown may go; None for the disruption budget."""
        if placement is None or not reason.startswith(_COOLDOWN):
            return None
        when = placement.placed_at.get(node)
        return None if when is None else when + self.policy.cooldown_s

    def refusal(self) -> Refusal | None:
        drains = self.refused_drains
        drain_text = "; ".join(
            f"drain of {d.node} refused: it would interrupt pinned app(s) {', '.join(d.apps)}"
            for d in drains
        )
        if self.refuse:
            message = (
                f"relocations refused for this pass: {self.usable} of {self.known} known "
                f"node(s) usable, below the min_usable_fraction of "
                f"{_fmt(self.policy.min_usable_fraction)}; only new work is placed"
            )
            if drain_text:
                message += "; " + drain_text
            return Refusal(reason="too-few-usable-nodes", message=message, drains=drains)
        if drains:
            return Refusal(reason="drain-would-interrupt-pinned", message=drain_text, drains=drains)
        return None


def reserved_by_placements(
    apps: Iterable[AppSpec], placements: Mapping[str, Placement]
) -> tuple[dict[str, int], dict[str, int]]:
    """Declared memory and disk (MiB) of every placed instance, per node.

    Every instance a placement names counts, running or not yet started, the way
    Kubernetes counts requests, with what the placement recorded it reserves
    (:attr:`Placement.reserved`; what the app declares when it recorded nothing), so a
    redeploy asking for more counts only once the planner has placed it; stopped
    instances (a forced drain's) and those of retired, blocked or deleted apps (the pass
    removes them) count nothing.

    Returns:
        ``(memory_mb, disk_mb)``: two maps from node id to the MiB reserved there.
    """
    memory: dict[str, int] = {}
    disk: dict[str, int] = {}
    for app in apps:
        if not (app.memory_mb or app.disk_mb) or app.retired or app.blocked:
            continue
        placement = placements.get(app.name)
        if placement is None:
            continue
        mem, disk_mb = _held(app, placement)
        for node in placement.nodes:
            if mem:
                memory[node] = memory.get(node, 0) + mem
            if disk_mb:
                disk[node] = disk.get(node, 0) + disk_mb
    return memory, disk


def _held(app: AppSpec, placement: Placement | None) -> tuple[int, int]:
    """What each placed instance of ``app`` reserves: what the placement recorded, or
    what the app declares when it recorded nothing."""
    if placement is None or placement.reserved is None:
        return app.memory_mb, app.disk_mb
    return placement.reserved


def allocatable(cap: NodeCapacity, reserved_mem: int, reserved_disk: int) -> tuple[int, int]:
    """What a node can still promise: total minus reservations (minus the disk floor).

    Returns:
        ``(memory_mb, disk_x10)``: allocatable memory in MiB, and ten times the allocatable
        disk above the free-disk floor (kept exact in integers). Either may be negative
        when placements already over-commit the node.
    """
    return (
        cap.memory_mb - reserved_mem,
        10 * (cap.disk_mb - reserved_disk) - cap.disk_floor_x10,
    )


def _score(app: str, node: str) -> bytes:
    return _sha256(f"{app}\n{node}".encode()).digest()


def _keyed_scores(name_b: bytes, ids_b: Sequence[bytes]) -> list[bytes]:
    """Per node of ``ids_b``, its score of the app ``name_b`` (``b"<name>\\n"``) followed
    by its id: every digest is 32 bytes long, so these order as the pairs (score, id) do.

    Hashing the app's part once and copying that state per node, and ordering bytes
    rather than tuples (none of which the cyclic collector then tracks), is the cheapest
    way found to score every node: the first pass of a new coordinator scores every app
    on every node of its selector.
    """
    copy = _sha256(name_b).copy
    keyed: list[bytes] = []
    append = keyed.append
    for node_b in ids_b:
        state = copy()
        state.update(node_b)
        append(state.digest() + node_b)
    return keyed


def _insert_ranked(ranking: Ranked, digest: bytes, node: str) -> None:
    """Insert into a list of (score, node) kept in descending order."""
    item = (digest, node)
    for i, other in enumerate(ranking):
        if item > other:
            ranking.insert(i, item)
            return
    ranking.append(item)


def _below_every_pick(entry: _Entry, change: _Change) -> bool:
    """Whether a new candidate scoring below the whole prefix leaves the picks unchanged.

    It would be chosen at a step only if its spread key there were smaller than the key of
    the node chosen at that step (on equal keys the higher score wins); steps chosen with
    key (0, 0) cannot be beaten.
    """
    group = change.new_group
    if group is None:
        return False
    rack, dc = group
    for key, racks, dcs in entry.checks:
        if (racks.get(rack, 0), dcs.get(dc, 0)) < key:
            return False
    return True
