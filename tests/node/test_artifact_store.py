"""Where a node gets a revision from: its own copy, the registry, or a peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.node import ArtifactNotFound
from corral.node.artifacts._artifact_store import ArtifactStore, Materializer, artifact_capability
from corral.registry import Deployment, MemoryRegistry, NodeRecord, artifact_key, node_key

from .conftest import packed_app

SECRET = "s3cret"


def store(registry: MemoryRegistry, root: Path, node: str, **kwargs: object) -> ArtifactStore:
    return ArtifactStore(registry, root / node, node_id=node, secret=SECRET, **kwargs)  # type: ignore[arg-type]


async def test_small_artifacts_travel_through_the_registry(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    packed = packed_app(tmp_path)
    digest = await store(registry, tmp_path, "a").store(packed.data)
    assert digest == packed.digest
    kv = await registry.get(artifact_key(digest))
    assert kv is not None
    assert kv.value == packed.data
    other = store(registry, tmp_path, "b")
    materialize = Materializer(other, tmp_path / "b-apps")
    deployment = Deployment(revision=digest, command=["python3", "server.py"])
    path = await materialize("shop", deployment)
    assert path == tmp_path / "b-apps" / "shop" / "revisions" / digest
    assert (path / "server.py").read_text() == "print('hello')\n"
    assert other.read_local(digest) == packed.data
    assert await materialize("shop", deployment) == path
    assert [p.name for p in path.parent.iterdir()] == [digest]


async def test_large_artifacts_are_fetched_from_the_node_that_has_them(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    packed = packed_app(tmp_path)
    await store(registry, tmp_path, "a", registry_limit=10).store(packed.data)
    assert await registry.get(artifact_key(packed.digest)) is None
    await registry.put(node_key("a"), NodeRecord(id="a", api_address="10.0.0.1:7400").encode())
    asked: list[tuple[str, str, str]] = []

    def download(base_url: str, digest: str, capability: str, path: Path, limit: int) -> str:
        asked.append((base_url, digest, capability))
        path.write_bytes(packed.data)
        return packed.digest

    other = store(registry, tmp_path, "b", download=download)
    assert await other.fetch(packed.digest) == packed.data
    assert asked == [
        ("http://10.0.0.1:7400", packed.digest, artifact_capability(SECRET, packed.digest))
    ]


async def test_a_peer_sending_other_bytes_is_not_believed(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    packed = packed_app(tmp_path)
    await registry.put(node_key("a"), NodeRecord(id="a", api_address="10.0.0.1:7400").encode())

    def download(base_url: str, digest: str, capability: str, path: Path, limit: int) -> str:
        path.write_bytes(b"something else")
        return "0" * 64

    other = store(registry, tmp_path, "b", download=download)
    with pytest.raises(ArtifactNotFound, match=r"tried 1: a \(sent bytes hashing to 000000000000"):
        await other.fetch(packed.digest)
    assert other.read_local(packed.digest) is None
