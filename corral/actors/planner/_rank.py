"""Ranking: rendezvous scores and the spread-first greedy choice of nodes.

Theory of operation
-------------------
Choosing the nodes of an application is a greedy walk: at each step, among the candidate
nodes not chosen yet, take the one with the smallest key

    (instances of this app already chosen in the node's rack,
     instances already chosen in the node's datacenter,
     preference)

where *preference* is the position in a list ordered best first: by rendezvous score
(highest first) for apps that declare no resources, by room left after placing (least
first, then node id) for apps that do. Distinct node ids have distinct scores (short of a
SHA-256 collision; the node id would still settle it), so every order is total and the
walk is a function of its inputs. With no racks and no datacenters the first two terms
are equal for every node and the walk is exactly rendezvous hashing.

The preference list need not be complete. Rendezvous apps usually need only the top few of
a thousand nodes, so the planner keeps the top ``K`` scores (a *prefix*) and walks that.
A step is decided inside the prefix when the best key found there is provably the smallest
over all candidates: either it is ``(0, 0)``, which nothing beats, or it is no larger than
the smallest key any group of candidates (rack, datacenter) could offer. Otherwise the walk
reports that it needs the whole list, and the caller computes it.

Nothing here reads a clock or draws a random number.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Final

__all__ = ["Group", "rendezvous_score", "spread_select"]

Group = tuple[str | None, str | None]
"""(rack, datacenter) of a node; ``None`` is the unnamed rack or datacenter."""

_sha256 = hashlib.sha256
_ZERO: Final = (0, 0)


def rendezvous_score(app: str, node: str) -> bytes:
    """The rendezvous score of ``app`` on ``node``: ``sha256("<app>\\n<node>")`` (UTF-8).

    Returns the 32-byte digest. Digests of equal length compare as big-endian numbers, so
    comparing the bytes is comparing the scores; higher ranks first.
    """
    return _sha256(f"{app}\n{node}".encode()).digest()


def spread_select(
    order: Sequence[str],
    *,
    complete: bool,
    candidates: Container[str],
    extra: Container[str],
    group_of: Mapping[str, Group],
    preselected: Sequence[str],
    want: int,
    groups: Callable[[], Mapping[Group, int]] | None,
) -> tuple[list[str], list[tuple[int, int]]] | None:
    """Walk ``order`` and choose up to ``want`` nodes, spreading over racks then datacenters.

    Args:
        order: node ids, best preference first.
        complete: whether ``order`` lists every candidate.
        candidates, extra: a node may be chosen when it is in either (and not chosen yet).
        group_of: (rack, datacenter) of every node in ``order`` and in ``preselected``.
        preselected: nodes already holding an instance that count for spreading but are
            not chosen again (they are not in the result).
        want: how many nodes to choose.
        groups: for an incomplete ``order``, a function giving how many candidates each
            (rack, datacenter) group holds, to prove a step is decided inside the prefix.

    Returns:
        ``(chosen, keys)`` in the order chosen, with the spread key of each step; fewer
        than ``want`` only when ``order`` is complete and ran out of candidates. ``None``
        when the prefix could not decide a step: the caller must supply the whole list.
    """
    racks: dict[str | None, int] = {}
    dcs: dict[str | None, int] = {}
    taken = set(preselected)
    for node in preselected:
        group = group_of.get(node)
        if group is not None:
            racks[group[0]] = racks.get(group[0], 0) + 1
            dcs[group[1]] = dcs.get(group[1], 0) + 1
    chosen: list[str] = []
    keys: list[tuple[int, int]] = []
    while len(chosen) < want:
        best: str | None = None
        best_key: tuple[int, int] | None = None
        for node in order:
            if node in taken or (node not in candidates and node not in extra):
                continue
            rack, dc = group_of[node]
            key = (racks.get(rack, 0), dcs.get(dc, 0))
            if best_key is None or key < best_key:
                best, best_key = node, key
                if key == _ZERO:
                    break
        if best is None or best_key is None:
            if complete:
                break
            return None
        if not complete and best_key != _ZERO:
            if groups is None:
                return None
            floor = _smallest_group_key(groups(), taken, candidates, extra, group_of, racks, dcs)
            if floor is not None and floor < best_key:
                return None
        chosen.append(best)
        keys.append(best_key)
        taken.add(best)
        rack, dc = group_of[best]
        racks[rack] = racks.get(rack, 0) + 1
        dcs[dc] = dcs.get(dc, 0) + 1
    return chosen, keys


def _smallest_group_key(
    groups: Mapping[Group, int],
    taken: set[str],
    candidates: Container[str],
    extra: Container[str],
    group_of: Mapping[str, Group],
    racks: Mapping[str | None, int],
    dcs: Mapping[str | None, int],
) -> tuple[int, int] | None:
    """The smallest spread key any group with a candidate left could offer."""
    used: dict[Group, int] = {}
    for node in taken:
        if node in candidates or node in extra:
            group = group_of.get(node)
            if group is not None:
                used[group] = used.get(group, 0) + 1
    smallest: tuple[int, int] | None = None
    for group, count in groups.items():
        if count - used.get(group, 0) <= 0:
            continue
        key = (racks.get(group[0], 0), dcs.get(group[1], 0))
        if smallest is None or key < smallest:
            smallest = key
    return smallest
