"""``corral proxy run``'s engine: a supervised proxy that applies each newer table."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from corral.actors.routing import RouteTable, decode_table_json, validate_table
from corral.proxy._caddy import CaddyDriver
from corral.proxy._driver import ProxyDriver
from corral.proxy._errors import InvalidProxySetup, ProxyApplyFailed, ProxyError
from corral.proxy._haproxy import HaproxyDriver
from corral.proxy._status import ProxyStatus, Verdict, verdict
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

    Raises:
        ProxyNotInstalled: the binary is missing.
        ProxyStartFailed: the process did not come up.
        InvalidProxySetup: an unusable kind, address or directory.
    """
    check_listen(listen)
    driver: HaproxyDriver | CaddyDriver
    if kind == "haproxy":
        driver = HaproxyDriver(listen=listen, data_dir=data_dir, binary=binary)
    elif kind == "caddy":
        driver = CaddyDriver(listen=listen, data_dir=data_dir, admin=admin, binary=binary)
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
    ``proxy.applied`` and ``proxy.failed`` events.

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
        self._status = ProxyStatus(id=proxy_id, kind=driver.kind, listen=driver.listen)
        self._lock = trio.Lock()

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


async def _forget_status(registry: Registry, status: ProxyStatus) -> None:
    try:
        await registry.delete(proxy_key(status.id))
    except RegistryError as exc:
        log.warning("%s: could not remove %s on the way out: %s", status.id, status.key, exc)


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
    task_status: trio.TaskStatus[ProxyEngine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``corral proxy run``: the real proxy, fed from the registry, until cancelled.

    Opens the registry, starts the proxy (:func:`open_proxy`), serves the stored
    table and every newer one (:func:`follow_routing`); on cancellation the proxy
    process is stopped by pid and the registry closed. With ``record`` it writes
    its :class:`ProxyStatus` to ``proxies/<id>`` once started and after every
    table (what it applied, when, and any error), and removes it when stopped.

    Args:
        kind: ``"haproxy"`` or ``"caddy"``.
        listen: ``host:port`` to serve HTTP on.
        registry_url: ``sqlite:///...`` or ``etcd://host:port``.
        data_dir: the proxy's files.
        proxy_id: its name in ``proxies/<id>`` (default: the kind).
        binary, admin: see :func:`open_proxy`.
        on_status: told the status after every table.
        emit: told ``proxy.applied`` / ``proxy.failed`` events.
        registry_options: TLS files and credentials for an etcd registry.
        record: write ``proxies/<id>``.

    ``task_status.started(engine)`` once the stored table is served.

    Raises:
        InvalidProxySetup: an unusable kind, address, id or directory.
    """
    from corral.registry import open_registry

    name = proxy_id or kind
    try:
        validate_name("proxy", name)
    except InvalidName as exc:
        raise InvalidProxySetup(f"--id: {exc}") from None

    async with (
        open_registry(registry_url, options=registry_options) as registry,
        open_proxy(
            kind,
            listen=listen,
            data_dir=data_dir,
            binary=binary,
            admin=admin,
            proxy_id=name,
            emit=emit,
        ) as engine,
    ):

        async def told(status: ProxyStatus) -> None:
            if record:
                await record_status(registry, status)
            if on_status is not None:
                await on_status(status)

        if record:
            await record_status(registry, engine.status)
        try:
            await follow_routing(
                registry, engine, on_status=told, task_status=_Relay(task_status, engine)
            )
        finally:
            if record:
                # A proxy stopped on purpose leaves the list; a killed one stays, its lag
                # growing, which is how `corral routes` shows it is not following.
                with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                    await _forget_status(registry, engine.status)


class _Relay:
    """Passes follow_routing's ``started()`` on as ``started(engine)``."""

    def __init__(self, status: trio.TaskStatus[ProxyEngine], engine: ProxyEngine) -> None:
        self._status = status
        self._engine = engine

    def started(self, value: object = None) -> None:
        self._status.started(self._engine)
