"""corral.proxy: real proxies (HAProxy 2.6, Caddy 2.6) that serve the routing table.

:func:`open_proxy` starts the proxy binary with its files under a data directory
and yields a :class:`ProxyEngine`; :meth:`ProxyEngine.offer` applies a table only
when it is newer, by (fence, revision), than the one applied, and
:attr:`ProxyEngine.status` is the ``proxies/<id>`` record. :func:`follow_routing`
feeds an engine from the registry's ``routing`` key. The process is stopped by
pid when the ``open_proxy`` block ends. :func:`run_proxy` is ``corral proxy run``
whole: registry, proxy and watch, until cancelled. :class:`ProxyTimeouts` is how
long both proxies let a backend take (``--response-timeout-ms``).
"""

from corral.proxy._caddy import DEFAULT_CADDY
from corral.proxy._engine import ProxyEngine, follow_routing, open_proxy, run_proxy
from corral.proxy._errors import (
    InvalidProxySetup,
    ProxyApplyFailed,
    ProxyError,
    ProxyInUse,
    ProxyNotInstalled,
    ProxyStartFailed,
)
from corral.proxy._haproxy import DEFAULT_HAPROXY
from corral.proxy._haproxy_plan import HaproxyState, desired_state, plan_update
from corral.proxy._push import caddy_pusher
from corral.proxy._tuning import ProxyTimeouts

__all__ = [
    "DEFAULT_CADDY",
    "DEFAULT_HAPROXY",
    "HaproxyState",
    "InvalidProxySetup",
    "ProxyApplyFailed",
    "ProxyEngine",
    "ProxyError",
    "ProxyInUse",
    "ProxyNotInstalled",
    "ProxyStartFailed",
    "ProxyTimeouts",
    "caddy_pusher",
    "desired_state",
    "follow_routing",
    "open_proxy",
    "plan_update",
    "run_proxy",
]
