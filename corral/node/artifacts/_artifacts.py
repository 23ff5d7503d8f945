"""Artifacts: an app directory as a content-addressed, reproducible tar.gz.

Theory of operation: an app directory names its command in ``corral.toml``
(``command = ["python3", "server.py"]`` and an optional ``[env]`` table) or in
a ``Procfile`` (``web: python3 server.py``). :func:`pack_directory` turns the
directory into a gzipped tar whose bytes depend only on the files' relative
paths, contents and executable bits — entries sorted, owners, times and the
gzip header zeroed — so packing the same tree twice gives the same sha256,
which is the artifact's name (its *digest*) and the app's revision.
:func:`inspect_artifact` reads an artifact member by member and checks each one
lexically, never asking the file system: regular files, directories and
symlinks only (no hard links, devices or fifos), no absolute names, no ``..``,
no member written through an earlier symlink, and a symlink only when its
target is relative, stays inside when resolved from the link's directory, and
does not itself go through another symlink (the CVE-2025-4517 chain needs
exactly that). The member count and the unpacked size are bounded while the
gzip stream is decompressed — by :class:`ArtifactLimits`' absolute cap and by a
ratio to the compressed size — so a bomb is refused before its bytes exist; the
headers before one member (which tarfile buffers whole) are bounded on their own.
:func:`unpack_artifact` is the same loop with a writer that creates every
directory itself and opens every file ``O_EXCL | O_NOFOLLOW``: what was checked
is what is written, and tarfile's extraction filters are not relied on.

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
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.node._errors import ArtifactInvalid, DigestMismatch
from corral.node._requests import env_name_problem, exec_string_problem
from corral.registry import HealthSpec

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
#: Past RATIO_FLOOR_BYTES unpacked, more than MAX_RATIO times the compressed size is a bomb.
MAX_RATIO = 200
RATIO_FLOOR_BYTES = 32 * 1024 * 1024
#: Lexical bounds on member names and link targets (a path, one component, the depth).
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
MAX_DEPTH = 48
#: Header bytes (pax or GNU long-name records included) allowed before one member.
MAX_HEADER_BYTES = 256 * 1024
#: corral.toml and Procfile are read into memory: they are small by nature.
MAX_MANIFEST_BYTES = 1024 * 1024
#: Linux refuses a single argv or environment string longer than this (MAX_ARG_STRLEN).
MAX_ARG_BYTES = 128 * 1024
COPY_CHUNK = 1024 * 1024

# Never packed: version control, caches, virtualenvs, a node's own data dir.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", ".corral", ".mypy_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Manifest:
    """What an artifact runs: the command (argv) and extra environment, and its
    readiness check (``[health]``; None: the public port accepting TCP)."""

    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    health: HealthSpec | None = None


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
    for index, arg in enumerate(command):
        _check_process_text(arg, "command", f"{MANIFEST_FILE} command argument {index}")
    for name in env:
        _check_env_name(name, where=f"{MANIFEST_FILE} [env]")
    values = {str(k): str(v) for k, v in env.items()}
    for name, value in values.items():
        _check_process_text(value, "env", f"{MANIFEST_FILE} [env] {name}")
    return Manifest(tuple(command), values, _parse_health(document.get("health")))


def _parse_health(table: object) -> HealthSpec | None:
    """``[health] path = "/healthz"`` (optional ``interval_ms``, ``timeout_ms``)."""
    if table is None:
        return None
    example = '[health] path = "/healthz", interval_ms = 2000, timeout_ms = 1000'
    if not isinstance(table, dict):
        raise ArtifactInvalid("health", f"{MANIFEST_FILE}: [health] must be a table ({example})")
    unknown = sorted(set(table) - {"path", "interval_ms", "timeout_ms"})
    if unknown:
        raise ArtifactInvalid(
            "health",
            f"{MANIFEST_FILE}: [health] has unknown keys {', '.join(map(repr, unknown))} "
            f"(known: path, interval_ms, timeout_ms)",
        )
    path = table.get("path", "")
    if not isinstance(path, str):
        raise ArtifactInvalid("health", f"{MANIFEST_FILE}: [health] path must be a string")
    defaults = HealthSpec()
    try:
        return HealthSpec(
            path=path,
            interval_ms=table.get("interval_ms", defaults.interval_ms),
            timeout_ms=table.get("timeout_ms", defaults.timeout_ms),
        )
    except ValueError as exc:
        raise ArtifactInvalid("health", f"{MANIFEST_FILE}: [health]: {exc}") from None


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
    for index, arg in enumerate(argv):
        _check_process_text(arg, "command", f"{PROCFILE} web command argument {index}")
    return Manifest(tuple(argv))


def _check_process_text(text: str, field_name: str, where: str) -> None:
    """Refuse text the kernel cannot pass to a process (argv or environment)."""
    problem = exec_string_problem(text)
    if problem is not None:
        raise ArtifactInvalid(field_name, f"{where} {problem}")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES:
        raise ArtifactInvalid(
            field_name, f"{where} is longer than the {MAX_ARG_BYTES} bytes a process accepts"
        )


def _check_env_name(name: str, *, where: str) -> None:
    problem = env_name_problem(name)
    if problem is not None:
        raise ArtifactInvalid("env", f"{where}: {problem}")


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


# --------------------------------------------------------------------------- reading archives


@dataclass(frozen=True)
class ArtifactLimits:
    """What one artifact may unpack to.

    Attributes:
        max_unpacked_bytes: the most the tar stream inside the gzip may hold
            (``--max-artifact-mb``), headers included.
        max_members: the most entries it may hold.
        max_ratio: past ``ratio_floor_bytes``, the most the tar stream may be as a
            multiple of the compressed size: more is a decompression bomb.
        ratio_floor_bytes: up to this many unpacked bytes the ratio is not judged, so a
            small app full of zeros or repeated text is never refused for it.
    """

    max_unpacked_bytes: int = MAX_UNPACKED_BYTES
    max_members: int = MAX_MEMBERS
    max_ratio: int = MAX_RATIO
    ratio_floor_bytes: int = RATIO_FLOOR_BYTES

    @classmethod
    def from_mb(cls, max_artifact_mb: int) -> ArtifactLimits:
        """Limits for ``--max-artifact-mb`` (MiB), the other bounds at their defaults."""
        return cls(max_unpacked_bytes=max_artifact_mb * 1024 * 1024)

    def budget(self, compressed: int) -> tuple[int, str, str]:
        """How many unpacked bytes ``compressed`` bytes may become, the rule that sets
        that bound, and the bound in words (both for the refusal message)."""
        by_ratio = max(self.ratio_floor_bytes, self.max_ratio * compressed)
        if by_ratio < self.max_unpacked_bytes:
            return (
                by_ratio,
                "decompression bomb",
                f"more than {self.max_ratio} times its {compressed} compressed bytes "
                f"(the ratio is judged past {self.ratio_floor_bytes} bytes)",
            )
        return (
            self.max_unpacked_bytes,
            "too large",
            f"more than the {self.max_unpacked_bytes} bytes --max-artifact-mb allows",
        )


DEFAULT_LIMITS = ArtifactLimits()


def _refuse(rule: str, member: str | None, detail: str) -> ArtifactInvalid:
    where = "" if member is None else f" (member {member!r})"
    return ArtifactInvalid("artifact", f"refused: {rule}{where}: {detail}")


class _BoundedGzip:
    """The decompressed bytes of every gzip member in turn, refusing to produce more
    than ``budget`` of them: the bound holds while streaming, before anything is
    written or even buffered.

    Outside a file's content (:meth:`content`), what is read is tar headers, which
    tarfile holds in memory whole (a pax header is read in one piece): those bytes,
    counted from the last member on, are bounded by :data:`MAX_HEADER_BYTES`, so a
    bomb hidden in a header cannot fill the memory either."""

    def __init__(self, data: bytes, budget: int, rule: str, bound: str) -> None:
        self._gzip = gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
        self._budget = budget
        self._rule = rule
        self._bound = bound
        self.produced = 0
        self._in_content = False
        self._header_bytes = 0

    def content(self, inside: bool) -> None:
        """Entering (True) or leaving (False) a file's content; either starts a new
        count of header bytes."""
        self._in_content = inside
        self._header_bytes = 0

    def read(self, size: int = -1) -> bytes:
        want = self._budget - self.produced + 1
        if size >= 0:
            want = min(want, size)
        try:
            chunk = self._gzip.read(want)
        except (OSError, EOFError, zlib.error) as exc:
            raise ArtifactInvalid("artifact", f"not a gzipped tar archive: {exc}") from exc
        self.produced += len(chunk)
        if self.produced > self._budget:
            raise _refuse(self._rule, None, f"it unpacks to {self._bound}")
        if not self._in_content:
            self._header_bytes += len(chunk)
            if self._header_bytes > MAX_HEADER_BYTES:
                raise _refuse(
                    "oversized tar header", None, f"more than {MAX_HEADER_BYTES} bytes of headers"
                )
        return chunk

    def close(self) -> None:
        self._gzip.close()


def _member_parts(name: str) -> tuple[str, ...]:
    """The member's path as components, checked lexically (no file system involved)."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse("name is not UTF-8", name, "rename it") from None
    if "\x00" in name:
        raise _refuse("NUL in a name", name, "rename it")
    if name.startswith("/"):
        raise _refuse("absolute name", name, "members must be relative to the app directory")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise _refuse("'..' component", name, "members must stay inside the app directory")
    if (
        len(encoded) > MAX_PATH_BYTES
        or len(parts) > MAX_DEPTH
        or any(len(p.encode()) > MAX_NAME_BYTES for p in parts)
    ):
        raise _refuse(
            "name too long",
            name[:80],
            f"paths are limited to {MAX_PATH_BYTES} bytes, {MAX_DEPTH} levels and "
            f"{MAX_NAME_BYTES} bytes per component",
        )
    return parts


def _link_walk(parent: tuple[str, ...], target: str, member: str) -> list[str]:
    """Resolve a symlink target lexically from the link's directory; refuse one that
    is absolute or climbs out. Returns every path the target uses as a directory on
    the way (none of them may be a link, checked by the caller)."""
    if not target or "\x00" in target:
        raise _refuse("symlink with an empty or NUL target", member, "remove the link")
    if target.startswith("/"):
        raise _refuse("absolute symlink target", member, f"{target!r} points outside")
    if len(target.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise _refuse("symlink target too long", member, f"more than {MAX_PATH_BYTES} bytes")
    stack = list(parent)
    used_as_directory: list[str] = []
    components = [c for c in target.split("/") if c not in ("", ".")]
    for index, component in enumerate(components):
        if component == "..":
            if not stack:
                raise _refuse("symlink leaves the revision directory", member, f"target {target!r}")
            stack.pop()
            continue
        stack.append(component)
        if index < len(components) - 1:
            used_as_directory.append("/".join(stack))
    return used_as_directory


class _Writer:
    """Writes members under a fresh root, creating every directory itself and never
    following a symlink: files are opened ``O_CREAT | O_EXCL | O_NOFOLLOW``."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        if root.is_symlink() or not root.is_dir():
            raise ArtifactInvalid("artifact", f"cannot unpack into {root}: not a directory")
        self._root = root
        self._made: set[tuple[str, ...]] = {()}

    def _path(self, parts: tuple[str, ...]) -> str:
        return os.path.join(self._root, *parts)

    def directory(self, parts: tuple[str, ...]) -> None:
        for depth in range(1, len(parts) + 1):
            prefix = parts[:depth]
            if prefix in self._made:
                continue
            path = self._path(prefix)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise _refuse("path used as a directory", "/".join(prefix), "") from None
            self._made.add(prefix)

    def open_file(self, parts: tuple[str, ...], executable: bool) -> int:
        self.directory(parts[:-1])
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(self._path(parts), flags, 0o755 if executable else 0o644)

    def symlink(self, parts: tuple[str, ...], target: str) -> None:
        self.directory(parts[:-1])
        os.symlink(target, self._path(parts))


@dataclass
class _Walk:
    """What one pass over an archive saw."""

    source: _BoundedGzip
    members: int = 0
    declared: int = 0
    kinds: dict[str, str] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)
    #: path a link target uses as a directory -> that link
    through: dict[str, str] = field(default_factory=dict)
    manifest_files: dict[str, bytes] = field(default_factory=dict)


def _walk_archive(data: bytes, limits: ArtifactLimits, writer: _Writer | None) -> _Walk:
    """Read every member of every gzip member once, check it, and (with a writer)
    write it. Validation and unpacking are this one loop, so they cannot disagree."""
    budget, rule, bound = limits.budget(len(data))
    source = _BoundedGzip(data, budget, rule, bound)
    walk = _Walk(source)
    try:
        # Stream mode over our own multi-member gzip reader: forward only, no seeks
        # that could decompress past the budget in one call.
        with tarfile.open(fileobj=source, mode="r|") as tar:  # type: ignore[call-overload]
            for info in tar:
                source.content(False)  # this member's headers are in: count afresh
                _take_member(tar, info, limits, (budget, rule, bound), walk, writer)
    except tarfile.TarError as exc:
        raise ArtifactInvalid("artifact", f"not a gzipped tar archive: {exc}") from exc
    finally:
        source.close()
    for used, link in sorted(walk.through.items()):
        if used in walk.links:
            raise _refuse(
                "symlink target passes through another symlink",
                link,
                f"its target goes through the link {used!r}; point it at the real path",
            )
    return walk


def _take_member(
    tar: tarfile.TarFile,
    info: tarfile.TarInfo,
    limits: ArtifactLimits,
    budget: tuple[int, str, str],
    walk: _Walk,
    writer: _Writer | None,
) -> None:
    name = info.name
    walk.members += 1
    if walk.members > limits.max_members:
        raise _refuse("too many members", name, f"more than {limits.max_members} entries")
    parts = _member_parts(name)
    path = "/".join(parts)
    if info.islnk():
        raise _refuse("hard link", name, "pack the file itself")
    if info.ischr() or info.isblk():
        raise _refuse("device", name, "only files, directories and symlinks are allowed")
    if info.isfifo():
        raise _refuse("fifo", name, "only files, directories and symlinks are allowed")
    kind = "dir" if info.isdir() else "file" if info.isreg() else "link" if info.issym() else ""
    if not kind:
        raise _refuse(f"member of type {info.type!r}", name, "only files, directories and symlinks")
    if not parts:
        if kind == "dir":
            return  # the root itself ("./")
        raise _refuse("non-directory at the root", name, "")
    prefix = ""
    for part in parts[:-1]:
        prefix = f"{prefix}/{part}" if prefix else part
        seen = walk.kinds.get(prefix)
        if seen == "link":
            raise _refuse(
                "path passes through a symlink",
                name,
                f"{prefix!r} is a symlink member; nothing may be written through it",
            )
        if seen == "file":
            raise _refuse("path passes through a file", name, f"{prefix!r} is a file member")
        walk.kinds[prefix] = "dir"
    if len(walk.kinds) > 4 * limits.max_members:
        raise _refuse(
            "too many paths", name, f"more than {4 * limits.max_members} files and directories"
        )
    seen = walk.kinds.get(path)
    if seen is not None:
        if seen == "dir" and kind == "dir":
            return
        raise _refuse("duplicate member", name, f"{path!r} appears twice")
    walk.kinds[path] = kind
    if kind == "dir":
        if writer is not None:
            writer.directory(parts)
        return
    if kind == "link":
        for used in _link_walk(parts[:-1], info.linkname, name):
            if used in walk.links:
                raise _refuse(
                    "symlink target passes through another symlink",
                    name,
                    f"its target goes through the link {used!r}; point it at the real path",
                )
            walk.through.setdefault(used, path)
        walk.links.add(path)
        if writer is not None:
            writer.symlink(parts, info.linkname)
        return
    walk.declared += info.size
    if walk.declared > budget[0]:
        raise _refuse(budget[1], name, f"its files would unpack to {budget[2]}")
    keep = path in (MANIFEST_FILE, PROCFILE)
    if keep and info.size > MAX_MANIFEST_BYTES:
        raise _refuse("manifest too large", name, f"more than {MAX_MANIFEST_BYTES} bytes")
    walk.source.content(True)
    _copy_content(tar, info, parts, walk, writer, keep=keep)
    walk.source.content(False)


def _copy_content(
    tar: tarfile.TarFile,
    info: tarfile.TarInfo,
    parts: tuple[str, ...],
    walk: _Walk,
    writer: _Writer | None,
    *,
    keep: bool,
) -> None:
    handle = tar.extractfile(info)
    assert handle is not None  # a regular file always has content
    kept: list[bytes] = []
    fd = None if writer is None else writer.open_file(parts, bool(info.mode & 0o111))
    try:
        while chunk := handle.read(COPY_CHUNK):
            if keep:
                kept.append(chunk)
            if fd is not None:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        if fd is not None:
            os.close(fd)
    if keep:
        walk.manifest_files["/".join(parts)] = b"".join(kept)


def inspect_artifact(data: bytes, limits: ArtifactLimits = DEFAULT_LIMITS) -> Manifest:
    """Check every member of artifact bytes, exactly as :func:`unpack_artifact` would,
    writing nothing, and return the manifest. Blocking and CPU-bound: call it from a
    worker thread.

    Raises:
        ArtifactInvalid: (field ``artifact``) not a gzipped tar, a member breaks a rule
            (the message names the rule and the member), or it unpacks to more than
            ``limits`` allow; (fields ``command``, ``env``) the manifest is invalid.
    """
    walk = _walk_archive(data, limits, None)
    return parse_manifest(walk.manifest_files.get(MANIFEST_FILE), walk.manifest_files.get(PROCFILE))


def unpack_artifact(
    data: bytes, digest: str, target: Path, limits: ArtifactLimits = DEFAULT_LIMITS
) -> None:
    """Verify ``data`` against ``digest`` and unpack it into ``target`` (created).

    ``tarfile``'s extraction filters are not relied on (CVE-2025-4517 bypasses the
    ``data`` filter on Python before 3.11.13 / 3.12.11 / 3.13.4): every member is
    checked lexically by :func:`inspect_artifact`'s rules and written here, by this
    module, without following any link. On a refusal ``target`` may hold part of the
    archive (each part inside it): unpack into a fresh directory and drop it on error.

    Raises:
        DigestMismatch: the bytes hash to something else.
        ArtifactInvalid: (field ``artifact``) as :func:`inspect_artifact`.
        OSError: the files cannot be written.
    """
    actual = digest_of(data)
    if actual != digest:
        raise DigestMismatch(
            f"artifact {digest} arrived as bytes hashing to {actual}; refusing to unpack it "
            "(deploy the app again)"
        )
    _walk_archive(data, limits, _Writer(target))
