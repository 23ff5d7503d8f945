"""The routing table: which backend URLs serve each domain (pure).

Theory of operation
-------------------
The lease holder renders ``domain -> [full URLs]`` from what the registry says:

* **apps** name their domains (``apps/<name>`` ``domains``);
* **aliases** point a domain at an app (``alias/<domain>``): the alias domain is
  served by exactly the backends of its target app;
* **placements** say which nodes serve each app (``placement/<name>``);
* **nodes** say, per app they serve, on which public port, and whether the
  process is running and ready (``nodes/<id>``), and under which host they are
  reached (the advertised host).

An instance is a backend only when all of it holds: the app is placed on the
node, a rolling deploy has not taken it out of the table, the node has a record
and an advertised host, the node serves the app on a port, and the process is
both running and ready. Every instance that fails one
of these is *held back* with the reason, never listed. A domain whose app has no
backend is left out entirely: a proxy then answers 404 for it, where an empty
list would make it answer 503 forever.

**Suspect nodes.** The lease holder's SWIM view (``member_states``) may hold a
node ``suspect`` (or ``dead`` while its record lasts): it keeps its work (its
placement does not change) but no traffic should wait on it, so its instances
are held back, and are listed again as soon as SWIM holds the node alive. When
*every* instance of an app that would otherwise serve is on such a node, they
are all kept: a suspect node may only be slow, and a proxy's own health checks
still skip one that stalled, where leaving the domain out is a certain 404.

The output is deterministic: domains and URLs are sorted, held-back entries are
sorted by (app, node, why). Bad input from one app (a malformed domain, an
alias to nothing, a domain two owners claim) is held back with the cause and
never stops another app's routes.

The table written to the registry carries a version ``(fence, revision)``:
``fence`` is the coordinator's, ``revision`` grows by one per change within the
key's life. :func:`next_table` returns None when nothing changed, so a second
render over unchanged inputs writes nothing. :func:`changed` says what moved
between two tables, the body of a ``routing.changed`` event.

No trio, no clock, no I/O.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import cbor2

from corral.registry import InvalidName, NodeRecord, validate_domain
from corral.transport import SchemaError, decode_message, encode_message, message

__all__ = [
    "MAX_BACKENDS_PER_DOMAIN",
    "MAX_DOMAINS",
    "HeldBack",
    "Instance",
    "NodeRoutes",
    "Rendered",
    "RouteTable",
    "RoutesChanged",
    "RoutingInputs",
    "TableVersion",
    "backend_address",
    "backend_url",
    "changed",
    "claimed_domains",
    "decode_table_cbor",
    "decode_table_json",
    "encode_table_cbor",
    "encode_table_json",
    "next_table",
    "node_routes_from_record",
    "normalize_domain",
    "render_routes",
    "validate_table",
]

#: Most domains one table carries; more are held back (the first ones, sorted, stay).
MAX_DOMAINS: Final = 100_000
#: Most backends one domain lists.
MAX_BACKENDS_PER_DOMAIN: Final = 1_000

_SCHEMA_VERSION: Final = 1


def normalize_domain(text: str) -> str:
    """Turn what a user typed into corral's form of a domain, or refuse it.

    The name is stripped of surrounding space and of one trailing dot (the
    fully-qualified spelling), lowercased, then checked as an RFC 1123 host name:
    dot-separated labels of 1-63 characters of a-z, 0-9 and '-', neither starting
    nor ending with '-', 253 characters at most.

    Args:
        text: the domain as given (``"Shop.Example."``).

    Returns:
        The normalized domain (``"shop.example"``).

    Raises:
        InvalidName: naming what is allowed.
    """
    if not isinstance(text, str):
        raise InvalidName(f"invalid domain {text!r}: a domain is a string such as shop.example")
    name = text.strip().lower()
    if name.endswith(".") and len(name) > 1:
        name = name[:-1]
    return validate_domain(name)


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Instance:
    """What a node says about the one instance of an app it serves.

    ``running``: the process is up. ``ready``: it passed its readiness check
    (the public port accepts a connection, or the configured health path answers
    2xx/3xx). ``public_port`` is None while the node holds no port for it.
    """

    public_port: int | None
    running: bool
    ready: bool
    state: str = ""


@dataclass(frozen=True, slots=True)
class NodeRoutes:
    """One node's part of the routing inputs: its advertised host and instances."""

    advertise_host: str
    instances: Mapping[str, Instance] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RoutingInputs:
    """Everything the renderer reads.

    Args:
        app_domains: every app -> the domains it claims (an app with none maps to
            an empty list; an alias to an app missing here is held back).
        aliases: alias domain -> the app it points at.
        placements: app name -> the nodes chosen to serve it.
        nodes: node id -> what that node publishes (a missing node has no record).
        out_of_table: app -> nodes its rollout leaves out (``PlacementRecord.out_of_table``).
        member_states: node id -> SWIM state; instances on a ``suspect`` or ``dead``
            node are held back unless no other instance of the app serves.
    """

    app_domains: Mapping[str, Sequence[str]] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    placements: Mapping[str, Sequence[str]] = field(default_factory=dict)
    nodes: Mapping[str, NodeRoutes] = field(default_factory=dict)
    #: app -> the placed nodes a rolling deploy has taken out of the table.
    out_of_table: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: node id -> its state in the lease holder's SWIM view (``alive``, ``suspect``,
    #: ``dead``, ``left``); a node not named counts as alive (its record decides).
    member_states: Mapping[str, str] = field(default_factory=dict)


def node_routes_from_record(
    record: NodeRecord, *, ready: Mapping[str, bool] | None = None
) -> NodeRoutes:
    """A node record as routing input.

    Each :class:`~corral.registry.ServingEntry` publishes ``ready``: the
    instance runs and passes its readiness check. A record from a build that
    published no readiness (``ready`` None) counts a ``running`` instance as
    ready. ``ready`` given here overrides what the record says (tests, tools).

    Args:
        record: the ``nodes/<id>`` record.
        ready: per app, whether the readiness check passes (None: the record's).

    Returns:
        The node's advertised host and one :class:`Instance` per served app.
    """
    instances: dict[str, Instance] = {}
    for app, entry in record.serving.items():
        running = entry.state == "running"
        if ready is not None:
            is_ready = bool(ready.get(app, False))
        else:
            is_ready = running if entry.ready is None else running and entry.ready
        port = entry.public_port if 1 <= entry.public_port <= 65535 else None
        instances[app] = Instance(
            public_port=port, running=running, ready=is_ready, state=entry.state
        )
    return NodeRoutes(advertise_host=record.advertise_host, instances=instances)


# --------------------------------------------------------------------------- outputs


@message("routing.held_back")
@dataclass(frozen=True, slots=True, order=True)
class HeldBack:
    """An instance (or a domain) kept out of the table, and why.

    ``node`` is None when the cause is not one node's (a domain problem).
    """

    app: str
    node: str | None
    why: str


@dataclass(frozen=True, slots=True)
class Rendered:
    """What :func:`render_routes` returns: the routes and what was held back."""

    domains: dict[str, tuple[str, ...]]
    held_back: tuple[HeldBack, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class TableVersion:
    """A table's version; tables compare by (fence, revision), larger is newer."""

    fence: int
    revision: int

    def __str__(self) -> str:
        return f"fence {self.fence} revision {self.revision}"


@message("routing.table")
@dataclass(frozen=True, slots=True)
class RouteTable:
    """The ``routing`` key: the versioned table proxies apply.

    ``domains`` maps each domain to its sorted backend URLs (never an empty list).
    """

    fence: int
    revision: int
    domains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    held_back: tuple[HeldBack, ...] = ()

    @property
    def version(self) -> TableVersion:
        return TableVersion(self.fence, self.revision)


@message("routing.changed")
@dataclass(frozen=True, slots=True)
class RoutesChanged:
    """What changed between two tables (the ``routing.changed`` event body).

    ``backends_added`` / ``backends_removed`` map a domain to the URLs that
    joined / left it, including every URL of an added / removed domain.
    """

    fence: int
    revision: int
    domains_added: tuple[str, ...] = ()
    domains_removed: tuple[str, ...] = ()
    backends_added: dict[str, tuple[str, ...]] = field(default_factory=dict)
    backends_removed: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.backends_added or self.backends_removed)


# --------------------------------------------------------------------------- rendering


def backend_url(host: str, port: int) -> str:
    """The full URL of a backend: ``http://host:port`` (an IPv6 host in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


@functools.lru_cache(maxsize=1 << 17)  # tables repeat the same URLs, table after table
def backend_address(url: str) -> str:
    """The inverse of :func:`backend_url`: ``http://host:port`` -> ``host:port``
    (an IPv6 host in brackets), as proxies dial it.

    Raises:
        ValueError: ``url`` is not ``http://host:port``.
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"backend {url!r} is not http://host:port")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"backend {url!r} has more than http://host:port")
    host = parts.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _valid_host(host: str) -> bool:
    return bool(host) and len(host) <= 253 and not any(c in host for c in "/?#@ \t\r\n")


#: SWIM states of a node no request should wait on.
UNREACHABLE_STATES: Final = frozenset({"suspect", "dead"})


def _app_backends(app: str, inputs: RoutingInputs, held: list[HeldBack]) -> tuple[str, ...]:
    urls: set[str] = set()
    # node -> (URL, SWIM state) of the instances that would serve but are on a node
    # SWIM cannot reach.
    unreachable: dict[str, tuple[str, str]] = {}
    rolling = inputs.out_of_table.get(app, frozenset())
    for node_id in sorted(set(inputs.placements.get(app, ()))):
        node = inputs.nodes.get(node_id)
        if node_id in rolling:
            held.append(HeldBack(app, node_id, "out of the table for a rolling deploy"))
            continue
        if node is None:
            held.append(HeldBack(app, node_id, "the node has no record (not registered or lapsed)"))
            continue
        instance = node.instances.get(app)
        if instance is None:
            held.append(HeldBack(app, node_id, "placed but the node does not serve it yet"))
            continue
        if not instance.running:
            state = f" (state {instance.state})" if instance.state else ""
            held.append(HeldBack(app, node_id, f"the process is not running{state}"))
            continue
        if not instance.ready:
            held.append(HeldBack(app, node_id, "running but not ready: its check does not pass"))
            continue
        port = instance.public_port
        if port is None or isinstance(port, bool) or not 1 <= port <= 65535:
            held.append(HeldBack(app, node_id, "the node holds no public port for it"))
            continue
        if not _valid_host(node.advertise_host):
            held.append(
                HeldBack(
                    app,
                    node_id,
                    f"the node advertises no usable host ({node.advertise_host!r}); "
                    "start it with --advertise",
                )
            )
            continue
        url = backend_url(node.advertise_host, port)
        member = inputs.member_states.get(node_id, "alive")
        if member in UNREACHABLE_STATES:
            unreachable[node_id] = (url, member)
        else:
            urls.add(url)
    if urls:
        for node_id, (_url, member) in sorted(unreachable.items()):
            held.append(
                HeldBack(
                    app,
                    node_id,
                    f"SWIM holds the node {member}: out of the table, keeping its work, "
                    "until it is alive again",
                )
            )
    else:  # every instance is on an unreachable node: better a slow backend than a 404
        urls.update(url for url, _member in unreachable.values())
    ordered = tuple(sorted(urls))
    if len(ordered) > MAX_BACKENDS_PER_DOMAIN:
        held.append(
            HeldBack(
                app,
                None,
                f"{len(ordered)} backends, more than the {MAX_BACKENDS_PER_DOMAIN} a domain "
                f"lists; the first {MAX_BACKENDS_PER_DOMAIN} (sorted) are kept",
            )
        )
        ordered = ordered[:MAX_BACKENDS_PER_DOMAIN]
    return ordered


def _claims(inputs: RoutingInputs, held: list[HeldBack]) -> dict[str, str]:
    """domain -> app serving it. App domains first, then aliases; conflicts held back."""
    owner: dict[str, str] = {}
    for app in sorted(inputs.app_domains):
        for raw in sorted(set(inputs.app_domains[app])):
            try:
                domain = normalize_domain(raw)
            except InvalidName as exc:
                held.append(HeldBack(app, None, str(exc)))
                continue
            other = owner.get(domain)
            if other is not None and other != app:
                held.append(
                    HeldBack(app, None, f"domain {domain} is already claimed by app {other}")
                )
                continue
            owner[domain] = app
    by_app = dict(owner)
    for raw in sorted(inputs.aliases):
        target = inputs.aliases[raw]
        try:
            domain = normalize_domain(raw)
        except InvalidName as exc:
            held.append(HeldBack(target, None, f"alias: {exc}"))
            continue
        if domain in by_app:
            held.append(
                HeldBack(
                    target,
                    None,
                    f"alias {domain} -> {target} ignored: app {by_app[domain]} claims the "
                    "domain itself",
                )
            )
            continue
        if domain in owner:  # two spellings of one alias domain
            continue
        if target not in inputs.app_domains:
            held.append(
                HeldBack(
                    target, None, f"alias {domain} points at app {target}, which does not exist"
                )
            )
            continue
        owner[domain] = target
    return owner


def claimed_domains(inputs: RoutingInputs) -> dict[str, str]:
    """Domain -> the app serving it, as :func:`render_routes` decides it (app domains,
    then aliases; what is held back for a bad name or a conflict is left out)."""
    return _claims(inputs, [])


def render_routes(inputs: RoutingInputs) -> Rendered:
    """Build ``domain -> [full URLs]`` and the list of what was held back.

    Args:
        inputs: apps' domains, aliases, placements and node records.

    Returns:
        The routes, sorted, with no domain mapped to an empty list, and every
        instance or domain kept out, with the reason, sorted.
    """
    held: list[HeldBack] = []
    owner = _claims(inputs, held)
    backends: dict[str, tuple[str, ...]] = {}
    for app in sorted(set(owner.values())):
        backends[app] = _app_backends(app, inputs, held)
    domains: dict[str, tuple[str, ...]] = {}
    for domain in sorted(owner):
        urls = backends.get(owner[domain], ())
        if urls:
            domains[domain] = urls
    if len(domains) > MAX_DOMAINS:
        kept = sorted(domains)[:MAX_DOMAINS]
        held.append(
            HeldBack(
                "",
                None,
                f"{len(domains)} domains, more than the {MAX_DOMAINS} a table carries; "
                f"the first {MAX_DOMAINS} (sorted) are kept",
            )
        )
        domains = {d: domains[d] for d in kept}
    return Rendered(domains=domains, held_back=tuple(sorted(set(held), key=_held_key)))


def _held_key(item: HeldBack) -> tuple[str, str, str]:
    return (item.app, item.node or "", item.why)


def next_table(previous: RouteTable | None, rendered: Rendered, fence: int) -> RouteTable | None:
    """The table to write after a render, or None when nothing is to be written.

    Args:
        previous: the table stored under ``routing`` now (None: none yet).
        rendered: this render.
        fence: the fence of the coordinator rendering.

    Returns:
        A table one revision past ``previous`` under ``fence``; None when the
        routes and held-back entries are those already stored, or when
        ``previous`` was written under a larger fence (this coordinator is stale).
    """
    if previous is None:
        return RouteTable(fence, 1, dict(rendered.domains), rendered.held_back)
    if previous.fence > fence:
        return None
    if previous.domains == rendered.domains and previous.held_back == rendered.held_back:
        return None
    return RouteTable(fence, previous.revision + 1, dict(rendered.domains), rendered.held_back)


def changed(old: RouteTable | None, new: RouteTable) -> RoutesChanged:
    """What moved from ``old`` to ``new``: domains and backends added or removed."""
    before: Mapping[str, tuple[str, ...]] = {} if old is None else old.domains
    after = new.domains
    added: dict[str, tuple[str, ...]] = {}
    removed: dict[str, tuple[str, ...]] = {}
    for domain in sorted(set(before) | set(after)):
        was = set(before.get(domain, ()))
        now = set(after.get(domain, ()))
        if now - was:
            added[domain] = tuple(sorted(now - was))
        if was - now:
            removed[domain] = tuple(sorted(was - now))
    return RoutesChanged(
        fence=new.fence,
        revision=new.revision,
        domains_added=tuple(sorted(set(after) - set(before))),
        domains_removed=tuple(sorted(set(before) - set(after))),
        backends_added=added,
        backends_removed=removed,
    )


# --------------------------------------------------------------------------- codecs


def _body(table: RouteTable) -> dict[str, Any]:
    _, body = encode_message(table)
    assert isinstance(body, dict)
    return body


# Tables repeat their domains table after table; a refused name raises and is not cached.
_valid_domain = functools.lru_cache(maxsize=1 << 17)(validate_domain)


def validate_table(table: object) -> RouteTable:
    """Check a table as a proxy must before serving it.

    Every domain is a normalized host name, every list has 1 to
    :data:`MAX_BACKENDS_PER_DOMAIN` ``http://host:port`` URLs, there are at most
    :data:`MAX_DOMAINS` domains, fence and revision are integers >= 0.

    Returns:
        ``table``.

    Raises:
        SchemaError: naming the first thing that does not fit.
    """
    if not isinstance(table, RouteTable):
        raise SchemaError(f"routing table: expected a RouteTable, got {type(table).__name__}")
    for name in ("fence", "revision"):
        value = getattr(table, name)
        if type(value) is not int or value < 0:
            raise SchemaError(f"routing table: {name} must be an integer >= 0, got {value!r}")
    if not isinstance(table.domains, dict):
        raise SchemaError("routing table: domains must be a map of domain -> URLs")
    if len(table.domains) > MAX_DOMAINS:
        raise SchemaError(f"routing table: {len(table.domains)} domains, more than {MAX_DOMAINS}")
    for domain, urls in table.domains.items():
        try:
            _valid_domain(domain)  # normalized already: lowercase, no trailing dot
        except (InvalidName, TypeError) as exc:
            raise SchemaError(f"routing table: {exc}") from None
        if not isinstance(urls, tuple | list) or not urls:
            raise SchemaError(f"routing table: domain {domain} lists no backend")
        if len(urls) > MAX_BACKENDS_PER_DOMAIN:
            raise SchemaError(
                f"routing table: domain {domain} lists {len(urls)} backends, "
                f"more than {MAX_BACKENDS_PER_DOMAIN}"
            )
        for url in urls:
            if not isinstance(url, str):
                raise SchemaError(f"routing table: domain {domain}: backend {url!r} is not text")
            try:
                backend_address(url)
            except ValueError as exc:
                raise SchemaError(f"routing table: domain {domain}: {exc}") from None
    return table


def encode_table_json(table: RouteTable) -> bytes:
    """The table as the registry stores it: UTF-8 JSON with ``"v": 1``.

    The ``domains`` field keeps the shape :class:`corral.registry._records.RoutingTable` reads.
    """
    return json.dumps(
        {"v": _SCHEMA_VERSION, **_body(table)}, separators=(",", ":"), sort_keys=True
    ).encode()


def decode_table_json(data: bytes) -> RouteTable:
    """Read a table written by :func:`encode_table_json`.

    Raises:
        SchemaError: not JSON, an unknown schema version, or a field that does not
            fit (the message names it).
    """
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SchemaError(f"routing table: not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise SchemaError(f"routing table: not a JSON object but {type(obj).__name__}")
    version = obj.pop("v", None)
    if isinstance(version, bool) or version != _SCHEMA_VERSION:
        raise SchemaError(f"routing table: unknown schema version v={version!r} (reads v=1)")
    return validate_table(decode_message("routing.table", obj))


def encode_table_cbor(table: RouteTable) -> bytes:
    """The table as CBOR (the message body the transport would carry)."""
    return bytes(cbor2.dumps(_body(table)))


def decode_table_cbor(data: bytes) -> RouteTable:
    """Read a table written by :func:`encode_table_cbor`.

    Raises:
        SchemaError: not CBOR, or a field that does not fit.
    """
    try:
        obj = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError) as exc:
        raise SchemaError(f"routing table: not CBOR: {exc}") from None
    return validate_table(decode_message("routing.table", obj))
