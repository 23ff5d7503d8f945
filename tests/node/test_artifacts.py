"""Artifacts: manifests, reproducible packing, checked unpacking."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from corral.node import ArtifactInvalid, DigestMismatch
from corral.node.artifacts import pack_directory, parse_manifest
from corral.node.artifacts._artifacts import digest_of, inspect_artifact, unpack_artifact


def make_app(root: Path) -> Path:
    root.mkdir()
    (root / "corral.toml").write_text(
        'command = ["python3", "server.py"]\n[env]\nGREETING = "hi"\n'
    )
    (root / "server.py").write_text("print('hi')\n")
    (root / "static").mkdir()
    (root / "static" / "a.txt").write_text("a")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return root


def test_manifest_from_corral_toml_and_procfile() -> None:
    manifest = parse_manifest(b'command = ["python3", "s.py"]\n[env]\nA = "1"\n', None)
    assert manifest.command == ("python3", "s.py")
    assert dict(manifest.env) == {"A": "1"}
    assert parse_manifest(None, b"# c\nworker: x\nweb: python3 -m http.server\n").command == (
        "python3",
        "-m",
        "http.server",
    )


@pytest.mark.parametrize(
    ("toml", "procfile", "field"),
    [
        (None, None, "command"),
        (b"command = []", None, "command"),
        (b"command = [1]", None, "command"),
        (b"not toml [", None, "command"),
        (None, b"worker: x\n", "command"),
        (b'command = ["x"]\n[env]\n"1A" = "x"\n', None, "env"),
    ],
)
def test_bad_manifests_name_the_field(
    toml: bytes | None, procfile: bytes | None, field: str
) -> None:
    with pytest.raises(ArtifactInvalid) as caught:
        parse_manifest(toml, procfile)
    assert caught.value.field == field


def test_packing_is_reproducible(tmp_path: Path) -> None:
    app = make_app(tmp_path / "app")
    first = pack_directory(app)
    os.utime(app / "server.py", (1, 1))
    second = pack_directory(app)
    assert first.digest == second.digest == digest_of(first.data)
    assert first.manifest.command == ("python3", "server.py")
    with tarfile.open(fileobj=io.BytesIO(first.data), mode="r:gz") as tar:
        names = tar.getnames()
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert names == sorted(names)
    assert "__pycache__" not in " ".join(names)
    (app / "server.py").write_text("print('changed')\n")
    assert pack_directory(app).digest != first.digest


def test_unpack_round_trip_keeps_exec_bit(tmp_path: Path) -> None:
    packed = pack_directory(make_app(tmp_path / "app"))
    target = tmp_path / "out"
    unpack_artifact(packed.data, packed.digest, target)
    assert (target / "static" / "a.txt").read_text() == "a"
    assert os.access(target / "run.sh", os.X_OK)
    assert inspect_artifact(packed.data).env == {"GREETING": "hi"}


def test_unpack_refuses_wrong_digest(tmp_path: Path) -> None:
    packed = pack_directory(make_app(tmp_path / "app"))
    with pytest.raises(DigestMismatch):
        unpack_artifact(packed.data, "0" * 64, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unpack_refuses_escaping_members(tmp_path: Path) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    data = raw.getvalue()
    with pytest.raises(ArtifactInvalid, match=r"refused: '..' component"):
        unpack_artifact(data, digest_of(data), tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()


def test_missing_command_and_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactInvalid, match="names a command") as no_command:
        pack_directory(tmp_path / "empty")
    # The message names the directory the operator pointed at, and the field.
    assert no_command.value.field == "command"
    assert str(tmp_path / "empty") in str(no_command.value)
    assert "no corral.toml or Procfile" in str(no_command.value)
    with pytest.raises(ArtifactInvalid, match="is not a directory"):
        pack_directory(tmp_path / "nope")
    with pytest.raises(ArtifactInvalid) as caught:
        inspect_artifact(b"not a tarball")
    assert caught.value.field == "artifact"
