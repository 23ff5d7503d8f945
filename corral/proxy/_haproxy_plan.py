"""HAProxy: the generated files and the Runtime API commands for a table (pure).

Theory of operation
-------------------
Each domain gets its own backend, ``d_<domain>``, and one server per backend
URL, named after the URL (``s`` + 16 hex digits of its sha256), so the same URL
always is the same server. A map file (``hosts.map``) sends a request's
``Host`` (lowercased, port stripped) to its backend; a host the map does not
name goes to ``corral-unknown``, which answers 404.

Two files are written for every table: the config and the map, always
describing the whole table, so a (re)start or a reload serves exactly it. What
changes in the running process is decided by :func:`plan_update` from what the
running process holds (:class:`HaproxyState`):

* **Reload** (``-W`` master, SIGUSR2) only for structural changes: a backend the
  running process does not have (a new domain), or a server whose address is a
  host name (servers added at runtime never resolve names).
* Otherwise **Runtime API** commands, in an order that never leaves a domain
  without a server it had: new servers are added (``add server``, then
  ``set server ... state ready``: they start in maintenance), map entries are
  added, changed or deleted (``add map`` / ``set map`` / ``del map``), then
  servers leaving a backend are drained (``state drain``), put in maintenance
  and deleted (``del server``). A server HAProxy refuses to delete (it still has
  connections: requests in flight finish on it) stays *parked* in maintenance
  and is deleted by a later update or tidy-up (:func:`tidy_commands`).

A domain removed from the table loses its map entry (so its host gets 404); its
backend stays in the running process until the next reload drops it.

Stalled backends (see :mod:`corral.proxy._tuning`): ``balance leastconn``,
``timeout connect`` and ``timeout server`` bounded, and a health check of every
server (``enable health`` after ``add server``: a runtime server starts unchecked).

Retries: ``retries 3``, ``option redispatch 1`` (every retry goes to another
server) and ``retry-on conn-failure empty-response response-timeout``, so an
instance that died between two tables costs no request. A request that could
not be sent at all (a refused connection) is always retried; one the server may
have acted on (it closed without an answer, or did not answer in time) is
replayed only when its method is safe to repeat (GET, HEAD, OPTIONS): a POST
is never sent twice (:data:`L7_RETRY_RULE`).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from corral.actors.routing import RouteTable
from corral.proxy._driver import dial_address
from corral.proxy._errors import InvalidProxySetup
from corral.proxy._tuning import DEFAULT_TIMEOUTS, ProxyTimeouts

__all__ = [
    "HOST_KEY",
    "L7_RETRY_RULE",
    "SERVER_OPTIONS",
    "UNKNOWN_BACKEND",
    "HaproxyFiles",
    "HaproxyState",
    "RuntimePlan",
    "backend_name",
    "desired_state",
    "plan_update",
    "render_config",
    "render_map",
    "server_name",
    "tidy_commands",
]

UNKNOWN_BACKEND = "corral-unknown"
#: Options of every server, in the config and in ``add server`` (which ignores
#: ``default-server``). Idle connections to a server keep HAProxy from deleting it;
#: purging them within a second lets a removed server go at the next tidy-up.
#: ``check``: every second a ``HEAD /`` (:func:`render_config`); two unanswered in a row
#: take the server out, two answered bring it back (a stalled backend, see ``_tuning``).
SERVER_OPTIONS = "pool-purge-delay 1s check inter 1s fastinter 250ms downinter 1s fall 2 rise 2"

#: HAProxy replays a request on ``empty-response`` and ``response-timeout`` whatever
#: its method; this keeps those replays to methods that are safe to repeat.
L7_RETRY_RULE = "http-request disable-l7-retry unless METH_GET or METH_OPTIONS"

#: The map key of a request: its ``Host`` as :func:`~corral.actors.routing.normalize_domain`
#: has it (lowercased, ``:port`` dropped, then one trailing dot). The regex is quoted: an
#: unquoted ``$`` would start an environment variable in haproxy.cfg.
HOST_KEY = "req.hdr(host),lower,field(1,:),regsub('[.]$','')"

_UNSAFE_PATH_CHARS = frozenset(" \t\r\n\"'#,()\\;%")


@dataclass(frozen=True, slots=True)
class HaproxyFiles:
    """Where the generated files live and where HAProxy listens."""

    config: str
    map: str
    admin_socket: str
    pid_file: str
    listen: str

    def __post_init__(self) -> None:
        for name in ("config", "map", "admin_socket", "pid_file"):
            path = getattr(self, name)
            bad = sorted(_UNSAFE_PATH_CHARS.intersection(path))
            if bad or not path.startswith("/"):
                raise InvalidProxySetup(
                    f"haproxy {name} path {path!r} cannot be written into haproxy.cfg: use an "
                    f"absolute data directory without {' '.join(repr(c) for c in bad) or 'them'}"
                )
        if len(self.admin_socket.encode()) > 100:
            raise InvalidProxySetup(
                f"haproxy admin socket path is {len(self.admin_socket.encode())} bytes, more "
                "than the 100 a unix socket path may have here; use a shorter --data-dir"
            )


@functools.lru_cache(maxsize=1 << 17)
def _server(url: str) -> tuple[str, str]:
    return server_name(url), dial_address(url)


def backend_name(domain: str) -> str:
    """The backend serving ``domain``."""
    return f"d_{domain}"


def server_name(url: str) -> str:
    """The server standing for a backend URL: stable, short, always a valid name."""
    return "s" + hashlib.sha256(url.encode()).hexdigest()[:16]


def _is_ip(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HaproxyState:
    """What a running HAProxy holds (or should hold).

    Args:
        hosts: domain -> backend, the map's entries.
        backends: backend -> server name -> address.
        parked: (backend, server) pairs in maintenance, waiting to be deleted.
    """

    hosts: Mapping[str, str] = field(default_factory=dict)
    backends: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    parked: frozenset[tuple[str, str]] = frozenset()


@functools.lru_cache(maxsize=1 << 16)  # one per domain; most stay as they were
def _backend(urls: tuple[str, ...]) -> Mapping[str, str]:
    return MappingProxyType(dict(_server(url) for url in urls))


def desired_state(table: RouteTable) -> HaproxyState:
    """The state that serves ``table`` exactly."""
    hosts: dict[str, str] = {}
    backends: dict[str, Mapping[str, str]] = {}
    for domain, urls in table.domains.items():
        name = backend_name(domain)
        hosts[domain] = name
        backends[name] = _backend(urls)
    return HaproxyState(hosts=hosts, backends=backends)


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    """How to go from the running state to the desired one.

    ``reload`` names why a reload is needed (None: the commands suffice);
    ``commands`` are Runtime API lines in order; ``after`` is the running state
    once they all succeed (a ``del server`` that fails parks its server instead).
    """

    reload: str | None
    commands: tuple[str, ...] = ()
    after: HaproxyState = field(default_factory=HaproxyState)


def plan_update(running: HaproxyState | None, desired: HaproxyState, map_path: str) -> RuntimePlan:
    """Decide between a reload and Runtime API commands.

    Args:
        running: what the running process holds; None when it has not started.
        desired: what the new table needs.
        map_path: the map file as the config names it (the Runtime API's map id).

    Returns:
        The plan; with ``reload`` set, the process is reloaded from the files
        and holds ``desired`` afterwards.
    """
    if running is None:
        return RuntimePlan(reload="first start", after=desired)
    new = sorted(desired.backends.keys() - running.backends.keys())
    if new:
        more = f" and {len(new) - 1} more" if len(new) > 1 else ""
        return RuntimePlan(reload=f"new backend {new[0]}{more}", after=desired)
    adds: list[str] = []
    removals: list[str] = []
    backends: dict[str, Mapping[str, str]] = dict(running.backends)  # copied on write
    parked = set(running.parked)
    with_parked = {backend for backend, _ in parked}
    touched = sorted(
        name
        for name, want in desired.backends.items()
        # Unchanged backends are mostly the very same (cached) mapping: `is` is enough.
        if name in with_parked or (want is not backends[name] and want != backends[name])
    )
    for name in touched:
        want = desired.backends[name]
        have = dict(backends[name])
        backends[name] = have
        for server in sorted(want):
            address = want[server]
            if server in have and have[server] == address:
                if (name, server) in parked:
                    adds.append(f"set server {name}/{server} state ready")
                    parked.discard((name, server))
                continue
            if server in have:  # same name, new address: cannot happen with URL names
                return RuntimePlan(reload=f"server {name}/{server} moved", after=desired)
            if not _is_ip(address):
                return RuntimePlan(
                    reload=f"server {address} is a host name (runtime servers never resolve)",
                    after=desired,
                )
            adds.append(f"add server {name}/{server} {address} {SERVER_OPTIONS}")
            # A server added at runtime has its health checks off until told.
            adds.append(f"enable health {name}/{server}")
            adds.append(f"set server {name}/{server} state ready")
            have[server] = address
        for server in sorted(set(have) - set(want)):
            if (name, server) not in parked:
                removals.append(f"set server {name}/{server} state drain")
                removals.append(f"set server {name}/{server} state maint")
            removals.append(f"del server {name}/{server}")
            del have[server]
            parked.discard((name, server))
    map_ops: list[str] = []
    for domain in sorted(desired.hosts) if desired.hosts != running.hosts else ():
        target = desired.hosts[domain]
        current = running.hosts.get(domain)
        if current is None:
            map_ops.append(f"add map {map_path} {domain} {target}")
        elif current != target:
            map_ops.append(f"set map {map_path} {domain} {target}")
    for domain in sorted(running.hosts.keys() - desired.hosts.keys()):
        map_ops.append(f"del map {map_path} {domain}")
    # Backends of removed domains keep their servers (no host reaches them) until a reload.
    after = HaproxyState(hosts=dict(desired.hosts), backends=backends, parked=frozenset(parked))
    return RuntimePlan(reload=None, commands=(*adds, *map_ops, *removals), after=after)


def tidy_commands(running: HaproxyState) -> tuple[str, ...]:
    """The ``del server`` commands that retry every parked server, sorted."""
    return tuple(f"del server {b}/{s}" for b, s in sorted(running.parked))


def render_map(state: HaproxyState) -> str:
    """The map file: one ``domain backend`` line per domain, sorted."""
    return "".join(f"{domain} {state.hosts[domain]}\n" for domain in sorted(state.hosts))


def render_config(
    state: HaproxyState, files: HaproxyFiles, *, timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS
) -> str:
    """The whole haproxy.cfg serving ``state``.

    The frontend looks the normalised ``Host`` (:data:`HOST_KEY`) up in the map;
    an unmatched host reaches ``corral-unknown``: 404. ``timeouts`` bound the
    connect (``timeout connect``), the response and each silence in it
    (``timeout server``) and a health check (``timeout check``).
    """
    lines = [
        "# Generated by corral for every routing table; edits are overwritten.",
        "global",
        f'    stats socket "{files.admin_socket}" mode 600 level admin expose-fd listeners',
        "    stats timeout 2m",
        f'    pidfile "{files.pid_file}"',
        "    hard-stop-after 30s",
        "",
        "defaults",
        "    mode http",
        f"    timeout connect {timeouts.dial_ms}ms",
        "    timeout client 30s",
        f"    timeout server {timeouts.response_ms}ms",
        "    timeout tunnel 1h",
        # A check has a request's bound: a slow page never takes every server out
        # (HAProxy would answer 503) unless its requests time out anyway. Any HTTP
        # answer, whatever its status, says the server is not stalled.
        f"    timeout check {timeouts.response_ms}ms",
        "    option httpchk HEAD /",
        "    http-check expect rstatus '^[1-5]'",
        "    timeout http-request 10s",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response response-timeout",
        f"    default-server {SERVER_OPTIONS}",
        "",
        "frontend corral",
        f"    bind {files.listen}",
        f"    {L7_RETRY_RULE}",
        f"    use_backend %[{HOST_KEY},map({files.map},{UNKNOWN_BACKEND})]",
        f"    default_backend {UNKNOWN_BACKEND}",
        "",
        f"backend {UNKNOWN_BACKEND}",
        "    http-request return status 404 content-type text/plain"
        ' string "no route for this host"',
    ]
    text = "\n".join(lines) + "\n"
    return text + "".join(
        _backend_block(name, tuple(sorted(state.backends[name].items())))
        for name in sorted(state.backends)
    )


@functools.lru_cache(maxsize=1 << 16)
def _backend_block(name: str, servers: tuple[tuple[str, str], ...]) -> str:
    head = f"\nbackend {name}\n    balance leastconn\n"
    return head + "".join(f"    server {server} {address}\n" for server, address in servers)
