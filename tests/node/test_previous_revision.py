"""A deploy records the revision it replaces (kept for rollback and as a copy)."""

from __future__ import annotations

from pathlib import Path

from corral.node._artifacts import pack_directory
from corral.node._operations import deploy
from corral.node._requests import DeployRequest
from corral.registry import MemoryRegistry

from .conftest import make_app_dir


async def test_each_deploy_remembers_the_revision_before_it(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    packs = []
    for n in range(3):
        directory = make_app_dir(tmp_path / f"v{n}")
        (directory / "server.py").write_text(f"print({n})\n")
        packs.append(pack_directory(directory))

    async def store(data: bytes) -> str:
        return next(p.digest for p in packs if p.data == data)

    async def run(n: int) -> tuple[str, str]:
        result = await deploy(registry, DeployRequest("web", packs[n].data), store, 0.0)
        assert result.app.deployment is not None
        return result.app.deployment.revision, result.app.deployment.previous

    assert await run(0) == (packs[0].digest, "")
    assert await run(1) == (packs[1].digest, packs[0].digest)
    # The same revision again keeps what it replaced, so rollback still has somewhere to go.
    assert await run(1) == (packs[1].digest, packs[0].digest)
    assert await run(2) == (packs[2].digest, packs[1].digest)
