"""The actor that serves the HTTP API with Hypercorn's Trio worker."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.types import ASGIApp

from corral.node._config import Address
from corral.supervision import Actor

log = logging.getLogger("corral.node.api")

#: Seconds open requests (an event stream) get to finish when the node stops.
GRACEFUL_TIMEOUT = 1.0


def hypercorn_config(bind: Address) -> Config:
    config = Config()
    config.bind = [str(bind)]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.keep_alive_timeout = 5.0
    return config


class ApiServer(Actor):
    """Serves ``app`` on ``bind`` while it runs; stops accepting and drains when stopped.

    Args:
        app_factory: builds the ASGI app (called in ``started``, with the actor running).
        bind: the address to listen on.
    """

    def __init__(self, app_factory: Callable[[], ASGIApp], bind: Address) -> None:
        super().__init__()
        self._app_factory = app_factory
        self._bind = bind
        self._shutdown = trio.Event()
        self._done = trio.Event()

    async def started(self) -> None:
        app = self._app_factory()
        self.ctx.start_task(self._serve, app)

    async def _serve(self, app: ASGIApp) -> None:
        try:
            await serve(app, hypercorn_config(self._bind), shutdown_trigger=self._shutdown.wait)  # type: ignore[arg-type]
        finally:
            self._done.set()

    async def stopping(self) -> None:
        self._shutdown.set()
        with trio.move_on_after(GRACEFUL_TIMEOUT + 1.0):
            await self._done.wait()
