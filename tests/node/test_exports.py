"""The public names of corral.node and its sub-packages."""

from __future__ import annotations

import corral.node
import corral.node.artifacts
import corral.node.cli
import corral.node.server


def test_corral_node_keeps_its_public_names() -> None:
    assert corral.node.__all__ == [
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


def test_each_sub_package_exports_what_the_others_call() -> None:
    assert corral.node.artifacts.__all__ == [
        "DEFAULT_LIMITS",
        "MAX_ARTIFACT_BYTES",
        "ArtifactLimits",
        "ArtifactStore",
        "Manifest",
        "Materializer",
        "PackedArtifact",
        "ServedCopy",
        "artifact_capability",
        "inspect_artifact",
        "pack_directory",
        "parse_manifest",
        "sweep_partial_files",
    ]
    assert corral.node.server.__all__ == ["node_run_command", "single_error"]
    assert corral.node.cli.__all__ == ["console_main"]
