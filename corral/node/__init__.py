"""The node service: assembly, configuration, HTTP API and the command line."""

from corral.node._cli import console_main as main

__all__ = ["main"]
