"""The command line: argument parsing, the API client, output formatting, the
demo, the local cluster, and the ``plan`` and ``proxy run`` commands.

The top of the node package: it imports :mod:`corral.node.artifacts` and, only
inside ``corral node run``, :mod:`corral.node.server`; nothing imports it but
``corral.node`` (for ``main``). Commands import their modules where they run,
so ``corral --help`` stays quick.
"""

from corral.node.cli._cli import console_main

__all__ = ["console_main"]
