"""A small synchronous client of the node's HTTP API (used by the CLI and the demo)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from corral.node._config import DEFAULT_API, DEFAULT_DATA_DIR
from corral.node._errors import (
    ApiError,
    ApiRefused,
    ConfigError,
    NodeTimedOut,
    NodeUnreachable,
)
from corral.node._identity import TOKEN_FILE, read_secret_file
from corral.node.artifacts import PackedArtifact

DEFAULT_API_URL = f"http://{DEFAULT_API}"
#: Seconds the command line waits for an answer: longer than a node's registry
#: deadline (corral.node.server._deadline.REGISTRY_DEADLINE), so a node whose registry is
#: stuck answers first, saying so, before this runs out.
DEFAULT_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0

JSONDict = dict[str, Any]


def resolve_api_url(flag: str | None, env: Mapping[str, str]) -> str:
    """``--api`` beats ``CORRAL_API`` beats the default; a bare host:port gets http://.

    Raises:
        ConfigError: the address is not ``host:port`` or ``http(s)://host:port``,
            naming where it came from.
    """
    where = "--api" if flag else "CORRAL_API" if env.get("CORRAL_API") else "the default"
    url = (flag or env.get("CORRAL_API") or DEFAULT_API_URL).strip()
    if "://" not in url:
        url = f"http://{url}"
    url = url.rstrip("/")
    try:
        parsed = httpx.URL(url)
        valid = (
            parsed.scheme in ("http", "https")
            and bool(parsed.host)
            and parsed.path in ("", "/")
            and " " not in url
        )
    except (httpx.InvalidURL, ValueError):
        valid = False
    if not valid:
        raise ConfigError(
            f"{where} {url.removeprefix('http://')!r} is not an API address; write host:port "
            "or http://host:port, e.g. --api 127.0.0.1:7400"
        )
    return url


def resolve_token_and_source(
    flag: str | None, env: Mapping[str, str], data_dir_flag: str | None, cwd: Path
) -> tuple[str, str]:
    """Like :func:`resolve_token`, also saying where the token came from."""
    if flag:
        return flag, "--token"
    if env.get("CORRAL_TOKEN"):
        return env["CORRAL_TOKEN"], "CORRAL_TOKEN"
    data_dir = cwd / Path(data_dir_flag or env.get("CORRAL_DATA_DIR") or DEFAULT_DATA_DIR)
    path = data_dir.expanduser() / TOKEN_FILE
    found = read_secret_file(path)
    if found is None:
        raise ApiError(
            f"no API token: {path} does not exist; pass --token, set CORRAL_TOKEN, or give "
            "--data-dir of the node you talk to"
        )
    return found, str(path)


def resolve_token(
    flag: str | None, env: Mapping[str, str], data_dir_flag: str | None, cwd: Path
) -> str:
    """``--token`` beats ``CORRAL_TOKEN`` beats ``<data-dir>/token``.

    Raises:
        ApiError: none of them gives a token; the message says where it looked.
    """
    return resolve_token_and_source(flag, env, data_dir_flag, cwd)[0]


class NodeClient:
    """Calls one node's API; raises NodeUnreachable or ApiRefused on failure."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        token_source: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.api_url = api_url
        self.token_source = token_source
        self._timeout = timeout
        self._client = httpx.Client(
            transport=transport,
            base_url=api_url,
            headers={"Authorization": f"Bearer {token}"},
            # A node that does not answer the connection fails fast; a slow answer
            # (a large deploy) may take the whole timeout.
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout)),
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: JSONDict | None = None) -> JSONDict:
        """Send one request and return the node's JSON answer.

        Raises:
            NodeUnreachable: no connection could be made (nothing listens there).
            NodeTimedOut: the node took the request and did not answer in time.
            ApiRefused, ApiError: as :meth:`_answer`.
        """
        try:
            response = self._client.request(method, path, json=body)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            raise NodeTimedOut(self.api_url, self._timeout, _reason(exc)) from exc
        except httpx.TransportError as exc:
            raise NodeUnreachable(self.api_url, _reason(exc)) from exc
        return self._answer(response)

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
                    self._answer(response)
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
        rows: list[JSONDict] = self.ps_answer()["rows"]
        return rows

    def ps_answer(self) -> JSONDict:
        """``{"rows": [...], "coordinator": {"holder", "cooldown_s"} or {"holder", "error"}}``."""
        return self.request("GET", "/v1/ps")

    def routes(self) -> JSONDict:
        """``GET /v1/routes``: the routing table, what it holds back, and the proxies."""
        return self.request("GET", "/v1/routes")

    def nodes(self) -> JSONDict:
        """``{"nodes": [...], "coordinator": id or None, "fence": int or None}``."""
        return self.request("GET", "/v1/nodes")

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
        domains: Sequence[str] | None = None,
        max_parallel: int | None = None,
        drain_ms: int | None = None,
        ready_timeout_ms: int | None = None,
    ) -> JSONDict:
        body: JSONDict = {"artifact": base64.b64encode(artifact.data).decode()}
        for key, value in (
            ("replicas", replicas),
            ("selector", None if selector is None else dict(selector)),
            ("memory_mb", memory_mb),
            ("disk_mb", disk_mb),
            ("pinned", pinned),
            ("env", None if env is None else dict(env)),
            ("domains", None if domains is None else list(domains)),
            ("max_parallel", max_parallel),
            ("drain_ms", drain_ms),
            ("ready_timeout_ms", ready_timeout_ms),
        ):
            if value is not None:
                body[key] = value
        return self.request("POST", f"/v1/apps/{name}/deploy", body)

    def set_selector(
        self, name: str, selector: Mapping[str, str] | None, *, unset: Sequence[str] = ()
    ) -> JSONDict:
        """Replace the app's selector, remove the keys ``unset`` from it, or (selector
        None and nothing to unset) clear it."""
        body: JSONDict
        if unset:
            body = {"unset": list(unset)}
        elif selector is None:
            body = {"clear": True}
        else:
            body = {"selector": dict(selector)}
        return self.request("POST", f"/v1/apps/{name}/selector", body)

    def set_replicas(self, name: str, replicas: str | int) -> JSONDict:
        return self.request("POST", f"/v1/apps/{name}/replicas", {"replicas": replicas})

    def retire(self, name: str) -> JSONDict:
        return self.request("POST", f"/v1/apps/{name}/retire")

    def rollback(self, name: str) -> JSONDict:
        """Redeploy the app's previous revision (``POST /v1/apps/{name}/rollback``)."""
        return self.request("POST", f"/v1/apps/{name}/rollback")

    def delete(self, name: str) -> JSONDict:
        return self.request("DELETE", f"/v1/apps/{name}")

    def set_domains(
        self,
        name: str,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        clear: bool = False,
    ) -> JSONDict:
        body: JSONDict = {"clear": True} if clear else {"add": list(add), "remove": list(remove)}
        return self.request("POST", f"/v1/apps/{name}/domains", body)

    def aliases(self) -> JSONDict:
        """``{"aliases": [{"domain", "app", "previous", "revision"}], "undecodable": [...]}``."""
        return self.request("GET", "/v1/aliases")

    def set_alias(self, domain: str, app: str) -> JSONDict:
        return self.request("POST", f"/v1/aliases/{domain}", {"app": app})

    def flip_alias(self, domain: str, app: str, *, expect: int | None = None) -> JSONDict:
        body: JSONDict = {"app": app}
        if expect is not None:
            body["expect"] = expect
        return self.request("POST", f"/v1/aliases/{domain}/flip", body)

    def rollback_alias(self, domain: str, *, expect: int | None = None) -> JSONDict:
        body: JSONDict = {} if expect is None else {"expect": expect}
        return self.request("POST", f"/v1/aliases/{domain}/rollback", body)

    def remove_alias(self, domain: str) -> JSONDict:
        return self.request("DELETE", f"/v1/aliases/{domain}")

    def node_operation(self, node: str, verb: str, *, force: bool = False) -> JSONDict:
        body: JSONDict | None = {"force": True} if force else None
        return self.request("POST", f"/v1/nodes/{node}/{verb}", body)

    def _answer(self, response: httpx.Response) -> JSONDict:
        """The JSON object of a corral answer, or the error it carries, in one line.

        Raises:
            ApiRefused: the node refused the request (``status``, ``field`` set); a
                refused token names the address and where the token came from.
            ApiError: what answered is not a corral node's API.
        """
        try:
            body = response.json()
        except ValueError:
            body = None
        status = response.status_code
        corral_error = isinstance(body, dict) and isinstance(body.get("error"), str)
        if status in (401, 403) and corral_error:
            assert isinstance(body, dict)
            source = f" from {self.token_source}" if self.token_source else ""
            raise ApiRefused(
                status,
                f"the node at {self.api_url} refused the token{source} ({status}: "
                f"{'not its token' if status == 403 else body['error']}); give that node's "
                "token: --data-dir of that node, --token, or CORRAL_TOKEN",
            )
        if status >= 400 and corral_error:
            assert isinstance(body, dict)
            raise ApiRefused(status, body["error"], body.get("field"))
        if status >= 400 or not isinstance(body, dict):
            text = " ".join(response.text.split())[:80]
            said = f"with {text!r}" if text else "with an empty body"
            raise ApiError(
                f"{self.api_url} answered {status} {said}, which is not a corral node's "
                "API; check --api: it must be a node's API address, not its peer (--listen) one"
            )
        return body


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def environment() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ


def client_transport() -> httpx.BaseTransport | None:
    """The HTTP transport the command line uses: None, httpx's own (a seam for tests)."""
    return None
