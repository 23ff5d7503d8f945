"""Hostile artifacts: each attack is rebuilt in the test and must be refused, with
nothing written outside the revision directory (checked by scanning a sandbox
around it), and a deploy of it over the API must be a 400 that writes nothing."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import corral.node.artifacts._artifact_store as artifact_store_module
from corral.node import ArtifactInvalid
from corral.node.artifacts import Manifest, pack_directory
from corral.node.artifacts._artifact_store import ArtifactStore, Materializer
from corral.node.artifacts._artifacts import (
    ArtifactLimits,
    digest_of,
    inspect_artifact,
    unpack_artifact,
)
from corral.node.server._api import ApiServices, build_api
from corral.registry import Deployment, MemoryRegistry

from .conftest import b64, make_app_dir, packed_app

Member = tuple[tarfile.TarInfo, bytes | None]


# --------------------------------------------------------------------------- building archives


def entry(name: str, kind: str = "file", data: bytes = b"x", link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    if kind == "file":
        info.size = len(data)
        return info, data
    info.type = {
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "chr": tarfile.CHRTYPE,
        "blk": tarfile.BLKTYPE,
    }[kind]
    info.linkname = link
    return info, None


def tar_bytes(members: Iterable[Member], *, end: bool = True) -> bytes:
    raw = io.BytesIO()
    tar = tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT)
    for info, data in members:
        tar.addfile(info, None if data is None else io.BytesIO(data))
    if end:
        tar.close()
    else:  # leave off the end-of-archive blocks (tarfile writes them on close)
        tar.fileobj = io.BytesIO()
        tar.closed = True
    return raw.getvalue()


def gz(*parts: bytes) -> bytes:
    """Each part as its own gzip member, concatenated (what ``cat a.gz b.gz`` gives)."""
    return b"".join(gzip.compress(part, mtime=0) for part in parts)


def archive(members: Iterable[Member]) -> bytes:
    return gz(tar_bytes(members))


def cve_2025_4517(component: int = 247) -> bytes:
    """The CVE-2025-4517 archive: a chain of symlinks whose resolved path overflows
    PATH_MAX, a link through it climbing back with '..', then a file written through it."""
    comp = "d" * component
    steps = "abcdefghijklmnop"
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(entry(os.path.join(path, comp), "dir"))
        members.append(entry(os.path.join(path, step), "symlink", link=comp))
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(entry(linkpath, "symlink", link="../" * len(steps)))
    members.append(entry("escape", "symlink", link=linkpath + "/.."))
    members.append(entry("escape/outside.txt", data=b"pwned\n"))
    return archive(members)


# --------------------------------------------------------------------------- the sandbox


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` (links not followed) with its content or link target."""
    found: dict[str, bytes | str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                found[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                found[path] = Path(path).read_bytes()
            else:
                found[path] = "dir"
    return found


class Sandbox:
    """A directory with a revision directory inside and secrets beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.revision = root / "apps" / "web" / "revisions" / "rev"
        root.mkdir(parents=True)
        (root / "token").write_text("node token\n")
        (root / "apps" / "other").mkdir(parents=True)
        (root / "apps" / "other" / "server.py").write_text("print('other app')\n")
        self.before = snapshot(root)

    def changed_outside(self) -> list[str]:
        """What appeared or changed outside the revision directory."""
        inside = str(self.revision) + os.sep
        after = snapshot(self.root)
        ancestors = {str(p) for p in self.revision.parents}
        return sorted(
            path
            for path, value in after.items()
            if self.before.get(path) != value
            and not path.startswith(inside)
            and path != str(self.revision)
            and path not in ancestors
        )

    def bytes_written(self) -> int:
        return sum(
            os.lstat(os.path.join(d, f)).st_size
            for d, _, files in os.walk(self.root)
            for f in files
        )


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path / "sandbox")


def refused(data: bytes, sandbox: Sandbox, limits: ArtifactLimits | None = None) -> str:
    """Assert ``data`` is refused by both the deploy check and the unpacker, and that
    nothing landed outside the revision directory; return the message."""
    extra = {} if limits is None else {"limits": limits}
    with pytest.raises(ArtifactInvalid) as checked:
        inspect_artifact(data, **extra)
    assert checked.value.field == "artifact"
    shutil.rmtree(sandbox.revision, ignore_errors=True)
    with pytest.raises(ArtifactInvalid) as unpacked:
        unpack_artifact(data, digest_of(data), sandbox.revision, **extra)
    assert str(unpacked.value) == str(checked.value)
    assert sandbox.changed_outside() == []
    return str(checked.value)


# --------------------------------------------------------------------------- the attacks


@pytest.mark.skipif(
    sys.version_info >= (3, 11, 13), reason="this interpreter's tarfile has the CVE-2025-4517 fix"
)
def test_the_cve_archive_does_escape_tarfiles_data_filter_on_this_interpreter(
    sandbox: Sandbox,
) -> None:
    # Why the filter is not trusted: the old unpacking wrote outside its directory.
    sandbox.revision.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(cve_2025_4517()), mode="r:gz") as tar:
        tar.extractall(sandbox.revision, filter="data")
    assert (sandbox.revision.parent / "outside.txt").read_bytes() == b"pwned\n"
    assert sandbox.changed_outside() == [str(sandbox.revision.parent / "outside.txt")]


@pytest.mark.parametrize(
    ("component", "rule"),
    [
        # as published: its chain of directories is refused for its length already
        (247, "refused: name too long (member 'dddd"),
        # with short names, by the rule the chain really breaks: nothing through a link
        (8, "refused: path passes through a symlink (member 'a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/ll"),
    ],
)
def test_the_cve_archive_is_refused_and_writes_nothing_outside(
    sandbox: Sandbox, component: int, rule: str
) -> None:
    assert rule in refused(cve_2025_4517(component), sandbox)


def test_a_member_through_an_earlier_symlink_is_refused(sandbox: Sandbox) -> None:
    data = archive(
        [entry("sub", "dir"), entry("inner", "symlink", link="sub"), entry("inner/f.txt")]
    )
    message = refused(data, sandbox)
    assert "path passes through a symlink (member 'inner/f.txt')" in message


def test_a_symlink_target_through_another_symlink_is_refused(sandbox: Sandbox) -> None:
    # d/up -> .. is inside; d/out -> up/../x is inside when read lexically, but
    # resolves through d/up to the parent of the revision directory.
    data = archive(
        [
            entry("d", "dir"),
            entry("d/up", "symlink", link=".."),
            entry("d/out", "symlink", link="up/../x"),
        ]
    )
    assert "symlink target passes through another symlink" in refused(data, sandbox)
    # ... also when the link it goes through comes later in the archive.
    later = archive(
        [entry("d/out", "symlink", link="up/../x"), entry("d/up", "symlink", link="..")]
    )
    assert "symlink target passes through another symlink" in refused(later, sandbox)


@pytest.mark.parametrize(
    ("members", "rule"),
    [
        ([entry("/etc/corral-evil")], "absolute name"),
        ([entry("../evil.txt")], "'..' component"),
        ([entry("a/../../evil.txt")], "'..' component"),
        ([entry("f"), entry("hl", "hardlink", link="f")], "hard link"),
        ([entry("pipe", "fifo")], "fifo"),
        ([entry("null", "chr")], "device"),
        ([entry("disk", "blk")], "device"),
        ([entry("l", "symlink", link="/etc/passwd")], "absolute symlink target"),
        ([entry("l", "symlink", link="../../token")], "symlink leaves the revision directory"),
        ([entry("d/l", "symlink", link="../../x")], "symlink leaves the revision directory"),
        ([entry("f"), entry("f", data=b"again")], "duplicate member"),
        ([entry("f"), entry("f/g")], "path passes through a file"),
        ([entry("x" * 300)], "name too long"),
        ([entry("/".join(["a"] * 49))], "name too long"),
        ([entry("l", "symlink", link="a/" * 600)], "symlink target too long"),
    ],
)
def test_members_breaking_a_rule_are_refused_naming_it(
    sandbox: Sandbox, members: list[Member], rule: str
) -> None:
    assert f"refused: {rule}" in refused(archive(members), sandbox)


def test_a_relative_symlink_staying_inside_is_kept(sandbox: Sandbox) -> None:
    data = archive(
        [
            entry("corral.toml", data=b'command = ["python3", "server.py"]\n'),
            entry("lib", "dir"),
            entry("lib/real.py", data=b"print(1)\n"),
            entry("server.py", "symlink", link="lib/real.py"),
            entry("lib/up", "symlink", link="../corral.toml"),
        ]
    )
    assert inspect_artifact(data).command == ("python3", "server.py")
    unpack_artifact(data, digest_of(data), sandbox.revision)
    assert os.readlink(sandbox.revision / "server.py") == "lib/real.py"
    assert (sandbox.revision / "server.py").read_bytes() == b"print(1)\n"
    assert sandbox.changed_outside() == []


def test_a_member_hidden_in_a_second_gzip_member_is_seen_by_check_and_unpack(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    head = tar_bytes([entry("corral.toml", data=b'command = ["true"]\n')], end=False)
    tail = tar_bytes([entry("../evil.txt", data=b"pwned\n")])
    data = gz(head, tail)
    # The trick: a stream reader stops after the first gzip member and sees no harm.
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as stream:
        assert [m.name for m in stream] == ["corral.toml"]
    assert "member '../evil.txt'" in refused(data, sandbox)
    # A harmless split archive: what the check reads is what is unpacked, both parts.
    benign = gz(head, tar_bytes([entry("second.txt", data=b"two\n")]))
    inspect_artifact(benign)
    target = tmp_path / "benign"
    unpack_artifact(benign, digest_of(benign), target)
    assert sorted(p.name for p in target.iterdir()) == ["corral.toml", "second.txt"]


MIB = 1024 * 1024


def test_a_bomb_over_the_configured_limit_is_refused_before_its_bytes_are_written(
    sandbox: Sandbox,
) -> None:
    data = archive(
        [entry("corral.toml", data=b'command = ["true"]\n'), entry("zeros", data=bytes(64 * MIB))]
    )
    assert len(data) < 100 * 1024  # 64 MiB of zeros compresses to ~64 KiB
    limits = ArtifactLimits(max_unpacked_bytes=1 * MIB)
    message = refused(data, sandbox, limits)
    assert "too large (member 'zeros')" in message
    assert "--max-artifact-mb" in message
    assert sandbox.bytes_written() < 64 * 1024


def test_a_bomb_is_refused_by_its_ratio_below_the_absolute_cap(sandbox: Sandbox) -> None:
    data = archive([entry("zeros", data=bytes(40 * MIB))])
    limits = ArtifactLimits(max_ratio=200, ratio_floor_bytes=1 * MIB)
    message = refused(data, sandbox, limits)
    assert (
        "refused: decompression bomb (member 'zeros'): its files would unpack to "
        "more than 200 times its" in message
    )
    assert sandbox.bytes_written() < 64 * 1024


def pax_bomb(size: int) -> bytes:
    """A member whose pax header holds ``size`` bytes: tarfile reads a header whole."""
    info = tarfile.TarInfo("f")
    info.pax_headers = {"comment": "x" * size}
    return archive([(info, None)])


def test_a_bomb_in_a_pax_header_is_stopped_before_tarfile_buffers_it(sandbox: Sandbox) -> None:
    message = refused(pax_bomb(8 * MIB), sandbox)  # default limits: the cap is far away
    assert "refused: oversized tar header: more than 262144 bytes of headers" in message


def test_the_unpacked_budget_holds_for_headers_too(sandbox: Sandbox) -> None:
    message = refused(pax_bomb(200 * 1024), sandbox, ArtifactLimits(max_unpacked_bytes=64 * 1024))
    assert "refused: too large: it unpacks to more than the 65536 bytes" in message


def test_many_members_with_modest_headers_pass(tmp_path: Path) -> None:
    # the header count starts afresh at each member: only one header's size is bounded
    members = []
    for i in range(64):
        info = tarfile.TarInfo(f"f{i}")
        info.pax_headers = {"comment": "x" * (16 * 1024)}
        members.append((info, None))
    data = archive(members)
    unpack_artifact(data, digest_of(data), tmp_path / "out")
    assert len(list((tmp_path / "out").iterdir())) == 64


def test_too_many_implied_directories_are_refused(sandbox: Sandbox) -> None:
    # each member implies 40 directories: the bookkeeping stays bounded too
    data = archive([entry(f"{i}/" + "/".join("d" * 40) + "/f") for i in range(3)])
    message = refused(data, sandbox, ArtifactLimits(max_members=20))
    assert "too many paths (member '1/d/d" in message


def test_too_many_members_are_refused(sandbox: Sandbox) -> None:
    data = archive([entry(f"f{i}") for i in range(11)])
    message = refused(data, sandbox, ArtifactLimits(max_members=10))
    assert "too many members (member 'f10'): more than 10 entries" in message


def test_a_normal_app_with_compressible_files_passes_the_default_limits(tmp_path: Path) -> None:
    app = make_app_dir(tmp_path / "app")
    (app / "data.txt").write_bytes(b"a" * (4 * MIB))  # ~1000:1, under the ratio floor
    packed = pack_directory(app)
    assert inspect_artifact(packed.data).command == ("python3", "server.py")
    unpack_artifact(packed.data, packed.digest, tmp_path / "out")
    assert (tmp_path / "out" / "data.txt").stat().st_size == 4 * MIB


@pytest.mark.parametrize(
    ("toml", "field", "words"),
    [
        ('command = ["python3", "server\\u0000.py"]\n', "command", "argument 1 holds a NUL"),
        ('command = "python3 a\\u0000b"\n', "command", "NUL"),
        ('command = ["true"]\n[env]\nMODE = "a\\u0000b"\n', "env", "[env] MODE holds a NUL"),
        (f'command = ["true", "{"x" * (128 * 1024 + 1)}"]\n', "command", "longer than"),
    ],
)
def test_manifest_text_no_process_can_take_is_refused(toml: str, field: str, words: str) -> None:
    data = archive([entry("corral.toml", data=toml.encode())])
    with pytest.raises(ArtifactInvalid) as caught:
        inspect_artifact(data)
    assert caught.value.field == field
    assert words in caught.value.message


def test_a_procfile_command_with_a_nul_is_refused() -> None:
    data = archive([entry("Procfile", data=b"web: python3 a\x00b\n")])
    with pytest.raises(ArtifactInvalid, match="NUL") as caught:
        inspect_artifact(data)
    assert caught.value.field == "command"


async def test_a_refused_revision_leaves_no_partial_directory(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    store = ArtifactStore(registry, tmp_path / "artifacts", node_id="n1", secret="s")
    data = cve_2025_4517(8)
    digest = await store.store(data)
    materialize = Materializer(store, tmp_path / "apps")
    with pytest.raises(ArtifactInvalid, match="passes through a symlink"):
        await materialize("web", Deployment(digest, ["true"]))
    assert list((tmp_path / "apps" / "web" / "revisions").iterdir()) == []


# --------------------------------------------------------------------------- over the API


class Api:
    def __init__(self, tmp_path: Path, limits: ArtifactLimits | None = None) -> None:
        self.registry = MemoryRegistry()
        self.store_dir = tmp_path / "artifacts"
        self.store = ArtifactStore(
            self.registry,
            self.store_dir,
            node_id="n1",
            secret="cluster-secret",
            limits=limits or ArtifactLimits(),
        )

        async def state() -> dict[str, Any]:
            return {}

        self.app = build_api(
            ApiServices(
                token="t",
                secret="cluster-secret",
                node_id="n1",
                registry=self.registry,
                artifacts=self.store,
                state=state,
                actors=dict,
                events=list,
                wall_clock=lambda: 1_700_000_000.0,
            )
        )

    async def deploy(self, data: bytes) -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://node",
            headers={"Authorization": "Bearer t"},
        ) as client:
            return await client.post("/v1/apps/web/deploy", json={"artifact": b64(data)})

    async def nothing_written(self) -> bool:
        keys = [kv.key for kv in await self.registry.range("")]
        return keys == [] and not (self.store_dir.exists() and any(self.store_dir.iterdir()))


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        (cve_2025_4517(8), "path passes through a symlink"),
        (archive([entry("corral.toml", data=b'command = ["true"]\n'), entry("../x")]), "'..'"),
        (archive([entry("corral.toml", data=b'command = ["true"]\n'), entry("p", "fifo")]), "fifo"),
        (archive([entry("zeros", data=bytes(8 * MIB))]), "too large (member 'zeros')"),
    ],
    ids=["cve-2025-4517", "dotdot", "fifo", "bomb"],
)
async def test_a_bad_artifact_deployed_over_the_api_is_400_and_writes_nothing(
    tmp_path: Path, data: bytes, rule: str
) -> None:
    api = Api(tmp_path, ArtifactLimits(max_unpacked_bytes=1 * MIB))
    response = await api.deploy(data)
    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "artifact"
    assert rule in body["error"]
    assert await api.nothing_written()


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        (b'command = ["python3", "server\\u0000.py"]\n', "command"),
        (b'command = ["true"]\n[env]\nMODE = "a\\u0000b"\n', "env"),
    ],
)
async def test_a_nul_in_the_manifest_is_400_naming_the_field(
    tmp_path: Path, toml: bytes, field: str
) -> None:
    api = Api(tmp_path)
    response = await api.deploy(archive([entry("corral.toml", data=toml)]))
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert "NUL" in response.json()["error"]
    assert await api.nothing_written()


async def test_a_good_artifact_still_deploys(tmp_path: Path) -> None:
    api = Api(tmp_path)
    response = await api.deploy(packed_app(tmp_path).data)
    assert response.status_code == 201


# --------------------------------------------------------------------------- fuzzing

# Mostly plausible members, so that many archives pass and are unpacked; the
# hostile parts (.., absolute names, special types) come in often enough to mix.
_plain = st.lists(st.sampled_from(["a", "b", "c", "e", "f", "."]), min_size=1, max_size=3)
_hostile = st.sampled_from(["..", "/abs", "a/../..", "/", "d" * 300, "./../x"])
_target = st.lists(st.sampled_from(["a", "b", "..", "..", "."]), min_size=1, max_size=4)
_bad_target = st.sampled_from(["/etc/passwd", "../../../token", "../other/server.py"])
_kind = st.sampled_from(["file"] * 6 + ["dir"] * 4 + ["symlink"] * 6)


@st.composite
def _members(draw: st.DrawFn) -> list[Member]:
    members: list[Member] = []
    names: list[str] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(_kind)
        if draw(st.integers(0, 30)) == 0:
            kind = draw(st.sampled_from(["hardlink", "fifo", "chr"]))
        name = draw(_hostile) if draw(st.integers(0, 30)) == 0 else "/".join(draw(_plain))
        if names and draw(st.booleans()):
            # names built on earlier ones: chains of links, and writes through them
            name = draw(st.sampled_from(names)) + "/" + name
        if draw(st.integers(0, 9)) == 0:
            link = draw(_bad_target)
        elif names and draw(st.booleans()):
            # through an earlier member, maybe climbing back out of it
            link = draw(st.sampled_from(names)) + "/.." * draw(st.integers(0, 3))
        else:
            link = "/".join(draw(_target))
        members.append(entry(name, kind, data=b"payload\n", link=link))
        names.append(name)
    return members


def accepted(action: Callable[[], object]) -> bool:
    """False when the archive is refused (a manifest naming no command is not the
    archive's fault: the unpacker never reads it)."""
    try:
        action()
    except ArtifactInvalid as exc:
        return exc.field != "artifact"
    return True


@st.composite
def _link_chains(draw: st.DrawFn) -> list[Member]:
    """Links at several depths whose targets name each other and climb with '..':
    where a lexical check alone lets an escape through."""
    members = [entry("a", "dir"), entry("a/b", "dir")]
    spots = ["x", "y", "a/x", "a/y", "a/b/x", "a/b/y"]
    for spot in draw(st.lists(st.sampled_from(spots), min_size=1, max_size=4, unique=True)):
        climb = "/.." * draw(st.integers(0, 3))
        target = draw(
            st.one_of(
                st.lists(st.sampled_from(["x", "y", "a", "b", "..", "."]), max_size=4).map(
                    "/".join
                ),
                st.sampled_from([other + climb for other in spots]),  # through another
                st.just(climb.lstrip("/")),  # up to an ancestor
            )
        )
        members.append(entry(spot, "symlink", link=target or "."))
    if draw(st.booleans()):
        members.append(entry(draw(st.sampled_from(spots)) + "/f"))
    return members


def refused_or_inside(members: list[Member], split: bool) -> None:
    """The property: the archive is refused by the deploy check and by the unpacker
    alike, or unpacked with every path (links resolved) inside the revision
    directory; either way nothing outside it changed."""
    if split and len(members) > 1:
        data = gz(tar_bytes(members[:1], end=False), tar_bytes(members[1:]))
    else:
        data = archive(members)
    with tempfile.TemporaryDirectory() as scratch:
        sandbox = Sandbox(Path(scratch) / "sandbox")
        checked_ok = accepted(lambda: inspect_artifact(data))
        unpacked_ok = accepted(lambda: unpack_artifact(data, digest_of(data), sandbox.revision))
        assert sandbox.changed_outside() == []
        assert checked_ok == unpacked_ok  # the deploy check and the node agree
        if checked_ok:
            root = os.path.realpath(sandbox.revision)
            for directory, dirs, files in os.walk(sandbox.revision):
                for name in dirs + files:
                    resolved = os.path.realpath(os.path.join(directory, name))
                    assert resolved == root or resolved.startswith(root + os.sep)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=_members(), split=st.booleans())
def test_fuzzed_archives_are_refused_or_unpacked_entirely_inside(
    members: list[Member], split: bool
) -> None:
    refused_or_inside(members, split)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=_link_chains())
def test_fuzzed_link_chains_are_refused_or_stay_inside(members: list[Member]) -> None:
    refused_or_inside(members, split=False)


async def test_the_deploy_reads_the_archive_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large archive takes seconds to read: on the event loop it would stop the node
    # (its lease, its API) for that long.
    on_main_thread: list[bool] = []

    def watched(data: bytes, limits: ArtifactLimits) -> Manifest:
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        return inspect_artifact(data, limits)

    monkeypatch.setattr(artifact_store_module, "inspect_artifact", watched)
    api = Api(tmp_path)
    assert (await api.deploy(packed_app(tmp_path).data)).status_code == 201
    assert on_main_thread == [False]
