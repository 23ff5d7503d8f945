"""The node service: its server, command line and artifacts.

Three sub-packages stand on a shared ground:

- ``corral.node.cli``: argument parsing, API client, formatting, demo, local
  cluster, the ``plan`` and ``proxy run`` commands (the top: imports the others);
- ``corral.node.server``: node assembly, HTTP API, views, metrics, events;
- ``corral.node.artifacts``: packing, the artifact store, copy plan, replicator;
- the ground, here: errors (``_errors``, one tree for all three: an
  ``ArtifactInvalid`` is a ``RequestInvalid``), request validation
  (``_requests``), configuration (``_config``), identity (``_identity``) and
  logging (``_logging``), which both the command line and the server use.

Only light modules are imported here, so the ``corral`` command starts quickly:
the server is imported by ``corral node run`` alone, and each command imports its
modules where it runs.
"""

from corral.node._errors import (
    ApiError,
    ApiRefused,
    ArtifactError,
    ArtifactInvalid,
    ArtifactNotFound,
    ConfigError,
    Conflict,
    DigestMismatch,
    NodeError,
    NodeUnreachable,
    NotFound,
    OperationRefused,
    RequestInvalid,
)
from corral.node.cli import console_main as main

__all__ = [
    "ApiError",
    "ApiRefused",
    "ArtifactError",
    "ArtifactInvalid",
    "ArtifactNotFound",
    "ConfigError",
    "Conflict",
    "DigestMismatch",
    "NodeError",
    "NodeUnreachable",
    "NotFound",
    "OperationRefused",
    "RequestInvalid",
    "main",
]
