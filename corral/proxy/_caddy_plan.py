"""Caddy: the whole config for a table, as one JSON document (pure).

Theory of operation
-------------------
Caddy takes its entire configuration at once (``POST /load`` on its admin API),
so every table becomes one document: one route per domain (a ``host`` matcher
and a ``reverse_proxy`` to the domain's backends, fewest requests in flight
first), then a catch-all route answering 404. Without that last route a host no
route matches gets 200 with an empty body. Caddy's ``host`` matcher ignores case
and the port but not a trailing dot, so each route names the domain both ways
(``shop.test`` and ``shop.test.``): a ``Host`` corral reads as the domain
reaches it however it is spelled.

``try_duration`` makes Caddy try another backend when a connection fails, so an
instance that died between two tables costs no request; a stalled one is left
by least connections, a bounded wait and passive health checks (see
:mod:`corral.proxy._tuning`). The admin API listens on a loopback address;
nothing is persisted (``config.persist`` false), and Caddy's storage is under
the data directory.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Final

from corral.actors.routing import RouteTable
from corral.proxy._driver import dial_address
from corral.proxy._tuning import DEFAULT_TIMEOUTS, FAIL_DURATION_S, SAFE_METHODS, ProxyTimeouts

__all__ = [
    "DEFAULT_TRY_DURATION_MS",
    "NOT_FOUND_BODY",
    "SERVER_NAME",
    "caddy_config_bytes",
    "caddy_document",
    "caddy_routes_bytes",
]

NOT_FOUND_BODY: Final = "no route for this host"
#: How long a request may keep trying backends with the default timeouts: past one
#: response timeout, so a request a stalled backend held is still sent to another one.
DEFAULT_TRY_DURATION_MS: Final = DEFAULT_TIMEOUTS.try_duration_ms


def _route(
    domain: str, urls: tuple[str, ...], try_duration_ms: int, timeouts: ProxyTimeouts
) -> dict[str, Any]:
    return {
        "match": [{"host": [domain, f"{domain}."]}],
        "handle": [
            {
                "handler": "reverse_proxy",
                "upstreams": [{"dial": dial_address(url)} for url in urls],
                "load_balancing": {
                    "selection_policy": {"policy": "least_conn"},
                    "try_duration": f"{try_duration_ms}ms",
                    "try_interval": "25ms",
                    "retry_match": [{"method": list(SAFE_METHODS)}],
                },
                "health_checks": {
                    "passive": {"fail_duration": f"{FAIL_DURATION_S}s", "max_fails": 1},
                },
                "transport": {
                    "protocol": "http",
                    "dial_timeout": f"{timeouts.dial_ms}ms",
                    "response_header_timeout": f"{timeouts.response_ms}ms",
                },
            }
        ],
        "terminal": True,
    }


_CATCH_ALL: Final[dict[str, Any]] = {
    "handle": [
        {
            "handler": "static_response",
            "status_code": 404,
            "headers": {"Content-Type": ["text/plain; charset=utf-8"]},
            "body": NOT_FOUND_BODY,
        }
    ]
}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


@functools.lru_cache(maxsize=1 << 16)  # one route per domain; most stay as they were
def _route_json(
    domain: str, urls: tuple[str, ...], try_duration_ms: int, timeouts: ProxyTimeouts
) -> str:
    return _dumps(_route(domain, urls, try_duration_ms, timeouts))


_ROUTES_MARK: Final = "__corral_routes__"
#: The name of the HTTP server corral's Caddy config serves the table on.
SERVER_NAME: Final = "corral"


def _shell(listen: str, admin: str, storage: str) -> dict[str, Any]:
    return {
        "admin": {"listen": admin, "config": {"persist": False}},
        "storage": {"module": "file_system", "root": storage},
        "logging": {"logs": {"default": {"level": "WARN"}}},
        "apps": {
            "http": {
                "grace_period": "2s",
                "servers": {
                    SERVER_NAME: {
                        "listen": [listen],
                        "automatic_https": {"disable": True},
                        "routes": _ROUTES_MARK,
                    }
                },
            }
        },
    }


def caddy_document(
    table: RouteTable,
    *,
    listen: str,
    admin: str,
    storage: str,
    try_duration_ms: int | None = None,
    timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
) -> dict[str, Any]:
    """The Caddy config serving ``table``, as a JSON object.

    Args:
        table: the routing table.
        listen: ``host:port`` to serve HTTP on.
        admin: ``host:port`` of the admin API (loopback).
        storage: the directory Caddy keeps its files in.
        try_duration_ms: how long a request may keep trying other backends
            (default: ``timeouts.try_duration_ms``).
        timeouts: the connect and response timeouts of every backend.
    """
    tries = timeouts.try_duration_ms if try_duration_ms is None else try_duration_ms
    doc = _shell(listen, admin, storage)
    doc["apps"]["http"]["servers"]["corral"]["routes"] = [
        *(_route(d, table.domains[d], tries, timeouts) for d in sorted(table.domains)),
        _CATCH_ALL,
    ]
    return doc


def caddy_config_bytes(
    table: RouteTable,
    *,
    listen: str,
    admin: str,
    storage: str,
    try_duration_ms: int | None = None,
    timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
) -> bytes:
    """:func:`caddy_document` encoded, built from cached per-route fragments.

    A table differs from the last one in a few domains; the others' JSON is
    reused, so a 10,000-domain document costs a join rather than a full encoding.
    """
    shell = _dumps(_shell(listen, admin, storage))
    routes = caddy_routes_bytes(
        table, try_duration_ms=try_duration_ms, timeouts=timeouts
    ).decode()
    return shell.replace(_dumps(_ROUTES_MARK), routes, 1).encode()


def caddy_routes_bytes(
    table: RouteTable,
    *,
    try_duration_ms: int | None = None,
    timeouts: ProxyTimeouts = DEFAULT_TIMEOUTS,
) -> bytes:
    """The routes array alone (every domain, then the catch-all 404), as JSON: what
    a push to a running Caddy replaces (``PATCH .../servers/corral/routes``)."""
    tries = timeouts.try_duration_ms if try_duration_ms is None else try_duration_ms
    routes = ",".join(
        [
            *(_route_json(d, table.domains[d], tries, timeouts) for d in sorted(table.domains)),
            _dumps(_CATCH_ALL),
        ]
    )
    return f"[{routes}]".encode()
