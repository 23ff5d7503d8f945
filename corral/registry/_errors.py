"""Errors of the registry.

::

    CorralError
    └── RegistryError
        ├── RegistryUnavailable   the store cannot be reached now (connection, busy, closed)
        ├── RegistryReplaced      the SQLite file was deleted or replaced under a running process
        ├── RegistryAuthError     the registry refused the credentials, or they cannot be loaded
        ├── LeaseNotFound         the lease does not exist or has expired
        ├── RevisionCompacted     a watch asked for history that was compacted away
        ├── InvalidKey            a key outside corral's key space (also a ValueError)
        ├── InvalidName           a name breaking the DNS-label rules (also a ValueError)
        ├── InvalidTxn            a txn that puts or deletes one key twice (also a ValueError)
        └── InvalidRegistryUrl    a registry URL no backend accepts (also a ValueError)
"""

from __future__ import annotations

from corral._errors import CorralError


class RegistryError(CorralError):
    """Base of registry errors."""


class RegistryUnavailable(RegistryError):
    """The registry cannot be reached now; the operation may or may not have applied
    when it was a write that reached the server (the message says which)."""


class RegistryReplaced(RegistryError):
    """The SQLite registry file this process opened is no longer at its path: it
    was deleted, or another file was put there. Fatal: the state this process
    shares with its peers is gone, and a node opening that path now would start a
    second, empty cluster."""

    def __init__(self, path: str, *, deleted: bool) -> None:
        what = "was deleted" if deleted else "was replaced by another file"
        super().__init__(
            f"the SQLite registry file {path} {what} while this process had it open; "
            "stop every node using it, put the original file back (or, to start over, "
            "remove it and its -wal and -shm files), then start the nodes again"
        )
        self.path = path
        self.deleted = deleted


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (user and password, client
    certificate), or they cannot be loaded. The message names the user or file
    and what to fix; it never contains a password."""


class LeaseNotFound(RegistryError):
    """The lease does not exist: never granted, revoked, or expired."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(
            f"lease {lease_id} not found: it expired or was revoked; grant a new lease"
        )
        self.lease_id = lease_id


class RevisionCompacted(RegistryError):
    """The history a watch asked for is gone; re-read the keys and watch from now."""

    def __init__(self, requested: int, compacted: int) -> None:
        super().__init__(
            f"revision {requested} is compacted (history starts after {compacted}); "
            "range-read the prefix again and watch from its revision + 1"
        )
        self.requested = requested
        self.compacted = compacted


class InvalidKey(RegistryError, ValueError):
    """The key is outside corral's key space."""


class InvalidName(RegistryError, ValueError):
    """An app or node name breaks the DNS-label rules."""


class InvalidTxn(RegistryError, ValueError):
    """A txn branch writes one key more than once (etcd refuses that too)."""


class InvalidRegistryUrl(RegistryError, ValueError):
    """No backend accepts this registry URL."""
