"""An app's declared ``memory_mb`` as a limit, not only a reservation.

Theory of operation
-------------------
An app deployed with ``--memory-mb N`` is placed where N MiB are free, and its
process may use at most N MiB. Two ways to hold it to that, the first that works:

* **cgroup v2.** Where ``/sys/fs/cgroup`` is a cgroup v2 hierarchy with the memory
  controller, and the node can create a cgroup under its own with
  ``memory.max`` writable, each limited process gets a cgroup of its own
  (``corral-<app>-<pid>``) with ``memory.max`` = N MiB (and no swap). The
  kernel ends the process (its OOM killer) when the whole cgroup — the process
  and everything it forks — passes the limit; ``memory.events`` then counts an
  ``oom_kill``, which is how the node tells that exit from a crash. The process
  moves into its cgroup right after it is spawned: what it allocates before
  that (a few milliseconds) is not counted.
* **The RSS watchdog,** everywhere else (cgroup v1, a read-only hierarchy, no
  root): every ``interval`` seconds the summed resident set size of the
  process and its descendants is compared with the limit; past it, the whole
  tree is killed (SIGKILL: a process outgrowing its memory gets no grace to
  grow further). A process allocating faster than it is polled can overshoot
  by what it allocates in one interval.

Either way the exit is reported with the reason :func:`memory_limit_reason`
("memory limit 512 MiB exceeded"), in ``corral ps`` and ``GET /v1/state``, and
the process is restarted with backoff like any other exit.

Decisions here are pure (:func:`rss_exceeds`, :func:`parse_own_cgroup`,
:func:`oom_kills`); the rest is a thin shell over the cgroup files.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger("corral.actors.process_supervisor")

MIB: Final = 1024 * 1024
#: Seconds between two RSS checks of the watchdog.
WATCHDOG_INTERVAL: Final = 0.2
CGROUP_MOUNT: Final = Path("/sys/fs/cgroup")


def memory_limit_reason(memory_mb: int) -> str:
    """The reason shown for a process ended for passing its memory limit."""
    return f"memory limit {memory_mb} MiB exceeded"


def rss_exceeds(rss_bytes: Iterable[int], memory_mb: int) -> bool:
    """Whether the summed resident set sizes pass a limit of ``memory_mb`` MiB
    (0: no limit)."""
    return memory_mb > 0 and sum(rss_bytes) > memory_mb * MIB


def parse_own_cgroup(text: str) -> str | None:
    """The cgroup v2 path of a process from its ``/proc/<pid>/cgroup`` text (the
    ``0::<path>`` line), or None when it has none."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def oom_kills(events_text: str) -> int:
    """The ``oom_kill`` count of a cgroup's ``memory.events`` text (0 when absent)."""
    for line in events_text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


@dataclass(frozen=True, slots=True)
class CgroupParent:
    """A cgroup v2 directory under which this node can create limited cgroups."""

    path: Path

    @classmethod
    def detect(
        cls, mount: Path = CGROUP_MOUNT, self_cgroup: Path = Path("/proc/self/cgroup")
    ) -> CgroupParent | None:
        """Find where this process may create memory-limited cgroups; None when it
        cannot (not cgroup v2, no memory controller, not writable)."""
        try:
            controllers = (mount / "cgroup.controllers").read_text().split()
            own = parse_own_cgroup(self_cgroup.read_text())
        except OSError:
            return None
        if "memory" not in controllers or own is None:
            return None
        parent = mount / own.lstrip("/")
        try:
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                # Fails with EBUSY when processes live in ``parent`` itself (the cgroup
                # v2 rule of no internal processes) or without the right to.
                (parent / "cgroup.subtree_control").write_text("+memory")
            probe = parent / f"corral-probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            try:
                writable = os.access(probe / "memory.max", os.W_OK)
            finally:
                probe.rmdir()
        except OSError:
            return None
        return cls(parent) if writable else None

    def limit(self, name: str, pid: int, memory_mb: int) -> Path | None:
        """Create cgroup ``name`` with ``memory.max`` = ``memory_mb`` MiB and move
        ``pid`` into it; None (and nothing left behind) when any step fails."""
        path = self.path / name
        try:
            path.mkdir(exist_ok=True)
            (path / "memory.max").write_text(str(memory_mb * MIB))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
            (path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.info("cannot limit pid %d with cgroup %s (%s); using the watchdog", pid, path, exc)
            remove_cgroup(path)
            return None
        return path


def cgroup_oom_killed(path: Path) -> bool:
    """Whether the kernel ended a process of the cgroup for passing ``memory.max``."""
    try:
        return oom_kills((path / "memory.events").read_text()) > 0
    except OSError:
        return False


def remove_cgroup(path: Path) -> None:
    """Remove an (empty) cgroup; a failure is logged, never raised."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove cgroup %s: %s", path, exc)
