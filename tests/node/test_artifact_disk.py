"""An artifact store on a full disk and with corrupt copies: a write the data dir has
no room for is refused before anything is written, names the data dir and the bytes
needed and free, and leaves no partial file; partial files a killed process left are
swept; a copy served to a peer is verified as it is read, and a corrupt one dropped."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
from starlette.types import ASGIApp

from corral.node._errors import CopyCorrupt, InsufficientStorage
from corral.node.artifacts import pack_directory
from corral.node.artifacts._artifact_store import (
    KEEP_FREE_BYTES,
    ArtifactStore,
    Peer,
    partial_path,
    partial_revision_path,
    removed_revision_path,
    sweep_partial_files,
)
from corral.node.artifacts._artifacts import digest_of
from corral.node.artifacts._copy_plan import Site
from corral.node.server._api import ApiServices, build_api
from corral.registry import MemoryRegistry, artifact_key

from ..conftest import SmallDisk
from .conftest import b64, make_app_dir, packed_app

MIB = 1024 * 1024


def store_in(data_dir: Path, **kwargs: object) -> ArtifactStore:
    return ArtifactStore(
        MemoryRegistry(),
        data_dir / "artifacts",
        node_id="n1",
        secret="s",
        **kwargs,  # type: ignore[arg-type]
    )


def api_of(store: ArtifactStore, registry: MemoryRegistry, secret: str) -> ASGIApp:
    """The node's API around ``store`` (token ``t``), with nothing else behind it."""

    async def state() -> dict[str, object]:
        return {}

    return build_api(
        ApiServices(
            token="t",
            secret=secret,
            node_id="n1",
            registry=registry,
            artifacts=store,
            state=state,
            actors=dict,
            events=list,
            wall_clock=lambda: 0.0,
        )
    )


def hidden(data_dir: Path) -> list[str]:
    """Every hidden entry under ``data_dir`` (a partial file is hidden)."""
    return sorted(
        str(Path(root, name).relative_to(data_dir))
        for root, dirs, files in os.walk(data_dir)
        for name in [*dirs, *files]
        if name.startswith(".")
    )


async def test_an_artifact_larger_than_the_room_left_is_refused_before_it_is_written(
    small_tmpfs: Callable[[int], SmallDisk],
) -> None:
    disk = small_tmpfs(32)
    data_dir = disk.path / "data"
    store = store_in(data_dir)
    disk.fill(leave=20 * MIB)
    free = disk.free()
    data = os.urandom(25 * MIB)
    with pytest.raises(InsufficientStorage) as refused:
        await store.store(data)
    error = refused.value
    assert error.data_dir == str(data_dir)
    assert error.needed == len(data) + KEEP_FREE_BYTES
    assert error.free == free
    message = str(error)
    assert str(data_dir) in message
    assert f"{len(data) + KEEP_FREE_BYTES} bytes" in message
    assert f"{free} bytes" in message
    assert disk.free() == free  # nothing was written
    assert hidden(data_dir) == []
    # What fits (with the room kept free) is stored.
    small = os.urandom(10 * MIB)
    assert await store.store(small) == digest_of(small)
    assert store.read_local(digest_of(small)) == small


async def test_the_api_answers_507_with_the_figures_and_records_nothing(
    small_tmpfs: Callable[[int], SmallDisk], tmp_path: Path
) -> None:
    disk = small_tmpfs(32)
    registry = MemoryRegistry()
    store = ArtifactStore(registry, disk.path / "data" / "artifacts", node_id="n1", secret="s")
    disk.fill(leave=20 * MIB)
    app = packed_app(tmp_path)
    big = make_app_dir(tmp_path / "big")
    (big / "blob.bin").write_bytes(os.urandom(25 * MIB))  # incompressible
    packed = pack_directory(big)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api_of(store, registry, "s")),
        base_url="http://node",
        headers={"Authorization": "Bearer t"},
    ) as client:
        response = await client.post("/v1/apps/big/deploy", json={"artifact": b64(packed.data)})
        assert response.status_code == 507
        error = response.json()["error"]
        assert f"in the data dir {disk.path / 'data'}:" in error
        assert f"needs {packed.size + KEEP_FREE_BYTES} bytes" in error
        assert "its file system has " in error
        assert (await client.get("/v1/apps")).json()["apps"] == []
        # A small app still deploys.
        small = await client.post("/v1/apps/small/deploy", json={"artifact": b64(app.data)})
        assert small.status_code == 201
    assert await registry.get(artifact_key(packed.digest)) is None
    assert hidden(disk.path / "data") == []


async def test_a_write_the_disk_fills_under_removes_its_partial_file(
    small_tmpfs: Callable[[int], SmallDisk],
) -> None:
    disk = small_tmpfs(16)
    data_dir = disk.path / "data"
    store = store_in(data_dir)
    # Another writer takes the room between the check and the write.
    store.check_room = lambda what, size: None  # type: ignore[method-assign]
    data = os.urandom(20 * MIB)
    with pytest.raises(InsufficientStorage, match=f"in the data dir {data_dir}"):
        await store.store(data)
    assert hidden(data_dir) == []
    assert disk.free() > 15 * MIB  # the partial file's blocks are back


async def test_a_copy_fetched_onto_a_full_disk_leaves_nothing_and_tries_no_other_peer(
    small_tmpfs: Callable[[int], SmallDisk],
) -> None:
    disk = small_tmpfs(16)
    data_dir = disk.path / "data"
    data = os.urandom(20 * MIB)
    tried: list[str] = []

    def download(base_url: str, digest: str, capability: str, path: Path, limit: int) -> str:
        tried.append(base_url)
        with path.open("wb") as out:
            out.write(data)
        return digest_of(data)

    store = store_in(data_dir, download=download)
    peers = [Peer("a", "a:1", Site()), Peer("b", "b:1", Site())]
    # The size unknown: the disk fills while the copy streams in.
    with pytest.raises(
        InsufficientStorage, match=r"a copy of artifact [0-9a-f]{64} from a"
    ) as full:
        await store.fetch_copy(digest_of(data), peers)
    assert 15 * MIB < full.value.needed - KEEP_FREE_BYTES <= 16 * MIB  # what it had received
    assert "it needs at least " in str(full.value)
    assert tried == ["http://a:1"]
    assert hidden(data_dir) == []
    # The size known: refused before anything is asked for.
    with pytest.raises(InsufficientStorage, match=f"a {len(data)}-byte copy"):
        await store.fetch_copy(digest_of(data), peers, size=len(data))
    assert tried == ["http://a:1"]


def test_partial_files_left_by_a_killed_process_are_swept(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = store_in(data_dir)
    digest = digest_of(b"kept")
    kept = store.local_path(digest)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"kept")
    partial_path(kept).write_bytes(b"x" * 1000)
    (kept.parent / ".notes").write_text("not ours")  # only our own patterns go
    revisions = data_dir / "apps" / "web" / "revisions"
    (revisions / digest).mkdir(parents=True)
    (revisions / digest / "server.py").write_text("ok")
    half = partial_revision_path(revisions / digest)
    half.mkdir()
    (half / "big.bin").write_bytes(b"y" * 500)
    removing = removed_revision_path(revisions / ("e" * 64))
    removing.mkdir()
    assert sweep_partial_files(data_dir) == (3, 1500)
    assert hidden(data_dir) == ["artifacts/.notes"]
    assert kept.read_bytes() == b"kept"
    assert (revisions / digest / "server.py").read_text() == "ok"
    assert sweep_partial_files(data_dir) == (0, 0)
    assert sweep_partial_files(tmp_path / "absent") == (0, 0)


async def test_a_served_copy_is_verified_and_a_corrupt_one_dropped(tmp_path: Path) -> None:
    store = store_in(tmp_path, registry_limit=0)
    data = os.urandom(3 * MIB + 5)
    digest = await store.store(data)
    dropped: list[str] = []
    store.on_drop(dropped.append)

    copy = store.open_copy(digest)
    assert copy is not None
    assert copy.size == len(data)
    try:
        assert b"".join(copy.chunks()) == data
    finally:
        copy.close()

    path = store.local_path(digest)
    with path.open("r+b") as file:  # a bit flipped on disk
        file.seek(2 * MIB + 7)
        byte = file.read(1)
        file.seek(2 * MIB + 7)
        file.write(bytes([byte[0] ^ 0x01]))
    copy = store.open_copy(digest)
    assert copy is not None
    served: list[bytes] = []
    chunks = copy.chunks()
    try:
        served.extend(next(chunks) for _ in range(len(data) // MIB))  # all but the last
        with pytest.raises(CopyCorrupt, match=f"copy of artifact {digest} hashes to"):
            next(chunks)
    finally:
        copy.close()
    assert len(b"".join(served)) < len(data)  # the last chunk was held back
    assert not path.exists()
    assert store.open_copy(digest) is None
    await trio.testing.wait_all_tasks_blocked()
    assert dropped == [digest]


async def test_a_copy_replaced_while_it_was_served_is_kept(tmp_path: Path) -> None:
    store = store_in(tmp_path, registry_limit=0)
    data = os.urandom(MIB)
    digest = await store.store(data)
    path = store.local_path(digest)
    path.write_bytes(b"corrupt")
    copy = store.open_copy(digest)
    assert copy is not None
    # Meanwhile the copy was fetched again (a new file under the name).
    fresh = partial_path(path)
    fresh.write_bytes(data)
    os.replace(fresh, path)
    try:
        with pytest.raises(CopyCorrupt):
            list(copy.chunks())
    finally:
        copy.close()
    assert path.read_bytes() == data


async def test_a_corrupt_local_copy_is_dropped_and_the_registry_copy_used(
    tmp_path: Path,
) -> None:
    registry = MemoryRegistry()
    store = ArtifactStore(registry, tmp_path / "artifacts", node_id="n1", secret="s")
    packed = packed_app(tmp_path)
    digest = await store.store(packed.data)
    assert await registry.get(artifact_key(digest)) is not None
    dropped: list[str] = []
    store.on_drop(dropped.append)
    store.local_path(digest).write_bytes(b"rotten")
    assert await store.fetch(digest) == packed.data
    assert store.read_local(digest) == packed.data  # the good bytes replace it
    await trio.testing.wait_all_tasks_blocked()
    assert dropped == [digest]
