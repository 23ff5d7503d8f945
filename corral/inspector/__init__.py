"""corral.inspector: the interactive actor inspector (``corral inspect``), a Textual app
over a node's HTTP API, and the plain-text tree ``--once`` prints."""

from corral.inspector._app import Inspector, run_app
from corral.inspector._live import run_inspector
from corral.inspector._source import NodeSource, SourceError

__all__ = [
    "Inspector",
    "NodeSource",
    "SourceError",
    "run_app",
    "run_inspector",
]
