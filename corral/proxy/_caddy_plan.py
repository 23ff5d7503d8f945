"""Caddy: the whole config for a table, as one JSON document (pure).

Theory of operation
-------------------
Caddy takes its entire configuration at once (``POST /load`` on its admin API),
so every table becomes one document: one route per domain (a ``host`` matcher
and a ``reverse_proxy`` to the domain's backends, round robin), then a
catch-all route answering 404. Without that last route a host no route matches
gets 200 with an empty body.

``try_duration`` makes Caddy try another backend when a connection fails, so an
instance that died between two tables costs no request. The admin API listens
on a loopback address; nothing is persisted (``config.persist`` false), and
Caddy's storage is under the data directory.
"""

from __future__ import annotations

from typing import Any, Final

from corral.actors.routing import RouteTable, backend_address
from corral.proxy._errors import InvalidProxySetup

__all__ = ["NOT_FOUND_BODY", "caddy_document", "dial_address"]

NOT_FOUND_BODY: Final = "no route for this host"


def dial_address(url: str) -> str:
    """The ``host:port`` the proxy dials for a backend URL.

    Raises:
        InvalidProxySetup: not an ``http://host:port`` URL.
    """
    try:
        return backend_address(url)
    except ValueError as exc:
        raise InvalidProxySetup(str(exc)) from None


def caddy_document(
    table: RouteTable,
    *,
    listen: str,
    admin: str,
    storage: str,
    try_duration_ms: int = 2000,
) -> dict[str, Any]:
    """The Caddy config serving ``table``.

    Args:
        table: the routing table.
        listen: ``host:port`` to serve HTTP on.
        admin: ``host:port`` of the admin API (loopback).
        storage: the directory Caddy keeps its files in.
        try_duration_ms: how long a request may keep trying other backends.
    """
    routes: list[dict[str, Any]] = []
    for domain in sorted(table.domains):
        upstreams = [{"dial": dial_address(url)} for url in table.domains[domain]]
        routes.append(
            {
                "match": [{"host": [domain]}],
                "handle": [
                    {
                        "handler": "reverse_proxy",
                        "upstreams": upstreams,
                        "load_balancing": {
                            "selection_policy": {"policy": "round_robin"},
                            "try_duration": f"{try_duration_ms}ms",
                            "try_interval": "25ms",
                        },
                    }
                ],
                "terminal": True,
            }
        )
    routes.append(
        {
            "handle": [
                {
                    "handler": "static_response",
                    "status_code": 404,
                    "headers": {"Content-Type": ["text/plain; charset=utf-8"]},
                    "body": NOT_FOUND_BODY,
                }
            ]
        }
    )
    return {
        "admin": {"listen": admin, "config": {"persist": False}},
        "storage": {"module": "file_system", "root": storage},
        "logging": {"logs": {"default": {"level": "WARN"}}},
        "apps": {
            "http": {
                "grace_period": "2s",
                "servers": {
                    "corral": {
                        "listen": [listen],
                        "automatic_https": {"disable": True},
                        "routes": routes,
                    }
                },
            }
        },
    }
