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

One process per node id
-----------------------
Each node process draws a random *instance* token at start and writes it, with
its pid and host name, into every record it writes. Two processes given the
same ``--node-id`` are told apart by it, and the one holding the live record
wins:

* a process that starts while a live record of another instance exists refuses
  to start (:func:`claim_on_start`), unless that record is a previous life of
  this node on this host whose process is gone (a crash, restarted within the
  old lease's TTL): the other process may well still be alive, merely slow;
* a running process that finds its record held by another instance
  (:func:`taken_by`) stops at once. That is the process that was paused or cut
  off past its lease: while it was away the cluster saw the node leave and a
  newcomer register, so the newcomer's view is the current one. A record that
  is simply absent (the lease lapsed and nobody took it) is written again.

Every write is guarded on the record's ``mod_revision`` (or its absence), so of
two processes racing for an absent record exactly one writes it, and the other
then finds it taken.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from corral.registry import MeasuredCapacity, NodeRecord, validate_name

__all__ = [
    "HeldElsewhere",
    "NodeIdentity",
    "StartClaim",
    "capacity_update",
    "claim_on_start",
    "fresh_record",
    "rewritten_record",
    "taken_by",
]


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
    #: This process: its random instance token, pid and host name.
    instance: str = ""
    pid: int = 0
    hostname: str = ""

    def __post_init__(self) -> None:
        validate_name("node", self.node_id)


@dataclass(frozen=True, slots=True)
class HeldElsewhere:
    """``nodes/<id>`` is held by another process: who it is, as its record says."""

    node_id: str
    instance: str
    pid: int
    hostname: str
    peer_address: str
    api_address: str

    @classmethod
    def of(cls, record: NodeRecord) -> HeldElsewhere:
        return cls(
            node_id=record.id,
            instance=record.instance,
            pid=record.pid,
            hostname=record.hostname,
            peer_address=record.peer_address,
            api_address=record.api_address,
        )

    def describe(self) -> str:
        """``instance 3f9a0c1d2e4b…, pid 4242 on host box, api 10.0.0.9:7400``."""
        parts = [f"instance {self.instance[:12]}…" if self.instance else "an older corral"]
        if self.pid:
            parts.append(f"pid {self.pid}" + (f" on host {self.hostname}" if self.hostname else ""))
        elif self.hostname:
            parts.append(f"on host {self.hostname}")
        if self.peer_address:
            parts.append(f"peer {self.peer_address}")
        if self.api_address:
            parts.append(f"api {self.api_address}")
        return ", ".join(parts)

    def taken_message(self) -> str:
        """One line for the running process that finds its record taken."""
        return (
            f"node {self.node_id}: another corral process ({self.describe()}) now holds "
            f"nodes/{self.node_id}; this process stops. Give each node its own --node-id, "
            "or stop the other one."
        )

    def refused_message(self) -> str:
        """One line for the process that refuses to start."""
        return (
            f"node id {self.node_id!r} is in use by a live node ({self.describe()}); this "
            "process does not start. Give each node its own --node-id, or stop the other one "
            "(if it is gone, its record lapses with its lease within --node-ttl-ms)."
        )


@dataclass(frozen=True, slots=True)
class StartClaim:
    """What a starting process may do with ``nodes/<id>``.

    ``refused`` names the live process holding it (do not start); otherwise
    ``replaces`` is the instance token of a gone previous life whose record the
    first write may overwrite ("" when there is none).
    """

    refused: HeldElsewhere | None = None
    replaces: str = ""


def claim_on_start(
    identity: NodeIdentity, stored: NodeRecord | None, *, holder_running: bool
) -> StartClaim:
    """Decide whether a starting process may take ``nodes/<id>``.

    Args:
        identity: the starting process (its instance, pid, host and addresses).
        stored: the live record, if any.
        holder_running: whether the process the record names (``stored.pid``) is
            running on this host; only asked when ``stored.hostname`` is this host.

    Returns:
        A refusal naming the holder, or the claim (with the instance it replaces).
    """
    if stored is None or stored.instance == identity.instance:
        return StartClaim()
    if not stored.instance:
        # Written by a build without instance tokens: its addresses tell a previous
        # life of this node (the same ones, which this process could bind) apart.
        if (stored.peer_address, stored.api_address) in (
            ("", ""),
            (identity.peer_address, identity.api_address),
        ):
            return StartClaim()
        return StartClaim(refused=HeldElsewhere.of(stored))
    if stored.hostname == identity.hostname and stored.pid > 0 and not holder_running:
        return StartClaim(replaces=stored.instance)
    return StartClaim(refused=HeldElsewhere.of(stored))


def taken_by(
    identity: NodeIdentity, stored: NodeRecord | None, *, replaces: str = ""
) -> HeldElsewhere | None:
    """Who holds ``nodes/<id>`` instead of this process, or None when it may write.

    Args:
        identity: this process.
        stored: the record stored now.
        replaces: the instance of a gone previous life this process may overwrite
            (from :func:`claim_on_start`).

    Returns:
        None when the record is absent, ours, the replaced previous life's, or
        written by a build without instance tokens; else the holder.
    """
    if stored is None or stored.instance in ("", identity.instance):
        return None
    if replaces and stored.instance == replaces:
        return None
    return HeldElsewhere.of(stored)


def _with_identity(
    record: NodeRecord, identity: NodeIdentity, capacity: MeasuredCapacity | None
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
        instance=identity.instance,
        pid=identity.pid,
        hostname=identity.hostname,
    )


def fresh_record(
    identity: NodeIdentity,
    *,
    capacity: MeasuredCapacity | None,
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
    capacity: MeasuredCapacity | None,
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
    identity: NodeIdentity, *, capacity: MeasuredCapacity | None, stored: NodeRecord
) -> NodeRecord | None:
    """Refresh identity and capacity in the stored record.

    Returns:
        The record to write, or None when it already says all of that.
    """
    updated = _with_identity(stored, identity, capacity)
    return None if updated == stored else updated
