"""Routing: the table of which backends serve each domain (the RoutingRenderer's core).

Pure: :func:`render_routes` builds ``domain -> [full URLs]`` from apps' domains, aliases,
placements and node records; :func:`next_table` versions it and says when nothing
is to be written; :func:`changed` is the ``routing.changed`` event body;
:func:`normalize_domain` is the one check of a domain name. I/O:
:func:`publish_routes` is one RoutingRenderer pass against the registry (read,
render, write under the fence only on change). Proxies apply a
:class:`RouteTable` (``corral.proxy``).

Each node publishes, per app, whether its instance runs and is ready
(``ServingEntry.ready``); :func:`node_routes_from_record` reads it.
:class:`RoutingRenderer` is the actor: on the coordinator lease holder it
renders on every change of its inputs (debounced), writes the table, emits
``routing.changed`` and pushes the table to configured Caddy admin endpoints; with
the node's SWIM view, instances on a node SWIM holds suspect leave the table
(:class:`MembershipChanged` renders at once). A render that would drop a domain the
last table served is held while the records of nodes placed for it are still
arriving (``_hold.decide_publish``: after a hand-over or a registry stall).
:func:`routes_answer` (pure) is what ``corral routes`` shows, with each proxy's
lag (:func:`proxy_lag`) from its ``proxies/<id>`` record.
"""

from corral.actors.routing._actor import (
    GetRoutingState,
    MembershipChanged,
    PushTarget,
    RoutingRenderer,
    RoutingState,
    routing_renderer_child_spec,
)
from corral.actors.routing._publish import publish_routes, read_routes_answer
from corral.actors.routing._render import (
    Instance,
    NodeRoutes,
    RouteTable,
    RoutingInputs,
    TableVersion,
    backend_address,
    backend_url,
    decode_table_json,
    encode_table_json,
    next_table,
    normalize_domain,
    render_routes,
    validate_table,
)

__all__ = [
    "GetRoutingState",
    "Instance",
    "MembershipChanged",
    "NodeRoutes",
    "PushTarget",
    "RouteTable",
    "RoutingInputs",
    "RoutingRenderer",
    "RoutingState",
    "TableVersion",
    "backend_address",
    "backend_url",
    "decode_table_json",
    "encode_table_json",
    "next_table",
    "normalize_domain",
    "publish_routes",
    "read_routes_answer",
    "render_routes",
    "routing_renderer_child_spec",
    "validate_table",
]
