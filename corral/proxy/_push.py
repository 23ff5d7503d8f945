"""The seed's push: the coordinator sends each new table straight to a Caddy admin API.

A Caddy started by ``corral proxy run --kind caddy`` (or any Caddy whose config
has an HTTP server named ``corral``) takes the table's routes with one
``PATCH /config/apps/http/servers/corral/routes``. The pushed routes are the
ones ``corral proxy run`` would load itself, so a Caddy fed both ways serves
the same table.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from corral.actors.routing import PushTarget, RouteTable
from corral.proxy._caddy_plan import DEFAULT_TRY_DURATION_MS, SERVER_NAME, caddy_routes_bytes
from corral.proxy._errors import InvalidProxySetup, ProxyApplyFailed

__all__ = ["caddy_pusher", "check_admin_url"]

#: Most bytes of a refusal's body quoted in the error.
_BODY_QUOTED = 300


def check_admin_url(url: str) -> str:
    """Check ``http://HOST:PORT`` (a Caddy admin endpoint); return it without a trailing /.

    Raises:
        InvalidProxySetup: naming the form expected.
    """
    parts = urlsplit(url.strip()) if isinstance(url, str) else None
    try:
        port = parts.port if parts is not None else None
    except ValueError:
        port = None
    if (
        parts is None
        or parts.scheme != "http"
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.username
    ):
        raise InvalidProxySetup(
            f"Caddy admin endpoint {url!r} is not http://HOST:PORT (e.g. http://127.0.0.1:2019)"
        )
    return url.strip().rstrip("/")


def caddy_pusher(admin_url: str, *, try_duration_ms: int = DEFAULT_TRY_DURATION_MS) -> PushTarget:
    """A push target replacing the routes of the Caddy at ``admin_url``.

    Raises:
        InvalidProxySetup: ``admin_url`` is not ``http://HOST:PORT``.
    """
    base = check_admin_url(admin_url)
    path = f"/config/apps/http/servers/{SERVER_NAME}/routes"

    async def push(table: RouteTable) -> None:
        body = caddy_routes_bytes(table, try_duration_ms=try_duration_ms)
        async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
            try:
                answer = await client.patch(
                    path, content=body, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as exc:
                raise ProxyApplyFailed(f"Caddy admin {base} unreachable: {exc}") from None
        if answer.status_code >= 300:
            raise ProxyApplyFailed(
                f"Caddy admin {base} refused table {table.version} with "
                f"{answer.status_code}: {answer.text[:_BODY_QUOTED]}"
            )

    return push
