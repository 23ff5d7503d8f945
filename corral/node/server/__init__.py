"""The node server: assembly, HTTP API, views, metrics and events.

:mod:`._node` assembles a node (registry, transport, actors, API server) and is
what ``corral node run`` calls; :mod:`._api` and :mod:`._operations` serve the
HTTP API over :mod:`._views`, :mod:`._events` and :mod:`._metrics`. It stands on
:mod:`corral.node.artifacts` and on the node's shared ground (errors, request
validation, configuration, identity, logging in ``corral.node``); only the
command line (:mod:`corral.node.cli`) imports it, where a command needs it.
"""

from corral.node.server._node import node_run_command, single_error

__all__ = ["node_run_command", "single_error"]
