"""The ``corral`` command line: one entry point, one subcommand per verb.

Exit status: 0 done; 1 the operation failed or was refused (unreachable node,
drain of pinned work, no such app...); 2 the request itself is wrong (a bad
flag, a bad name, replicas 0, an app directory without a command); 141 the
reader of its output left (``corral ps | head -1``), quietly, as a program
SIGPIPE ends. Errors are one line on standard error saying what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from corral.node._errors import ApiRefused, ConfigError, NodeError, RequestInvalid

EXIT_FAILED = 1
EXIT_USAGE = 2
#: What the shell reports for a program SIGPIPE ended (128 + 13), as for ``seq``, ``git
#: log``...: ``corral ps | head -1`` stops quietly, and a ``set -o pipefail`` script
#: sees the same status it sees for any other tool whose reader left.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
#: The shortest redraw interval of ``corral inspect``.
MIN_INTERVAL = 0.1


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors in one line that point at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _client_options() -> _Parser:
    common = _Parser(add_help=False)
    group = common.add_argument_group("reaching a node")
    group.add_argument(
        "--api", metavar="URL", help="the node's API (default $CORRAL_API or http://127.0.0.1:7400)"
    )
    group.add_argument(
        "--token", help="API bearer token (default $CORRAL_TOKEN or <data-dir>/token)"
    )
    group.add_argument(
        "--data-dir",
        metavar="DIR",
        help="where to find the token file (default $CORRAL_DATA_DIR or ./.corral)",
    )
    group.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def _node_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", metavar="FILE", help="TOML config file (or $CORRAL_CONFIG)")
    run.add_argument("--data-dir", metavar="DIR", help="state directory (default ./.corral)")
    run.add_argument(
        "--registry",
        metavar="URL",
        help="sqlite:///<data-dir>/registry.db (default), etcd://h:p or etcds://h:p (TLS)",
    )
    _registry_tls_options(run)
    run.add_argument("--node-id", metavar="ID", help="node name (default: from the host name)")
    run.add_argument("--listen", metavar="HOST:PORT", help="peer address (default 127.0.0.1:7401)")
    run.add_argument("--api", metavar="HOST:PORT", help="API address (default 127.0.0.1:7400)")
    run.add_argument("--advertise", metavar="HOST", help="host other nodes and proxies dial")
    run.add_argument(
        "--label", metavar="K=V", action="append", default=[], help="node label (repeatable)"
    )
    run.add_argument("--rack", help="rack name, for spreading replicas")
    run.add_argument("--datacenter", help="datacenter name, for spreading replicas")
    run.add_argument("--token", help="API bearer token (default: <data-dir>/token, generated)")
    run.add_argument("--secret", help="cluster secret for peers (default: <data-dir>/secret)")
    run.add_argument("--port-range-start", metavar="PORT", help="app ports from (default 24000)")
    run.add_argument("--port-range-end", metavar="PORT", help="app ports to (default 24998)")
    run.add_argument("--port-quarantine-ms", metavar="MS", help="released port rest (600000)")
    run.add_argument("--lease-ttl-ms", metavar="MS", help="coordinator lease TTL (45000)")
    run.add_argument("--node-ttl-ms", metavar="MS", help="node record lease TTL (15000)")
    run.add_argument("--shutdown-grace-ms", metavar="MS", help="grace per actor on stop (10000)")
    run.add_argument("--max-artifact-mb", metavar="MB", help="max unpacked artifact (1024)")
    run.add_argument("--artifact-copies", metavar="N", help="copies of each live revision (3)")
    run.add_argument(
        "--artifact-interval-ms", metavar="MS", help="artifact copies are placed every (20000)"
    )
    run.add_argument(
        "--grace-period-ms", metavar="MS", help="a down node keeps its work this long (300000)"
    )
    run.add_argument(
        "--cooldown-ms", metavar="MS", help="no rebalancing of an instance placed since (600000)"
    )
    run.add_argument("--disruption-budget", metavar="N", help="most relocations per pass (5)")
    run.add_argument(
        "--min-usable-percent",
        metavar="PCT",
        help="refuse relocations below this share of usable nodes (50)",
    )
    run.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve GET /metrics without a token here (loopback only; the API serves "
        "it with the token anyway)",
    )
    run.add_argument(
        "--log-format",
        metavar="text|json",
        help="log lines for people (text, the default) or one JSON object per line (json)",
    )
    run.add_argument("--probe-interval-ms", metavar="MS", help="SWIM: time between probes (1000)")
    run.add_argument(
        "--probe-timeout-ms", metavar="MS", help="SWIM: ack wait before indirect probes (500)"
    )
    run.add_argument(
        "--indirect-checks", metavar="N", help="SWIM: members asked to probe for us (3)"
    )
    run.add_argument(
        "--suspicion-mult", metavar="N", help="SWIM: scales the suspicion timeout (4)"
    )
    run.add_argument(
        "--proxy",
        metavar="caddy=URL",
        action="append",
        default=[],
        help="Caddy admin endpoint the coordinator pushes each routing table to (repeatable)",
    )


def _registry_tls_options(run: argparse.ArgumentParser) -> None:
    """The registry TLS and auth flags ``corral node run`` and ``corral proxy run`` share."""
    run.add_argument("--registry-ca", metavar="FILE", help="CA (PEM) etcds:// trusts")
    run.add_argument("--registry-cert", metavar="FILE", help="client certificate for etcd (PEM)")
    run.add_argument("--registry-key", metavar="FILE", help="key of --registry-cert (PEM)")
    run.add_argument("--registry-user", metavar="USER", help="etcd user to authenticate as")
    run.add_argument(
        "--registry-password",
        metavar="PASSWORD",
        help="its password (prefer $CORRAL_REGISTRY_PASSWORD or --registry-password-file)",
    )
    run.add_argument(
        "--registry-password-file", metavar="FILE", help="file holding the etcd password"
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= MIN_INTERVAL:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is too short; give at least {MIN_INTERVAL}")
    return value


def _verb(
    verbs: Any, name: str, text: str, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` opens with the same sentence the list shows."""
    parser: argparse.ArgumentParser = verbs.add_parser(
        name, help=text, description=text[0].upper() + text[1:] + ".", parents=list(parents)
    )
    return parser


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="corral",
        description="Place applications on a fleet of machines and run them.",
        epilog="Run `corral COMMAND --help` for a command's options. Exit status: 0 done, "
        "1 failed or refused, 2 the request itself is wrong, 141 the reader of the output "
        "left (| head).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _client_options()

    node = _verb(commands, "node", "run a node, list nodes, or cordon / uncordon / drain one")
    node_verbs = node.add_subparsers(dest="verb", metavar="VERB", required=True)
    _node_run_options(_verb(node_verbs, "run", "run this machine's corral node"))
    _verb(
        node_verbs,
        "ls",
        "list the nodes: state (with cordon or drain), apps served, labels, coordinator",
        [common],
    )
    for verb, text in (
        ("cordon", "the node keeps its work but takes no new work"),
        ("uncordon", "the node takes work again (also ends a drain)"),
        ("drain", "move the node's work elsewhere (refused for pinned work unless --force)"),
    ):
        sub = _verb(node_verbs, verb, text, [common])
        sub.add_argument("node_id", metavar="NODE", help="the node's id (see corral node ls)")
        if verb == "drain":
            sub.add_argument(
                "--force",
                action="store_true",
                help="drain even though pinned apps run there: they are stopped, not moved",
            )

    proxy = _verb(commands, "proxy", "run a real proxy (HAProxy or Caddy) serving the routes")
    proxy_verbs = proxy.add_subparsers(dest="verb", metavar="VERB", required=True)
    proxy_run = _verb(
        proxy_verbs, "run", "start HAProxy or Caddy and feed it every routing table"
    )
    from corral.node.cli._proxy_command import add_proxy_run_options

    add_proxy_run_options(proxy_run)
    proxy_run.add_argument(
        "--registry", metavar="URL", help="the cluster's registry: sqlite:///PATH or etcd://h:p"
    )
    _registry_tls_options(proxy_run)
    _verb(
        commands,
        "routes",
        "print the routing table: domains, backends, held-back instances, proxies",
        [common],
    )

    deploy = _verb(
        commands, "deploy", "deploy an app directory (corral.toml or Procfile)", [common]
    )
    deploy.add_argument("directory", metavar="DIR", help="the app directory")
    deploy.add_argument(
        "--name", required=True, help="app name: 1-63 of a-z, 0-9 and '-' (a DNS label)"
    )
    deploy.add_argument(
        "--replicas",
        metavar="N|all",
        help="all (every eligible node) or a whole number >= 1; a new app defaults to all, "
        "a redeploy keeps the current count",
    )
    deploy.add_argument(
        "--node-selector",
        metavar="K=V",
        action="append",
        help="run only on nodes labelled K=V (repeatable; all must match); added to the "
        "app's selector: a deploy narrows where an app runs and never lifts a constraint, "
        "and refuses to change a key's value (use corral app selector --set, --unset or "
        "--clear for that)",
    )
    deploy.add_argument(
        "--memory-mb", metavar="MB", type=int, help="memory to reserve per instance"
    )
    deploy.add_argument("--disk-mb", metavar="MB", type=int, help="disk to reserve per instance")
    deploy.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        help="never move an instance (a drain then refuses unless --force)",
    )
    deploy.add_argument(
        "--env",
        metavar="NAME[=VALUE]",
        action="append",
        help="environment variable for the app; NAME alone copies it from this shell",
    )
    deploy.add_argument(
        "--domain",
        metavar="D",
        action="append",
        help="a host name the app serves (repeatable; replaces its domains; a redeploy "
        "without --domain keeps them)",
    )
    deploy.add_argument(
        "--max-parallel",
        metavar="N",
        type=int,
        help="roll a new revision across at most N instances at a time (default 1; kept "
        "with the app)",
    )
    deploy.add_argument(
        "--drain-ms",
        metavar="MS",
        type=int,
        help="how long an instance out of routing finishes its requests before it stops "
        "(default 2000; kept with the app)",
    )
    deploy.add_argument(
        "--ready-timeout-ms",
        metavar="MS",
        type=int,
        help="how long a restarted instance may take to be ready before the rollout halts "
        "(default 60000; kept with the app)",
    )

    rollback = _verb(
        commands,
        "rollback",
        "redeploy an app's previous revision; it rolls node by node like a deploy",
        [common],
    )
    rollback.add_argument("name", metavar="APP", help="the app to roll back")

    app = _verb(commands, "app", "change an app: selector, replicas, domains, retire, delete")
    app_verbs = app.add_subparsers(dest="verb", metavar="VERB", required=True)
    selector = _verb(
        app_verbs, "selector", "set, unset keys of, or clear the app's node selector", [common]
    )
    selector.add_argument("--name", required=True, help="the app")
    choice = selector.add_mutually_exclusive_group(required=True)
    choice.add_argument(
        "--set",
        metavar="K=V",
        action="append",
        help="run only on nodes labelled K=V (repeatable; replaces the whole selector)",
    )
    choice.add_argument(
        "--unset",
        metavar="K",
        action="append",
        help="remove key K from the selector, keeping the others (repeatable)",
    )
    choice.add_argument("--clear", action="store_true", help="lift the selector: any node")
    replicas = _verb(app_verbs, "replicas", "set how many nodes run the app", [common])
    replicas.add_argument("--name", required=True, help="the app")
    replicas.add_argument(
        "--count", metavar="N|all", required=True, help="all, or a whole number >= 1"
    )
    domains = _verb(app_verbs, "domains", "add, remove or clear the app's domains", [common])
    domains.add_argument("--name", required=True, help="the app")
    domain_choice = domains.add_mutually_exclusive_group(required=True)
    domain_choice.add_argument(
        "--add", metavar="D", action="append", help="claim a domain for the app (repeatable)"
    )
    domain_choice.add_argument(
        "--remove", metavar="D", action="append", help="release one of its domains (repeatable)"
    )
    domain_choice.add_argument("--clear", action="store_true", help="release all its domains")
    for verb, text in (
        ("retire", "stop every instance of the app and keep its record (deploy revives it)"),
        ("delete", "remove the app; nodes stop it and clear its ports and files"),
    ):
        sub = _verb(app_verbs, verb, text, [common])
        sub.add_argument("--name", required=True, help="the app")

    alias = _verb(commands, "alias", "point domains at apps: set, flip, rollback, ls, rm")
    alias_verbs = alias.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (
        ("set", "create an alias DOMAIN -> APP (refused if the alias exists)"),
        ("flip", "repoint an alias at APP; the app it pointed at becomes its previous"),
        ("rollback", "flip an alias back to its previous app"),
        ("rm", "remove an alias"),
    ):
        sub = _verb(alias_verbs, verb, text, [common])
        sub.add_argument("domain", metavar="DOMAIN", help="the alias's host name")
        if verb in ("set", "flip"):
            sub.add_argument("app", metavar="APP", help="the app it points at")
        if verb in ("flip", "rollback"):
            sub.add_argument(
                "--expect",
                metavar="REV",
                type=int,
                help="refuse unless the alias is still at this revision (corral alias ls)",
            )
    _verb(alias_verbs, "ls", "list the aliases: domain, app, previous app, revision", [common])

    _verb(commands, "ps", "app instances across the cluster, and whether each can move", [common])
    _verb(
        commands,
        "state",
        "what this node knows and does: lease, processes, placements, unplaced apps",
        [common],
    )
    events = _verb(commands, "events", "what this node's actors did recently", [common])
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    inspect = _verb(
        commands,
        "inspect",
        "the interactive inspector: nodes, apps, routes, actors and events, live "
        "(press ? in it for the keys)",
        [common],
    )
    inspect.add_argument(
        "--interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=1.0,
        help="read the node every SECONDS (default 1)",
    )
    inspect.add_argument(
        "--once",
        action="store_true",
        help="print the actor tree once as plain text and exit, for scripts (also when "
        "standard output is not a terminal; --json implies it)",
    )

    demo = _verb(commands, "demo", "a three-node cluster on this machine, narrated")
    demo.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster running after the story, with how to reach it (corral "
        "inspect...), until Ctrl-C; its data directories and logs are kept",
    )

    plan = commands.add_parser(
        "plan",
        help="dry-run the placement planner on a JSON document",
        description="Read a planner input document (a file, or - for stdin) and print "
        "the decisions the planner would make, as JSON. Nothing is written anywhere.",
        epilog='The smallest document: {"now": 0, "nodes": [{"id": "a"}], "apps": '
        '[{"name": "web", "replicas": 1}]}. Nodes take state, labels, rack, datacenter, '
        'down_since, capacity and "drain": "forced" (a drain forced with --force: the node '
        "is emptied, its pinned instances stopped rather than the drain refused); apps take "
        "replicas, selector, memory_mb, disk_mb, pinned, retired, blocked; placements map an "
        'app to its nodes, placed_at and "stopped" (nodes where a forced drain stopped an '
        "instance of that pinned app); policy holds grace_period_s, cooldown_s, "
        "disruption_budget and min_usable_fraction. The answer holds placements, additions, "
        "removals, deferred (each with until: when a cooldown ends, null for the disruption "
        'budget), unplaced, stranded, refused, paused and "stopped" (per pinned app, the '
        "nodes where a forced drain stopped it: the next document's placements[app].stopped).",
    )
    plan.add_argument("file", help="path of the JSON document, or - for standard input")
    return parser


def _subparser(parser: argparse.ArgumentParser, names: Sequence[str]) -> argparse.ArgumentParser:
    """The (sub-)parser that ``names`` (command, verb) lead to."""
    current = parser
    for name in names:
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or name not in actions[0].choices:
            break
        current = actions[0].choices[name]
    return current


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is reported by the sub-command it was given to."""
    parser = _build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        names = [n for n in (args.command, getattr(args, "verb", None)) if n]
        _subparser(parser, names).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _error(stream: TextIO, message: str) -> None:
    from corral.node.cli._format import printable

    print(f"corral: error: {printable(message)}", file=stream)


def _print_json(stdout: TextIO, value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), file=stdout)


def _client(args: argparse.Namespace) -> Any:
    from corral.node.cli._client import (
        NodeClient,
        client_transport,
        environment,
        resolve_api_url,
        resolve_token_and_source,
    )

    env = environment()
    url = resolve_api_url(args.api, env)
    token, source = resolve_token_and_source(args.token, env, args.data_dir, Path.cwd())
    return NodeClient(url, token, token_source=source, transport=client_transport())


def _env_pairs(items: Sequence[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise RequestInvalid(
                    "env", f"{name} is not set in this shell; write --env {name}=VALUE"
                )
            value = os.environ[name]
        pairs[name] = value
    return pairs


def _deploy(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import (
        check_name,
        parse_domains,
        parse_env,
        parse_megabytes,
        parse_pairs,
        parse_replicas,
        parse_rollout_option,
    )
    from corral.node.artifacts import pack_directory
    from corral.node.cli._format import printable_tree

    name = check_name("app", args.name)
    replicas = None if args.replicas is None else parse_replicas(args.replicas)
    for field, value in (("memory_mb", args.memory_mb), ("disk_mb", args.disk_mb)):
        if value is not None:
            parse_megabytes(value, field)
    for field in ("max_parallel", "drain_ms", "ready_timeout_ms"):
        if getattr(args, field) is not None:
            parse_rollout_option(getattr(args, field), field)
    selector = (
        None if args.node_selector is None else parse_pairs(args.node_selector, "node-selector")
    )
    env = _env_pairs(args.env)
    if env is not None:
        parse_env(env)
    domains = None if args.domain is None else parse_domains(args.domain, "domain")
    packed = pack_directory(Path(args.directory))
    with _client(args) as client:
        answer = client.deploy(
            name,
            packed,
            replicas=replicas,
            selector=selector,
            memory_mb=args.memory_mb,
            disk_mb=args.disk_mb,
            pinned=args.pin,
            env=env,
            domains=domains,
            max_parallel=args.max_parallel,
            drain_ms=args.drain_ms,
            ready_timeout_ms=args.ready_timeout_ms,
        )
    if args.json:
        _print_json(stdout, answer)
        return 0
    answer = printable_tree(answer)
    app = answer["app"]
    where = "the registry" if answer["stored_in_registry"] else f"node {answer['received_by']}"
    selector_text = ", ".join(f"{k}={v}" for k, v in sorted(app["selector"].items())) or "none"
    print(
        f"{'created' if answer['created'] else 'updated'} {app['name']}: revision "
        f"{app['deployment']['revision'][:12]} ({answer['artifact_size']} bytes, kept in {where}); "
        f"replicas {app['replicas']}, selector {selector_text}"
        + (", pinned" if app["pinned"] else "")
        + (f"; domains {', '.join(app['domains'])}" if app.get("domains") else ""),
        file=stdout,
    )
    return 0


def _rollback(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import check_name
    from corral.node.cli._format import printable_tree

    name = check_name("app", args.name)
    with _client(args) as client:
        answer = client.rollback(name)
    if args.json:
        _print_json(stdout, answer)
        return 0
    app = printable_tree(answer["app"])
    revision = app["deployment"]["revision"][:12]
    replaced = (app.get("previous_deployment") or {}).get("revision", "")[:12]
    print(
        f"{name}: rolling back to revision {revision} (from {replaced}); "
        "`corral ps` shows the progress",
        file=stdout,
    )
    return 0


def _app(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import (
        check_name,
        parse_domains,
        parse_pairs,
        parse_replicas,
        parse_selector_keys,
    )
    from corral.node.cli._format import printable_tree

    name = check_name("app", args.name)
    add = parse_domains(args.add, "add") if getattr(args, "add", None) else ()
    remove = parse_domains(args.remove, "remove") if getattr(args, "remove", None) else ()
    with _client(args) as client:
        if args.verb == "selector":
            unset = parse_selector_keys(args.unset, "unset") if args.unset else ()
            pairs = None if args.clear or unset else parse_pairs(args.set, "set")
            answer = client.set_selector(name, pairs, unset=unset)
            selector = printable_tree(answer["app"]["selector"])
            text = f"{name}: selector " + (
                ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
                or "cleared: every node may serve it"
            )
        elif args.verb == "replicas":
            answer = client.set_replicas(name, parse_replicas(args.count, "count"))
            text = f"{name}: replicas {answer['app']['replicas']}"
        elif args.verb == "domains":
            answer = client.set_domains(name, add=add, remove=remove, clear=args.clear)
            owned = printable_tree(answer["app"]["domains"])
            text = f"{name}: domains " + (", ".join(owned) or "none")
        elif args.verb == "retire":
            answer = client.retire(name)
            text = f"{name}: retired; its instances stop, `corral deploy` brings it back"
        else:
            answer = client.delete(name)
            text = f"{name}: deleted; nodes stop it and clear its state"
    if args.json:
        _print_json(stdout, answer)
    else:
        print(text, file=stdout)
    return 0


def _alias(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import check_domain, check_name
    from corral.node.cli._format import alias_message, aliases_table

    if args.verb == "ls":
        with _client(args) as client:
            answer = client.aliases()
        print(json.dumps(answer, indent=2) if args.json else aliases_table(answer), file=stdout)
        return 0
    domain = check_domain(args.domain)
    app = check_name("app", args.app, field="app") if args.verb in ("set", "flip") else None
    with _client(args) as client:
        if args.verb == "set":
            assert app is not None
            answer = client.set_alias(domain, app)
        elif args.verb == "flip":
            assert app is not None
            answer = client.flip_alias(domain, app, expect=args.expect)
        elif args.verb == "rollback":
            answer = client.rollback_alias(domain, expect=args.expect)
        else:
            answer = client.remove_alias(domain)
    if args.json:
        _print_json(stdout, answer)
    else:
        print(alias_message(args.verb, answer), file=stdout)
    return 0


def _node_list(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node.cli._format import nodes_table

    with _client(args) as client:
        answer = client.nodes()
    print(json.dumps(answer, indent=2) if args.json else nodes_table(answer), file=stdout)
    return 0


def _node_verb(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import check_name
    from corral.node.cli._format import printable_tree

    if args.verb == "ls":
        return _node_list(args, stdout)
    node = check_name("node", args.node_id, field="node")
    with _client(args) as client:
        answer = client.node_operation(node, args.verb, force=getattr(args, "force", False))
    if args.json:
        _print_json(stdout, answer)
        return 0
    if args.verb == "drain":
        interrupted = printable_tree(answer.get("interrupted") or [])
        text = drain_message(node, interrupted, forced=args.force)
    elif args.verb == "cordon":
        text = f"{node}: cordoned; it keeps its work and takes none"
    else:
        text = f"{node}: takes work again"
    print(text, file=stdout)
    return 0


def drain_message(node: str, pinned: Sequence[str], *, forced: bool) -> str:
    """What ``corral node drain`` prints: where the work goes, and (forced) which pinned
    apps stop on the node and stay stopped."""
    if not forced:
        return f"{node}: draining; its work moves to other nodes"
    if not pinned:
        return f"{node}: draining (forced); its work moves to other nodes (no pinned app there)"
    return (
        f"{node}: draining (forced); its unpinned work moves to other nodes; pinned app(s) "
        f"{', '.join(pinned)} are stopped there and not started elsewhere "
        f"(`corral node uncordon {node}` starts them there again)"
    )


def _read_command(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node.cli._format import event_line, ps_table, routes_text, state_summary

    with _client(args) as client:
        if args.command == "ps":
            answer = client.ps_answer()
            if args.json:
                print(json.dumps(answer["rows"], indent=2), file=stdout)
            else:
                print(ps_table(answer["rows"], answer.get("coordinator")), file=stdout)
        elif args.command == "routes":
            answer = client.routes()
            if args.json:
                _print_json(stdout, answer)
            else:
                print(routes_text(answer), file=stdout)
        elif args.command == "state":
            state = client.state()
            print(
                json.dumps(state, indent=2, sort_keys=True) if args.json else state_summary(state),
                file=stdout,
            )
        elif args.follow:
            try:
                for event in client.follow_events():
                    print(json.dumps(event) if args.json else event_line(event), file=stdout)
                    stdout.flush()
            except KeyboardInterrupt:
                return 0
        else:
            for event in client.events():
                print(json.dumps(event) if args.json else event_line(event), file=stdout)
    return 0


def _inspect(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.inspector import run_inspector
    from corral.node.cli._format import printable_tree

    if args.json or args.once or not stdout.isatty():
        with _client(args) as client:
            if args.json:
                _print_json(stdout, client.actors())
                return 0
            return run_inspector(
                lambda: printable_tree(client.actors()), stdout, interval=args.interval, once=True
            )
    from corral.inspector import NodeSource, run_app
    from corral.node.cli._client import environment, resolve_api_url, resolve_token_and_source

    env = environment()
    url = resolve_api_url(args.api, env)
    token, _ = resolve_token_and_source(args.token, env, args.data_dir, Path.cwd())
    return run_app(NodeSource(url, token), interval=args.interval)


def _dispatch(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
        "deploy": _deploy,
        "rollback": _rollback,
        "app": _app,
        "alias": _alias,
        "ps": _read_command,
        "routes": _read_command,
        "state": _read_command,
        "events": _read_command,
        "inspect": _inspect,
    }
    if args.command == "node":
        if args.verb == "run":
            from corral.node.server import node_run_command

            return node_run_command(args, stderr)
        return _node_verb(args, stdout)
    if args.command == "proxy":
        from corral.node.cli._proxy_command import proxy_run_command

        return proxy_run_command(args, stderr)
    if args.command == "demo":
        from corral.node.cli._demo import demo_command

        return demo_command(stdout, keep=args.keep)
    return handlers[args.command](args, stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``corral`` command; return its exit status."""
    args = _parse(argv)
    if args.command == "plan":
        from corral.node.cli._plan_command import plan_command

        return plan_command(args.file, sys.stdin, sys.stdout, sys.stderr)
    try:
        return _dispatch(args, sys.stdout, sys.stderr)
    except RequestInvalid as exc:
        # The field as the command line spells its flag (memory_mb -> memory-mb), not
        # what follows it (env.MY_VAR names a variable).
        flag, dot, rest = exc.field.partition(".")
        _error(sys.stderr, f"{flag.replace('_', '-')}{dot}{rest}: {exc.message}")
        return EXIT_USAGE
    except ConfigError as exc:
        _error(sys.stderr, str(exc))
        return EXIT_USAGE
    except ApiRefused as exc:
        _error(sys.stderr, str(exc))
        return EXIT_USAGE if exc.status == 400 else EXIT_FAILED
    except NodeError as exc:
        _error(sys.stderr, str(exc))
        return EXIT_FAILED


def _discard_stdout() -> None:
    """Point the standard output descriptor at /dev/null, so the interpreter's last
    flush on exit finds no closed pipe and prints no second traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def console_main() -> None:
    """The ``corral`` program: :func:`main`, ending quietly with
    :data:`EXIT_BROKEN_PIPE` when the reader of its output left (``| head``)."""
    try:
        status = main()
        sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
    except BrokenPipeError:
        _discard_stdout()
        status = EXIT_BROKEN_PIPE
    sys.exit(status)
