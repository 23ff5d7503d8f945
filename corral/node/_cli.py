"""The ``corral`` command line: one entry point, one subcommand per verb.

Exit status: 0 done; 1 the operation failed or was refused (unreachable node,
drain of pinned work, no such app...); 2 the request itself is wrong (a bad
flag, a bad name, replicas 0, an app directory without a command). Errors are
one line on standard error saying what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from corral.node._errors import ApiRefused, ConfigError, NodeError, RequestInvalid

EXIT_FAILED = 1
EXIT_USAGE = 2


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
        "--registry", metavar="URL", help="sqlite:///<data-dir>/registry.db (default) or etcd://h:p"
    )
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


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="corral",
        description="Place applications on a fleet of machines and run them.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _client_options()

    node = commands.add_parser("node", help="run a node, or cordon / uncordon / drain one")
    node_verbs = node.add_subparsers(dest="verb", metavar="VERB", required=True)
    _node_run_options(node_verbs.add_parser("run", help="run this machine's corral node"))
    for verb, text in (
        ("cordon", "the node keeps its work but takes no new work"),
        ("uncordon", "the node takes work again"),
        ("drain", "move the node's work elsewhere (refused for pinned work unless --force)"),
    ):
        sub = node_verbs.add_parser(verb, help=text, parents=[common])
        sub.add_argument("node_id", metavar="NODE", help="the node's id")
        if verb == "drain":
            sub.add_argument("--force", action="store_true", help="stop pinned work too")

    deploy = commands.add_parser(
        "deploy", parents=[common], help="deploy an app directory (corral.toml or Procfile)"
    )
    deploy.add_argument("directory", metavar="DIR", help="the app directory")
    deploy.add_argument("--name", required=True, help="app name (DNS label)")
    deploy.add_argument("--replicas", help="all, or a whole number >= 1")
    deploy.add_argument(
        "--node-selector", metavar="K=V", action="append", help="run only on nodes with label"
    )
    deploy.add_argument("--memory-mb", type=int, help="memory to reserve per instance")
    deploy.add_argument("--disk-mb", type=int, help="disk to reserve per instance")
    deploy.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, help="never move an instance"
    )
    deploy.add_argument(
        "--env",
        metavar="NAME[=VALUE]",
        action="append",
        help="environment variable for the app; NAME alone copies it from this shell",
    )

    app = commands.add_parser("app", help="change an app: selector, replicas, retire, delete")
    app_verbs = app.add_subparsers(dest="verb", metavar="VERB", required=True)
    selector = app_verbs.add_parser("selector", parents=[common], help="set or clear the selector")
    selector.add_argument("--name", required=True)
    choice = selector.add_mutually_exclusive_group(required=True)
    choice.add_argument("--set", metavar="K=V", action="append", help="required node label")
    choice.add_argument("--clear", action="store_true", help="lift the selector")
    replicas = app_verbs.add_parser("replicas", parents=[common], help="set the replica count")
    replicas.add_argument("--name", required=True)
    replicas.add_argument("--count", required=True, help="all, or a whole number >= 1")
    for verb, text in (("retire", "stop every instance, keep the app"), ("delete", "remove it")):
        sub = app_verbs.add_parser(verb, parents=[common], help=text)
        sub.add_argument("--name", required=True)

    commands.add_parser("ps", parents=[common], help="app instances across the cluster")
    commands.add_parser("state", parents=[common], help="what this node knows and does")
    events = commands.add_parser("events", parents=[common], help="recent events")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    inspect = commands.add_parser("inspect", parents=[common], help="live view of the actor tree")
    inspect.add_argument("--interval", type=float, default=1.0, help="refresh every N seconds")
    inspect.add_argument("--once", action="store_true", help="print the tree once and exit")

    demo = commands.add_parser("demo", help="a three-node cluster on this machine, narrated")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory")

    plan = commands.add_parser(
        "plan",
        help="dry-run the placement planner on a JSON document",
        description="Read a planner input document (a file, or - for stdin) and print "
        "the decisions the planner would make, as JSON. Nothing is written anywhere.",
    )
    plan.add_argument("file", help="path of the JSON document, or - for standard input")
    return parser


def _error(stream: TextIO, message: str) -> None:
    print(f"corral: error: {message}", file=stream)


def _print_json(stdout: TextIO, value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True), file=stdout)


def _client(args: argparse.Namespace) -> Any:
    from corral.node._client import NodeClient, environment, resolve_api_url, resolve_token

    env = environment()
    url = resolve_api_url(args.api, env)
    token = resolve_token(args.token, env, args.data_dir, Path.cwd())
    return NodeClient(url, token)


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
    from corral.node._artifacts import pack_directory
    from corral.node._requests import check_name, parse_pairs, parse_replicas

    name = check_name("app", args.name)
    replicas = None if args.replicas is None else parse_replicas(args.replicas)
    selector = (
        None if args.node_selector is None else parse_pairs(args.node_selector, "node-selector")
    )
    env = _env_pairs(args.env)
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
        )
    if args.json:
        _print_json(stdout, answer)
        return 0
    app = answer["app"]
    where = "the registry" if answer["stored_in_registry"] else f"node {answer['received_by']}"
    selector_text = ", ".join(f"{k}={v}" for k, v in sorted(app["selector"].items())) or "none"
    print(
        f"{'created' if answer['created'] else 'updated'} {app['name']}: revision "
        f"{app['deployment']['revision'][:12]} ({answer['artifact_size']} bytes, kept in {where}); "
        f"replicas {app['replicas']}, selector {selector_text}"
        + (", pinned" if app["pinned"] else ""),
        file=stdout,
    )
    return 0


def _app(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import check_name, parse_pairs, parse_replicas

    name = check_name("app", args.name)
    with _client(args) as client:
        if args.verb == "selector":
            pairs = None if args.clear else parse_pairs(args.set, "set")
            answer = client.set_selector(name, pairs)
            text = f"{name}: selector " + (
                ", ".join(f"{k}={v}" for k, v in sorted(answer["app"]["selector"].items()))
                or "cleared: every node may serve it"
            )
        elif args.verb == "replicas":
            answer = client.set_replicas(name, parse_replicas(args.count, "count"))
            text = f"{name}: replicas {answer['app']['replicas']}"
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


def _node_verb(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._requests import check_name

    node = check_name("node", args.node_id, field="node")
    with _client(args) as client:
        answer = client.node_operation(node, args.verb, force=getattr(args, "force", False))
    if args.json:
        _print_json(stdout, answer)
        return 0
    text = {
        "cordon": f"{node}: cordoned; it keeps its work and takes none",
        "uncordon": f"{node}: takes work again",
        "drain": f"{node}: draining; its work moves to other nodes",
    }[args.verb]
    if answer.get("interrupted"):
        text += f" (pinned, stopped: {', '.join(answer['interrupted'])})"
    print(text, file=stdout)
    return 0


def _read_command(args: argparse.Namespace, stdout: TextIO) -> int:
    from corral.node._format import event_line, ps_table, state_summary

    with _client(args) as client:
        if args.command == "ps":
            rows = client.ps()
            print(json.dumps(rows, indent=2) if args.json else ps_table(rows), file=stdout)
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

    with _client(args) as client:
        return run_inspector(client.actors, stdout, interval=args.interval, once=args.once)


def _dispatch(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, TextIO], int]] = {
        "deploy": _deploy,
        "app": _app,
        "ps": _read_command,
        "state": _read_command,
        "events": _read_command,
        "inspect": _inspect,
    }
    if args.command == "node":
        if args.verb == "run":
            from corral.node._node import node_run_command

            return node_run_command(args, stderr)
        return _node_verb(args, stdout)
    if args.command == "demo":
        from corral.node._demo import demo_command

        return demo_command(stdout, keep=args.keep)
    return handlers[args.command](args, stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``corral`` command; return its exit status."""
    args = _build_parser().parse_args(argv)
    if args.command == "plan":
        from corral.node._plan_command import plan_command

        return plan_command(args.file, sys.stdin, sys.stdout, sys.stderr)
    try:
        return _dispatch(args, sys.stdout, sys.stderr)
    except (RequestInvalid, ConfigError) as exc:
        _error(sys.stderr, str(exc))
        return EXIT_USAGE
    except ApiRefused as exc:
        _error(sys.stderr, str(exc))
        return EXIT_USAGE if exc.status == 400 else EXIT_FAILED
    except NodeError as exc:
        _error(sys.stderr, str(exc))
        return EXIT_FAILED


def console_main() -> None:
    sys.exit(main())
