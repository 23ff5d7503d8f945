"""The inspector's view of a node: its HTTP API over httpx, on asyncio.

Textual runs on asyncio, the node on Trio: the inspector is its own process and
reads the node only through the API a script would use. Every read returns the
decoded JSON object or raises :class:`SourceError` with one line saying what
went wrong (unreachable, refused token, not a corral API); the app shows that
line and tries again, so a node that goes away and comes back is followed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

JSONDict = dict[str, Any]
#: Seconds one read may take; a node busy longer than this is reported, not waited on
#: (``GET /v1/state`` may spend a few seconds asking a busy coordinator).
READ_TIMEOUT = 10.0
#: The longest event line accepted from a stream (a larger one ends the stream).
MAX_EVENT_LINE = 256 * 1024


class SourceError(Exception):
    """A read from the node failed; the message says why, in one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


class NodeSource:
    """Reads one node's API (and, with the same token, another node's actor tree).

    Args:
        api_url: the node's API, e.g. ``http://127.0.0.1:7400``.
        token: its bearer token.
        transport: an httpx transport (tests give an ``httpx.MockTransport``).
    """

    def __init__(
        self, api_url: str, token: str, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self._transport = transport
        self._client = httpx.AsyncClient(
            transport=transport,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(READ_TIMEOUT, connect=2.0),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _url(self, path: str, base: str | None = None) -> str:
        return (base or self.api_url).rstrip("/") + path

    def _decode(self, response: httpx.Response, where: str) -> JSONDict:
        try:
            body = response.json()
        except ValueError:
            body = None
        status = response.status_code
        error = body.get("error") if isinstance(body, dict) else None
        if status in (401, 403):
            raise SourceError(
                f"{where} refused the token ({status}); give that node's token "
                "(--token, CORRAL_TOKEN or --data-dir of that node)",
                status,
            )
        if status >= 400:
            said = error if isinstance(error, str) else f"answered {status}"
            raise SourceError(f"{where}: {said}", status)
        if not isinstance(body, dict):
            raise SourceError(f"{where} did not answer with a JSON object: not a corral API?")
        return body

    async def get(self, path: str, base: str | None = None) -> JSONDict:
        """``GET path`` on the node (or on ``base``, another node's API URL)."""
        where = base or self.api_url
        try:
            response = await self._client.get(self._url(path, base))
        except httpx.HTTPError as exc:
            raise SourceError(f"cannot reach {where} ({_reason(exc)})") from exc
        return self._decode(response, where)

    async def post(self, path: str, body: JSONDict | None = None) -> JSONDict:
        try:
            response = await self._client.post(self._url(path), json=body)
        except httpx.HTTPError as exc:
            raise SourceError(f"cannot reach {self.api_url} ({_reason(exc)})") from exc
        return self._decode(response, self.api_url)

    async def routes(self) -> JSONDict | None:
        """The routing table, or None when this node's API has none (no routing yet)."""
        try:
            return await self.get("/v1/routes")
        except SourceError as exc:
            if exc.status == 404:
                return None
            raise

    async def follow_events(self, after: int = 0) -> AsyncIterator[JSONDict]:
        """The node's events (those after ``seq`` ``after``), then new ones as they happen.
        Ends when the stream ends; raises :class:`SourceError` when it cannot be had."""
        url = self._url("/v1/events")
        try:
            async with self._client.stream(
                "GET", url, params={"follow": "1"}, timeout=httpx.Timeout(None, connect=2.0)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._decode(response, self.api_url)
                async for line in response.aiter_lines():
                    if len(line) > MAX_EVENT_LINE:
                        raise SourceError(f"{self.api_url} sent an event line too long to read")
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if not isinstance(event, dict):
                        continue
                    seq = event.get("seq")
                    if isinstance(seq, int) and seq <= after:
                        continue
                    yield event
        except httpx.HTTPError as exc:
            raise SourceError(f"the event stream of {self.api_url} broke ({_reason(exc)})") from exc
