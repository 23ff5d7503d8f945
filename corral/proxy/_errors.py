"""Errors of the proxy drivers.

::

    CorralError
    └── ProxyError
        ├── ProxyNotInstalled      the proxy binary is not on this machine
        ├── ProxyStartFailed       the proxy process did not come up (it exited, or never listened)
        ├── ProxyApplyFailed       a table could not be applied (the old one stays served)
        ├── InvalidProxySetup      a data directory, address or option the proxy cannot use
        └── ProxyInUse             the data directory or id belongs to another running proxy
"""

from __future__ import annotations

from corral._errors import CorralError

__all__ = [
    "InvalidProxySetup",
    "ProxyApplyFailed",
    "ProxyError",
    "ProxyInUse",
    "ProxyNotInstalled",
    "ProxyStartFailed",
]


class ProxyError(CorralError):
    """Base of the proxy drivers' errors."""


class ProxyNotInstalled(ProxyError):
    """The proxy's binary is missing; the message names the package to install."""


class ProxyStartFailed(ProxyError):
    """The proxy process exited or did not answer in time; the message quotes its log."""


class ProxyApplyFailed(ProxyError):
    """A table was not applied; the proxy keeps serving the table it had."""


class InvalidProxySetup(ProxyError):
    """An option the proxy cannot work with; the message names it and what to use."""


class ProxyInUse(ProxyError):
    """Another live ``corral proxy run`` holds the data directory or the id; the
    one-line message names its pid and listen address."""
