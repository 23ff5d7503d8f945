"""Real processes: spawn in an own process group, log, watch, end the whole tree.

Signals go to the process *group* only while its leader is not reaped: an unreaped
leader (alive or zombie) keeps its pid, hence the group id, from being reused, so
``killpg`` can never reach a stranger. Descendants that left the group are found
with psutil, whose process handles refuse to signal a reused pid: by parentage,
and by the ``CORRAL_APP_INSTANCE`` marker in their environment, which finds even
one that ``setsid`` and a double fork took out of both group and ancestry.

:func:`enable_subreaper` makes the node a child subreaper (Linux), so such
orphans are re-parented to the node instead of init; ``reap_orphans`` collects
their exit status once they die, and only theirs (``orphans_to_reap``): the exit
status of a process the launcher (or anything else in the node) waits for is
never taken from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import trio

from corral.actors.process_supervisor._errors import SpawnFailed
from corral.actors.process_supervisor._launcher import LaunchSpec
from corral.actors.process_supervisor._layout import AppPaths
from corral.actors.process_supervisor._limits import (
    WATCHDOG_INTERVAL,
    CgroupParent,
    cgroup_oom_killed,
    memory_limit_reason,
    remove_cgroup,
    rss_exceeds,
)
from corral.actors.process_supervisor._logs import RotatingLog
from corral.actors.process_supervisor._policy import (
    INSTANCE_VAR,
    ChildProcess,
    ObservedProcess,
    PidRecord,
    is_leftover,
    is_marked_leftover,
    marker_scope,
    orphans_to_reap,
    parse_instance_marker,
)
from corral.actors.process_supervisor._readiness import http_status_passes
from corral.registry import HealthSpec

log = logging.getLogger("corral.actors.process_supervisor")

_POLL = 0.05


def write_json_atomically(path: Path, obj: object, *, durable: bool = True) -> None:
    """Write ``obj`` as JSON to ``path`` so a reader sees the old or the new file, never
    a partial one. ``durable``: fsync before the rename, so it survives a power loss
    (pid files do not need that: their processes would not survive it either)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        file = open(tmp, "w", encoding="utf-8")  # closed by the with below
    except FileNotFoundError:
        # The directory is there on every write but the first: make it only then (a
        # mkdir per write was a syscall and a caught FileExistsError per instance start).
        path.parent.mkdir(parents=True, exist_ok=True)
        file = open(tmp, "w", encoding="utf-8")
    with file:
        json.dump(obj, file, sort_keys=True)
        if durable:
            file.flush()
            os.fsync(file.fileno())
    os.replace(tmp, path)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.send_signal(sig)


class _ParentMap:
    """pid -> parent pid of every process, rebuilt at most every ``max_age`` seconds.

    Finding a process's descendants means reading every process's parent (Linux
    has no cheap reverse link), which takes milliseconds; stopping a hundred apps at
    once shares one scan. A process the scan did not see (started after it) always
    gets a fresh scan, or what it forked since would be missed. A descendant forked
    after the scan by a process it did see is still reached by the process-group
    signal, unless it also left the group.
    """

    def __init__(self, max_age: float = 0.05) -> None:
        self.max_age = max_age
        self._at = -float("inf")
        self._children: dict[int, list[int]] = {}
        self._seen: set[int] = set()

    def descendants(self, pid: int) -> list[psutil.Process]:
        now = time.monotonic()
        if now - self._at > self.max_age or pid not in self._seen:
            children: dict[int, list[int]] = {}
            seen: set[int] = set()
            for child, parent in _parent_pids():
                children.setdefault(parent, []).append(child)
                seen.add(child)
            self._children, self._seen, self._at = children, seen, time.monotonic()
        found: list[psutil.Process] = []
        stack = list(self._children.get(pid, ()))
        while stack:
            child = stack.pop()
            try:
                found.append(psutil.Process(child))
            except psutil.Error:
                continue
            stack.extend(self._children.get(child, ()))
        return found


def _proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the fields of ``/proc/<pid>/stat`` after the command name) of every
    process (Linux only): field 0 is the state, 1 the parent pid, 3 the session, 19
    the start time in clock ticks."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        yield int(name), stat[stat.rfind(b")") + 2 :].split()


def _parent_pids() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process: straight from ``/proc/<pid>/stat`` on Linux
    (a few milliseconds for hundreds of processes), through psutil elsewhere."""
    if not _HAS_PROC:  # pragma: no cover - not Linux
        return [(p.pid, p.ppid()) for p in psutil.process_iter() if _alive(p)]
    return [
        (pid, int(fields[1]))
        for pid, fields in _proc_stats()
        if len(fields) >= 2 and fields[1].isdigit()
    ]


_HAS_PROC = os.path.isdir("/proc/self")
_MARKER_PREFIX = INSTANCE_VAR.encode() + b"="


def _marker_of(pid: int) -> str | None:
    """The ``CORRAL_APP_INSTANCE`` of a live process, or None (none, not ours to read,
    a zombie, gone)."""
    if not _HAS_PROC:  # pragma: no cover - not Linux
        with contextlib.suppress(psutil.Error, OSError):
            return psutil.Process(pid).environ().get(INSTANCE_VAR)
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            data = file.read()
    except OSError:
        return None
    if data.startswith(_MARKER_PREFIX):
        start = len(_MARKER_PREFIX)
    else:
        at = data.find(b"\0" + _MARKER_PREFIX)
        if at < 0:
            return None
        start = at + 1 + len(_MARKER_PREFIX)
    end = data.find(b"\0", start)
    return data[start : end if end >= 0 else len(data)].decode("utf-8", "replace")


class _MarkerMap:
    """pid -> marker of every live process that carries one, rebuilt at most every
    ``max_age`` seconds (or on demand): a stop of many apps at once shares one scan."""

    def __init__(self, max_age: float = 0.05) -> None:
        self.max_age = max_age
        self._at = -float("inf")
        self._markers: dict[int, str] = {}

    def scan(self, *, fresh: bool = False) -> dict[int, str]:
        if fresh or time.monotonic() - self._at > self.max_age:
            me = os.getpid()
            pids = (
                [int(n) for n in os.listdir("/proc") if n.isdigit()] if _HAS_PROC else psutil.pids()
            )
            markers = {}
            for pid in pids:
                if pid != me and (marker := _marker_of(pid)) is not None:
                    markers[pid] = marker
            self._markers, self._at = markers, time.monotonic()
        return self._markers

    def carriers(self, marker: str, *, fresh: bool = False) -> list[psutil.Process]:
        """The live processes carrying exactly ``marker``."""
        if not marker:
            return []
        found = []
        for pid, seen in self.scan(fresh=fresh).items():
            if seen == marker:
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(pid))
        return found


_markers = _MarkerMap()


def _merge(*groups: Iterable[psutil.Process]) -> list[psutil.Process]:
    merged: dict[int, psutil.Process] = {}
    for group in groups:
        for proc in group:
            merged.setdefault(proc.pid, proc)
    return list(merged.values())


# --------------------------------------------------------------------------- subreaper

#: Leaders this interpreter's launchers started and have not reaped: pid -> marker.
_launched: dict[int, str] = {}
#: Spawns under way: their pid is not in ``_launched`` yet, so no orphan scan runs.
_spawning = 0
_subreaper = False
#: Adopted orphans seen alive (pid -> start ticks), for the next scan.
_adopted: dict[int, int] = {}

_PR_SET_CHILD_SUBREAPER = 36


def enable_subreaper() -> bool:
    """Make this process a child subreaper: orphaned descendants (an app's daemon that
    double-forked away) are re-parented to it rather than to init, so they stay in
    reach and their exit status is collected by ``reap_orphans``.

    Returns:
        True when enabled; False where the kernel has no such thing (not Linux) or
        refused (the reason is logged). Nothing else changes either way.
    """
    global _subreaper
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            log.warning("cannot become a child subreaper: %s", os.strerror(err))
            return False
    except (OSError, AttributeError) as exc:
        log.warning("cannot become a child subreaper: %s", exc)
        return False
    _subreaper = True
    return True


def _children() -> list[ChildProcess]:
    me = os.getpid()
    found = []
    for pid, fields in _proc_stats():
        if len(fields) < 20 or fields[1] != str(me).encode():
            continue
        zombie = fields[0] == b"Z"
        found.append(
            ChildProcess(
                pid=pid,
                start_ticks=int(fields[19]),
                session=int(fields[3]),
                zombie=zombie,
                marker=None if zombie or pid in _launched else _marker_of(pid),
            )
        )
    return found


def reap_orphans_now() -> int:
    """Collect every adopted orphan that has died (see ``orphans_to_reap``); return how
    many. Does nothing unless :func:`enable_subreaper` succeeded, or while a spawn is
    under way."""
    global _adopted
    if not _subreaper or _spawning or not _HAS_PROC:
        return 0
    scan = orphans_to_reap(
        _children(),
        own_session=os.getsid(0),
        own_marker=os.environ.get(INSTANCE_VAR),
        launched=frozenset(_launched),
        adopted=_adopted,
    )
    _adopted = dict(scan.adopted)
    reaped = 0
    for pid in scan.reap:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            reaped += done == pid
    return reaped


_parents = _ParentMap()


def _descendants(pid: int) -> list[psutil.Process]:
    return _parents.descendants(pid)


class OsProcess:
    """A real process started by :class:`OsLauncher` (see ``LaunchedProcess``)."""

    def __init__(
        self,
        process: trio.Process,
        spec: LaunchSpec,
        nursery: trio.Nursery,
        logs: tuple[RotatingLog, RotatingLog],
    ) -> None:
        self._process = process
        self._spec = spec
        self._logs = logs
        self._pumps_done = trio.Event()
        self._pump_scope = trio.CancelScope()
        self._stop_started = False
        self._stop_done = trio.Event()
        self._reaped = False
        self._returncode: int | None = None
        self._tree: list[psutil.Process] = []
        self._limit_exceeded: str | None = None
        self._cgroup: Path | None = None
        nursery.start_soon(self._pump_logs)

    def limit_memory(
        self, nursery: trio.Nursery, cgroups: CgroupParent | None, interval: float
    ) -> str:
        """Hold the process to ``spec.memory_mb``: its own cgroup when ``cgroups`` is
        given and that works, else the RSS watchdog. Returns which ("cgroup" or
        "watchdog")."""
        if cgroups is not None:
            name = f"corral-{self._spec.app}-{self.pid}"
            self._cgroup = cgroups.limit(name, self.pid, self._spec.memory_mb)
            if self._cgroup is not None:
                return "cgroup"
        nursery.start_soon(self._watch_memory, interval)
        return "watchdog"

    async def _watch_memory(self, interval: float) -> None:
        memory_mb = self._spec.memory_mb
        try:
            leader = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._exited():
            sizes: list[int] = []
            for proc in [leader, *_descendants(self.pid)]:
                with contextlib.suppress(psutil.Error):
                    sizes.append(proc.memory_info().rss)
            if rss_exceeds(sizes, memory_mb):
                self._limit_exceeded = memory_limit_reason(memory_mb)
                log.warning(
                    "app %s: pid %d uses %d MiB, past its limit of %d MiB; killing it",
                    self._spec.app,
                    self.pid,
                    sum(sizes) // (1024 * 1024),
                    memory_mb,
                )
                self.kill()
                return
            await trio.sleep(interval)

    @property
    def limit_exceeded(self) -> str | None:
        return self._limit_exceeded

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def reaped(self) -> bool:
        return self._reaped

    # ------------------------------------------------------------------ watching

    def _leader_exited(self) -> bool:
        try:
            result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return result is not None

    async def wait_exited(self) -> None:
        """Wait until the leader exited, without reaping it (so its pid, hence its group
        id, stays reserved). Each call watches its own pidfd, so any number of tasks may
        wait at once, also after the nursery of the process was cancelled."""
        if self._reaped:
            await trio.lowlevel.checkpoint()
            return
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = None
        if fd is None:  # pragma: no cover - kernels before 5.3
            while not self._leader_exited():  # noqa: ASYNC110 - no event to wait for
                await trio.sleep(_POLL)
            return
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)

    def _exited(self) -> bool:
        return self._reaped or self._leader_exited()

    async def _pump_logs(self) -> None:
        try:
            with self._pump_scope:
                async with trio.open_nursery() as nursery:
                    stdout, stderr = self._process.stdout, self._process.stderr
                    if stdout is not None:
                        nursery.start_soon(self._pump, stdout, self._logs[0])
                    if stderr is not None:
                        nursery.start_soon(self._pump, stderr, self._logs[1])
        finally:
            self._pumps_done.set()

    @staticmethod
    async def _pump(stream: trio.abc.ReceiveStream, sink: RotatingLog) -> None:
        try:
            while chunk := await stream.receive_some(65536):
                sink.write(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def wait_ready(self) -> bool:
        delay = _POLL
        with trio.move_on_after(self._spec.ready_timeout):
            while not self._exited():
                try:
                    stream = await trio.open_tcp_stream(
                        self._spec.ready_host, self._spec.public_port
                    )
                except OSError:
                    await trio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                await trio.aclose_forcefully(stream)
                return True
        return False

    async def check_ready(self) -> bool:
        if self._exited():
            return False
        return await probe_ready(self._spec.ready_host, self._spec.public_port, self._spec.health)

    # ------------------------------------------------------------------ ending

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._reaped:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _whole_tree(self, *, fresh: bool = False) -> list[psutil.Process]:
        """Descendants by parentage, and every process carrying this start's marker
        (those that left both the group and the ancestry)."""
        return _merge(
            self._tree,
            _descendants(self.pid),
            _markers.carriers(self._spec.instance, fresh=fresh),
        )

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        self._tree = _merge(self._tree, _markers.carriers(self._spec.instance, fresh=True))
        _signal_all(self._tree, signal.SIGKILL)

    async def finish(self) -> int:
        await self.wait_exited()
        # The zombie leader still holds the group id: end what it left in its group,
        # and what it left outside of it.
        self._tree = self._whole_tree()
        self.kill()
        await self._tree_gone()
        return await self.reap()

    async def _tree_gone(self) -> None:
        """SIGKILL is not instant: wait (up to 2 s) until every member of the tree died;
        then look again for marked processes forked meanwhile (a few rounds at most)."""
        for _ in range(3):
            with trio.move_on_after(2.0):
                while any(_alive(p) for p in self._tree):  # noqa: ASYNC110 - psutil polls
                    await trio.sleep(0.01)
            late = [
                p
                for p in _markers.carriers(self._spec.instance, fresh=True)
                if p.pid not in {q.pid for q in self._tree}
            ]
            if not late:
                return
            self._tree = _merge(self._tree, late)
            _signal_all(late, signal.SIGKILL)

    async def stop(self, grace: float) -> int:
        if self._stop_started:
            await self._stop_done.wait()
            return await self.reap()
        self._stop_started = True
        try:
            if not self._reaped:
                self._tree = self._whole_tree()
                self._signal_group(signal.SIGTERM)
                _signal_all(self._tree, signal.SIGTERM)
                with trio.move_on_after(grace):
                    await self.wait_exited()
                    # Descendants are not our children: psutil can only be polled.
                    while any(_alive(p) for p in self._tree):  # noqa: ASYNC110
                        await trio.sleep(_POLL)
                self.kill()
                await self._tree_gone()
            return await self.reap()
        finally:
            self._stop_done.set()

    async def reap(self) -> int:
        code = await self._process.wait()
        if self._reaped:
            return code
        self._reaped = True
        self._returncode = code
        _launched.pop(self.pid, None)
        if self._cgroup is not None:
            if cgroup_oom_killed(self._cgroup):
                self._limit_exceeded = memory_limit_reason(self._spec.memory_mb)
            remove_cgroup(self._cgroup)
            self._cgroup = None
        self._forget_pid_file()
        # Let the pumps write what the pipes still hold, then end them (a descendant
        # that escaped the group could keep a pipe open forever).
        with trio.move_on_after(1.0):
            await self._pumps_done.wait()
        self._pump_scope.cancel()
        stdout, stderr = self._logs
        stdout.close()
        stderr.write(_banner(f"pid {self.pid} exited with code {code}"))
        stderr.close()
        return code

    def _forget_pid_file(self) -> None:
        path = self._spec.paths.pid_file
        with contextlib.suppress(OSError, ValueError):
            record = PidRecord.from_json(json.loads(path.read_text()))
            if record is not None and record.pid == self.pid:
                path.unlink()


def _banner(text: str) -> bytes:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"--- corral {stamp}: {text} ---\n".encode()


def _observe(pid: int) -> tuple[psutil.Process, ObservedProcess] | None:
    try:
        proc = psutil.Process(pid)
        create_time = proc.create_time()
        cmdline = tuple(proc.cmdline())
    except psutil.Error:
        return None
    app = node = instance = None
    with contextlib.suppress(psutil.Error, OSError):
        environ = proc.environ()
        app, node = environ.get("CORRAL_APP"), environ.get("CORRAL_NODE")
        instance = environ.get(INSTANCE_VAR)
    return proc, ObservedProcess(create_time, cmdline, app, node, instance)


class OsLauncher:
    """Starts real processes (see ``Launcher``).

    Args:
        log_max_bytes: size at which stdout.log / stderr.log rotate.
        log_backups: rotated files kept per stream.
        memory_cgroups: whether an app's ``memory_mb`` is enforced with a cgroup v2
            ``memory.max`` where this node can create one (``None``: detect once, at
            the first limited start); ``False`` always uses the RSS watchdog.
        watchdog_interval: seconds between two RSS checks of the watchdog.
    """

    def __init__(
        self,
        *,
        log_max_bytes: int = 10 * 1024 * 1024,
        log_backups: int = 5,
        memory_cgroups: bool | None = None,
        watchdog_interval: float = WATCHDOG_INTERVAL,
    ) -> None:
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.watchdog_interval = watchdog_interval
        self._cgroups: CgroupParent | None = None
        self._cgroups_detected = memory_cgroups is False

    def _cgroup_parent(self) -> CgroupParent | None:
        if not self._cgroups_detected:
            self._cgroups_detected = True
            self._cgroups = CgroupParent.detect()
            log.info(
                "memory limits are enforced with %s",
                f"cgroup v2 under {self._cgroups.path}" if self._cgroups else "the RSS watchdog",
            )
        return self._cgroups

    async def spawn(self, spec: LaunchSpec, nursery: trio.Nursery) -> OsProcess:
        global _spawning
        if not spec.command:
            raise SpawnFailed(f"app {spec.app!r} has an empty command; deploy it with a command")
        try:
            spec.paths.logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpawnFailed(
                f"cannot start app {spec.app!r}: cannot create its log directory "
                f"{spec.paths.logs}: {exc.strerror or exc}; check the data directory"
            ) from exc
        sizes = {"max_bytes": self.log_max_bytes, "backups": self.log_backups}
        logs = (
            RotatingLog(spec.paths.stdout_log, **sizes),
            RotatingLog(spec.paths.stderr_log, **sizes),
        )
        _spawning += 1
        try:
            process = await trio.lowlevel.open_process(
                list(spec.command),
                cwd=str(spec.cwd),
                env=dict(spec.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            _launched[process.pid] = spec.instance
        except BaseException as exc:
            for sink in logs:
                sink.close()
            if isinstance(exc, OSError):
                raise SpawnFailed(
                    f"cannot start app {spec.app!r}: {list(spec.command)!r} in {spec.cwd}: "
                    f"{exc.strerror or exc}; check the deployment's command and that its "
                    "program exists in the artifact or on the node's PATH"
                ) from exc
            if isinstance(exc, ValueError | TypeError):
                # e.g. "embedded null byte": an argument or variable the OS cannot take
                raise SpawnFailed(
                    f"cannot start app {spec.app!r}: its command or environment cannot be "
                    f"passed to the OS ({type(exc).__name__}: {exc}); fix the deployment's "
                    "command and env (no NUL bytes, no '=' in variable names)"
                ) from exc
            raise
        finally:
            _spawning -= 1
        logs[1].write(
            _banner(f"{spec.app} revision {spec.revision[:12]} started as pid {process.pid}")
        )
        launched = OsProcess(process, spec, nursery, logs)
        if spec.memory_mb > 0:
            launched.limit_memory(nursery, self._cgroup_parent(), self.watchdog_interval)
        # The pid file lets a later life of the node find this process if this one dies.
        observed = _observe(process.pid)
        if observed is not None:
            _, seen = observed
            record = PidRecord(
                spec.app,
                spec.node_id,
                process.pid,
                seen.create_time,
                seen.cmdline,
                spec.revision,
                spec.instance,
            )
            try:
                write_json_atomically(spec.paths.pid_file, record.to_json(), durable=False)
            except OSError:
                log.exception("cannot write pid file %s", spec.paths.pid_file)
        return launched

    async def end_leftovers(
        self, data_dir: Path, grace: float, *, node_id: str | None = None
    ) -> list[PidRecord]:
        found: list[tuple[PidRecord, psutil.Process, Path | None]] = []
        for pid_file in sorted(AppPaths.apps_root(data_dir).glob("*/process.json")):
            try:
                record = PidRecord.from_json(json.loads(pid_file.read_text()))
            except (OSError, ValueError):
                record = None
            seen = None if record is None else _observe(record.pid)
            if record is not None and seen is not None and is_leftover(record, seen[1]):
                found.append((record, seen[0], pid_file))
            else:
                pid_file.unlink(missing_ok=True)
        if node_id is not None:
            found += self._marked_leftovers(
                node_id, marker_scope(node_id, data_dir), {record.pid for record, _, _ in found}
            )
        if found:
            async with trio.open_nursery() as nursery:
                for record, proc, where in found:
                    nursery.start_soon(self._end_leftover, record, proc, where, grace)
        return [record for record, _, _ in found]

    @staticmethod
    def _marked_leftovers(
        node_id: str, scope: str, known: set[int]
    ) -> list[tuple[PidRecord, psutil.Process, Path | None]]:
        """Processes carrying a marker of an earlier life of this node (``scope``: its id
        and data directory) that no pid file named: descendants that escaped their
        group (and their leader's death)."""
        live = frozenset(_launched.values())
        found: list[tuple[PidRecord, psutil.Process, Path | None]] = []
        for pid, marker in sorted(_markers.scan(fresh=True).items()):
            if pid in known or not is_marked_leftover(marker, scope=scope, live=live):
                continue
            observed = _observe(pid)
            parsed = parse_instance_marker(marker)
            if observed is None or parsed is None or observed[1].instance != marker:
                continue
            proc, seen = observed
            record = PidRecord(parsed[1], node_id, pid, seen.create_time, seen.cmdline, "", marker)
            found.append((record, proc, None))
        return found

    @staticmethod
    async def _end_leftover(
        record: PidRecord, leader: psutil.Process, pid_file: Path | None, grace: float
    ) -> None:
        log.warning(
            "ending pid %d of app %s left running by a previous life of this node",
            record.pid,
            record.app,
        )
        tree = _merge([leader], _descendants(record.pid), _markers.carriers(record.instance))
        # Only a pid file's leader heads a group of its own (it was started with one).
        owns_group = pid_file is not None

        def signal_tree(sig: signal.Signals) -> None:
            if owns_group and _alive(leader):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(record.pid, sig)
            _signal_all(tree, sig)

        signal_tree(signal.SIGTERM)
        _, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=grace))
        if alive:
            signal_tree(signal.SIGKILL)
            await trio.to_thread.run_sync(lambda: psutil.wait_procs(alive, timeout=5.0))
        if pid_file is not None:
            pid_file.unlink(missing_ok=True)  # noqa: ASYNC240 - one small local file

    @property
    def adopts_orphans(self) -> bool:
        return _subreaper and _HAS_PROC

    async def reap_orphans(self) -> int:
        await trio.lowlevel.checkpoint()
        return reap_orphans_now()


#: Most bytes read of a health check's answer before its status line must have ended.
_STATUS_LINE_MAX = 4096


async def probe_ready(host: str, port: int, health: HealthSpec | None) -> bool:
    """One readiness check of ``host:port``: a TCP connection is accepted or, with a
    ``health.path``, an HTTP GET of it answers 2xx/3xx within ``health.timeout_ms``.
    Never raises."""
    timeout = (health.timeout_ms if health is not None else 1000) / 1000
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return False
        try:
            if health is None or not health.path:
                return True
            request = (
                f"GET {health.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "User-Agent: corral-health\r\nConnection: close\r\n\r\n"
            ).encode("ascii")
            await stream.send_all(request)
            seen = b""
            while b"\n" not in seen and len(seen) < _STATUS_LINE_MAX:
                chunk = await stream.receive_some(_STATUS_LINE_MAX)
                if not chunk:
                    break
                seen += chunk
            return http_status_passes(seen.split(b"\n", 1)[0])
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            await trio.aclose_forcefully(stream)
    return False
