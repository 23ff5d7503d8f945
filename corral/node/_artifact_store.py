"""Where artifacts live, and how a node gets the revision an app runs.

* A node that receives a deploy keeps the artifact in ``<data-dir>/artifacts/``.
  When it is small (at most :data:`REGISTRY_ARTIFACT_LIMIT`, well under etcd's
  1.5 MiB request limit) it is also written to the registry at
  ``artifacts/<digest>``, created only if absent. A larger one stays on that node,
  which serves it at ``GET /v1/artifacts/<digest>`` to peers presenting
  :func:`artifact_capability` (an HMAC of the digest under the cluster secret).
* :class:`Materializer` is the ``materialize(app, deployment) -> Path`` callable
  the Reconciler takes: it returns ``<data-dir>/apps/<name>/revisions/<digest>/``,
  unpacking it first when needed from the local copy, the registry, or a peer
  (in node-id order), after checking the digest. The directory appears by an
  atomic rename, so a half-unpacked revision is never seen.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio

from corral.node._artifacts import (
    DEFAULT_LIMITS,
    REGISTRY_ARTIFACT_LIMIT,
    ArtifactLimits,
    Manifest,
    digest_of,
    inspect_artifact,
    unpack_artifact,
)
from corral.node._errors import ArtifactError, ArtifactNotFound, DigestMismatch
from corral.registry import (
    Compare,
    Deployment,
    NodeRecord,
    Put,
    Registry,
    artifact_key,
    read_records,
    validate_digest,
)

PEER_FETCH_TIMEOUT = 30.0

FetchFromPeer = Callable[[str, str, str], Awaitable[bytes]]


def artifact_capability(secret: str, digest: str) -> str:
    """The bearer value that lets a peer fetch one artifact: HMAC-SHA256(secret, digest)."""
    return hmac.new(secret.encode(), f"artifact:{digest}".encode(), hashlib.sha256).hexdigest()


async def fetch_over_http(base_url: str, digest: str, capability: str) -> bytes:
    """Fetch ``/v1/artifacts/<digest>`` from a peer's API."""
    async with httpx.AsyncClient(timeout=PEER_FETCH_TIMEOUT) as client:
        response = await client.get(
            f"{base_url}/v1/artifacts/{digest}",
            headers={"Authorization": f"Bearer {capability}"},
        )
        response.raise_for_status()
        return response.content


class ArtifactStore:
    """This node's artifacts: its local copies, the registry's, and its peers'."""

    def __init__(
        self,
        registry: Registry,
        directory: Path,
        *,
        node_id: str,
        secret: str,
        fetch_from_peer: FetchFromPeer = fetch_over_http,
        registry_limit: int = REGISTRY_ARTIFACT_LIMIT,
        limits: ArtifactLimits = DEFAULT_LIMITS,
    ) -> None:
        self._registry = registry
        self._directory = directory
        self._node_id = node_id
        self._secret = secret
        self._fetch_from_peer = fetch_from_peer
        self._registry_limit = registry_limit
        self._limits = limits

    @property
    def limits(self) -> ArtifactLimits:
        """What an artifact may unpack to on this node."""
        return self._limits

    async def inspect(self, data: bytes) -> Manifest:
        """Check artifact bytes against this node's limits in a worker thread (the
        loop keeps serving while a large archive is read); return the manifest.

        Raises:
            ArtifactInvalid: as :func:`corral.node._artifacts.inspect_artifact`.
        """
        return await trio.to_thread.run_sync(inspect_artifact, data, self._limits)

    @property
    def registry_limit(self) -> int:
        """Artifacts up to this many bytes are also kept in the registry."""
        return self._registry_limit

    def local_path(self, digest: str) -> Path:
        return self._directory / f"{validate_digest(digest)}.tar.gz"

    def read_local(self, digest: str) -> bytes | None:
        """This node's copy of the artifact, or None."""
        try:
            return self.local_path(digest).read_bytes()
        except FileNotFoundError:
            return None

    async def store(self, data: bytes) -> str:
        """Keep ``data`` here, and in the registry when small; return its digest."""
        digest = digest_of(data)
        await trio.to_thread.run_sync(self._write_local, digest, data)
        if len(data) <= self._registry_limit:
            key = artifact_key(digest)
            await self._registry.txn([Compare.absent(key)], [Put(key, data)])
        return digest

    def _write_local(self, digest: str, data: bytes) -> None:
        path = self.local_path(digest)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        partial.write_bytes(data)
        os.replace(partial, path)

    async def fetch(self, digest: str) -> bytes:
        """The artifact's bytes, checked against the digest, from wherever it is.

        Raises:
            ArtifactNotFound: no copy here, in the registry, or on any reachable node.
        """
        local = await trio.to_thread.run_sync(self.read_local, digest)
        if local is not None and digest_of(local) == digest:
            return local
        kv = await self._registry.get(artifact_key(digest))
        if kv is not None and digest_of(kv.value) == digest:
            await trio.to_thread.run_sync(self._write_local, digest, kv.value)
            return kv.value
        tried: list[str] = []
        nodes, _ = await read_records(self._registry, "nodes/")
        for record in sorted(
            (r for r in nodes.values() if isinstance(r, NodeRecord)), key=lambda r: r.id
        ):
            if record.id == self._node_id or not record.api_address:
                continue
            base_url = f"http://{record.api_address}"
            tried.append(base_url)
            try:
                data = await self._fetch_from_peer(
                    base_url, digest, artifact_capability(self._secret, digest)
                )
            except (httpx.HTTPError, OSError):
                continue
            if digest_of(data) == digest:
                await trio.to_thread.run_sync(self._write_local, digest, data)
                return data
        where = ", ".join(tried) or "no other node"
        raise ArtifactNotFound(
            f"artifact {digest} is neither on this node, in the registry, nor on {where}; "
            "the node that received it is gone or uses another cluster secret: deploy again"
        )


class Materializer:
    """``materialize(app, deployment) -> Path``: the unpacked revision directory."""

    def __init__(self, store: ArtifactStore, apps_dir: Path) -> None:
        self._store = store
        self._apps_dir = apps_dir
        self._locks: dict[str, trio.Lock] = {}

    def revision_dir(self, app: str, digest: str) -> Path:
        return self._apps_dir / app / "revisions" / validate_digest(digest)

    async def __call__(self, app: str, deployment: Deployment) -> Path:
        target = self.revision_dir(app, deployment.digest)
        lock = self._locks.setdefault(target.as_posix(), trio.Lock())
        async with lock:
            if target.is_dir():
                return target
            data = await self._store.fetch(deployment.digest)
            try:
                await trio.to_thread.run_sync(
                    _unpack_atomically, data, deployment.digest, target, self._store.limits
                )
            except DigestMismatch:
                raise
            except OSError as exc:
                raise ArtifactError(
                    f"cannot unpack {deployment.digest} into {target}: {exc}"
                ) from exc
        return target


def _unpack_atomically(data: bytes, digest: str, target: Path, limits: ArtifactLimits) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    try:
        unpack_artifact(data, digest, partial, limits)
        try:
            os.rename(partial, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
