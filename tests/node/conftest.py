"""Shared helpers for the node service's tests."""

from __future__ import annotations

import base64
from pathlib import Path

from corral.node.artifacts import PackedArtifact, pack_directory


def make_app_dir(root: Path, *, command: str = '["python3", "server.py"]') -> Path:
    """A tiny app directory with a corral.toml."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "corral.toml").write_text(f"command = {command}\n")
    (root / "server.py").write_text("print('hello')\n")
    return root


def packed_app(tmp_path: Path, name: str = "app") -> PackedArtifact:
    return pack_directory(make_app_dir(tmp_path / name))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
