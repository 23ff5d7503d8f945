"""A node's identity and secrets under its data directory.

* ``<data-dir>/node-id``: the node id, taken from ``--node-id`` or derived from the
  host name on first start, then kept, so a node keeps its name across restarts.
* ``<data-dir>/token``: the API bearer token (mode 0600), generated when absent.
* ``<data-dir>/secret``: the cluster secret peers authenticate with (mode 0600),
  generated when absent; every node of one cluster must be given the same one.
* :func:`new_instance_token`: a random token per node process, written into
  ``nodes/<id>`` so two processes given one node id are told apart.
* :func:`secret_fingerprint`: what the registry keeps of the cluster secret, so a
  node given another secret refuses to start instead of joining half-way.
* :func:`probe_capacity`: memory and the data directory's disk, in MiB (psutil).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

import psutil

from corral.node._errors import ConfigError
from corral.registry import InvalidName, MeasuredCapacity, validate_name

NODE_ID_FILE = "node-id"
TOKEN_FILE = "token"
SECRET_FILE = "secret"
MIB = 1024 * 1024
#: The message HMAC-ed under the cluster secret into its fingerprint.
FINGERPRINT_MESSAGE = b"corral cluster fingerprint"


def node_id_from_hostname(hostname: str) -> str:
    """A DNS-label node id made from a host name (``Web_01.example`` -> ``web-01``)."""
    first = hostname.split(".", 1)[0].lower()
    label = re.sub(r"[^a-z0-9-]+", "-", first)
    label = re.sub(r"-{2,}", "-", label).strip("-")[:63].strip("-")
    return label or "node"


def ensure_node_id(
    data_dir: Path, configured: str | None, hostname: str, *, persist: bool = True
) -> str:
    """The node id for this data directory, persisted on first start (unless ``persist``
    is False: then the caller writes it with :func:`persist_node_id` once it is sure).

    Raises:
        ConfigError: the id breaks the DNS-label rules, or the data directory already
            belongs to another node id.
    """
    path = data_dir / NODE_ID_FILE
    try:
        kept: str | None = path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        kept = None
    chosen = configured or kept or node_id_from_hostname(hostname)
    try:
        validate_name("node", chosen)
    except InvalidName as exc:
        raise ConfigError(f"--node-id: {exc}") from None
    if kept is not None and kept != chosen:
        raise ConfigError(
            f"data directory {data_dir} belongs to node {kept!r}, not {chosen!r}; "
            "give another --data-dir, or drop --node-id to run as the node it was"
        )
    if kept is None and persist:
        persist_node_id(data_dir, chosen)
    return chosen


def persist_node_id(data_dir: Path, node_id: str) -> None:
    """Record ``node_id`` as this data directory's node (no-op when already recorded)."""
    path = data_dir / NODE_ID_FILE
    if path.exists():
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(node_id + "\n", encoding="utf-8")


def read_secret_file(path: Path) -> str | None:
    """The stripped content of a token or secret file, or None when absent."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def ensure_secret_file(path: Path, configured: str | None) -> str:
    """Return ``configured``, else the file's content, else a new random value
    written to ``path`` with mode 0600."""
    if configured:
        return configured
    existing = read_secret_file(path)
    if existing:
        return existing
    value = secrets.token_hex(32)  # hex: never starts with '-', safe on a command line
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    return value


def new_instance_token() -> str:
    """A random token naming this node process (32 hex digits)."""
    return secrets.token_hex(16)


def secret_fingerprint(secret: str) -> str:
    """HMAC-SHA256 of a fixed message under the cluster secret, as 64 hex digits.

    The same secret always gives the same fingerprint; the fingerprint does not
    reveal the secret."""
    return hmac.new(secret.encode("utf-8"), FINGERPRINT_MESSAGE, hashlib.sha256).hexdigest()


def same_fingerprint(a: str, b: str) -> bool:
    """Compare two fingerprints in constant time."""
    return hmac.compare_digest(a.encode("ascii", "replace"), b.encode("ascii", "replace"))


def process_running(pid: int, started_before: float) -> bool:
    """Whether process ``pid`` runs on this host and was created no later than
    ``started_before`` (unix time, with a second of slack): a pid reused by a
    younger process does not count. A process we may not inspect counts as running."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started_before <= 0 or process.create_time() <= started_before + 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def probe_capacity(data_dir: Path) -> MeasuredCapacity:
    """Memory total/available and the data directory's disk total/free, in MiB.

    A resource that cannot be read reports zeros (such a node is given no work
    that needs it until it can)."""
    try:
        memory = psutil.virtual_memory()
        memory_mb, memory_free_mb = memory.total // MIB, memory.available // MIB
    except OSError:
        memory_mb = memory_free_mb = 0
    try:
        disk = psutil.disk_usage(str(data_dir))
        disk_mb, disk_free_mb = disk.total // MIB, disk.free // MIB
    except OSError:
        disk_mb = disk_free_mb = 0
    return MeasuredCapacity(
        memory_mb=int(memory_mb),
        memory_free_mb=int(memory_free_mb),
        disk_mb=int(disk_mb),
        disk_free_mb=int(disk_free_mb),
    )
