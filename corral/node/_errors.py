"""Errors of the node service, its HTTP API and its command line.

::

    CorralError
    └── NodeError
        ├── ConfigError          a flag, environment variable or config-file value is wrong
        ├── RequestInvalid       a request field fails validation (API 400, CLI exit 2); .field
        │   └── ArtifactInvalid  an app directory or artifact names no runnable command
        ├── ArtifactError        an artifact cannot be had
        │   ├── ArtifactNotFound no copy of the digest in the registry or on any node
        │   ├── DigestMismatch   the bytes fetched do not hash to the digest asked for
        │   └── CopyCorrupt      a copy on this node's disk does not hash to its digest (dropped)
        ├── InsufficientStorage  the data dir's file system has no room for it (API 507)
        ├── OperationRefused     the request is valid but would do harm (e.g. drain of pinned work)
        ├── Conflict             the record kept changing under a guarded write
        ├── NotFound             no such app or node
        └── ApiError             the command line could not get an answer it can use
            ├── NodeUnreachable  nothing answered at the API address tried
            ├── NodeTimedOut     the node took the request and did not answer in time
            └── ApiRefused       the node answered with an error status; .status, .field

A registry that does not answer an API handler in time raises
:class:`corral.node.server._deadline.RegistryTooSlow`, a ``RegistryUnavailable`` (a 504).
"""

from __future__ import annotations

from corral._errors import CorralError


class NodeError(CorralError):
    """Base class of the node service's errors."""


class ConfigError(NodeError):
    """A configuration value (flag, environment variable or config file) is wrong."""


class RequestInvalid(NodeError):
    """A request field fails validation; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ArtifactInvalid(RequestInvalid):
    """An app directory or artifact does not name a runnable command."""


class ArtifactError(NodeError):
    """An artifact cannot be obtained."""


class ArtifactNotFound(ArtifactError):
    """No copy of the artifact exists where this node can reach it (a holder may come
    back: the reconciler shows the instance ``starting`` with this reason)."""

    unreachable = True


class DigestMismatch(ArtifactError):
    """Fetched bytes do not hash to the digest they were asked for under."""


class CopyCorrupt(ArtifactError):
    """A copy on this node's disk does not hash to its digest; it has been dropped."""


class InsufficientStorage(NodeError):
    """The data dir's file system has no room for what was asked (API 507).

    Attributes:
        data_dir: the node's data directory.
        needed: the bytes that had to be free (what is written plus what stays free).
        free: the bytes free there when it was checked.
    """

    def __init__(
        self,
        what: str,
        data_dir: str,
        needed: int,
        free: int,
        *,
        kept: int = 0,
        at_least: bool = False,
    ) -> None:
        kept_free = f", {kept} of them kept free for the node's own writes," if kept else ""
        super().__init__(
            f"no room for {what} in the data dir {data_dir}: it needs "
            f"{'at least ' if at_least else ''}{needed} bytes "
            f"({needed / 2**20:.1f} MiB) free{kept_free} and its file system has {free} "
            f"bytes ({free / 2**20:.1f} MiB); free some space there, or send less"
        )
        self.data_dir = data_dir
        self.needed = needed
        self.free = free


class OperationRefused(NodeError):
    """The request is well formed but refused because of what it would do."""


class Conflict(NodeError):
    """A guarded write kept losing to concurrent writers."""


class NotFound(NodeError):
    """No such app or node."""


class ApiError(NodeError):
    """The command line did not get a usable answer from the node."""


class NodeUnreachable(ApiError):
    """Nothing answered at the API address the command line tried."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach the corral node at {url} ({reason}); start one with "
            "`corral node run`, or point at another with --api URL or CORRAL_API"
        )
        self.url = url


class NodeTimedOut(ApiError):
    """The node accepted the request and sent no answer within the command line's
    timeout: it is up, and busy or stuck (a write may have been applied)."""

    def __init__(self, url: str, timeout: float, reason: str) -> None:
        super().__init__(
            f"the corral node at {url} took the request but did not answer within "
            f"{timeout:g} s ({reason}); it is up but slow, or its registry is (`corral state` "
            "names a registry error): a change asked for may have been applied, `corral ps` "
            "shows whether it was, and repeating the same request is safe"
        )
        self.url = url


class ApiRefused(ApiError):
    """The node answered with an error; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
