"""Where artifacts live, and how a node gets the revision an app runs.

* A node that receives a deploy keeps the artifact in ``<data-dir>/artifacts/``.
  When it is small (at most :data:`REGISTRY_ARTIFACT_LIMIT`, well under etcd's
  1.5 MiB request limit) it is also written to the registry at
  ``artifacts/<digest>``, created only if absent. A larger one stays on that node,
  which serves it at ``GET /v1/artifacts/<digest>`` to peers presenting
  :func:`artifact_capability` (an HMAC of the digest under the cluster secret).
  The lease holder's ArtifactReplicator assigns copies of every live revision to
  more nodes (``copies/<digest>``); each node streams its assigned copies from a
  holder (:meth:`ArtifactStore.fetch_copy`) and says what it has in ``held/<node>``.
* :class:`Materializer` is the ``materialize(app, deployment) -> Path`` callable
  the Reconciler takes: it returns ``<data-dir>/apps/<name>/revisions/<digest>/``,
  unpacking it first when needed from the local copy, the registry, or a peer
  (the holders first, same rack first, then every other node), after checking
  the digest. The directory appears by an atomic rename, so a half-unpacked
  revision is never seen.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from corral.node._artifacts import (
    DEFAULT_LIMITS,
    MAX_ARTIFACT_BYTES,
    REGISTRY_ARTIFACT_LIMIT,
    ArtifactLimits,
    Manifest,
    digest_of,
    inspect_artifact,
    unpack_artifact,
)
from corral.node._copy_plan import Site, fetch_order
from corral.node._errors import ArtifactError, ArtifactNotFound, DigestMismatch
from corral.registry import (
    HELD_PREFIX,
    NODES_PREFIX,
    Compare,
    CopyAssignment,
    Deployment,
    HeldCopies,
    NodeRecord,
    Put,
    Registry,
    artifact_key,
    copies_key,
    decode_record,
    read_records,
    validate_digest,
)

PEER_FETCH_TIMEOUT = 30.0
#: Bytes read from a peer per write while a copy streams to disk.
STREAM_CHUNK = 1024 * 1024
#: Chunks read ahead of the hashing thread, at most.
HASH_BACKLOG = 8
#: Copies fetched at once by one node (each streams in its own worker thread).
DEFAULT_CONCURRENT_FETCHES = 4

#: ``run_blocking(fn, *args, limiter=...)``: how blocking file and network work runs
#: (a worker thread; tests in virtual time pass :func:`run_inline`).
RunBlocking = Callable[..., Awaitable[Any]]


async def run_in_thread(
    fn: Callable[..., Any], *args: Any, limiter: trio.CapacityLimiter | None = None
) -> Any:
    """Run ``fn(*args)`` in a worker thread (the default :data:`RunBlocking`)."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter)


async def run_inline(
    fn: Callable[..., Any], *args: Any, limiter: trio.CapacityLimiter | None = None
) -> Any:
    """Run ``fn(*args)`` on the event loop: for tests on a virtual clock only."""
    return fn(*args)


#: ``download(base_url, digest, capability, path, max_bytes) -> sha256 hex``: stream a
#: peer's copy into ``path``, blocking (it runs in a worker thread).
Download = Callable[[str, str, str, Path, int], str]


def artifact_capability(secret: str, digest: str) -> str:
    """The bearer value that lets a peer fetch one artifact: HMAC-SHA256(secret, digest)."""
    return hmac.new(secret.encode(), f"artifact:{digest}".encode(), hashlib.sha256).hexdigest()


def download_over_http(
    base_url: str, digest: str, capability: str, path: Path, max_bytes: int
) -> str:
    """Stream ``/v1/artifacts/<digest>`` from a peer's API into ``path``, hashing on
    the way; refuse a body past ``max_bytes``. Blocking: call it from a worker thread.

    Raises:
        httpx.HTTPError: the peer cannot be reached or answered an error.
        ArtifactError: the body is larger than ``max_bytes``.
        OSError: ``path`` cannot be written.
    """
    sha = hashlib.sha256()
    written = 0
    # Hashing runs in a second thread (hashlib lets go of the GIL on large buffers), so
    # it overlaps the network reads instead of adding to them; at most HASH_BACKLOG
    # chunks wait for it.
    pending: deque[Future[None]] = deque()
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-sha256") as hasher,
        httpx.Client(timeout=PEER_FETCH_TIMEOUT) as client,
        client.stream(
            "GET",
            f"{base_url}/v1/artifacts/{digest}",
            headers={"Authorization": f"Bearer {capability}"},
        ) as response,
    ):
        response.raise_for_status()
        with open(path, "wb") as out:
            for chunk in response.iter_raw(STREAM_CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    raise ArtifactError(
                        f"{base_url} sent more than {max_bytes} bytes for artifact {digest}"
                    )
                pending.append(hasher.submit(sha.update, chunk))
                out.write(chunk)
                while len(pending) > HASH_BACKLOG:
                    pending.popleft().result()
        for done in pending:
            done.result()
    return sha.hexdigest()


@dataclass(frozen=True, slots=True)
class Peer:
    """A node an artifact can be fetched from."""

    node: str
    api_address: str
    site: Site


def order_peers(
    digest: str, me: str, records: Mapping[str, NodeRecord], holders: Iterable[str]
) -> list[Peer]:
    """The nodes to fetch ``digest`` from, best first: those that hold it or are
    assigned it, same rack first (:func:`fetch_order`), then every other node by id
    (a copy may be anywhere); never ``me``, never a node without an API address."""
    sites = {n: Site(r.rack, r.datacenter) for n, r in records.items()}
    ordered = fetch_order((h for h in holders if h in records), me, sites, digest)
    ordered += sorted(n for n in records if n not in ordered and n != me)
    return [Peer(n, records[n].api_address, sites[n]) for n in ordered if records[n].api_address]


class ArtifactStore:
    """This node's artifacts: its local copies, the registry's, and its peers'."""

    def __init__(
        self,
        registry: Registry,
        directory: Path,
        *,
        node_id: str,
        secret: str,
        download: Download = download_over_http,
        registry_limit: int = REGISTRY_ARTIFACT_LIMIT,
        limits: ArtifactLimits = DEFAULT_LIMITS,
        concurrent_fetches: int = DEFAULT_CONCURRENT_FETCHES,
        max_artifact_bytes: int = MAX_ARTIFACT_BYTES,
        run_blocking: RunBlocking = run_in_thread,
    ) -> None:
        self._registry = registry
        self._directory = directory
        self._node_id = node_id
        self._secret = secret
        self._download = download
        self._registry_limit = registry_limit
        self._limits = limits
        self._fetches = trio.CapacityLimiter(concurrent_fetches)
        self._max_bytes = max_artifact_bytes
        self._copy_locks: dict[str, trio.Lock] = {}
        self.run_blocking = run_blocking

    @property
    def node_id(self) -> str:
        return self._node_id

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
        manifest: Manifest = await self.run_blocking(inspect_artifact, data, self._limits)
        return manifest

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

    def held(self) -> dict[str, int]:
        """The copies on this node's disk: digest -> size in bytes (blocking)."""
        copies: dict[str, int] = {}
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            return copies
        for entry in entries:
            name = entry.name
            if not name.endswith(".tar.gz") or name.startswith("."):
                continue
            digest = name.removesuffix(".tar.gz")
            try:
                validate_digest(digest)
                copies[digest] = entry.stat().st_size
            except (ValueError, OSError):
                continue
        return copies

    def release(self, digest: str) -> bool:
        """Delete this node's copy (blocking); whether there was one."""
        try:
            self.local_path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    async def store(self, data: bytes) -> str:
        """Keep ``data`` here, and in the registry when small; return its digest."""
        digest = digest_of(data)
        await self.run_blocking(self._write_local, digest, data)
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

    async def peers_for(self, digest: str) -> list[Peer]:
        """The other nodes to fetch ``digest`` from, best first (:func:`order_peers`),
        from the registry's ``nodes/``, ``held/`` and ``copies/<digest>``."""
        nodes, _ = await read_records(self._registry, NODES_PREFIX)
        held, _ = await read_records(self._registry, HELD_PREFIX)
        assigned = await self._registry.get(copies_key(digest))
        holders = {
            h.node for h in held.values() if isinstance(h, HeldCopies) and digest in h.copies
        }
        if assigned is not None:
            copy = decode_record(assigned.key, assigned.value)
            if isinstance(copy, CopyAssignment):
                holders.update(copy.holders)
        records = {r.id: r for r in nodes.values() if isinstance(r, NodeRecord)}
        return order_peers(digest, self._node_id, records, holders)

    async def fetch_copy(self, digest: str, peers: list[Peer] | None = None) -> Path:
        """Get a copy of ``digest`` onto this node's disk from a peer: streamed in a
        worker thread, its sha256 checked before it takes its name; at most
        ``concurrent_fetches`` at once. Returns the local path.

        Raises:
            ArtifactNotFound: no peer gave the right bytes; names each one tried and why.
        """
        path = self.local_path(digest)
        lock = self._copy_locks.setdefault(digest, trio.Lock())
        async with lock:
            if path.exists():
                return path
            if peers is None:
                peers = await self.peers_for(digest)
            tried: list[str] = []
            for peer in peers:
                why = await self._fetch_from(peer, digest, path)
                if why is None:
                    self._copy_locks.pop(digest, None)
                    return path
                tried.append(f"{peer.node} ({why})")
        holders = "; ".join(tried) or "no other node has an API address"
        raise ArtifactNotFound(
            f"artifact {digest} is neither on this node, in the registry, nor on any peer "
            f"(tried {len(tried)}: {holders}); the nodes that held it are gone or use "
            "another cluster secret: deploy again"
        )

    async def _fetch_from(self, peer: Peer, digest: str, path: Path) -> str | None:
        """Stream one peer's copy into place; None on success, else why not."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        capability = artifact_capability(self._secret, digest)
        base_url = f"http://{peer.api_address}"
        try:
            actual = await self.run_blocking(
                self._download,
                base_url,
                digest,
                capability,
                partial,
                self._max_bytes,
                limiter=self._fetches,
            )
            if actual != digest:
                return f"sent bytes hashing to {actual[:12]}"
            os.replace(partial, path)
            return None
        except httpx.HTTPStatusError as exc:
            return f"HTTP {exc.response.status_code}"
        except (httpx.HTTPError, OSError, ArtifactError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            partial.unlink(missing_ok=True)

    async def fetch(self, digest: str) -> bytes:
        """The artifact's bytes, checked against the digest, from wherever it is:
        this node, the registry, or a peer (holders first, same rack first).

        Raises:
            ArtifactNotFound: no copy here, in the registry, or on any reachable node.
        """
        local: bytes | None = await self.run_blocking(self.read_local, digest)
        if local is not None and digest_of(local) == digest:
            return local
        kv = await self._registry.get(artifact_key(digest))
        if kv is not None and digest_of(kv.value) == digest:
            await self.run_blocking(self._write_local, digest, kv.value)
            return kv.value
        if local is not None:
            await self.run_blocking(self.release, digest)  # a corrupt copy
        path = await self.fetch_copy(digest)
        data: bytes = await self.run_blocking(path.read_bytes)
        if digest_of(data) != digest:
            raise ArtifactNotFound(f"artifact {digest} changed on disk while being read")
        return data


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
