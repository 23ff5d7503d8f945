"""Where artifact copies go, and what a node keeps: pure decisions, no trio, no I/O.

Theory of operation: the *live* revisions are the current revision of every app
and the one before it (kept for rollback). Each live revision gets at least
``copies`` holders, and every node that runs the app besides. Holders are picked
one at a time: first a node in a rack no holder is in yet (preferring a datacenter
no holder is in either), then by rendezvous rank — the sha256 of digest and node
id — so the choice for one digest depends on nothing but the nodes themselves,
and adding a node takes over only the copies it now ranks first for.

The assignment breaks nothing on the way: while fewer than ``copies`` of the
chosen holders actually have the bytes, the nodes that have them stay assigned
too (best ranked first), so a live revision never loses its last copy to a plan;
they are dropped on a later pass, once the new holders have fetched.

:func:`keep_plan` is one node's side: fetch what it is assigned and lacks;
release what it has and is neither assigned, nor run by a local process, nor
live and waiting for its first assignment — once that has lasted ``grace``
seconds (the caller keeps the ``since`` times).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.registry import AppRecord, PlacementRecord

#: Holders a live revision gets at least (``--artifact-copies``).
DEFAULT_COPIES = 3


@dataclass(frozen=True, slots=True)
class Site:
    """Where a node is: its rack and datacenter (None when unset)."""

    rack: str | None = None
    datacenter: str | None = None

    @property
    def rack_key(self) -> tuple[str | None, str | None]:
        """Racks are told apart within their datacenter."""
        return (self.datacenter, self.rack)


@dataclass(frozen=True, slots=True)
class LiveRevision:
    """A revision some app runs now or ran just before (``apps`` use it; ``runners``
    are the nodes placed to run it now)."""

    digest: str
    apps: tuple[str, ...] = ()
    runners: frozenset[str] = frozenset()


def live_revisions(
    apps: Mapping[str, AppRecord], placements: Mapping[str, PlacementRecord]
) -> dict[str, LiveRevision]:
    """Every app's current and previous revision, with the nodes placed to run it.

    Args:
        apps: app name -> ``apps/<name>``.
        placements: app name -> ``placement/<name>``.
    """
    users: dict[str, set[str]] = {}
    runners: dict[str, set[str]] = {}
    for name, app in apps.items():
        deployment = app.deployment
        if deployment is None:
            continue
        users.setdefault(deployment.digest, set()).add(name)
        placed = placements.get(name)
        if placed is not None and not app.retired:
            runners.setdefault(deployment.digest, set()).update(placed.nodes)
        if app.previous_deployment is not None:
            users.setdefault(app.previous_deployment.digest, set()).add(name)
    return {
        digest: LiveRevision(digest, tuple(sorted(names)), frozenset(runners.get(digest, ())))
        for digest, names in users.items()
    }


def rendezvous(digest: str, node: str) -> int:
    """The rank of ``node`` for ``digest``: larger ranks first."""
    return int.from_bytes(hashlib.sha256(f"{digest}\x00{node}".encode()).digest()[:8], "big")


def choose_holders(
    digest: str,
    nodes: Mapping[str, Site],
    copies: int,
    required: Iterable[str] = (),
) -> tuple[str, ...]:
    """The nodes that should hold ``digest``: every ``required`` one that is a live
    node, then more until ``copies`` (or every node), spread across racks and
    datacenters, then by rendezvous rank. Sorted."""
    chosen = sorted(n for n in set(required) if n in nodes)
    racks = {nodes[n].rack_key for n in chosen}
    centres = {nodes[n].datacenter for n in chosen}
    rest = sorted((n for n in nodes if n not in chosen), key=lambda n: -rendezvous(digest, n))
    while rest and len(chosen) < copies:
        best = max(
            rest,
            key=lambda n: (
                nodes[n].rack_key not in racks,
                nodes[n].datacenter not in centres,
                rendezvous(digest, n),
            ),
        )
        rest.remove(best)
        chosen.append(best)
        racks.add(nodes[best].rack_key)
        centres.add(nodes[best].datacenter)
    return tuple(sorted(chosen))


def assign_holders(
    revision: LiveRevision,
    nodes: Mapping[str, Site],
    held: Mapping[str, frozenset[str]],
    copies: int,
) -> tuple[str, ...]:
    """:func:`choose_holders`, plus the nodes that have the bytes while fewer than
    ``copies`` of the chosen ones do (make before break). Sorted."""
    chosen = choose_holders(revision.digest, nodes, copies, revision.runners)
    having = [n for n in nodes if revision.digest in held.get(n, frozenset())]
    ready = sum(1 for n in chosen if n in having)
    want = min(copies, len(having))
    keep = sorted(
        (n for n in having if n not in chosen), key=lambda n: -rendezvous(revision.digest, n)
    )
    extra = keep[: max(0, want - ready)]
    return tuple(sorted((*chosen, *extra)))


def plan_copies(
    revisions: Mapping[str, LiveRevision],
    nodes: Mapping[str, Site],
    held: Mapping[str, frozenset[str]],
    copies: int = DEFAULT_COPIES,
) -> dict[str, tuple[str, ...]]:
    """digest -> holders for every live revision (see :func:`assign_holders`).

    Args:
        revisions: the live revisions (:func:`live_revisions`).
        nodes: node id -> site, for the live nodes only.
        held: node id -> the digests it has on disk (other nodes' entries are ignored).
        copies: holders each revision gets at least.
    """
    return {
        digest: assign_holders(revision, nodes, held, copies)
        for digest, revision in sorted(revisions.items())
    }


@dataclass(frozen=True, slots=True)
class KeepPlan:
    """What one node does with its copies this pass."""

    fetch: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    #: digest -> when it was first seen unwanted (the caller keeps it for the next pass).
    since: dict[str, float] = field(default_factory=dict)


def keep_plan(
    node: str,
    assignments: Mapping[str, Iterable[str]],
    held: Iterable[str],
    *,
    running: Iterable[str],
    live: Iterable[str],
    since: Mapping[str, float],
    now: float,
    grace: float,
) -> KeepPlan:
    """One node's fetches and releases.

    Args:
        node: this node's id.
        assignments: digest -> holders (every ``copies/<digest>``).
        held: the digests this node has on disk.
        running: the revisions a local process runs (never released).
        live: the live revisions (one without an assignment yet is kept).
        since: digest -> when it was first seen unwanted, from the previous pass.
        now: the current time (seconds, any monotonic clock).
        grace: how long a copy stays unwanted before it is released.
    """
    have = set(held)
    mine = {d for d, holders in assignments.items() if node in holders}
    waiting = {d for d in live if d not in assignments}
    wanted = mine | set(running) | waiting
    unwanted = sorted(have - wanted)
    first = {d: since.get(d, now) for d in unwanted}
    release = tuple(d for d in unwanted if now - first[d] >= grace)
    return KeepPlan(
        fetch=tuple(sorted(mine - have)),
        release=release,
        since={d: t for d, t in first.items() if d not in release},
    )


def fetch_order(
    holders: Iterable[str], me: str, sites: Mapping[str, Site], digest: str
) -> list[str]:
    """The holders to fetch ``digest`` from, in order: same rack, same datacenter,
    then the rest, each by rendezvous rank (so fetches spread over the holders)."""
    mine = sites.get(me, Site())

    def key(node: str) -> tuple[int, int]:
        site = sites.get(node, Site())
        closeness = 0 if site.rack_key == mine.rack_key else 1
        if closeness and site.datacenter == mine.datacenter:
            closeness = 1
        elif closeness:
            closeness = 2
        return (closeness, -rendezvous(digest, node))

    return sorted((h for h in set(holders) if h != me), key=key)


def revisions_to_remove(
    on_disk: Mapping[str, Iterable[str]],
    apps: Mapping[str, AppRecord],
    running: Mapping[str, Iterable[str]],
) -> dict[str, list[str]]:
    """The unpacked revision directories to delete: app -> digests that are neither
    the app's current nor previous revision, nor run by a local process.

    Args:
        on_disk: app -> the revision directories this node has.
        apps: app name -> ``apps/<name>`` (an app that is gone keeps nothing).
        running: app -> the revisions its local processes run.
    """
    doomed: dict[str, list[str]] = {}
    for app, digests in on_disk.items():
        record = apps.get(app)
        deployment = None if record is None else record.deployment
        keep = set(running.get(app, ()))
        if deployment is not None:
            keep.add(deployment.digest)
        if record is not None and record.previous_deployment is not None:
            keep.add(record.previous_deployment.digest)
        gone = sorted(set(digests) - keep)
        if gone:
            doomed[app] = gone
    return doomed
