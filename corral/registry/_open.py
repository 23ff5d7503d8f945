""":func:`open_registry`: a registry URL (see :mod:`._url`) to an open registry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from corral.registry._base import Registry
from corral.registry._errors import InvalidRegistryUrl
from corral.registry._url import RegistryOptions, parse_registry_url


@asynccontextmanager
async def open_registry(
    url: str,
    *,
    clock: Callable[[], float] | None = None,
    options: RegistryOptions | None = None,
    lease_ttl: float | None = None,
) -> AsyncIterator[Registry]:
    """Open the registry at ``url`` and close it on exit.

    Args:
        url: see the module docstring.
        clock: lease clock for memory (default trio.current_time) and SQLite
            (default the host's boot-time clock, which every process of the host
            shares); etcd keeps its own.
        options: TLS files and credentials for etcd.
        lease_ttl: the shortest lease TTL (seconds) the caller keeps alive; etcd
            sizes its per-request timeouts from it, so a silent member costs one
            short attempt before the next (see ``corral.registry._endpoints``).

    For SQLite it also runs a lease sweeper in the background while open.

    Raises:
        InvalidRegistryUrl: naming what is accepted, or what is wrong with ``options``.
        RegistryAuthError: a TLS file or the password file cannot be loaded.
        RegistryUnavailable: the store cannot be opened or reached.
    """
    parsed = parse_registry_url(url)
    options = options or RegistryOptions()
    problems = options.problems(parsed)
    if problems:
        raise InvalidRegistryUrl(f"registry options for {url}: {'; '.join(problems)}")
    registry: Registry
    if parsed.scheme == "sqlite":
        from corral.registry._sqlite import SQLiteRegistry

        sqlite = await SQLiteRegistry.open(
            parsed.path,
            clock=clock,
            poll_interval=parsed.poll_interval,
            synchronous=parsed.synchronous,
        )
        # A system task rather than a nursery, so exceptions from the caller's
        # block come out as they are, not wrapped in an ExceptionGroup.
        sweeping = trio.CancelScope()

        async def sweep() -> None:
            with sweeping:
                await sqlite.run_sweeper()

        trio.lowlevel.spawn_system_task(sweep, name=f"registry sweeper {parsed.path}")
        try:
            yield sqlite
        finally:
            sweeping.cancel()
            await sqlite.aclose()
        return
    if parsed.scheme == "memory":
        from corral.registry._memory import MemoryRegistry

        registry = MemoryRegistry(clock)
    else:
        from corral.registry._etcd import EtcdRegistry

        registry = EtcdRegistry(
            parsed.endpoints,
            prefix=parsed.prefix,
            lease_ttl=lease_ttl,
            tls=options.ssl_context() if parsed.tls else None,
            user=options.user,
            password=options.load_password(),
        )
    try:
        yield registry
    finally:
        await registry.aclose()
