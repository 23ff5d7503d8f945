"""The ``corral`` command line: one entry point, one subcommand per verb."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Place applications on a fleet of machines and run them.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    plan = commands.add_parser(
        "plan",
        help="dry-run the placement planner on a JSON document",
        description="Read a planner input document (a file, or - for stdin) and print "
        "the decisions the planner would make, as JSON. Nothing is written anywhere.",
    )
    plan.add_argument("file", help="path of the JSON document, or - for standard input")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``corral`` command; return its exit status."""
    args = _build_parser().parse_args(argv)
    if args.command == "plan":
        from corral.node._plan_command import plan_command

        return plan_command(args.file, sys.stdin, sys.stdout, sys.stderr)
    raise AssertionError(f"unhandled command {args.command!r}")


def console_main() -> None:
    sys.exit(main())
