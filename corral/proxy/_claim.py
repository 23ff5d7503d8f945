"""One ``corral proxy run`` per data directory and per id.

The data directory is held by an ``fcntl.flock`` on ``DIR/proxy.lock`` for the
life of the process (the kernel drops it when the process dies, however it dies),
with ``PID LISTEN`` written in the file so a refused second run can name the
first. The id is held through its ``proxies/<id>`` record, which names the owning
process (pid, host, create time): a record whose owner still runs (this host) or
still reports (another host) refuses a second run; one left by a dead process is
taken over (:func:`corral.proxy._status.claim_refusal` decides).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from corral.proxy._errors import InvalidProxySetup, ProxyInUse
from corral.proxy._status import ProxyStatus, claim_refusal
from corral.registry import Compare, Delete, Put, Registry, RegistryError, proxy_key
from corral.transport import SchemaError

__all__ = ["DataDirLock", "Owner", "claim_id", "release_id"]

log = logging.getLogger("corral.proxy")

LOCK_FILE = "proxy.lock"
#: Two create times of one process read apart differ by rounding only.
_CREATE_TIME_SLACK = 0.05


@dataclass(frozen=True, slots=True)
class Owner:
    """The ``corral proxy run`` process that owns an id."""

    pid: int
    host: str
    started_at: float

    @classmethod
    def this_process(cls) -> Owner:
        return cls(os.getpid(), socket.gethostname(), psutil.Process().create_time())

    def owns(self, record: ProxyStatus) -> bool:
        return (record.pid, record.host) == (self.pid, self.host) and (
            record.started_at is not None
            and abs(record.started_at - self.started_at) <= _CREATE_TIME_SLACK
        )


def _runs(pid: int, started_at: float | None) -> bool:
    """Whether the process ``pid`` of this host still runs (the same one: same create time)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = process.create_time()
    except psutil.Error:
        return False
    return started_at is None or abs(created - started_at) <= _CREATE_TIME_SLACK


class DataDirLock:
    """The flock on ``DIR/proxy.lock``, held until :meth:`release` (or the process ends)."""

    def __init__(self, data_dir: Path, listen: str) -> None:
        """Take the lock.

        Raises:
            ProxyInUse: another live process holds it; the message names its pid
                and listen address.
            InvalidProxySetup: the directory cannot be created or written.
        """
        path = Path(data_dir) / LOCK_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InvalidProxySetup(f"--data-dir {data_dir}: cannot write {path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").split()
            os.close(fd)
            pid = holder[0] if holder else "?"
            listen_of = holder[1] if len(holder) > 1 else "?"
            raise ProxyInUse(
                f"data dir {data_dir} is in use by corral proxy run pid {pid} "
                f"(listening on {listen_of}); stop it first, or pass another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {listen}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


async def claim_id(registry: Registry, status: ProxyStatus, *, now: float) -> None:
    """Write ``status`` (stamped with its owner) as ``proxies/<id>`` unless another live
    process owns that record; the write is guarded on the record read, so of two runs
    claiming at once one is refused.

    Raises:
        ProxyInUse: naming the owner.
        RegistryError: the registry cannot be used.
    """
    key = proxy_key(status.id)
    for _ in range(3):
        kv = await registry.get(key)
        found = None
        if kv is not None:
            try:
                found = ProxyStatus.decode(kv.value)
            except SchemaError as exc:
                log.warning("%s does not decode (%s): taking it over", key, exc)
        alive = None
        if found is not None and found.pid is not None and found.host == status.host:
            alive = found.pid != status.pid and _runs(found.pid, found.started_at)
        refusal = claim_refusal(found, host=status.host or "", now=now, owner_alive=alive)
        if refusal is not None:
            raise ProxyInUse(refusal)
        guard = Compare.absent(key) if kv is None else Compare.mod_revision_is(key, kv.mod_revision)
        result = await registry.txn([guard], [Put(key, status.encode())])
        if result.succeeded:
            return
    raise ProxyInUse(f"{key} keeps changing under another corral proxy run; try again")


async def release_id(registry: Registry, proxy_id: str, owner: Owner) -> None:
    """Remove ``proxies/<id>`` if ``owner`` still owns it (a later owner's record stays)."""
    key = proxy_key(proxy_id)
    try:
        kv = await registry.get(key)
        if kv is None:
            return
        try:
            record = ProxyStatus.decode(kv.value)
        except SchemaError:
            return
        if not owner.owns(record):
            log.info("%s: the record now belongs to pid %s; leaving it", key, record.pid)
            return
        await registry.txn([Compare.mod_revision_is(key, kv.mod_revision)], [Delete(key)])
    except RegistryError as exc:
        log.warning("%s: could not remove %s on the way out: %s", proxy_id, key, exc)
