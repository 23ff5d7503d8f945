"""Artifacts: packing an app directory, the on-disk store, and copies across nodes.

A pure half decides: :mod:`._artifacts` (manifest, digest, pack and unpack
rules) and :mod:`._copy_plan` (which nodes hold which digest). A shell acts:
:mod:`._artifact_store` (the data dir's copies, serving and fetching them) and
:mod:`._replicator` (the actor that keeps the planned copies). The server
(:mod:`corral.node.server`) and the command line (:mod:`corral.node.cli`) stand
on this package; it imports neither. Its errors are the node's
(:mod:`corral.node._errors`): ``ArtifactInvalid`` is a ``RequestInvalid``.

The replicator is not re-exported here: it imports the actor runtime and the
transport, and ``corral.node`` (so every ``corral`` command) imports this
package; re-exporting it cost ``import corral.node`` about 0.5 s (0.75 s to
1.3 s, measured). The server imports it from :mod:`._replicator`.
"""

from corral.node.artifacts._artifact_store import (
    ArtifactStore,
    Materializer,
    ServedCopy,
    artifact_capability,
    sweep_partial_files,
)
from corral.node.artifacts._artifacts import (
    DEFAULT_LIMITS,
    MAX_ARTIFACT_BYTES,
    ArtifactLimits,
    Manifest,
    PackedArtifact,
    inspect_artifact,
    pack_directory,
    parse_manifest,
)

__all__ = [
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
