"""Registry URLs and :func:`open_registry`.

Accepted URLs::

    memory://                                       a fresh in-process MemoryRegistry
    sqlite:///abs/path/registry.db[?poll_interval=0.05&synchronous=full]
    etcd://host:port[,host:port...][/?prefix=<namespace>]
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote

import trio

from corral.registry._base import Registry
from corral.registry._errors import InvalidRegistryUrl

ACCEPTED_URLS = (
    "memory://, sqlite:///absolute/path/registry.db, etcd://host:port[,host:port...]"
    "[/?prefix=namespace/]"
)

REGISTRY_FILE = "registry.db"


@dataclass(frozen=True, slots=True)
class RegistryUrl:
    """A parsed registry URL."""

    scheme: Literal["memory", "sqlite", "etcd"]
    path: str = ""
    endpoints: tuple[str, ...] = ()
    prefix: str = ""
    poll_interval: float | None = None
    synchronous: str | None = None


def default_registry_url(data_dir: str | os.PathLike[str]) -> str:
    """The embedded default: ``sqlite:///<data_dir>/registry.db``."""
    return "sqlite://" + os.path.join(os.path.abspath(os.fspath(data_dir)), REGISTRY_FILE)


def _bad(url: str, why: str) -> InvalidRegistryUrl:
    return InvalidRegistryUrl(f"bad registry URL {url!r}: {why}; accepted: {ACCEPTED_URLS}")


def parse_registry_url(url: str) -> RegistryUrl:
    """Parse a registry URL.

    Raises:
        InvalidRegistryUrl: naming what is accepted.
    """
    if not isinstance(url, str):
        raise _bad(repr(url), "not a string")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "no scheme")
    rest, _, query_text = rest.partition("?")
    try:
        query = {k: v[-1] for k, v in parse_qs(query_text, strict_parsing=bool(query_text)).items()}
    except ValueError:
        raise _bad(url, f"cannot parse the query {query_text!r}") from None
    if scheme == "memory":
        if rest or query:
            raise _bad(url, "memory:// takes no path or options")
        return RegistryUrl("memory")
    if scheme == "sqlite":
        if not rest.startswith("/"):
            raise _bad(url, "the SQLite path must be absolute (three slashes: sqlite:///path)")
        unknown = set(query) - {"poll_interval", "synchronous"}
        if unknown:
            raise _bad(url, f"unknown SQLite options {sorted(unknown)}")
        poll: float | None = None
        if "poll_interval" in query:
            try:
                poll = float(query["poll_interval"])
            except ValueError:
                raise _bad(url, "poll_interval must be a number of seconds") from None
            if poll <= 0:
                raise _bad(url, "poll_interval must be > 0")
        synchronous = query.get("synchronous")
        if synchronous is not None and synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise _bad(url, "synchronous must be normal, full or extra")
        return RegistryUrl(
            "sqlite",
            path=unquote(rest),
            poll_interval=poll,
            synchronous=None if synchronous is None else synchronous.upper(),
        )
    if scheme == "etcd":
        hosts, _, path = rest.partition("/")
        if path:
            raise _bad(url, "etcd URLs take no path; give a namespace as ?prefix=...")
        unknown = set(query) - {"prefix"}
        if unknown:
            raise _bad(url, f"unknown etcd options {sorted(unknown)}")
        endpoints = tuple(h for h in hosts.split(","))
        for endpoint in endpoints:
            host, colon, port = endpoint.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise _bad(url, f"endpoint {endpoint!r} is not host:port")
        return RegistryUrl("etcd", endpoints=endpoints, prefix=query.get("prefix", ""))
    raise _bad(url, f"unknown scheme {scheme!r}")


@asynccontextmanager
async def open_registry(
    url: str, *, clock: Callable[[], float] | None = None
) -> AsyncIterator[Registry]:
    """Open the registry at ``url`` and close it on exit.

    Args:
        url: see the module docstring.
        clock: lease clock for memory (default trio.current_time) and SQLite
            (default time.time, so processes agree); etcd keeps its own.

    For SQLite it also runs a lease sweeper in the background while open.

    Raises:
        InvalidRegistryUrl: naming what is accepted.
        RegistryUnavailable: the store cannot be opened or reached.
    """
    parsed = parse_registry_url(url)
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

        registry = EtcdRegistry(parsed.endpoints, prefix=parsed.prefix)
    try:
        yield registry
    finally:
        await registry.aclose()
