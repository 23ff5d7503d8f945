"""The interface every proxy driver implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import trio

from corral.actors.routing import RouteTable, backend_address
from corral.proxy._errors import InvalidProxySetup

__all__ = ["Applied", "ProxyDriver", "dial_address"]


def dial_address(url: str) -> str:
    """The ``host:port`` a proxy dials for a backend URL (IPv6 as ``[addr]:port``).

    Raises:
        InvalidProxySetup: not an ``http://host:port`` URL.
    """
    try:
        return backend_address(url)
    except ValueError as exc:
        raise InvalidProxySetup(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Applied:
    """How one table was applied.

    ``how`` is ``"runtime"`` (HAProxy Runtime API commands), ``"reload"`` (an
    HAProxy reload from the generated files, ``why`` says what made it
    structural), ``"start"`` (the process was (re)started) or ``"load"`` (a
    Caddy ``POST /load``); ``seconds`` runs until the proxy serves the table;
    ``commands`` counts Runtime API lines sent.
    """

    how: str
    seconds: float
    commands: int = 0
    why: str = ""


class ProxyDriver(ABC):
    """A running proxy that serves one routing table at a time.

    Drivers know nothing of versions: :class:`corral.proxy.ProxyEngine` decides
    which table is newer and calls :meth:`apply` with it.
    """

    kind: str
    """``"haproxy"`` or ``"caddy"``."""

    @property
    @abstractmethod
    def listen(self) -> str:
        """``host:port`` the proxy serves HTTP on."""

    @property
    @abstractmethod
    def reloads(self) -> int:
        """How many times the process was reloaded or restarted since it was opened."""

    @abstractmethod
    async def apply(self, table: RouteTable) -> Applied:
        """Serve ``table`` from now on, replacing the previous one.

        A process found dead is started again with ``table``.

        Raises:
            ProxyApplyFailed: the proxy refused it; it keeps serving what it had.
        """

    async def tidy(self) -> int:
        """Finish what an apply left pending (HAProxy: servers still to delete).

        Returns:
            How many items are still pending (0 for drivers with nothing to tidy).
        """
        return 0

    async def wait_exit(self) -> int:
        """Return once the proxy process exits (it is reaped), with its exit code
        (negative: killed by that signal). A driver with no process to die never returns.
        """
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def restart(self) -> Applied | None:
        """Start the proxy process again, serving the table it served last.

        Returns:
            How it was started, or None when it was running already (an apply
            found it dead and started it first).

        Raises:
            ProxyStartFailed: it did not come up; call again later.
        """
        raise NotImplementedError(f"the {self.kind} driver cannot restart its process")
