"""``corral proxy run``: a real HAProxy or Caddy that serves the routing table.

Like an ingress controller: it starts and supervises the proxy binary with its
files under ``--data-dir``, watches the registry's ``routing`` key, applies
every newer table (never an older one), and records in ``proxies/<id>`` what it
applied, when, and any error. SIGTERM or SIGINT stops the proxy process (by
pid) and the command.

A proxy process that dies is started again with the table it served (backing
off while it keeps dying); the record says each restart. One ``corral proxy
run`` per data dir and per id: a second is refused, naming the first's pid.

Exit status: 0 stopped by a signal; 1 the proxy or the registry failed (a
missing binary too), or the data dir or id is in use by another live ``corral
proxy run``; 2 a bad flag (an unknown kind, a bad address or id).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path
from typing import TextIO

import trio

from corral.node._config import resolve_node_config
from corral.node._errors import ConfigError

__all__ = ["add_proxy_run_options", "proxy_run_command"]

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
                        task_status=task_status,
                    )
                )
                log.info(
                    "proxy %s (%s) serving on %s from registry %s",
                    engine.status.id,
                    args.kind,
                    args.listen,
                    config.registry_url,
                )

    try:
        try:
            trio.run(serve)
        except BaseExceptionGroup as group:
            from corral.node._node import single_error

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
