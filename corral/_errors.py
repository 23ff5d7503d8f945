"""The root of every error corral raises.

Each package keeps its own error module with its tree drawn in the docstring;
every tree is rooted here, so ``except CorralError`` catches anything of ours.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base class of every corral error."""
