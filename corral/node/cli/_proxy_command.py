"""``corral proxy run``: a real HAProxy or Caddy that serves the routing table.

Like an ingress controller: it starts and supervises the proxy binary with its
files under ``--data-dir``, watches the registry's ``routing`` key, applies
every newer table (never an older one), and records in ``proxies/<id>`` what it
applied, when, and any error. SIGTERM or SIGINT stops the proxy process (by
pid) and the command.

A proxy process that dies is started again with the table it served (backing
off while it keeps dying); the record says each restart. One ``corral proxy
run`` per data dir and per id: a second is refused, naming the first's pid.

``--response-timeout-ms`` (or ``CORRAL_RESPONSE_TIMEOUT_MS``) is how long a backend
may take to start its response, and on HAProxy stay silent midway, before a
safe request goes to another backend and any other gets 504 (default 3000).

Exit status: 0 stopped by a signal; 1 the proxy or the registry failed (a
missing binary too), or the data dir or id is in use by another live ``corral
proxy run``; 2 a bad flag (an unknown kind, a bad address or id).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import trio

from corral.node._config import env_name, resolve_node_config
from corral.node._errors import ConfigError
from corral.proxy._tuning import (
    MAX_RESPONSE_TIMEOUT_MS,
    MIN_RESPONSE_TIMEOUT_MS,
    RESPONSE_TIMEOUT_MS,
    ProxyTimeouts,
)

__all__ = ["add_proxy_run_options", "proxy_run_command", "proxy_timeouts"]

log = logging.getLogger("corral.proxy")

#: The registry settings ``corral proxy run`` shares with ``corral node run``.
REGISTRY_SETTINGS = (
    "registry",
    "registry-ca",
    "registry-cert",
    "registry-key",
    "registry-user",
    "registry-password",
    "registry-password-file",
)


def add_proxy_run_options(run: argparse.ArgumentParser) -> None:
    """The flags of ``corral proxy run`` besides the registry ones."""
    run.add_argument("--kind", required=True, choices=("haproxy", "caddy"), help="which proxy")
    run.add_argument(
        "--listen", required=True, metavar="HOST:PORT", help="where the proxy serves HTTP"
    )
    run.add_argument(
        "--data-dir", required=True, metavar="DIR", help="the proxy's config, socket and logs"
    )
    run.add_argument("--id", metavar="NAME", help="its name in proxies/<id> (default: the kind)")
    run.add_argument("--binary", metavar="PATH", help="the proxy executable (default: Debian's)")
    run.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="Caddy only: its admin API address (default: a free loopback port); "
        "nodes started with --proxy caddy=http://HOST:PORT push tables there too",
    )
    run.add_argument(
        "--response-timeout-ms",
        metavar="MS",
        help=f"how long a backend may take to start its response (on HAProxy also to "
        f"stay silent midway) before a GET/HEAD/OPTIONS is retried elsewhere and any "
        f"other request gets 504; raise it for long polling or server-sent events "
        f"(default {RESPONSE_TIMEOUT_MS}; env {env_name('response-timeout-ms')})",
    )


def proxy_timeouts(flag: str | None, env: Mapping[str, str]) -> ProxyTimeouts:
    """The proxy's timeouts from ``--response-timeout-ms`` or else its environment
    variable (pure).

    Raises:
        ConfigError: the value is not a whole number of milliseconds in range; the
            message names the flag or variable it came from.
    """
    name = env_name("response-timeout-ms")
    if flag is not None:
        raw, where = flag, "--response-timeout-ms"
    elif env.get(name):
        raw, where = env[name], name
    else:
        return ProxyTimeouts()
    text = raw.strip()
    if not text.isdigit() or not MIN_RESPONSE_TIMEOUT_MS <= int(text) <= MAX_RESPONSE_TIMEOUT_MS:
        raise ConfigError(
            f"{where}: {raw!r} is not a whole number of milliseconds from "
            f"{MIN_RESPONSE_TIMEOUT_MS} to {MAX_RESPONSE_TIMEOUT_MS}"
        )
    return ProxyTimeouts(response_ms=int(text))


def proxy_run_command(args: argparse.Namespace, stderr: TextIO) -> int:
    """Run ``corral proxy run`` until a signal; returns the exit status."""
    from corral.node._logging import configure_logging
    from corral.proxy import InvalidProxySetup, ProxyError, run_proxy
    from corral.registry import RegistryError

    flags = {name: getattr(args, name.replace("-", "_"), None) for name in REGISTRY_SETTINGS}
    if not flags["registry"] and not os.environ.get("CORRAL_REGISTRY"):
        raise ConfigError(
            "--registry: corral proxy run needs the cluster's registry, e.g. "
            "--registry sqlite:///var/lib/corral/registry.db or etcd://10.0.0.1:2379"
        )
    config = resolve_node_config(flags, os.environ, cwd=Path.cwd())
    timeouts = proxy_timeouts(getattr(args, "response_timeout_ms", None), os.environ)
    data_dir = (Path.cwd() / Path(args.data_dir).expanduser()).resolve()
    configure_logging(stderr)

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        log.info("proxy stopping (%s)", signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                engine = await nursery.start(
                    lambda task_status=trio.TASK_STATUS_IGNORED: run_proxy(
                        args.kind,
                        listen=args.listen,
                        registry_url=config.registry_url,
                        registry_options=config.registry_options,
                        data_dir=data_dir,
                        proxy_id=args.id,
                        binary=args.binary,
                        admin=args.admin,
                        timeouts=timeouts,
                        task_status=task_status,
                    )
                )
                log.info(
                    "proxy %s (%s) serving on %s from registry %s (response timeout %d ms)",
                    engine.status.id,
                    args.kind,
                    args.listen,
                    config.registry_url,
                    timeouts.response_ms,
                )

    try:
        try:
            trio.run(serve)
        except BaseExceptionGroup as group:
            from corral.node.server import single_error

            raise single_error(group) from None
    except InvalidProxySetup as exc:
        print(f"corral: error: {exc}", file=stderr)
        return 2
    except ProxyError as exc:
        print(f"corral: error: {exc}", file=stderr)
        return 1
    except RegistryError as exc:
        print(f"corral: error: the registry cannot be used: {exc}", file=stderr)
        return 1
    return 0
