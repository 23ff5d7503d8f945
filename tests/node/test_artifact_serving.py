"""A copy served to a peer over real HTTP (the node's API under Hypercorn, on
loopback): a good one arrives whole; a corrupt one is cut short before its end, so
the fetcher keeps nothing, and the holder drops it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
from hypercorn.trio import serve

from corral.node import ArtifactNotFound
from corral.node._config import Address
from corral.node.artifacts._artifact_store import (
    ArtifactStore,
    Peer,
    artifact_capability,
    download_over_http,
)
from corral.node.artifacts._copy_plan import Site
from corral.node.cli._local_cluster import free_port
from corral.node.server._server import hypercorn_config
from corral.registry import MemoryRegistry

from .test_artifact_disk import api_of, hidden

pytestmark = pytest.mark.slow

SECRET = "cluster-secret"
MIB = 1024 * 1024


@dataclass
class Holder:
    store: ArtifactStore
    base_url: str
    dropped: list[str]


@pytest.fixture
async def holder(tmp_path: Path) -> AsyncIterator[Holder]:
    registry = MemoryRegistry()
    store = ArtifactStore(
        registry, tmp_path / "holder" / "artifacts", node_id="n1", secret=SECRET, registry_limit=0
    )
    dropped: list[str] = []
    store.on_drop(dropped.append)
    app = api_of(store, registry, SECRET)
    port = free_port()
    config = hypercorn_config(Address("127.0.0.1", port))  # as the node serves its API
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve(app, config, shutdown_trigger=shutdown.wait))  # type: ignore[arg-type]
        with trio.fail_after(10):
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.02)
                    continue
                await stream.aclose()
                break
        yield Holder(store, f"http://127.0.0.1:{port}", dropped)
        shutdown.set()


async def fetch(holder: Holder, digest: str, into: Path) -> str:
    with trio.fail_after(20):
        result: str = await trio.to_thread.run_sync(
            download_over_http,
            holder.base_url,
            digest,
            artifact_capability(SECRET, digest),
            into,
            64 * MIB,
        )
    return result


async def test_a_good_copy_arrives_whole(holder: Holder, tmp_path: Path) -> None:
    data = os.urandom(5 * MIB + 3)
    digest = await holder.store.store(data)
    into = tmp_path / "fetched"
    assert await fetch(holder, digest, into) == digest
    assert into.read_bytes() == data


async def test_a_corrupt_copy_is_cut_short_and_dropped_by_its_holder(
    holder: Holder, tmp_path: Path
) -> None:
    data = os.urandom(5 * MIB + 3)
    digest = await holder.store.store(data)
    path = holder.store.local_path(digest)
    with path.open("r+b") as file:  # one byte rots on the holder's disk
        file.seek(MIB)
        byte = file.read(1)
        file.seek(MIB)
        file.write(bytes([byte[0] ^ 0x40]))
    # Through the store, as a fetching node does: nothing is kept, the holder named.
    fetcher = ArtifactStore(
        MemoryRegistry(), tmp_path / "fetcher" / "artifacts", node_id="n2", secret=SECRET
    )
    peer = Peer("n1", holder.base_url.removeprefix("http://"), Site())
    with trio.fail_after(20), pytest.raises(ArtifactNotFound, match=r"n1 \(RemoteProtocolError"):
        await fetcher.fetch_copy(digest, [peer])
    assert fetcher.read_local(digest) is None
    assert hidden(tmp_path / "fetcher") == []
    assert not path.exists()
    assert holder.dropped == [digest]
    # Asked again, the holder says it has none.
    with pytest.raises(httpx.HTTPStatusError, match="404"):
        await fetch(holder, digest, tmp_path / "again")
