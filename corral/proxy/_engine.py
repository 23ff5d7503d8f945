"""``corral proxy run``'s engine: a supervised proxy that applies each newer table."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from corral.actors.routing import RouteTable, decode_table_json, validate_table
from corral.proxy._caddy import CaddyDriver
from corral.proxy._claim import DataDirLock, Owner, claim_id, release_id
from corral.proxy._driver import ProxyDriver
from corral.proxy._errors import InvalidProxySetup, ProxyApplyFailed, ProxyError
from corral.proxy._haproxy import HaproxyDriver
from corral.proxy._process import exit_cause
from corral.proxy._status import ProxyStatus, RestartPolicy, Verdict, restart_delay, verdict
from corral.proxy._tuning import DEFAULT_TIMEOUTS, ProxyTimeouts
from corral.registry import (
    ROUTING_KEY,
    InvalidName,
    Registry,
    RegistryError,
    RegistryOptions,
    RegistryUnavailable,
    RevisionCompacted,
    proxy_key,
    validate_name,
)
from corral.transport import SchemaError

__all__ = [
    "ProxyEngine",
    "check_listen",
    "follow_routing",
    "open_proxy",
    "record_status",
    "run_proxy",
]

log = logging.getLogger("corral.proxy")

#: Seconds between two writes of ``proxies/<id>`` while nothing changes.
DEFAULT_REPORT_EVERY = 5.0
#: How fast a dead proxy process is started again, unless told otherwise.
DEFAULT_RESTART_POLICY = RestartPolicy()


_LISTEN = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})")


def check_listen(listen: str) -> str:
    """Check a ``host:port`` listen address; return it.

    Raises:
        InvalidProxySetup: naming the form expected.
    """
    match = _LISTEN.fullmatch(listen) if isinstance(listen, str) else None
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise InvalidProxySetup(
            f"listen address {listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080)"
        )
    return listen


@asynccontextmanager
async def open_proxy(
    kind: str,
    *,
    listen: str,
    data_dir: Path,
    binary: str | None = None,
    admin: str | None = None,
    proxy_id: str | None = None,
    wall_clock: Callable[[], float] = time.time,
    emit: Callable[..., None] | None = None,
    timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
) -> AsyncIterator[ProxyEngine]:
    """Start the real proxy and yield its engine; stop the process by pid on exit.

    Args:
        kind: ``"haproxy"`` or ``"caddy"``.
        listen: ``host:port`` to serve HTTP on (a loopback one in tests).
        data_dir: the proxy's files: config, map, admin socket, log.
        binary: the executable (default: Debian's path).
        admin: Caddy's admin ``127.0.0.1:PORT`` (default: a free one).
        proxy_id: the name recorded in ``proxies/<id>`` (default: ``<kind>``).
        wall_clock: wall time for ``applied_at``.
        emit: told ``proxy.applied`` / ``proxy.failed`` events (see :class:`ProxyEngine`).
        timeouts: how long a backend may take to connect and to answer.

    Raises:
        ProxyNotInstalled: the binary is missing.
        ProxyStartFailed: the process did not come up.
        InvalidProxySetup: an unusable kind, address or directory.
    """
    check_listen(listen)
    driver: HaproxyDriver | CaddyDriver
    if kind == "haproxy":
        driver = HaproxyDriver(
            listen=listen, data_dir=data_dir, binary=binary, timeouts=timeouts
        )
    elif kind == "caddy":
        driver = CaddyDriver(
            listen=listen, data_dir=data_dir, admin=admin, binary=binary, timeouts=timeouts
        )
    else:
        raise InvalidProxySetup(f"unknown proxy kind {kind!r}: use haproxy or caddy")
    try:
        await driver.start()
        yield ProxyEngine(driver, proxy_id=proxy_id or kind, wall_clock=wall_clock, emit=emit)
    finally:
        await driver.aclose()


class ProxyEngine:
    """Applies tables to a driver in version order and keeps its status.

    ``emit(kind, **fields)`` (an actor context's ``emit``, say) is told
    ``proxy.applied``, ``proxy.failed`` and ``proxy.restarted`` events.

    A table is applied only when it is newer, by (fence, revision), than the one
    applied, and not under a fence below ``min_fence``; a failed apply keeps
    the old table served and is retried when the same or a newer table is
    offered again.
    """

    def __init__(
        self,
        driver: ProxyDriver,
        *,
        proxy_id: str,
        wall_clock: Callable[[], float] = time.time,
        emit: Callable[..., None] | None = None,
    ) -> None:
        self.driver = driver
        self._wall = wall_clock
        self._emit = emit
        self._status = ProxyStatus(
            id=proxy_id, kind=driver.kind, listen=driver.listen, since=wall_clock()
        )
        self._lock = trio.Lock()
        #: Monotonic times the process exited or failed to start (the newest few).
        self._exits: list[float] = []

    @property
    def status(self) -> ProxyStatus:
        """What ``proxies/<id>`` should say now."""
        return dataclasses.replace(self._status, reloads=self.driver.reloads)

    async def offer(self, table: RouteTable, *, min_fence: int = 0) -> Verdict:
        """Apply ``table`` if it is newer than the applied one.

        Returns:
            What was decided; after :attr:`Verdict.APPLY` check :attr:`status`
            for the outcome (``error`` is set when the proxy refused it).
        """
        async with self._lock:
            decided = verdict(self._status.applied, table.version, min_fence=min_fence)
            seen = self._status
            if seen.seen_fence is None or (seen.seen_fence, seen.seen_revision or 0) < (
                table.fence,
                table.revision,
            ):
                self._status = dataclasses.replace(
                    seen, seen_fence=table.fence, seen_revision=table.revision
                )
            if decided is not Verdict.APPLY:
                log.debug("%s: table %s not applied: %s", self._status.id, table.version, decided)
                return decided
            try:
                try:
                    validate_table(table)
                except SchemaError as exc:
                    raise ProxyApplyFailed(f"table {table.version} refused: {exc}") from None
                applied = await self.driver.apply(table)
            except ProxyError as exc:
                log.warning("%s: table %s failed: %s", self._status.id, table.version, exc)
                self._status = dataclasses.replace(self._status, error=str(exc))
                if self._emit is not None:
                    self._emit(
                        "proxy.failed",
                        proxy=self._status.id,
                        fence=table.fence,
                        revision=table.revision,
                        error=str(exc),
                    )
                return decided
            self._status = dataclasses.replace(
                self._status,
                applied_fence=table.fence,
                applied_revision=table.revision,
                applied_at=self._wall(),
                apply_s=applied.seconds,
                error=None,
            )
            log.info(
                "%s: applied %s (%s%s, %.1f ms)",
                self._status.id,
                table.version,
                applied.how,
                f": {applied.why}" if applied.why else "",
                applied.seconds * 1000,
            )
            if self._emit is not None:
                self._emit(
                    "proxy.applied",
                    proxy=self._status.id,
                    fence=table.fence,
                    revision=table.revision,
                    how=applied.how,
                    seconds=applied.seconds,
                )
            return decided

    async def supervise(
        self,
        *,
        on_status: Callable[[ProxyStatus], Awaitable[None]] | None = None,
        policy: RestartPolicy = DEFAULT_RESTART_POLICY,
    ) -> None:
        """Keep the proxy process running; runs until cancelled.

        When the process exits it is reaped and started again serving the table it
        served, after :func:`restart_delay` (at once the first time; doubling
        waits in a crash loop). The status says each outage (``last_error``,
        ``since`` None) and each restart (``restarts``, ``since``); ``on_status``
        is told both, ``emit`` gets ``proxy.failed`` and ``proxy.restarted``.
        """
        while True:
            code = await self.driver.wait_exit()
            cause = f"{self.driver.kind} {exit_cause(code)}"
            down_at = trio.current_time()
            while True:
                self._exits = [*self._exits[-32:], trio.current_time()]
                await self._note_down(cause, on_status)
                delay = restart_delay(self._exits, policy)
                if delay:
                    log.warning("%s: starting it again in %.1f s", self._status.id, delay)
                await trio.sleep(delay)
                try:
                    async with self._lock:
                        await self.driver.restart()
                except ProxyError as exc:
                    cause = f"{self.driver.kind} did not start again: {exc}"
                    continue
                break
            self._status = dataclasses.replace(
                self._status, restarts=self._status.restarts + 1, since=self._wall()
            )
            outage = trio.current_time() - down_at
            log.warning(
                "%s: %s started again (restart %d, %.2f s after it died)",
                self._status.id,
                self.driver.kind,
                self._status.restarts,
                outage,
            )
            if self._emit is not None:
                self._emit(
                    "proxy.restarted",
                    proxy=self._status.id,
                    restarts=self._status.restarts,
                    seconds=round(outage, 3),
                    error=self._status.last_error,
                )
            if on_status is not None:
                await on_status(self.status)

    async def _note_down(
        self, cause: str, on_status: Callable[[ProxyStatus], Awaitable[None]] | None
    ) -> None:
        log.warning("%s: the proxy process is down: %s", self._status.id, cause)
        self._status = dataclasses.replace(self._status, last_error=cause, since=None)
        if self._emit is not None:
            self._emit("proxy.failed", proxy=self._status.id, error=cause)
        if on_status is not None:
            await on_status(self.status)


async def follow_routing(
    registry: Registry,
    engine: ProxyEngine,
    *,
    on_status: Callable[[ProxyStatus], Awaitable[None]] | None = None,
    tidy_interval: float = 2.0,
    retry_interval: float = 1.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Watch the ``routing`` key and offer every table to ``engine``; runs until cancelled.

    Reads the key first, then watches from the next revision; started once the
    stored table was offered. A value that does not decode is logged and
    skipped (the proxy keeps what it serves). A registry that fails, or a watch
    whose revision was compacted, is read again from the start after
    ``retry_interval`` seconds.

    Args:
        registry: where ``routing`` lives.
        engine: the proxy to feed.
        on_status: called with the status after each table (to write ``proxies/<id>``).
        tidy_interval: seconds between the driver's tidy-ups (:meth:`ProxyDriver.tidy`).
        retry_interval: seconds before reading the registry again after it failed.
    """
    started = False

    def mark_started() -> None:
        nonlocal started
        if not started:
            started = True
            task_status.started()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_tidy_every, engine.driver, tidy_interval)
        while True:
            try:
                await _follow(registry, engine, on_status, mark_started)
            except (RegistryUnavailable, RevisionCompacted) as exc:
                log.warning(
                    "%s: lost the routing watch (%s); reading it again in %.1f s",
                    engine.status.id,
                    exc,
                    retry_interval,
                )
                await trio.sleep(retry_interval)


async def _tidy_every(driver: ProxyDriver, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        await driver.tidy()


async def _follow(
    registry: Registry,
    engine: ProxyEngine,
    on_status: Callable[[ProxyStatus], Awaitable[None]] | None,
    started: Callable[[], None],
) -> None:
    # The revision first: a write between the two reads is then seen twice
    # (harmless: the same version is not applied again), never missed.
    revision = await registry.revision()
    kv = await registry.get(ROUTING_KEY)
    if kv is not None:
        await _offer_value(engine, kv.value, on_status)
        revision = max(revision, kv.mod_revision)
    started()
    async with registry.watch(ROUTING_KEY, start_revision=revision + 1) as events:
        async for event in events:
            if event.kv.key != ROUTING_KEY or not event.kv.value:
                continue
            await _offer_value(engine, event.kv.value, on_status)


async def _offer_value(
    engine: ProxyEngine,
    value: bytes,
    on_status: Callable[[ProxyStatus], Awaitable[None]] | None,
) -> None:
    try:
        table = decode_table_json(value)
    except SchemaError as exc:
        log.warning("routing key does not decode, keeping the table served: %s", exc)
        return
    await engine.offer(table)
    if on_status is not None:
        await on_status(engine.status)


async def record_status(registry: Registry, status: ProxyStatus) -> bool:
    """Write ``status`` under ``proxies/<id>``; a registry failure is logged, not
    raised (the proxy keeps serving). Returns whether it was written."""
    try:
        await registry.put(proxy_key(status.id), status.encode())
    except RegistryError as exc:
        log.warning("%s: could not record its status in %s: %s", status.id, status.key, exc)
        return False
    return True


async def run_proxy(
    kind: str,
    *,
    listen: str,
    registry_url: str,
    data_dir: Path,
    proxy_id: str | None = None,
    binary: str | None = None,
    admin: str | None = None,
    on_status: Callable[[ProxyStatus], Awaitable[None]] | None = None,
    emit: Callable[..., None] | None = None,
    registry_options: RegistryOptions | None = None,
    record: bool = True,
    report_every: float = DEFAULT_REPORT_EVERY,
    restart_policy: RestartPolicy = DEFAULT_RESTART_POLICY,
    wall_clock: Callable[[], float] = time.time,
    timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
    task_status: trio.TaskStatus[ProxyEngine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``corral proxy run``: the real proxy, fed from the registry, until cancelled.

    Takes the data directory (a lock file in it) and, with ``record``, the id
    (its ``proxies/<id>`` record) for this process; opens the registry, starts
    the proxy (:func:`open_proxy`), serves the stored table and every newer one
    (:func:`follow_routing`), and supervises the process
    (:meth:`ProxyEngine.supervise`: a proxy that dies is reaped and started
    again with the table it served). On cancellation the proxy process is
    stopped by pid and the registry closed. With ``record`` it writes its
    :class:`ProxyStatus` to ``proxies/<id>`` once started, after every table,
    outage and restart, and every ``report_every`` seconds (so a record no
    longer refreshed shows its owner is gone), and removes it when stopped
    (only while the record is still its own).

    Args:
        kind: ``"haproxy"`` or ``"caddy"``.
        listen: ``host:port`` to serve HTTP on.
        registry_url: ``sqlite:///...`` or ``etcd://host:port``.
        data_dir: the proxy's files.
        proxy_id: its name in ``proxies/<id>`` (default: the kind).
        binary, admin: see :func:`open_proxy`.
        on_status: told the status after every table, outage and restart.
        emit: told ``proxy.applied`` / ``proxy.failed`` / ``proxy.restarted`` events.
        registry_options: TLS files and credentials for an etcd registry.
        record: write ``proxies/<id>``.
        report_every: seconds between two writes of the record.
        restart_policy: how fast a dead proxy process is started again.
        wall_clock: wall time for the record's times.
        timeouts: how long a backend may take to connect and to answer
            (``--response-timeout-ms``).

    ``task_status.started(engine)`` once the stored table is served.

    Raises:
        InvalidProxySetup: an unusable kind, address, id or directory.
        ProxyInUse: another live ``corral proxy run`` holds the data directory or the id.
    """
    from corral.registry import open_registry

    name = proxy_id or kind
    try:
        validate_name("proxy", name)
    except InvalidName as exc:
        raise InvalidProxySetup(f"--id: {exc}") from None
    check_listen(listen)
    owner = Owner.this_process()
    lock = DataDirLock(data_dir, listen)
    try:
        async with open_registry(url=registry_url, options=registry_options) as registry:
            stamp = _Stamp(owner, report_every, wall_clock) if record else None
            if stamp is not None:
                await claim_id(
                    registry,
                    stamp(ProxyStatus(id=name, kind=kind, listen=listen)),
                    now=wall_clock(),
                )
            try:
                async with open_proxy(
                    kind,
                    listen=listen,
                    data_dir=data_dir,
                    binary=binary,
                    admin=admin,
                    proxy_id=name,
                    emit=emit,
                    wall_clock=wall_clock,
                    timeouts=timeouts,
                ) as engine:
                    await _serve(
                        registry,
                        engine,
                        stamp=stamp,
                        on_status=on_status,
                        report_every=report_every,
                        restart_policy=restart_policy,
                        task_status=task_status,
                    )
            finally:
                if record:
                    # A proxy stopped on purpose leaves the list; a killed one stays
                    # and, no longer refreshed, shows in `corral routes` as not reporting.
                    with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                        await release_id(registry, name, owner)
    finally:
        lock.release()


class _Stamp:
    """Stamps a status with its owner and the time it is written."""

    def __init__(self, owner: Owner, report_every: float, wall: Callable[[], float]) -> None:
        self._owner = owner
        self._every = report_every
        self._wall = wall

    def __call__(self, status: ProxyStatus) -> ProxyStatus:
        return dataclasses.replace(
            status,
            reported_at=self._wall(),
            report_every=self._every,
            pid=self._owner.pid,
            host=self._owner.host,
            started_at=self._owner.started_at,
        )


async def _serve(
    registry: Registry,
    engine: ProxyEngine,
    *,
    stamp: _Stamp | None,
    on_status: Callable[[ProxyStatus], Awaitable[None]] | None,
    report_every: float,
    restart_policy: RestartPolicy,
    task_status: trio.TaskStatus[ProxyEngine],
) -> None:
    # The record is written by one task, always with the current status: a burst of
    # changes is one write, an older status never lands after a newer one, and a slow
    # registry delays no restart and no table.
    wanted = trio.Event()
    wanted.set()

    async def report_periodically() -> None:
        nonlocal wanted
        while True:
            with trio.move_on_after(report_every):
                await wanted.wait()
            wanted = trio.Event()
            if stamp is not None:
                await record_status(registry, stamp(engine.status))

    async def told(status: ProxyStatus) -> None:
        wanted.set()
        if on_status is not None:
            await on_status(status)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report_periodically)
        nursery.start_soon(
            functools.partial(engine.supervise, on_status=told, policy=restart_policy)
        )
        await nursery.start(functools.partial(follow_routing, registry, engine, on_status=told))
        task_status.started(engine)
