"""The deploy command an example app's corral.toml tells a newcomer to run is one the CLI
accepts, and it deploys that very directory."""

from __future__ import annotations

import shlex
from pathlib import Path

from corral.node.cli._cli import _parse

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "# Deploy with: "


def test_the_hello_example_names_a_deploy_command_that_parses() -> None:
    toml = ROOT / "examples" / "apps" / "hello" / "corral.toml"
    (line,) = [line for line in toml.read_text().splitlines() if line.startswith(PREFIX)]
    argv = shlex.split(line.removeprefix(PREFIX))
    assert argv[0] == "corral"
    args = _parse(argv[1:])
    assert args.command == "deploy"
    assert args.name == "hello"
    assert (ROOT / args.directory).resolve() == toml.parent
