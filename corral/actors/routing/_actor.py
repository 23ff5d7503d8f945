"""The RoutingRenderer actor: keeps the ``routing`` key in step with the registry.

It runs on every node but acts only while its node holds the coordinator lease
(``lease/coordinator`` names this node; the fence is the key's create
revision, and every write is guarded on it, so a node that lost the lease a
moment ago writes nothing; the holder and fence are kept from a watch of the
key, not read on every pass). It watches the inputs of the table (``apps/``,
``placement/``, ``nodes/``, ``alias/``) and the lease key, and after each burst
of changes renders through :func:`publish_routes`, which writes only on
change: the first change after a calm at once, and whatever changes while a
pass runs, or within ``debounce`` seconds of its start, in the next pass (so
at most one pass per ``debounce``, however fast the inputs change).
Each write emits ``routing.changed`` with what moved, and is pushed to every
configured push target (the seed's push to Caddy admin endpoints, see
``corral.proxy.caddy_pusher``). Every ``resync`` seconds it renders anyway, so a
missed watch event costs at most that long.

With ``membership`` (the node's SWIM view, as the coordinator gets it) each
pass renders with every node's SWIM state, so an instance on a node SWIM holds
suspect leaves the table while it keeps its work; the membership actor tells
:class:`MembershipChanged` on every change of its view, which renders at once.

Right after it becomes the holder its inputs may still be arriving (node
records lapsed in a registry stall and are being written again): a render that
would drop a domain the last table served is held, writing nothing, while a
node placed for that domain's app has no record yet (or one that does not yet
name the app's instance), SWIM does not hold it dead
or left, and it has been missing for less than ``settle`` seconds (see
``_hold``); the pass after the record arrives, or the settle time ends, decides again.

Registry trouble is logged and retried on the next pass; it never crashes the
actor, and a failing push target never delays the others or the table.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from corral.actors.routing._hold import DEFAULT_SETTLE
from corral.actors.routing._publish import Published, publish_routes
from corral.actors.routing._render import (
    RoutesChanged,
    RouteTable,
    TableVersion,
    decode_table_json,
)
from corral.actors.routing._view import newly_silent
from corral.registry import (
    ALIAS_PREFIX,
    APPS_PREFIX,
    COORDINATOR_LEASE_KEY,
    NODES_PREFIX,
    PLACEMENT_PREFIX,
    PROXIES_PREFIX,
    ROUTING_KEY,
    CoordinatorLease,
    EventType,
    KeyValue,
    ProxyRecord,
    Registry,
    RegistryError,
    RevisionCompacted,
    decode_record,
    read_records,
)
from corral.supervision import Actor, ChildSpec, Restart
from corral.transport import SchemaError, message

if TYPE_CHECKING:  # the coordinator imports this package
    from corral.actors.coordinator import MemberStatus

__all__ = [
    "DEFAULT_DEBOUNCE",
    "DEFAULT_RESYNC",
    "GetRoutingState",
    "MembershipChanged",
    "PushTarget",
    "RoutingRenderer",
    "RoutingState",
    "routing_renderer_child_spec",
]

log = logging.getLogger("corral.actors.routing")

#: Shortest time between the starts of two renders, in seconds.
DEFAULT_DEBOUNCE = 0.05
#: Seconds between renders when nothing was seen to change.
DEFAULT_RESYNC = 10.0
#: Seconds one push may take.
DEFAULT_PUSH_TIMEOUT = 10.0
_WATCH_RETRY = 1.0
#: Seconds between two looks, by the lease holder, for proxies no longer reporting.
DEFAULT_PROXY_CHECK = 5.0

#: What a node last saw of a proxy's record: (applied version, apply error,
#: restarts, why its process is down (None while it runs)).
_ProxySeen = tuple[TableVersion | None, str | None, int, str | None]

#: The prefixes (and key) whose changes may change the table.
WATCHED: tuple[str, ...] = (APPS_PREFIX, PLACEMENT_PREFIX, NODES_PREFIX, ALIAS_PREFIX)

#: Pushes one table to one proxy; raises (anything) when it did not take it.
PushTarget = Callable[[RouteTable], Awaitable[None]]


@message("routing.get_state")
@dataclass(frozen=True)
class GetRoutingState:
    """Ask the RoutingRenderer what it did last; replies a :class:`RoutingState`."""


@message("routing.membership_changed")
@dataclass(frozen=True)
class MembershipChanged:
    """The node's SWIM view changed: render now (told by the membership actor)."""


@message("routing.state")
@dataclass(frozen=True)
class RoutingState:
    """What the RoutingRenderer did last.

    ``fence``: the fence it renders under (None: this node does not hold the
    lease). ``version``: the table it last wrote or found current. ``passes`` /
    ``writes``: renders and writes so far. ``pushes``: per push target, the
    version it last took (None: none yet) and its last error.
    """

    fence: int | None = None
    version: TableVersion | None = None
    passes: int = 0
    writes: int = 0
    last_error: str | None = None
    pushed: dict[str, TableVersion | None] = field(default_factory=dict)
    push_errors: dict[str, str] = field(default_factory=dict)


def changed_event_fields(diff: RoutesChanged) -> dict[str, object]:
    """The ``routing.changed`` event's fields (JSON-able) for ``diff``."""
    return {
        "fence": diff.fence,
        "revision": diff.revision,
        "domains_added": list(diff.domains_added),
        "domains_removed": list(diff.domains_removed),
        "backends_added": {d: list(urls) for d, urls in diff.backends_added.items()},
        "backends_removed": {d: list(urls) for d, urls in diff.backends_removed.items()},
    }


class RoutingRenderer(Actor):
    """Renders and writes the routing table while this node holds the lease.

    Args:
        node_id: this node's id (compared with the lease holder).
        registry: the shared registry.
        pushers: push target name (e.g. ``caddy=http://127.0.0.1:2019``) -> push.
        membership: node id -> its SWIM status (anything with a ``state``), read on
            every pass; None: records alone decide.
        debounce: shortest time between the starts of two renders.
        resync: seconds between renders when nothing changed.
        push_timeout: seconds one push may take.
        proxy_check: seconds between two looks for proxies whose record is no
            longer refreshed (told once each as ``proxy.failed`` by the lease holder).
        wall_clock: wall time, to judge how old a proxy's record is.
        settle: seconds a placed node's missing record is awaited before a table
            may drop the domains only it served.
    """

    mailbox_size = 16

    def __init__(
        self,
        node_id: str,
        registry: Registry,
        *,
        pushers: Mapping[str, PushTarget] | None = None,
        membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
        debounce: float = DEFAULT_DEBOUNCE,
        resync: float = DEFAULT_RESYNC,
        push_timeout: float = DEFAULT_PUSH_TIMEOUT,
        proxy_check: float = DEFAULT_PROXY_CHECK,
        wall_clock: Callable[[], float] = time.time,
        settle: float = DEFAULT_SETTLE,
    ) -> None:
        super().__init__()
        self._settle = settle
        #: placed node -> when (trio time) this holder first saw its record missing.
        self._missing_since: dict[str, float] = {}
        #: when a held render must be decided again though nothing changed.
        self._recheck_at = math.inf
        self._last_hold = ""
        self._proxy_check = proxy_check
        self._wall = wall_clock
        self._membership = membership
        self._node_id = node_id
        self._registry = registry
        self._pushers = dict(pushers or {})
        self._debounce = debounce
        self._resync = resync
        self._push_timeout = push_timeout
        self._dirty = trio.Event()
        self._state = RoutingState(pushed=dict.fromkeys(self._pushers))
        self._table: RouteTable | None = None
        #: (holder, fence) as the lease watch last saw it (None: no holder), once known.
        self._lease: tuple[str, int] | None = None
        self._lease_known = False
        self._push_wanted = trio.Event()

    async def started(self) -> None:
        self._dirty.set()  # render once at start
        for prefix in WATCHED:
            self.ctx.start_task(self._watch, prefix)
        self.ctx.start_task(self._watch_lease)
        self.ctx.start_task(self._render_loop)
        self.ctx.start_task(self._watch_proxies)
        self.ctx.start_task(self._look_for_silent_proxies)
        if self._pushers:
            self.ctx.start_task(self._push_loop)

    async def handle(self, message: object) -> object:
        if isinstance(message, GetRoutingState):
            return self._state
        if isinstance(message, MembershipChanged):
            self._dirty.set()
        return None

    # ------------------------------------------------------------------ watching

    async def _watch(self, prefix: str) -> None:
        while True:
            try:
                async with self._registry.watch(prefix) as events:
                    self._dirty.set()  # whatever happened before the watch began
                    async for _event in events:
                        self._dirty.set()
            except (RegistryError, RevisionCompacted) as exc:
                log.debug("routing watch on %s broke (%s); watching again", prefix, exc)
            except trio.ClosedResourceError:
                return
            await trio.sleep(_WATCH_RETRY)

    async def _watch_lease(self) -> None:
        """Keep :attr:`_lease` (holder, fence) as the lease key says, so a pass needs no
        read of it (a stale value costs nothing: every write is guarded on the fence)."""
        while True:
            try:
                revision = await self._registry.revision()
                self._lease = self._lease_of(await self._registry.get(COORDINATOR_LEASE_KEY))
                self._lease_known = True
                self._dirty.set()
                async with self._registry.watch(COORDINATOR_LEASE_KEY, revision + 1) as events:
                    async for event in events:
                        if event.kv.key != COORDINATOR_LEASE_KEY:
                            continue
                        self._lease = (
                            None if event.type is EventType.DELETE else self._lease_of(event.kv)
                        )
                        self._lease_known = True
                        self._dirty.set()
            except (RegistryError, RevisionCompacted) as exc:
                log.debug("routing lease watch broke (%s); watching again", exc)
            except trio.ClosedResourceError:
                return
            self._lease_known = False
            await trio.sleep(_WATCH_RETRY)

    @staticmethod
    def _lease_of(kv: KeyValue | None) -> tuple[str, int] | None:
        if kv is None:
            return None
        record = decode_record(kv.key, kv.value)
        return (record.holder, kv.create_revision) if isinstance(record, CoordinatorLease) else None

    async def _watch_proxies(self) -> None:
        """Tell this node's event log what ``corral proxy run`` processes report:
        ``proxy.applied`` when one applies a new version, ``proxy.failed`` on a new error
        or outage of its process, ``proxy.restarted`` when its process was restarted."""
        seen: dict[str, _ProxySeen] = {}
        while True:
            try:
                async with self._registry.watch(PROXIES_PREFIX) as events:
                    async for event in events:
                        if not event.kv.value:
                            seen.pop(event.kv.key.removeprefix(PROXIES_PREFIX), None)
                            continue
                        record = decode_record(event.kv.key, event.kv.value)
                        if isinstance(record, ProxyRecord):
                            self._note_proxy(record, seen)
            except (RegistryError, RevisionCompacted) as exc:
                log.debug("proxies watch broke (%s); watching again", exc)
            except trio.ClosedResourceError:
                return
            await trio.sleep(_WATCH_RETRY)

    async def _look_for_silent_proxies(self) -> None:
        """While this node holds the lease, tell each proxy whose record stopped being
        refreshed (its ``corral proxy run`` died, hangs or lost the registry) as one
        ``proxy.failed``; nothing else would: such a proxy writes no more events."""
        told: frozenset[str] = frozenset()
        while True:
            await trio.sleep(self._proxy_check)
            try:
                if await self._fence() is None:
                    told = frozenset()
                    continue
                records, _ = await read_records(self._registry, PROXIES_PREFIX)
            except RegistryError as exc:
                log.debug("could not read the proxies (%s); looking again later", exc)
                continue
            proxies = [r for r in records.values() if isinstance(r, ProxyRecord)]
            silent, told = newly_silent(proxies, now=self._wall(), flagged=told)
            for record, seconds in silent:
                self.ctx.emit(
                    "proxy.failed",
                    proxy=record.id,
                    proxy_kind=record.kind,
                    error=f"not reporting for {seconds:.0f} s (pid {record.pid} on "
                    f"{record.host}): check its corral proxy run; its state is unknown",
                    not_reporting_s=seconds,
                )

    def _note_proxy(
        self, record: ProxyRecord, seen: dict[str, _ProxySeen]
    ) -> None:
        applied = (
            None
            if record.applied_fence is None or record.applied_revision is None
            else TableVersion(record.applied_fence, record.applied_revision)
        )
        before = seen.get(record.id)
        # An outage: the process died and is not started again yet.
        down = record.last_error if record.since is None else None
        seen[record.id] = (applied, record.error, record.restarts, down)
        if applied is not None and (before is None or before[0] != applied):
            self.ctx.emit(
                "proxy.applied",
                proxy=record.id,
                proxy_kind=record.kind,
                fence=applied.fence,
                revision=applied.revision,
                seconds=record.apply_s,
            )
        if record.error and (before is None or before[1] != record.error):
            self.ctx.emit(
                "proxy.failed", proxy=record.id, proxy_kind=record.kind, error=record.error
            )
        if down and (before is None or before[3] != down):
            self.ctx.emit("proxy.failed", proxy=record.id, proxy_kind=record.kind, error=down)
        if before is not None and record.restarts > before[2]:
            self.ctx.emit(
                "proxy.restarted",
                proxy=record.id,
                proxy_kind=record.kind,
                restarts=record.restarts,
                error=record.last_error,
            )

    async def _render_loop(self) -> None:
        while True:
            with trio.move_on_at(min(trio.current_time() + self._resync, self._recheck_at)):
                await self._dirty.wait()
            # The first change after a calm renders at once (an alias flip is served as
            # soon as it can be); what changes during a pass, or within ``debounce`` of
            # its start, is rendered together by the next one.
            self._dirty = trio.Event()
            began = trio.current_time()
            await self._pass()
            await trio.sleep_until(began + self._debounce)

    # ------------------------------------------------------------------ one pass

    async def _fence(self) -> int | None:
        lease = self._lease
        if not self._lease_known:
            lease = self._lease_of(await self._registry.get(COORDINATOR_LEASE_KEY))
        if lease is None or lease[0] != self._node_id:
            return None
        return lease[1]

    async def _pass(self) -> None:
        state = self._state
        try:
            fence = await self._fence()
            if fence is None:
                if state.fence is not None:
                    log.info("not the coordinator any more: the routing table is left alone")
                self._state = _replace(self._state, fence=None, last_error=None)
                self._missing_since = {}  # a new term waits for the records afresh
                self._recheck_at = math.inf
                return
            if fence != state.fence:
                self._missing_since = {}
            now = trio.current_time()
            published = await publish_routes(
                self._registry,
                fence=fence,
                member_states=self._member_states(),
                missing_since=self._missing_since,
                now=now,
                settle=self._settle,
            )
        except RegistryError as exc:
            log.warning("routing pass failed (%s); trying again on the next change", exc)
            self._state = _replace(self._state, last_error=str(exc))
            return
        self._note_missing(published, now)
        written = published.written
        if written is None and published.why.startswith("guard failed"):
            self._lease_known = False  # read the lease again next time
        if written is not None:
            self._table = written
            diff = published.diff
            if diff is not None and not diff.empty:
                self.ctx.emit("routing.changed", **changed_event_fields(diff))
            log.info(
                "routing table %s: %d domains, %d held back",
                written.version,
                len(written.domains),
                len(written.held_back),
            )
        elif self._table is None or self._table.fence != fence:
            self._table = await self._stored(fence)
        self._state = _replace(
            self._state,
            fence=fence,
            version=None if self._table is None else self._table.version,
            passes=state.passes + 1,
            writes=state.writes + (written is not None),
            last_error=None,
        )
        if self._table is not None and self._pushers:
            self._push_wanted.set()

    def _note_missing(self, published: Published, now: float) -> None:
        """Remember since when each placed node's record is missing; on a held render,
        say why once and look again when the first awaited record's settle time ends."""
        self._missing_since = {n: self._missing_since.get(n, now) for n in published.missing}
        if not published.held:
            self._recheck_at = math.inf
            if self._last_hold:
                log.info("routing table no longer held: the awaited node records are in")
            self._last_hold = ""
            return
        # The earliest settle time still ahead (one already past would wake it at once).
        ends = [t + self._settle for t in self._missing_since.values() if t + self._settle > now]
        self._recheck_at = min(ends, default=math.inf)
        if published.why != self._last_hold:
            log.warning("routing table %s", published.why)
            self.ctx.emit("routing.held", why=published.why)
        self._last_hold = published.why

    def _member_states(self) -> dict[str, str] | None:
        if self._membership is None:
            return None
        return {node: status.state for node, status in self._membership().items()}

    async def _stored(self, fence: int) -> RouteTable | None:
        kv = await self._registry.get(ROUTING_KEY)
        if kv is None:
            return None
        try:
            table = decode_table_json(kv.value)
        except SchemaError:
            return None
        return table if table.fence <= fence else None

    async def _push_loop(self) -> None:
        """Push each new table to the targets that do not have it, apart from the
        render loop (a slow target never holds a render back); retry failed ones."""
        while True:
            await self._push_wanted.wait()
            self._push_wanted = trio.Event()
            if self._table is None:
                continue
            await self._push_all(self._table)
            if self._state.push_errors:
                with trio.move_on_after(min(self._resync, 2.0)):
                    await self._push_wanted.wait()
                self._push_wanted.set()

    async def _push_all(self, table: RouteTable) -> None:
        due = {
            name: push
            for name, push in self._pushers.items()
            if self._state.pushed.get(name) != table.version
        }
        if not due:
            return
        pushed = dict(self._state.pushed)
        errors = dict(self._state.push_errors)

        async def one(name: str, push: PushTarget) -> None:
            try:
                with trio.fail_after(self._push_timeout):
                    await push(table)
            except Exception as exc:  # one target's trouble is its own
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if errors.get(name) != text:
                    log.warning(
                        "pushing routing table %s to %s failed: %s", table.version, name, text
                    )
                errors[name] = text
                self.ctx.emit(
                    "proxy.failed",
                    proxy=name,
                    fence=table.fence,
                    revision=table.revision,
                    error=text,
                )
                return
            pushed[name] = table.version
            errors.pop(name, None)
            self.ctx.emit(
                "proxy.applied",
                proxy=name,
                fence=table.fence,
                revision=table.revision,
                how="push",
            )

        async with trio.open_nursery() as nursery:
            for name, push in sorted(due.items()):
                nursery.start_soon(one, name, push)
        self._state = _replace(self._state, pushed=pushed, push_errors=errors)


def _replace(state: RoutingState, **changes: object) -> RoutingState:
    return dataclasses.replace(state, **changes)  # type: ignore[arg-type]


def routing_renderer_child_spec(
    node_id: str,
    registry: Registry,
    *,
    pushers: Mapping[str, PushTarget] | None = None,
    membership: Callable[[], Mapping[str, MemberStatus]] | None = None,
    name: str = "routing",
    debounce: float = DEFAULT_DEBOUNCE,
    resync: float = DEFAULT_RESYNC,
    proxy_check: float = DEFAULT_PROXY_CHECK,
    wall_clock: Callable[[], float] = time.time,
    settle: float = DEFAULT_SETTLE,
) -> ChildSpec:
    """A ChildSpec running :class:`RoutingRenderer` (PERMANENT) for the node assembly."""
    return ChildSpec(
        name=name,
        factory=lambda: RoutingRenderer(
            node_id,
            registry,
            pushers=pushers,
            membership=membership,
            debounce=debounce,
            resync=resync,
            proxy_check=proxy_check,
            wall_clock=wall_clock,
            settle=settle,
        ),
        restart=Restart.PERMANENT,
        shutdown_grace=1.0,
    )
