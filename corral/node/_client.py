"""A small synchronous client of the node's HTTP API (used by the CLI and the demo)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from corral.node._artifacts import PackedArtifact
from corral.node._config import DEFAULT_API, DEFAULT_DATA_DIR
from corral.node._errors import ApiError, ApiRefused, NodeUnreachable
from corral.node._identity import TOKEN_FILE, read_secret_file

DEFAULT_API_URL = f"http://{DEFAULT_API}"
DEFAULT_TIMEOUT = 30.0

JSONDict = dict[str, Any]


def resolve_api_url(flag: str | None, env: Mapping[str, str]) -> str:
    """``--api`` beats ``CORRAL_API`` beats the default; a bare host:port gets http://."""
    url = flag or env.get("CORRAL_API") or DEFAULT_API_URL
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")


def resolve_token(
    flag: str | None, env: Mapping[str, str], data_dir_flag: str | None, cwd: Path
) -> str:
    """``--token`` beats ``CORRAL_TOKEN`` beats ``<data-dir>/token``.

    Raises:
        ApiError: none of them gives a token; the message says where it looked.
    """
    token = flag or env.get("CORRAL_TOKEN")
    if token:
        return token
    data_dir = cwd / Path(data_dir_flag or env.get("CORRAL_DATA_DIR") or DEFAULT_DATA_DIR)
    path = data_dir.expanduser() / TOKEN_FILE
    found = read_secret_file(path)
    if found is None:
        raise ApiError(
            f"no API token: {path} does not exist; pass --token, set CORRAL_TOKEN, or give "
            "--data-dir of the node you talk to"
        )
    return found


class NodeClient:
    """Calls one node's API; raises NodeUnreachable or ApiRefused on failure."""

    def __init__(self, api_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api_url = api_url
        self._client = httpx.Client(
            base_url=api_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: JSONDict | None = None) -> JSONDict:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise NodeUnreachable(self.api_url, _reason(exc)) from exc
        return _answer(response)

    def state(self) -> JSONDict:
        return self.request("GET", "/v1/state")

    def actors(self) -> JSONDict:
        return self.request("GET", "/v1/actors")

    def events(self) -> list[JSONDict]:
        events: list[JSONDict] = self.request("GET", "/v1/events")["events"]
        return events

    def follow_events(self) -> Iterator[JSONDict]:
        """Recent events, then new ones as they happen (until interrupted)."""
        try:
            with self._client.stream(
                "GET", "/v1/events", params={"follow": "1"}, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _answer(response)
                try:
                    for line in response.iter_lines():
                        if line.strip():
                            yield json.loads(line)
                except httpx.TransportError as exc:
                    raise ApiError(
                        f"the event stream from {self.api_url} ended: the node stopped or "
                        f"restarted ({_reason(exc)}); run the command again to follow it"
                    ) from exc
        except httpx.TransportError as exc:
            raise NodeUnreachable(self.api_url, _reason(exc)) from exc

    def ps(self) -> list[JSONDict]:
        rows: list[JSONDict] = self.request("GET", "/v1/ps")["rows"]
        return rows

    def deploy(
        self,
        name: str,
        artifact: PackedArtifact,
        *,
        replicas: str | int | None = None,
        selector: Mapping[str, str] | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        pinned: bool | None = None,
        env: Mapping[str, str] | None = None,
    ) -> JSONDict:
        body: JSONDict = {"artifact": base64.b64encode(artifact.data).decode()}
        for key, value in (
            ("replicas", replicas),
            ("selector", None if selector is None else dict(selector)),
            ("memory_mb", memory_mb),
            ("disk_mb", disk_mb),
            ("pinned", pinned),
            ("env", None if env is None else dict(env)),
        ):
            if value is not None:
                body[key] = value
        return self.request("POST", f"/v1/apps/{name}/deploy", body)

    def set_selector(self, name: str, selector: Mapping[str, str] | None) -> JSONDict:
        body: JSONDict = {"clear": True} if selector is None else {"selector": dict(selector)}
        return self.request("POST", f"/v1/apps/{name}/selector", body)

    def set_replicas(self, name: str, replicas: str | int) -> JSONDict:
        return self.request("POST", f"/v1/apps/{name}/replicas", {"replicas": replicas})

    def retire(self, name: str) -> JSONDict:
        return self.request("POST", f"/v1/apps/{name}/retire")

    def delete(self, name: str) -> JSONDict:
        return self.request("DELETE", f"/v1/apps/{name}")

    def node_operation(self, node: str, verb: str, *, force: bool = False) -> JSONDict:
        body: JSONDict | None = {"force": True} if force else None
        return self.request("POST", f"/v1/nodes/{node}/{verb}", body)


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def _answer(response: httpx.Response) -> JSONDict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            raise ApiRefused(response.status_code, body["error"], body.get("field"))
        raise ApiRefused(
            response.status_code, f"the node answered {response.status_code}: {response.text[:200]}"
        )
    if not isinstance(body, dict):
        raise ApiRefused(response.status_code, "the node answered something that is not JSON")
    return body


def environment() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
