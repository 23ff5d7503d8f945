"""The NodeRegistration actor: keeps ``nodes/<id>`` alive while the node lives.

It grants a node lease, writes the node's record attached to it, keeps the
lease alive at a third of its TTL and refreshes the capacity now and then.
When it stops (the node shutting down) it revokes the lease inside its
shielded cleanup, so the record vanishes at once and the coordinator sees the
node leave; when the node dies, the record vanishes a TTL later by itself.

What to write is decided in :mod:`._record` (pure); this actor reads, calls
it, and writes with a compare on the record's ``mod_revision``.

When a read finds ``nodes/<id>`` held by another process (another instance
token: a second process started with this node id while this one was paused
past its lease), the actor writes nothing more, hands its own lease back and
calls ``on_taken``: the node assembly stops the whole node there.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.actors.node_record._record import (
    HeldElsewhere,
    NodeIdentity,
    capacity_update,
    fresh_record,
    rewritten_record,
    taken_by,
)
from corral.registry import (
    Compare,
    DecodedRecords,
    KeyValue,
    LeaseNotFound,
    MeasuredCapacity,
    NodeRecord,
    Put,
    Registry,
    RegistryError,
    RegistryUnavailable,
    node_key,
)
from corral.supervision import Actor, ChildSpec, Restart
from corral.transport import message

__all__ = [
    "DEFAULT_CAPACITY_INTERVAL",
    "DEFAULT_NODE_LEASE_TTL",
    "GetRegistration",
    "NodeRegistration",
    "node_registration_child_spec",
]

#: The node lease's TTL in seconds: the same as the coordinator's leaseTtlMs.
DEFAULT_NODE_LEASE_TTL = 45.0
#: How often capacity is measured again, in seconds.
DEFAULT_CAPACITY_INTERVAL = 30.0
#: Read-modify-write attempts before a write gives up until the next tick.
_WRITE_ATTEMPTS = 5


@message("node-record.state")
@dataclass(frozen=True)
class GetRegistration:
    """Ask for the registration state: lease, record, counters."""


@dataclass(frozen=True)
class _Renew:
    """Timer: keep the lease alive (or register again)."""


@dataclass(frozen=True)
class _RefreshCapacity:
    """Timer: measure capacity again and write it when it changed."""


class _RecordTaken(Exception):
    """A read found ``nodes/<id>`` held by another instance (internal to the actor)."""

    def __init__(self, held: HeldElsewhere) -> None:
        super().__init__(held.taken_message())
        self.held = held


def _with_instance(identity: NodeIdentity) -> NodeIdentity:
    """``identity`` with this process's pid and host name, and a fresh random
    instance token unless it already has one."""
    return dataclasses.replace(
        identity,
        instance=identity.instance or secrets.token_hex(16),
        pid=identity.pid or os.getpid(),
        hostname=identity.hostname or socket.gethostname(),
    )


class NodeRegistration(Actor):
    """Holds the node's lease and its ``nodes/<id>`` record.

    Args:
        identity: who the node is (id, labels, rack, datacenter, addresses).
        registry: the shared registry.
        capacity_probe: returns the node's capacity now (None when unknown);
            the node service passes a psutil-based one, tests a fixed one.
        wall_clock: unix time, for ``started_at``.
        lease_ttl: the node lease's TTL in seconds; kept alive every third.
        capacity_interval: seconds between capacity refreshes.
        on_taken: called once when another process holds ``nodes/<id>``; the
            node stops on it (when None, the actor only logs it and goes idle).
        replaces: the instance token of a gone previous life whose record the
            first write may overwrite (see ``claim_on_start``).

    An identity without an instance token is given a random one here; the node
    assembly draws it once per process (``node_registration_child_spec``), so a restart of
    this actor keeps it.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        registry: Registry,
        *,
        capacity_probe: Callable[[], MeasuredCapacity | None],
        wall_clock: Callable[[], float] = time.time,
        lease_ttl: float = DEFAULT_NODE_LEASE_TTL,
        capacity_interval: float = DEFAULT_CAPACITY_INTERVAL,
        on_taken: Callable[[HeldElsewhere], None] | None = None,
        replaces: str = "",
    ) -> None:
        super().__init__()
        if lease_ttl <= 0 or capacity_interval <= 0:
            raise ValueError("lease_ttl and capacity_interval must be positive seconds")
        self._identity = _with_instance(identity)
        self._on_taken = on_taken
        self._replaces = replaces
        self._taken: HeldElsewhere | None = None
        self._registry = registry
        self._capacity_probe = capacity_probe
        self._wall_clock = wall_clock
        self._lease_ttl = lease_ttl
        self._capacity_interval = capacity_interval
        self._key = node_key(identity.node_id)
        self._lease: int | None = None
        self._last: NodeRecord | None = None
        # The record as last read, decoded once per version (the capacity refresh reads
        # it every 30 s, and it seldom changed).
        self._decoded = DecodedRecords()
        self._started_at = 0.0
        self._registrations = 0
        self._lease_losses = 0
        self._last_error: str | None = None

    async def started(self) -> None:
        self._started_at = self._wall_clock()
        self.ctx.every(self._lease_ttl / 3, _Renew())
        self.ctx.every(self._capacity_interval, _RefreshCapacity())
        await self._register_quietly()

    async def handle(self, message: object) -> object:
        match message:
            case _Renew():
                await self._renew()
                return None
            case _RefreshCapacity():
                await self._refresh_capacity()
                return None
            case GetRegistration():
                return self._state()
        return await super().handle(message)

    async def stopping(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            await self._registry.revoke(lease)
        except RegistryError as exc:
            # Cut off from the registry: the record vanishes a TTL from now.
            self.ctx.log.warning("could not revoke node lease %s: %s", lease, exc)

    # ------------------------------------------------------------------ steps

    async def _renew(self) -> None:
        if self._taken is not None:
            return
        if self._lease is None:
            await self._register_quietly()
            return
        try:
            await self._registry.keepalive(self._lease)
        except LeaseNotFound:
            self._lease = None
            self._lease_losses += 1
            self.ctx.emit("node.lease-lost", node=self._identity.node_id)
            await self._register_quietly()
        except RegistryError as exc:
            self._note_error("keep the node lease alive", exc)

    async def _refresh_capacity(self) -> None:
        if self._lease is None or self._taken is not None:
            return
        try:
            await self._write(self._refreshed)
        except _RecordTaken as taken:
            await self._give_up(taken.held)
        except LeaseNotFound:
            self._lease = None
            await self._register_quietly()
        except RegistryError as exc:
            self._note_error("refresh the node record", exc)

    async def _register_quietly(self) -> None:
        try:
            await self._register()
        except _RecordTaken as taken:
            await self._give_up(taken.held)
        except RegistryError as exc:
            self._note_error("register the node", exc)

    async def _give_up(self, held: HeldElsewhere) -> None:
        """Another process holds the record: write nothing more and stop the node."""
        if self._taken is not None:
            return
        self._taken = held
        lease, self._lease = self._lease, None
        if lease is not None:
            await self._revoke_quietly(lease)
        self.ctx.emit(
            "node.record-taken",
            node=self._identity.node_id,
            instance=held.instance,
            pid=held.pid,
            hostname=held.hostname,
        )
        if self._on_taken is None:
            self.ctx.log.error("%s", held.taken_message())
        else:
            self._on_taken(held)

    async def _register(self) -> None:
        lease = await self._registry.grant(self._lease_ttl)
        try:
            await self._write(self._registration, lease=lease.id)
        except BaseException:
            await self._revoke_quietly(lease.id)
            raise
        self._lease = lease.id
        self._registrations += 1
        self._last_error = None
        record = self._last
        self.ctx.emit(
            "node.registered",
            node=self._identity.node_id,
            lease=lease.id,
            change_token=None if record is None else record.change_token,
        )

    def _registration(self, stored: NodeRecord | None) -> NodeRecord:
        capacity = self._capacity_probe()
        if self._last is None:
            return fresh_record(
                self._identity, capacity=capacity, started_at=self._started_at, previous=stored
            )
        return rewritten_record(
            self._identity, capacity=capacity, last_seen=self._last, stored=stored
        )

    def _refreshed(self, stored: NodeRecord | None) -> NodeRecord | None:
        if stored is None:
            # Deleted under a live lease (by hand?): put it back as last seen.
            return self._registration(None)
        return capacity_update(self._identity, capacity=self._capacity_probe(), stored=stored)

    async def _write(
        self,
        decide: Callable[[NodeRecord | None], NodeRecord | None],
        *,
        lease: int | None = None,
    ) -> None:
        """Read-modify-write of the record, guarded on its mod_revision.

        Raises:
            _RecordTaken: another instance holds the record (nothing is written).
            RegistryError: the registry failed, or the record kept changing
                under us for every attempt (RegistryUnavailable then).
        """
        lease = self._lease if lease is None else lease
        for _ in range(_WRITE_ATTEMPTS):
            kv = await self._registry.get(self._key)
            stored = _decode_node(kv, self._decoded)
            held = taken_by(self._identity, stored, replaces=self._replaces)
            if held is not None:
                raise _RecordTaken(held)
            record = decide(stored)
            if record is None:
                self._last = stored
                return
            guard = (
                Compare.absent(self._key)
                if kv is None
                else Compare.mod_revision_is(self._key, kv.mod_revision)
            )
            result = await self._registry.txn(
                [guard], [Put(self._key, record.encode(), lease=lease)]
            )
            if result.succeeded:
                self._last = record
                return
        raise _contended(self._key)

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self._registry.revoke(lease)
        except RegistryError:
            pass

    def _note_error(self, what: str, exc: RegistryError) -> None:
        self._last_error = f"could not {what}: {exc}"
        self.ctx.log.warning("%s", self._last_error)
        self.ctx.emit("node.registry-error", node=self._identity.node_id, error=self._last_error)

    def _state(self) -> dict[str, Any]:
        record = self._last
        return {
            "node": self._identity.node_id,
            "instance": self._identity.instance,
            "registered": self._lease is not None,
            "taken_by": None if self._taken is None else self._taken.describe(),
            "lease": self._lease,
            "lease_ttl": self._lease_ttl,
            "registrations": self._registrations,
            "lease_losses": self._lease_losses,
            "change_token": None if record is None else record.change_token,
            "last_error": self._last_error,
        }


def _decode_node(kv: KeyValue | None, decoded_records: DecodedRecords) -> NodeRecord | None:
    if kv is None:
        return None
    decoded = decoded_records.decode(kv)
    # A value this build cannot read is overwritten: the node owns its record.
    return decoded if isinstance(decoded, NodeRecord) else None


def _contended(key: str) -> RegistryError:
    return RegistryUnavailable(
        f"{key} changed under every one of {_WRITE_ATTEMPTS} read-modify-write attempts; "
        "another writer is updating it constantly; retrying on the next tick"
    )


def node_registration_child_spec(
    identity: NodeIdentity,
    registry: Registry,
    *,
    capacity_probe: Callable[[], MeasuredCapacity | None],
    wall_clock: Callable[[], float] = time.time,
    lease_ttl: float = DEFAULT_NODE_LEASE_TTL,
    capacity_interval: float = DEFAULT_CAPACITY_INTERVAL,
    on_taken: Callable[[HeldElsewhere], None] | None = None,
    replaces: str = "",
    name: str = "registration",
    shutdown_grace: float = 5.0,
) -> ChildSpec:
    """A ChildSpec running :class:`NodeRegistration` (PERMANENT) for the node assembly.

    The instance token is drawn here, once, when ``identity`` has none: every
    restart of the actor writes as the same process.
    """
    identity = _with_instance(identity)

    def factory() -> NodeRegistration:
        return NodeRegistration(
            identity,
            registry,
            capacity_probe=capacity_probe,
            wall_clock=wall_clock,
            lease_ttl=lease_ttl,
            capacity_interval=capacity_interval,
            on_taken=on_taken,
            replaces=replaces,
        )

    return ChildSpec(
        name=name, factory=factory, restart=Restart.PERMANENT, shutdown_grace=shutdown_grace
    )
