"""corral.inspector: a live terminal view of a node's actor tree."""

from corral.inspector._live import run_inspector
from corral.inspector._render import render_tree

__all__ = ["render_tree", "run_inspector"]
