"""The ArtifactReplicator on the memory registry, in virtual time: copies spread, a
stale lease holder writes nothing, old revisions and unused bytes are collected."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from corral.node import ArtifactNotFound
from corral.node.artifacts import pack_directory
from corral.node.artifacts._artifact_store import ArtifactStore, Download, Peer, run_inline
from corral.node.artifacts._copy_plan import Site
from corral.node.artifacts._replicator import ArtifactReplicator, GetArtifactState
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AppRecord,
    CoordinatorLease,
    CopyAssignment,
    Deployment,
    HeldCopies,
    MemoryRegistry,
    NodeRecord,
    app_key,
    artifact_key,
    copies_key,
    decode_record,
    held_key,
    node_key,
)
from corral.supervision import ChildSpec, open_actor_system

from .conftest import make_app_dir, packed_app


def version(root: Path, n: int) -> bytes:
    directory = make_app_dir(root / f"v{n}")
    (directory / "server.py").write_text(f"print({n})\n")
    return pack_directory(directory).data


SECRET = "s"
RACKS = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}


@dataclass
class Fleet:
    registry: MemoryRegistry
    root: Path
    stores: dict[str, ArtifactStore]
    running: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    downloads: list[tuple[str, str]] = field(default_factory=list)
    broken: set[str] = field(default_factory=set)
    system: Any = None
    #: what every store fetches with: the peer's copy as the API serves it
    download: Download | None = None

    def apps_dir(self, node: str) -> Path:
        return self.root / node / "apps"

    async def state(self, node: str) -> dict[str, Any]:
        return await self.system.ref(f"/artifacts-{node}").ask(GetArtifactState())  # type: ignore[no-any-return]


@asynccontextmanager
async def fleet(
    tmp_path: Path,
    nodes: tuple[str, ...] = ("n1", "n2", "n3"),
    *,
    holder: str = "n1",
    registry_limit: int = 10,
    copies: int = 2,
) -> AsyncIterator[Fleet]:
    registry = MemoryRegistry()
    stores: dict[str, ArtifactStore] = {}
    box = Fleet(registry, tmp_path, stores)

    def download(base_url: str, digest: str, capability: str, path: Path, limit: int) -> str:
        """The peer's copy as its API serves it (verified while it is read)."""
        peer = base_url.removeprefix("http://").split(":")[0]
        box.downloads.append((peer, digest))
        if peer in box.broken:
            raise OSError(f"{peer} is unreachable")
        copy = stores[peer].open_copy(digest)
        if copy is None:
            raise OSError(f"{peer} holds no copy (404)")
        sha = hashlib.sha256()
        try:
            with path.open("wb") as out:
                for chunk in copy.chunks():
                    sha.update(chunk)
                    out.write(chunk)
        finally:
            copy.close()
        return sha.hexdigest()

    box.download = download

    for node in nodes:
        await registry.put(
            node_key(node),
            NodeRecord(id=node, rack=RACKS[node], api_address=f"{node}:1").encode(),
        )
        stores[node] = ArtifactStore(
            registry,
            tmp_path / node / "artifacts",
            node_id=node,
            secret=SECRET,
            download=download,
            registry_limit=registry_limit,
            run_blocking=run_inline,
        )
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder, 0.0).encode())
    async with open_actor_system("test") as system:
        box.system = system
        for node in nodes:

            def factory(node: str = node) -> ArtifactReplicator:
                async def running() -> Mapping[str, set[str]]:
                    return box.running.get(node, {})

                return ArtifactReplicator(
                    node_id=node,
                    registry=registry,
                    store=stores[node],
                    apps_dir=box.apps_dir(node),
                    running=running,
                    copies=copies,
                    interval=1.0,
                    release_grace=2.0,
                    blob_grace=2.0,
                )

            await system.spawn(ChildSpec(name=f"artifacts-{node}", factory=factory))
        yield box


async def deploy(box: Fleet, node: str, app: str, data: bytes) -> str:
    digest = await box.stores[node].store(data)
    kv = await box.registry.get(app_key(app))
    before = None if kv is None else decode_record(kv.key, kv.value)
    previous = None
    if isinstance(before, AppRecord) and before.deployment is not None:
        previous = before.deployment
    record = AppRecord(app, deployment=Deployment(digest, ["true"]), previous_deployment=previous)
    await box.registry.put(app_key(app), record.encode())
    return digest


async def assignment(box: Fleet, digest: str) -> CopyAssignment | None:
    kv = await box.registry.get(copies_key(digest))
    record = None if kv is None else decode_record(kv.key, kv.value)
    return record if isinstance(record, CopyAssignment) else None


async def held(box: Fleet, node: str) -> set[str]:
    kv = await box.registry.get(held_key(node))
    record = None if kv is None else decode_record(kv.key, kv.value)
    return set(record.copies) if isinstance(record, HeldCopies) else set()


async def test_a_deployed_revision_gets_copies_in_both_racks(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path) as box:
        digest = await deploy(box, "n2", "web", packed_app(tmp_path).data)
        await trio.sleep(5)
        copy = await assignment(box, digest)
        assert copy is not None
        assert copy.apps == ["web"]
        assert copy.size > 0
        racks = {RACKS[n] for n in copy.holders}
        assert racks == {"r1", "r2"}
        for node in copy.holders:
            assert digest in await held(box, node)
            assert box.stores[node].read_local(digest) is not None
        # The one who received the deploy was fetched from.
        assert {peer for peer, _ in box.downloads} == {"n2"}
        state = await box.state("n1")
        assert state["coordinating"] is True


async def test_only_the_lease_holder_assigns(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path, holder="gone") as box:
        digest = await deploy(box, "n2", "web", packed_app(tmp_path).data)
        await trio.sleep(5)
        assert await assignment(box, digest) is None
        # Unassigned but live: the deploying node keeps its copy.
        assert box.stores["n2"].read_local(digest) is not None
        assert await held(box, "n2") == {digest}


async def test_a_fetch_that_fails_falls_back_and_names_the_holders_tried(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path, copies=3) as box:
        box.broken = {"n2"}
        digest = await deploy(box, "n2", "web", packed_app(tmp_path).data)
        await trio.sleep(3)
        state = await box.state("n3")
        assert "tried 2:" in state["failed"][digest]
        assert "n2 (" in state["failed"][digest]
        assert "unreachable" in state["failed"][digest]
        box.broken = set()
        await trio.sleep(3)
        for node in ("n1", "n2", "n3"):
            assert box.stores[node].read_local(digest) is not None


async def test_old_revisions_are_collected_and_running_ones_kept(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path, copies=3) as box:
        digests = []
        for n in range(4):
            data = version(tmp_path, n)
            digests.append(await deploy(box, "n1", "web", data))
            box.running["n3"] = {"web": {digests[0]}}  # an old process runs on n3
            for node in box.stores:
                (box.apps_dir(node) / "web" / "revisions" / digests[-1]).mkdir(parents=True)
            await trio.sleep(2)
        await trio.sleep(10)
        for node, store in box.stores.items():
            on_disk = set(store.held())
            unpacked = {p.name for p in (box.apps_dir(node) / "web" / "revisions").iterdir()}
            expected = {digests[2], digests[3]} | ({digests[0]} if node == "n3" else set())
            assert on_disk == expected, node
            assert unpacked == expected, node
        assert await assignment(box, digests[1]) is None


async def test_registry_kept_bytes_are_deleted_once_nothing_refers_to_them(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path, registry_limit=10 * 1024 * 1024) as box:
        digests = []
        for n in range(3):
            data = version(tmp_path, n)
            digests.append(await deploy(box, "n1", "web", data))
            await trio.sleep(1)
        await trio.sleep(10)
        assert await box.registry.get(artifact_key(digests[0])) is None
        assert await box.registry.get(artifact_key(digests[1])) is not None
        assert await box.registry.get(artifact_key(digests[2])) is not None


async def test_the_held_key_of_a_node_without_a_record_is_deleted_and_comes_back_with_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path) as box:
        digest = await deploy(box, "n2", "web", packed_app(tmp_path).data)
        # A node that left long ago: its key stayed, and nothing else of it did.
        await box.registry.put(held_key("n9"), HeldCopies("n9", {digest: 10}).encode())
        await trio.sleep(5)
        assert await box.registry.get(held_key("n9")) is None
        for node in ("n1", "n2", "n3"):
            assert await box.registry.get(held_key(node)) is not None
        # n3's record lapses: after the grace its key goes, and stays gone meanwhile.
        await box.registry.delete(node_key("n3"))
        await trio.sleep(10)
        assert await box.registry.get(held_key("n3")) is None
        # Back again: n3 writes what it holds on its next pass.
        await box.registry.put(
            node_key("n3"), NodeRecord(id="n3", rack="r2", api_address="n3:1").encode()
        )
        await trio.sleep(3)
        assert await held(box, "n3") == set(box.stores["n3"].held())
        assert await box.registry.get(held_key("n1")) is not None


async def test_a_corrupt_copy_is_dropped_by_its_holder_withdrawn_and_fetched_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with fleet(tmp_path, copies=3) as box:
        packed = packed_app(tmp_path)
        digest = await deploy(box, "n2", "web", packed.data)
        await trio.sleep(5)
        for node in ("n1", "n2", "n3"):
            assert digest in await held(box, node)
        path = box.stores["n3"].local_path(digest)
        rotten = bytearray(path.read_bytes())
        rotten[len(rotten) // 2] ^= 0xFF
        path.write_bytes(bytes(rotten))
        seen: list[set[str]] = []

        async def follow_held(task_status: trio.TaskStatus[None]) -> None:
            async with box.registry.watch(held_key("n3")) as events:
                task_status.started()
                async for event in events:
                    record = decode_record(event.kv.key, event.kv.value)
                    assert isinstance(record, HeldCopies)
                    seen.append(set(record.copies))

        async with trio.open_nursery() as nursery:
            await nursery.start(follow_held)
            # A node fetching from n3 gets no corrupt copy ...
            assert box.download is not None
            fetcher = ArtifactStore(
                box.registry,
                tmp_path / "n9" / "artifacts",
                node_id="n9",
                secret=SECRET,
                download=box.download,
                run_blocking=run_inline,
            )
            with pytest.raises(ArtifactNotFound, match=r"tried 1: n3 \(CopyCorrupt: "):
                await fetcher.fetch_copy(digest, [Peer("n3", "n3:1", Site("r2"))])
            assert fetcher.read_local(digest) is None
            # ... and n3 drops it, says so in held/n3, then fetches it again.
            await trio.sleep(3)
            nursery.cancel_scope.cancel()
        assert seen[0] == set()
        assert seen[-1] == {digest}
        assert box.stores["n3"].read_local(digest) == packed.data
