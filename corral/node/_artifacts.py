"""Artifacts: an app directory as a content-addressed, reproducible tar.gz.

Theory of operation: an app directory names its command in ``corral.toml``
(``command = ["python3", "server.py"]`` and an optional ``[env]`` table) or in
a ``Procfile`` (``web: python3 server.py``). :func:`pack_directory` turns the
directory into a gzipped tar whose bytes depend only on the files' relative
paths, contents and executable bits — entries sorted, owners, times and the
gzip header zeroed — so packing the same tree twice gives the same sha256,
which is the artifact's name (its *digest*) and the app's revision.
:func:`unpack_artifact` checks the digest, refuses members that would land
outside the target or are not plain files, directories or links inside it,
and bounds what it will write.

Everything here is synchronous file and byte work with no clock and no trio;
the node calls the blocking parts from a worker thread.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shlex
import stat
import tarfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.node._errors import ArtifactInvalid, DigestMismatch

MANIFEST_FILE = "corral.toml"
PROCFILE = "Procfile"
#: Artifacts up to this size are stored in the registry itself (etcd refuses
#: requests above 1.5 MiB); larger ones stay on the node that received them.
REGISTRY_ARTIFACT_LIMIT = 1024 * 1024
#: The largest artifact a node accepts at all.
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024
#: The most an artifact may unpack to, and how many entries it may hold.
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
MAX_MEMBERS = 20_000

# Never packed: version control, caches, virtualenvs, a node's own data dir.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", ".corral", ".mypy_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Manifest:
    """What an artifact runs: the command (argv) and extra environment."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PackedArtifact:
    """The tar.gz bytes, their sha256 hex digest, and the manifest read from them."""

    data: bytes = field(repr=False)
    digest: str
    manifest: Manifest

    @property
    def size(self) -> int:
        return len(self.data)


def digest_of(data: bytes) -> str:
    """The sha256 hex digest naming ``data``."""
    return hashlib.sha256(data).hexdigest()


def parse_manifest(corral_toml: bytes | None, procfile: bytes | None) -> Manifest:
    """Read the command from ``corral.toml`` (preferred) or a ``Procfile``.

    Args:
        corral_toml: the bytes of ``corral.toml``, or None when absent.
        procfile: the bytes of ``Procfile``, or None when absent.

    Raises:
        ArtifactInvalid: (field ``command``) neither names a command, or one is malformed.
    """
    if corral_toml is not None:
        return _parse_corral_toml(corral_toml)
    if procfile is not None:
        return _parse_procfile(procfile)
    raise ArtifactInvalid(
        "command",
        f"no {MANIFEST_FILE} or {PROCFILE} names a command; add a {MANIFEST_FILE} with "
        f'command = ["python3", "server.py"], or a {PROCFILE} with "web: python3 server.py"',
    )


def _parse_corral_toml(raw: bytes) -> Manifest:
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ArtifactInvalid("command", f"{MANIFEST_FILE} is not valid TOML: {exc}") from exc
    command = document.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(arg, str) and arg for arg in command)
    ):
        raise ArtifactInvalid(
            "command",
            f"{MANIFEST_FILE} must set command to a non-empty list of strings, "
            'e.g. command = ["python3", "server.py"]',
        )
    env = document.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(value, str | int | float) and not isinstance(value, bool)
        for value in env.values()
    ):
        raise ArtifactInvalid(
            "env", f'{MANIFEST_FILE}: [env] must be a table of strings, e.g. GREETING = "hi"'
        )
    for name in env:
        _check_env_name(name, where=f"{MANIFEST_FILE} [env]")
    return Manifest(tuple(command), {str(k): str(v) for k, v in env.items()})


def _parse_procfile(raw: bytes) -> Manifest:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactInvalid("command", f"{PROCFILE} is not UTF-8 text") from exc
    entries: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, rest = line.partition(":")
        if sep and kind.strip():
            entries[kind.strip()] = rest.strip()
    if "web" not in entries or not entries["web"]:
        found = ", ".join(sorted(entries)) or "none"
        raise ArtifactInvalid(
            "command",
            f'{PROCFILE} has no "web: <command>" line (process types found: {found}); '
            "add one, e.g. web: python3 server.py",
        )
    try:
        argv = shlex.split(entries["web"])
    except ValueError as exc:
        raise ArtifactInvalid("command", f"{PROCFILE} web command: {exc}") from exc
    return Manifest(tuple(argv))


def _check_env_name(name: str, *, where: str) -> None:
    if (
        not name
        or not (name[0].isalpha() or name[0] == "_")
        or not all(c.isalnum() or c == "_" for c in name)
    ):
        raise ArtifactInvalid(
            "env", f"{where}: {name!r} is not an environment variable name (use A-Z, 0-9, _)"
        )


def _tarinfo(name: str, path: Path, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    else:
        raise ArtifactInvalid(
            "path", f"{path} is neither a file, a directory nor a symlink; remove it"
        )
    return info


def pack_directory(directory: Path) -> PackedArtifact:
    """Pack an app directory into a reproducible tar.gz.

    Args:
        directory: holds the app and its ``corral.toml`` or ``Procfile``.

    Returns:
        The packed artifact, with its digest and manifest.

    Raises:
        ArtifactInvalid: the directory is missing, names no command, holds a special
            file, or packs to more than :data:`MAX_ARTIFACT_BYTES`.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ArtifactInvalid("path", f"{directory} is not a directory; give the app's directory")
    try:
        manifest = parse_manifest(
            _read_optional(root / MANIFEST_FILE), _read_optional(root / PROCFILE)
        )
    except ArtifactInvalid as exc:
        # Name the directory: the operator may have pointed at the wrong one.
        raise ArtifactInvalid(exc.field, f"{directory}: {exc.message}") from None
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative in _walk(root):
            path = root / relative
            st = path.lstat()
            info = _tarinfo(relative, path, st)
            if info.isreg():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    compressed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    data = compressed.getvalue()
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ArtifactInvalid(
            "path",
            f"{directory} packs to {len(data)} bytes, more than the {MAX_ARTIFACT_BYTES} allowed; "
            "leave build outputs and data out of the app directory",
        )
    return PackedArtifact(data, digest_of(data), manifest)


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _walk(root: Path) -> list[str]:
    """Relative POSIX paths of everything to pack, sorted, parents before children."""
    found: list[str] = []
    for current, dirs, files in os.walk(root):
        base = Path(current).relative_to(root)
        kept = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in kept:
            if (Path(current) / name).is_symlink():
                files.append(name)  # a link to a directory is packed as a link
        dirs[:] = [d for d in kept if not (Path(current) / d).is_symlink()]
        found.extend((base / d).as_posix() for d in dirs)
        found.extend((base / f).as_posix() for f in files if not f.endswith(SKIPPED_SUFFIXES))
    return sorted(found)


def read_artifact_manifest(data: bytes) -> Manifest:
    """Read the manifest out of artifact bytes without unpacking them.

    Raises:
        ArtifactInvalid: (field ``artifact``) not a gzipped tar; (field ``command``)
            it names no command.
    """
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for name in (MANIFEST_FILE, PROCFILE):
                try:
                    member = tar.getmember(name)
                except KeyError:
                    continue
                handle = tar.extractfile(member) if member.isreg() else None
                if handle is not None:
                    files[name] = handle.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArtifactInvalid("artifact", f"not a gzipped tar archive: {exc}") from exc
    return parse_manifest(files.get(MANIFEST_FILE), files.get(PROCFILE))


def unpack_artifact(data: bytes, digest: str, target: Path) -> None:
    """Verify ``data`` against ``digest`` and unpack it into ``target`` (created).

    Raises:
        DigestMismatch: the bytes hash to something else.
        ArtifactInvalid: (field ``artifact``) not a gzipped tar, a member escapes the
            target or is a device, or it unpacks to more than the limits allow.
    """
    actual = digest_of(data)
    if actual != digest:
        raise DigestMismatch(
            f"artifact {digest} arrived as bytes hashing to {actual}; refusing to unpack it "
            "(deploy the app again)"
        )
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            if len(members) > MAX_MEMBERS:
                raise ArtifactInvalid(
                    "artifact", f"holds {len(members)} entries, more than {MAX_MEMBERS}"
                )
            total = sum(member.size for member in members)
            if total > MAX_UNPACKED_BYTES:
                raise ArtifactInvalid(
                    "artifact", f"unpacks to {total} bytes, more than {MAX_UNPACKED_BYTES}"
                )
            target.mkdir(parents=True, exist_ok=True)
            tar.extractall(target, filter="data")
    except tarfile.FilterError as exc:
        raise ArtifactInvalid("artifact", f"refused member: {exc}") from exc
    except (tarfile.TarError, EOFError) as exc:
        raise ArtifactInvalid("artifact", f"not a gzipped tar archive: {exc}") from exc
