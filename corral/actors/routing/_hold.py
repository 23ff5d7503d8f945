"""Whether a render may be published, or must wait for inputs still arriving (pure).

Theory of operation
-------------------
The lease holder renders from one consistent read of the registry, but a
consistent read is not a complete one. Right after a hand-over (or an etcd
stall that let node leases lapse) the nodes' records are still coming back:
a node that serves its apps, and that SWIM hears, may have no ``nodes/<id>``
record for a few seconds. Rendered from that view, every domain served only
by such nodes drops out of the table and proxies answer 404 for it (issue 26:
a new coordinator published a table with 0 domains).

So a render that drops a domain the last published table served is published
only when the inputs *explain* the drop:

* no app claims the domain any more (the app was deleted, its domains
  changed, its alias removed or retargeted); or
* every node placed for the domain's app either has a record that names the
  instance (and says why it is out: not running, not ready, rolling, no
  port...), or is known gone: SWIM holds it ``dead`` or ``left``, or its record
  has been missing (or incomplete) for longer than the settle time.

A record can also come back before all of it does: a node whose lease lapsed
registers again at once, and its reconciler writes what it serves on its next
pass. So a present record that names no instance of an app placed on it, while
the last table served that app's domain from that node's host, is not yet an
answer either.

A placed node whose record is missing or incomplete that way, that SWIM does
not hold gone, and that has been so for less than the settle time is
*awaited*. A dropped domain whose app is placed on an awaited node is not
explained, and the render is held: nothing is written, the last table keeps
serving, and the next pass (the record arriving is a watched change) decides
again. Given complete inputs (no node awaited) the render is published as it is.

No trio, no clock (``now`` is an argument), no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from corral.actors.routing._render import Rendered, RouteTable, RoutingInputs, claimed_domains

__all__ = [
    "DEFAULT_SETTLE",
    "GONE_STATES",
    "PublishDecision",
    "awaited_nodes",
    "decide_publish",
    "incomplete_records",
]

#: Seconds a placed node's record may be missing before its absence counts as an
#: answer (its node lapsed for good); until then the node is awaited. Past the few
#: seconds an alive node takes to register again after its lease lapsed (a lease TTL).
DEFAULT_SETTLE: Final = 10.0

#: SWIM states that say a node is gone (its missing record is its answer).
GONE_STATES: Final = frozenset({"dead", "left"})


def incomplete_records(inputs: RoutingInputs) -> frozenset[str]:
    """The placed nodes whose record is missing, or names no instance of an app placed
    on the node (a record written again after its lease lapsed, before its reconciler
    said what it serves)."""
    placed: dict[str, set[str]] = {}
    for app, nodes in inputs.placements.items():
        for node in nodes:
            placed.setdefault(node, set()).add(app)
    return frozenset(
        node
        for node, apps in placed.items()
        if (record := inputs.nodes.get(node)) is None
        or any(app not in record.instances for app in apps)
    )


def awaited_nodes(
    inputs: RoutingInputs, *, missing_since: Mapping[str, float], now: float, settle: float
) -> frozenset[str]:
    """The placed nodes whose record (or part of it) may still arrive.

    Args:
        inputs: the routing inputs (placements, node records, SWIM states).
        missing_since: node -> when this renderer first saw its record missing or
            incomplete (a node not named: first seen so ``now``).
        now: the renderer's clock.
        settle: seconds after which a missing record counts as an answer.

    Returns:
        Every node of :func:`incomplete_records` that SWIM does not hold ``dead`` or
        ``left`` and that has been so for less than ``settle`` seconds.
    """
    return frozenset(
        node
        for node in incomplete_records(inputs)
        if inputs.member_states.get(node, "alive") not in GONE_STATES
        and now - missing_since.get(node, now) < settle
    )


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _waiting_for(
    app: str, served_from: tuple[str, ...], inputs: RoutingInputs, awaited: frozenset[str]
) -> frozenset[str]:
    """The awaited nodes placed for ``app`` whose record could still bring its backends
    back: no record at all, or one naming no instance of ``app`` though the last table
    served it from that node's host."""
    hosts = {_host(url) for url in served_from}
    waiting = set()
    for node in frozenset(inputs.placements.get(app, ())) & awaited:
        record = inputs.nodes.get(node)
        if record is None or (
            app not in record.instances and record.advertise_host.strip("[]") in hosts
        ):
            waiting.add(node)
    return frozenset(waiting)


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """Whether to publish a render.

    ``publish``: the render may be written (it still is only when it changed).
    ``why``: when held, which domains the inputs do not explain dropping and the
    nodes whose records are awaited for them; "" when published.
    ``unexplained``: dropped domain -> the awaited nodes placed for its app.
    """

    publish: bool
    why: str = ""
    unexplained: Mapping[str, frozenset[str]] = field(default_factory=dict)


def decide_publish(
    last: RouteTable | None,
    inputs: RoutingInputs,
    rendered: Rendered,
    awaited: frozenset[str],
) -> PublishDecision:
    """Publish ``rendered`` unless it drops a domain of ``last`` the inputs do not explain.

    Args:
        last: the table published now (None: none yet, nothing can be dropped).
        inputs: what ``rendered`` was rendered from.
        rendered: ``render_routes(inputs)``.
        awaited: the placed nodes whose records may still arrive (:func:`awaited_nodes`).

    Returns:
        ``publish=True`` when every domain of ``last`` missing from ``rendered`` is
        explained (see the module docstring); else ``publish=False`` naming each
        unexplained domain and the nodes it waits for.
    """
    if last is None or not awaited:
        return PublishDecision(True)
    dropped = [d for d in sorted(last.domains) if d not in rendered.domains]
    if not dropped:
        return PublishDecision(True)
    owner = claimed_domains(inputs)
    unexplained: dict[str, frozenset[str]] = {}
    for domain in dropped:
        app = owner.get(domain)
        if app is None:
            continue  # nobody claims it any more: the inputs say so
        waiting = _waiting_for(app, last.domains[domain], inputs, awaited)
        if waiting:
            unexplained[domain] = waiting
    if not unexplained:
        return PublishDecision(True)
    nodes = sorted(set().union(*unexplained.values()))
    shown = sorted(unexplained)
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    why = (
        f"held: it would drop {len(shown)} served domain(s) ({', '.join(shown[:5])}{more}) "
        f"while the records of {len(nodes)} placed node(s) ({', '.join(nodes)}) have not "
        "fully arrived; the last table keeps serving until they do, SWIM holds those nodes "
        "dead or left, or they stay missing past the settle time"
    )
    return PublishDecision(False, why, unexplained)
