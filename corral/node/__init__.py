"""The node service: assembly, configuration, HTTP API and the command line.

Only light modules are imported here, so the ``corral`` command starts quickly;
the assembly (``corral.node._node.run_node``), the API (``_api.build_api``), the
client (``_client.NodeClient``) and the local cluster (``_local_cluster``) are
imported where they are used.
"""

from corral.node._artifacts import Manifest, PackedArtifact, pack_directory, parse_manifest
from corral.node._cli import console_main as main
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

__all__ = [
    "ApiError",
    "ApiRefused",
    "ArtifactError",
    "ArtifactInvalid",
    "ArtifactNotFound",
    "ConfigError",
    "Conflict",
    "DigestMismatch",
    "Manifest",
    "NodeError",
    "NodeUnreachable",
    "NotFound",
    "OperationRefused",
    "PackedArtifact",
    "RequestInvalid",
    "main",
    "pack_directory",
    "parse_manifest",
]
