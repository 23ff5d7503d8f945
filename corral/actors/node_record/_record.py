"""What a node writes about itself in ``nodes/<id>`` (pure).

Theory of operation
-------------------
``nodes/<id>`` has more than one writer. The node's registration owns who the
node is (labels, rack, datacenter, addresses, start time) and what it has
(capacity). The node's reconciler owns what it serves (``serving``) and mints
``change_token`` when that changes. Each writer does read-modify-write guarded
on the record's ``mod_revision``, and carries over every field it does not own,
so neither ever erases the other's news.

Three moments call for a write, each a function here:

* :func:`fresh_record` — the first write of this node's life. A record left by
  a previous life (a restart within the old lease's TTL) describes processes
  that are gone, so ``serving`` starts empty and ``change_token`` moves past
  the old one, telling every reader that the serving set changed.
* :func:`rewritten_record` — the lease was lost and the record vanished with
  it. It is written again as this life last saw it, serving set included (the
  processes are still running), with a new ``change_token``.
* :func:`capacity_update` — periodic: the identity and capacity fields are
  refreshed; None when nothing changed, so an idle node writes nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from corral.registry import Capacity, NodeRecord, validate_name

__all__ = ["NodeIdentity", "capacity_update", "fresh_record", "rewritten_record"]


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who a node is and where it can be reached; written into ``nodes/<id>``."""

    node_id: str
    labels: dict[str, str] = field(default_factory=dict)
    rack: str | None = None
    datacenter: str | None = None
    peer_address: str = ""
    api_address: str = ""
    advertise_host: str = ""

    def __post_init__(self) -> None:
        validate_name("node", self.node_id)


def _with_identity(
    record: NodeRecord, identity: NodeIdentity, capacity: Capacity | None
) -> NodeRecord:
    return dataclasses.replace(
        record,
        labels=dict(identity.labels),
        rack=identity.rack,
        datacenter=identity.datacenter,
        peer_address=identity.peer_address,
        api_address=identity.api_address,
        advertise_host=identity.advertise_host,
        capacity=capacity,
    )


def fresh_record(
    identity: NodeIdentity,
    *,
    capacity: Capacity | None,
    started_at: float,
    previous: NodeRecord | None,
) -> NodeRecord:
    """The first record of this node's life.

    Args:
        identity: who the node is.
        capacity: what it has now (None when it could not be measured).
        started_at: wall-clock time this life began.
        previous: the record still stored from an earlier life, if any.

    Returns:
        An ``alive`` record serving nothing, with a change token past the
        previous one.
    """
    token = 0 if previous is None else previous.change_token + 1
    record = NodeRecord(
        id=identity.node_id, state="alive", change_token=token, started_at=started_at
    )
    return _with_identity(record, identity, capacity)


def rewritten_record(
    identity: NodeIdentity,
    *,
    capacity: Capacity | None,
    last_seen: NodeRecord,
    stored: NodeRecord | None,
) -> NodeRecord:
    """The record to write again after this life's lease was lost.

    Args:
        identity: who the node is.
        capacity: what it has now.
        last_seen: the record as this life last read or wrote it.
        stored: whatever is stored now (normally nothing: it left with the lease).

    Returns:
        ``last_seen`` (or ``stored`` when present, being newer) with the
        identity and capacity refreshed and the change token moved on.
    """
    base = stored if stored is not None else last_seen
    token = max(base.change_token, last_seen.change_token) + 1
    return _with_identity(dataclasses.replace(base, change_token=token), identity, capacity)


def capacity_update(
    identity: NodeIdentity, *, capacity: Capacity | None, stored: NodeRecord
) -> NodeRecord | None:
    """Refresh identity and capacity in the stored record.

    Returns:
        The record to write, or None when it already says all of that.
    """
    updated = _with_identity(stored, identity, capacity)
    return None if updated == stored else updated
