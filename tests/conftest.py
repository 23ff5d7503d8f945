"""Settings and fixtures shared by the whole suite."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Two shared cores make per-example timings meaningless, so no deadlines anywhere.
settings.register_profile("dev", deadline=None)
# In CI the examples are derived from each test, not drawn at random: a run is
# reproducible, and a failure there is one a developer can replay exactly.
# Local runs keep exploring new examples.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@dataclass(frozen=True)
class SmallDisk:
    """A small tmpfs mounted for one test (see :func:`small_tmpfs`)."""

    path: Path

    def free(self) -> int:
        """Bytes free on it now."""
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, name: str = "filler", leave: int = 0) -> Path:
        """Write the file ``name`` until at most ``leave`` bytes are free (to the last
        block when ``leave`` is 0); returns its path."""
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1024 * 1024, 64 * 1024, 4096, 512):
                while self.free() - size >= leave or (leave == 0 and size <= 4096):
                    try:
                        os.write(fd, b"\xa5" * size)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return path


@pytest.fixture
def small_tmpfs() -> Iterator[Callable[[int], SmallDisk]]:
    """``mount(size_mib) -> SmallDisk``: a fresh tmpfs of that size, for tests of a
    full disk; unmounted at the end. Skips the test when it cannot be mounted (it
    needs root, as in CI)."""
    mounted: list[Path] = []

    def mount(size_mib: int) -> SmallDisk:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root (CI runs the tests as root)")
        path = Path(tempfile.mkdtemp(prefix="corral-tmpfs-", dir="/tmp"))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            path.rmdir()
            pytest.skip(f"cannot mount a tmpfs at {path}: {done.stderr.strip() or done.returncode}")
        mounted.append(path)
        return SmallDisk(path)

    yield mount
    for path in mounted:
        # Lazily when busy: a process the test started may still be exiting.
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)
