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
* Every file is written under a hidden partial name first (:func:`partial_path`) and
  renamed into place; a write that fails removes its partial file, and
  :func:`sweep_partial_files` removes those a killed process left, at start. A
  stored artifact or fetched copy must leave :data:`KEEP_FREE_BYTES` free on the
  data dir's file system, else :class:`InsufficientStorage` names the bytes needed
  and free.
* A copy served to a peer (:meth:`ArtifactStore.open_copy`) is hashed as it is
  read, and its last chunk is given only once the whole copy matched its digest: a
  copy that does not is dropped (the peer sees its answer cut short) and the
  store's drop listeners are told, so the replicator withdraws it from
  ``held/<node>`` and fetches it again.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import logging
import os
import re
import shutil
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from corral.node._errors import (
    ArtifactError,
    ArtifactNotFound,
    CopyCorrupt,
    DigestMismatch,
    InsufficientStorage,
)
from corral.node.artifacts._artifacts import (
    DEFAULT_LIMITS,
    MAX_ARTIFACT_BYTES,
    REGISTRY_ARTIFACT_LIMIT,
    ArtifactLimits,
    Manifest,
    digest_of,
    inspect_artifact,
    unpack_artifact,
)
from corral.node.artifacts._copy_plan import Site, fetch_order
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

log = logging.getLogger("corral.node.artifacts")

PEER_FETCH_TIMEOUT = 30.0
#: What a stored artifact or a fetched copy must leave free on the data dir's file
#: system: room for the registry's writes, the node's log and the small files of the
#: next passes (the registry also keeps a reserve of its own: see SQLiteRegistry).
KEEP_FREE_BYTES = 4 * 1024 * 1024
#: Bytes read per chunk of a copy served to a peer.
SERVE_CHUNK = 1024 * 1024
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


def partial_path(path: Path) -> Path:
    """The hidden name a file is written under before it is renamed to ``path``
    (``.<name>.<32 hex>``; :func:`sweep_partial_files` knows the pattern)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}")


def partial_revision_path(target: Path) -> Path:
    """The hidden directory a revision is unpacked into before it is renamed to ``target``."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")


def removed_revision_path(target: Path) -> Path:
    """Where a revision directory is renamed to while it is deleted."""
    return target.with_name(f".{target.name}.removing")


_PARTIAL_COPY = re.compile(r"\.[0-9a-f]{64}\.tar\.gz\.[0-9a-f]{32}")
_PARTIAL_REVISION = re.compile(r"\.[0-9a-f]{64}\.(?:[0-9a-f]{32}\.partial|removing)")


def sweep_partial_files(data_dir: Path) -> tuple[int, int]:
    """Remove what interrupted writes left in ``data_dir``: hidden partial artifact
    copies (``artifacts/.<digest>.tar.gz.<hex>``), half-unpacked revisions
    (``apps/<app>/revisions/.<digest>.<hex>.partial``) and half-removed ones
    (``.<digest>.removing``). Blocking; run it at start, before anything writes there.

    Returns:
        How many were removed, and the bytes they held.
    """
    removed = freed = 0
    artifacts = data_dir / "artifacts"
    for entry in _entries(artifacts):
        if _PARTIAL_COPY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                size = entry.stat(follow_symlinks=False).st_size
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed, freed = removed + 1, freed + size
    for app in _entries(data_dir / "apps"):
        for entry in _entries(Path(app.path) / "revisions"):
            if _PARTIAL_REVISION.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                size = tree_bytes(Path(entry.path))
                shutil.rmtree(entry.path, ignore_errors=True)
                removed, freed = removed + 1, freed + size
    return removed, freed


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed; a file gone meanwhile counts 0)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def free_bytes(path: Path) -> int:
    """Bytes this process may still write on the file system holding ``path`` (or its
    nearest existing parent). Blocking (a statvfs)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused for want of space (ENOSPC, or a quota)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class ServedCopy:
    """One of this node's copies, read for a peer: each chunk is hashed as it is read,
    and the last one is given only once the whole copy matched its digest, so a
    corrupt copy never reaches a peer whole. Blocking reads: iterate :meth:`chunks`
    from a worker thread. Close it when done."""

    def __init__(self, store: ArtifactStore, digest: str, fd: int) -> None:
        self._store = store
        self._digest = digest
        self._fd = fd
        st = os.fstat(fd)
        self.size = st.st_size
        self._identity = (st.st_dev, st.st_ino)

    def chunks(self) -> Iterator[bytes]:
        """The copy's bytes, in chunks of :data:`SERVE_CHUNK`.

        Raises:
            CopyCorrupt: the bytes do not hash to the digest (instead of the last
                chunk); the copy has been dropped and the store's listeners told.
        """
        sha = hashlib.sha256()
        chunk = os.read(self._fd, SERVE_CHUNK)
        while chunk:
            sha.update(chunk)
            following = os.read(self._fd, SERVE_CHUNK)
            if not following and sha.hexdigest() != self._digest:
                break  # read whole and it does not match: its last chunk is never given
            yield chunk
            chunk = following
        else:
            if sha.hexdigest() == self._digest:
                return
            # An empty file: it matches no artifact.
        actual = sha.hexdigest()
        self._store.drop_corrupt(self._digest, self._identity)
        raise CopyCorrupt(
            f"this node's copy of artifact {self._digest} hashes to {actual}; it was "
            "dropped and will be fetched again from another holder"
        )

    def close(self) -> None:
        os.close(self._fd)


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
        self._drop_listeners: list[tuple[trio.lowlevel.TrioToken, Callable[[str], object]]] = []
        self.run_blocking = run_blocking

    @property
    def data_dir(self) -> Path:
        """The node's data directory (the store keeps its copies in ``<data-dir>/artifacts``)."""
        return self._directory.parent

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
            ArtifactInvalid: as :func:`corral.node.artifacts._artifacts.inspect_artifact`.
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

    def on_drop(self, listener: Callable[[str], object]) -> Callable[[], None]:
        """Call ``listener(digest)`` on the calling Trio loop each time a corrupt copy
        is dropped (whichever thread found it). Returns what stops it."""
        entry = (trio.lowlevel.current_trio_token(), listener)
        self._drop_listeners.append(entry)

        def stop() -> None:
            if entry in self._drop_listeners:
                self._drop_listeners.remove(entry)

        return stop

    def drop_corrupt(self, digest: str, identity: tuple[int, int] | None = None) -> None:
        """Delete a copy found corrupt and tell the drop listeners (blocking; any thread).

        Args:
            identity: (device, inode) of the file found corrupt: a copy fetched again
                meanwhile is another file, and is kept. None: whatever is there.
        """
        path = self.local_path(digest)
        try:
            if identity is None or _identity_of(path) == identity:
                path.unlink()
        except FileNotFoundError:
            pass
        log.warning(
            "this node's copy of artifact %s does not hash to its digest: dropped (the "
            "replicator withdraws it from held/ and fetches it again where assigned)",
            digest,
        )
        for token, listener in list(self._drop_listeners):
            try:
                token.run_sync_soon(listener, digest)
            except trio.RunFinishedError:
                continue

    def open_copy(self, digest: str) -> ServedCopy | None:
        """This node's copy of ``digest``, opened to be served (:class:`ServedCopy`), or
        None when there is none. Blocking."""
        try:
            fd = os.open(self.local_path(digest), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return ServedCopy(self, digest, fd)
        except BaseException:
            os.close(fd)
            raise

    def no_room(self, what: str, needed: int, *, at_least: bool = False) -> InsufficientStorage:
        """The refusal for ``what``, which needs ``needed`` bytes written (``at_least``:
        or more). Blocking: it measures what is free now."""
        return InsufficientStorage(
            what,
            str(self.data_dir),
            needed + KEEP_FREE_BYTES,
            free_bytes(self._directory),
            kept=KEEP_FREE_BYTES,
            at_least=at_least,
        )

    def check_room(self, what: str, size: int) -> None:
        """Refuse to write ``size`` bytes that would leave less than
        :data:`KEEP_FREE_BYTES` free (blocking).

        Raises:
            InsufficientStorage: naming the data dir, the bytes needed and free.
        """
        if free_bytes(self._directory) < size + KEEP_FREE_BYTES:
            raise self.no_room(what, size)

    async def store(self, data: bytes) -> str:
        """Keep ``data`` here, and in the registry when small; return its digest.

        Raises:
            InsufficientStorage: the data dir has no room for it (nothing is left behind).
        """
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
        what = f"this {len(data)}-byte artifact"
        self.check_room(what, len(data))
        partial = partial_path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(data)
            os.replace(partial, path)
        except BaseException as exc:
            partial.unlink(missing_ok=True)
            if is_disk_full(exc):
                raise self.no_room(what, len(data)) from exc
            raise

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

    async def fetch_copy(
        self, digest: str, peers: list[Peer] | None = None, size: int | None = None
    ) -> Path:
        """Get a copy of ``digest`` onto this node's disk from a peer: streamed in a
        worker thread, its sha256 checked before it takes its name; at most
        ``concurrent_fetches`` at once. Returns the local path.

        Args:
            size: the copy's size when known: refused at once when there is no room.

        Raises:
            ArtifactNotFound: no peer gave the right bytes; names each one tried and why.
            InsufficientStorage: the data dir has no room for the copy (the partial
                file is removed; no other peer is tried).
        """
        path = self.local_path(digest)
        lock = self._copy_locks.setdefault(digest, trio.Lock())
        async with lock:
            if path.exists():
                return path
            if size is not None:
                await self.run_blocking(
                    self.check_room, f"a {size}-byte copy of artifact {digest}", size
                )
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
        partial = partial_path(path)
        capability = artifact_capability(self._secret, digest)
        base_url = f"http://{peer.api_address}"
        full: OSError | None = None
        received = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
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
        except OSError as exc:
            if not is_disk_full(exc):
                return f"{type(exc).__name__}: {exc}"
            full = exc
            received = await self.run_blocking(_size_of, partial)
        except (httpx.HTTPError, ArtifactError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            partial.unlink(missing_ok=True)
        # Measured once the partial file is gone: what is free for the next attempt.
        raise await self.run_blocking(
            functools.partial(
                self.no_room,
                f"a copy of artifact {digest} from {peer.node} (the disk filled after "
                f"{received} bytes of it)",
                received,
                at_least=True,
            )
        ) from full

    async def fetch(self, digest: str) -> bytes:
        """The artifact's bytes, checked against the digest, from wherever it is:
        this node, the registry, or a peer (holders first, same rack first).

        Raises:
            ArtifactNotFound: no copy here, in the registry, or on any reachable node.
        """
        local: bytes | None = await self.run_blocking(self.read_local, digest)
        if local is not None:
            if digest_of(local) == digest:
                return local
            await self.run_blocking(self.drop_corrupt, digest)
        kv = await self._registry.get(artifact_key(digest))
        if kv is not None and digest_of(kv.value) == digest:
            try:
                await self.run_blocking(self._write_local, digest, kv.value)
            except InsufficientStorage as exc:  # the local copy is a cache: go on without
                log.warning("no local copy kept of the registry's artifact: %s", exc)
            return kv.value
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


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _identity_of(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _unpack_atomically(data: bytes, digest: str, target: Path, limits: ArtifactLimits) -> None:
    partial = partial_revision_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        unpack_artifact(data, digest, partial, limits)
        try:
            os.rename(partial, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
