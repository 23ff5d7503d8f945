"""The node's HTTP API: a Starlette app, served by Hypercorn's Trio worker.

Every route needs ``Authorization: Bearer <token>``: none gives 401, a wrong one
403 (compared in constant time). ``GET /v1/artifacts/<digest>`` also accepts the
per-artifact capability peers derive from the cluster secret. Errors are JSON
``{"error": "...", "field": "..."}``: 400 names the field, 404 no such app or
node, 409 refused or raced, 413 the body passed its cap (checked while it streams
in), 503 the registry is unreachable, 507 the data dir has no room (naming it, the
bytes needed and the bytes free), and 500 (with an ``id`` the node's log
names next to the traceback) anything no route expected.

Routes::

    GET    /v1/state                      this node, lease, processes, placements, unplaced
    GET    /v1/actors                     the actor tree
    GET    /v1/events[?follow=1]          recent events; follow streams them (NDJSON)
    GET    /v1/ps                         app instances across the cluster, and the
                                          coordinator's cooldown RELOC judged them by
    GET    /v1/nodes                      nodes: the lease holder's states, the operator's intent,
                                          the coordinator
    GET    /v1/apps, /v1/apps/{name}      app records
    POST   /v1/apps/{name}/deploy         {"artifact": base64, "replicas", "selector", ...}
    POST   /v1/apps/{name}/selector       {"selector": {k: v}} | {"unset": [k]} | {"clear": true}
    POST   /v1/apps/{name}/replicas       {"replicas": "all" | N}
    POST   /v1/apps/{name}/retire
    POST   /v1/apps/{name}/rollback       redeploy the previous revision (it rolls node by node)
    POST   /v1/apps/{name}/domains        {"add": [d, ...]} | {"remove": [d, ...]} | {"clear": true}
    GET    /v1/aliases                    every alias: domain, app, previous, revision
    POST   /v1/aliases/{domain}           {"app": A}: create, refused when it exists (409)
    POST   /v1/aliases/{domain}/flip      {"app": A, "expect": revision?}: repoint (409 if raced)
    POST   /v1/aliases/{domain}/rollback  {"expect": revision?}: flip to the previous app
    DELETE /v1/aliases/{domain}
    DELETE /v1/apps/{name}
    POST   /v1/nodes/{node}/cordon | uncordon | drain   (drain: {"force": bool})
    GET    /v1/artifacts/{digest}         raw tar.gz, for peers
    GET    /metrics                       Prometheus text format (also without a token
                                          on the loopback --metrics-listen address)
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.actors.routing import read_routes_answer
from corral.node._errors import (
    ArtifactError,
    Conflict,
    CopyCorrupt,
    InsufficientStorage,
    NotFound,
    OperationRefused,
    RequestInvalid,
)
from corral.node._requests import (
    check_domain,
    check_name,
    parse_bool,
    parse_deploy,
    parse_domains,
    parse_json_body,
    parse_pairs,
    parse_replicas,
    parse_selector_keys,
)
from corral.node.artifacts import MAX_ARTIFACT_BYTES, ArtifactStore, ServedCopy, artifact_capability
from corral.node.server import _operations as ops
from corral.node.server._deadline import REGISTRY_DEADLINE, DeadlineRegistry, RegistryTooSlow
from corral.node.server._events import EventLines
from corral.node.server._views import (
    Coordination,
    CoordinatorUnavailable,
    CoordinatorView,
    NodeStatesView,
    node_rows,
    ps_rows,
)
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AppRecord,
    CoordinatorLease,
    NodeIntent,
    NodeRecord,
    PlacementRecord,
    Registry,
    RegistryUnavailable,
    decode_record,
    read_records,
    validate_digest,
)

# base64 of the largest artifact plus room for the other fields.
MAX_BODY_BYTES = MAX_ARTIFACT_BYTES * 4 // 3 + 64 * 1024
#: Bodies up to this size are parsed on the event loop; larger ones in a thread.
PARSE_INLINE_BYTES = 256 * 1024
EVENT_POLL_INTERVAL = 0.25
#: Most ``GET /v1/events?follow=1`` streams one node serves at once; past it, 429. Each
#: open stream wakes every EVENT_POLL_INTERVAL and its first answer is the whole backlog
#: (up to 1,000 events); issue 25 saw 500 of them keep /v1/ps waiting 4 s.
MAX_EVENT_STREAMS = 64
#: The Retry-After of a stream refused at the cap (streams end when their readers leave).
EVENT_STREAM_RETRY_AFTER_S = 5
#: The Prometheus text format, version 0.0.4.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

JSONDict = dict[str, Any]


log = logging.getLogger("corral.node.api")


class _ArtifactCopy(Response):
    """A copy served to a peer, verified while it streams (:class:`ServedCopy`), read
    in 1 MiB chunks in a worker thread (64 KiB chunks cost a worker-thread hop each: a
    third of the throughput on a 64 MiB artifact). A copy that turns out corrupt is
    cut short before its last chunk, so the peer sees an incomplete body."""

    media_type = "application/gzip"

    def __init__(self, copy: ServedCopy) -> None:
        super().__init__(media_type=self.media_type)
        self._copy = copy
        self.headers["content-length"] = str(copy.size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = self._copy.chunks()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            while (chunk := await trio.to_thread.run_sync(next, chunks, None)) is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except CopyCorrupt as exc:
            log.warning("artifact %s not served: %s", scope.get("path"), exc)
        finally:
            self._copy.close()


class _EventStreams:
    """The event streams one API serves now, and its cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0


class _CappedEventStream(StreamingResponse):
    """An event stream counted while it is served, or a 429 past the cap.

    Counted around the whole response, which returns when the stream ends or its
    reader leaves (a generator's own ``finally`` may wait for the garbage collector),
    and checked where it is counted, with no await between, so a burst of
    requests cannot pass the cap."""

    def __init__(self, streams: _EventStreams, content: AsyncGenerator[bytes, None]) -> None:
        super().__init__(content, media_type="application/x-ndjson")
        self._streams = streams
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streams = self._streams
        if streams.open >= streams.cap:
            await self._content.aclose()  # never started: nothing of it runs
            refused = _error(
                429,
                f"this node already serves {streams.open} event streams, the most it serves "
                f"at once; try again in {EVENT_STREAM_RETRY_AFTER_S} s, or read the recent "
                "events without following them (corral events, GET /v1/events)",
            )
            refused.headers["Retry-After"] = str(EVENT_STREAM_RETRY_AFTER_S)
            await refused(scope, receive, send)
            return
        streams.open += 1
        try:
            await super().__call__(scope, receive, send)
        finally:
            streams.open -= 1


@dataclass(frozen=True)
class ApiServices:
    """What the API needs from the node it runs in."""

    token: str
    secret: str
    node_id: str
    registry: Registry
    artifacts: ArtifactStore
    state: Callable[[], Awaitable[JSONDict]]
    actors: Callable[[], JSONDict]
    #: recent events, oldest first, each a dict with a strictly increasing "seq".
    events: Callable[[], list[JSONDict]]
    #: unix time, for deployed_at.
    wall_clock: Callable[[], float]
    #: optional: called after a write changed what the coordinator decides from (the
    #: coordinator itself watches the registry, so it needs no such call).
    changed: Callable[[str], Awaitable[None]] | None = None
    #: the lease holder's coordinator state (its policy and deferred moves: ps tells
    #: instances still in their cooldown), or ``{"holder": ..., "error": ...}`` saying
    #: why it cannot be had; None: there is no coordinator to ask.
    coordinator: Callable[[], Awaitable[Coordination]] | None = None
    #: request bodies larger than this are refused with 413 while they stream in.
    max_body_bytes: int = MAX_BODY_BYTES
    #: ``GET /metrics``: the node's metrics in the Prometheus text format (None: 404).
    metrics: Callable[[], Awaitable[bytes]] | None = None
    #: most event streams (``GET /v1/events?follow=1``) served at once; past it, 429.
    max_event_streams: int = MAX_EVENT_STREAMS
    #: how answers name the registry (its URL), and the seconds one registry call of a
    #: handler may take before the answer is a 504 saying so (see DeadlineRegistry).
    registry_name: str = "the registry"
    registry_deadline: float = REGISTRY_DEADLINE


def record_json(record: AppRecord | NodeRecord | PlacementRecord | NodeIntent) -> JSONDict:
    """A record as the JSON the registry stores (without the schema version)."""
    data: JSONDict = json.loads(record.encode())
    data.pop("v", None)
    return data


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    body: JSONDict = {"error": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status)


class BearerAuth:
    """ASGI middleware: 401 without a bearer token, 403 with a wrong one."""

    def __init__(self, app: ASGIApp, token: str, secret: str) -> None:
        self._app = app
        self._token = token.encode()
        self._secret = secret

    def _allowed(self, path: str, presented: bytes) -> bool:
        ok = hmac.compare_digest(presented, self._token)
        if path.startswith("/v1/artifacts/"):
            digest = path.removeprefix("/v1/artifacts/")
            capability = artifact_capability(self._secret, digest).encode()
            ok = hmac.compare_digest(presented, capability) or ok
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        header = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value
        scheme, _, presented = header.partition(b" ")
        if scheme.lower() != b"bearer" or not presented.strip():
            response: Response = _error(
                401,
                "missing bearer token; send Authorization: Bearer <token> "
                "(the node writes it to <data-dir>/token)",
            )
            response.headers["WWW-Authenticate"] = 'Bearer realm="corral"'
        elif not self._allowed(scope["path"], presented.strip()):
            response = _error(403, "wrong bearer token; use the one in the node's <data-dir>/token")
        else:
            await self._app(scope, receive, send)
            return
        await response(scope, receive, send)


class _BodyTooLarge(Exception):
    """A request body passed its size cap (answered 413)."""

    def __init__(self, limit: int, declared: int | None) -> None:
        said = f"declares {declared} bytes, more than" if declared is not None else "passed"
        super().__init__(
            f"the request body {said} the {limit} bytes ({limit / 2**20:.1f} MiB) this node "
            "accepts; send a smaller artifact"
        )


class ErrorIds:
    """ASGI middleware: an exception no route handles becomes a JSON 500 carrying an
    error id, and the traceback is logged under that id, so an operator can find it
    and no client ever sees a traceback. (Starlette's own last resort answers in
    text and raises the exception on.)"""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, send_and_note)
        except Exception as exc:
            error_id = secrets.token_hex(6)
            log.exception(
                "API %s %s failed (error id %s)", scope.get("method"), scope.get("path"), error_id
            )
            if started:
                return  # the answer is under way: the client sees it cut short
            response = JSONResponse(
                {
                    "error": f"internal error ({type(exc).__name__}), id {error_id}; the node's "
                    "log has the details under that id",
                    "id": error_id,
                },
                status_code=500,
            )
            await response(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, read as it streams in and refused as soon as it passes
    ``limit`` bytes (a declared Content-Length or not, chunked too), so a large
    body is never held whole."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _BodyTooLarge(limit, int(length))
    chunks: list[bytes] = []
    size = 0
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge(limit, None)
            chunks.append(chunk)
    return b"".join(chunks)


async def _json_body(request: Request, limit: int) -> Mapping[str, Any]:
    raw = await _read_body(request, limit)
    if len(raw) <= PARSE_INLINE_BYTES:
        return parse_json_body(raw)
    # An artifact upload: scanning and decoding it takes a fraction of a second.
    return await trio.to_thread.run_sync(parse_json_body, raw)


def _expected_revision(body: Mapping[str, Any]) -> int | None:
    """``expect``: the alias revision the caller saw (``corral alias ls --json``)."""
    value = body.get("expect")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestInvalid("expect", f"{value!r} is not an alias revision (a whole number >= 1)")
    return value


def _refuse_unknown(body: Mapping[str, Any], allowed: set[str]) -> None:
    for key in sorted(body):
        if key not in allowed:
            raise RequestInvalid(key, f"is not a field here; known: {', '.join(sorted(allowed))}")


def build_api(services: ApiServices) -> ASGIApp:
    """The node's ASGI app: bearer authentication in front of every route, and a JSON
    500 with a logged error id behind them all."""
    registry = DeadlineRegistry(
        services.registry, services.registry_name, services.registry_deadline
    )
    event_streams = _EventStreams(services.max_event_streams)
    event_lines = EventLines(services.events)

    async def body_of(request: Request) -> Mapping[str, Any]:
        return await _json_body(request, services.max_body_bytes)

    async def changed(reason: str) -> None:
        if services.changed is not None:
            await services.changed(reason)

    async def state(request: Request) -> Response:
        return JSONResponse(await services.state())

    async def actors(request: Request) -> Response:
        return JSONResponse(services.actors())

    async def events(request: Request) -> Response:
        if request.query_params.get("follow") not in ("1", "true", "yes"):
            return JSONResponse({"events": services.events()})
        limit_text = request.query_params.get("limit", "")
        limit = int(limit_text) if limit_text.isdigit() else math.inf

        async def stream() -> AsyncGenerator[bytes, None]:
            sent = 0
            last = -1
            while True:
                chunk, last, count = event_lines.after(last, limit - sent)
                if count:
                    yield chunk
                    sent += count
                    if sent >= limit:
                        return
                await trio.sleep(EVENT_POLL_INTERVAL)

        return _CappedEventStream(event_streams, stream())

    async def read_by_name(prefix: str, kind: type[Any]) -> dict[str, Any]:
        records, _ = await read_records(registry, prefix)
        return {
            key.split("/", 1)[1]: record
            for key, record in records.items()
            if isinstance(record, kind)
        }

    async def ps(request: Request) -> Response:
        apps = await read_by_name("apps/", AppRecord)
        placements = await read_by_name("placement/", PlacementRecord)
        nodes = await read_by_name("nodes/", NodeRecord)
        intents = await read_by_name("intent/", NodeIntent)
        coordinator = CoordinatorView.from_state(
            await services.coordinator()
            if services.coordinator is not None
            else CoordinatorUnavailable(None, "this node has no coordinator to ask")
        )
        rows = ps_rows(
            apps, placements, nodes, intents, now=services.wall_clock(), coordinator=coordinator
        )
        return JSONResponse(
            {"rows": [row.to_json() for row in rows], "coordinator": coordinator.to_json()}
        )

    async def nodes(request: Request) -> Response:
        lease_kv = await registry.get(COORDINATOR_LEASE_KEY)
        lease = None if lease_kv is None else decode_record(lease_kv.key, lease_kv.value)
        holder = lease.holder if isinstance(lease, CoordinatorLease) else None
        # The lease holder's node states; the records alone when it cannot be asked.
        states = NodeStatesView.from_state(
            await services.coordinator()
            if services.coordinator is not None
            else CoordinatorUnavailable(holder, "this node has no coordinator to ask")
        )
        rows = node_rows(
            await read_by_name("nodes/", NodeRecord),
            await read_by_name("intent/", NodeIntent),
            holder,
            states,
            apps=await read_by_name("apps/", AppRecord),
            placements=await read_by_name("placement/", PlacementRecord),
        )
        return JSONResponse(
            {
                "nodes": [row.to_json() for row in rows],
                "coordinator": holder,
                "fence": lease_kv.create_revision if holder and lease_kv else None,
                "states": states.to_json(),
                "now": services.wall_clock(),
            }
        )

    async def routes(request: Request) -> Response:
        return JSONResponse(await read_routes_answer(registry, services.wall_clock()))

    async def list_apps(request: Request) -> Response:
        apps, undecodable = await read_records(registry, "apps/")
        return JSONResponse(
            {
                "apps": [
                    record_json(r) for _, r in sorted(apps.items()) if isinstance(r, AppRecord)
                ],
                "undecodable": [{"key": u.key, "reason": u.reason} for u in undecodable],
            }
        )

    async def get_app(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        apps, _ = await read_records(registry, f"apps/{name}")
        record = apps.get(f"apps/{name}")
        if not isinstance(record, AppRecord):
            raise NotFound(f"no app named {name!r}; `corral ps` lists the apps there are")
        return JSONResponse({"app": record_json(record)})

    async def deploy(request: Request) -> Response:
        deploy_request = parse_deploy(request.path_params["name"], await body_of(request))
        result = await ops.deploy(
            registry,
            deploy_request,
            services.artifacts.store,
            services.wall_clock(),
            inspect=services.artifacts.inspect,
        )
        response = JSONResponse(
            {
                "app": record_json(result.app),
                "created": result.created,
                "artifact_size": result.artifact_size,
                "stored_in_registry": result.artifact_size <= services.artifacts.registry_limit,
                "received_by": services.node_id,
            },
            status_code=201 if result.created else 200,
        )
        await changed(f"deploy {deploy_request.name}")
        return response

    async def selector(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        body = await body_of(request)
        _refuse_unknown(body, {"selector", "clear", "unset"})
        clear = parse_bool(body.get("clear", False), "clear")
        if [clear, "selector" in body, "unset" in body].count(True) != 1:
            raise RequestInvalid(
                "selector",
                'give one of {"selector": {"k": "v"}}, {"unset": ["k", ...]} or {"clear": true}',
            )
        pairs = None if clear or "unset" in body else parse_pairs(body["selector"], "selector")
        if pairs is not None and not pairs:
            raise RequestInvalid(
                "selector", 'is empty; to lift the constraint send {"clear": true}'
            )
        unset = parse_selector_keys(body["unset"], "unset") if "unset" in body else ()
        app = await ops.set_selector(registry, name, pairs, unset=unset)
        await changed(f"selector {name}")
        return JSONResponse({"app": record_json(app)})

    async def replicas(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        body = await body_of(request)
        _refuse_unknown(body, {"replicas"})
        if "replicas" not in body:
            raise RequestInvalid("replicas", "missing; give all or a whole number >= 1")
        app = await ops.set_replicas(registry, name, parse_replicas(body["replicas"]))
        await changed(f"replicas {name}")
        return JSONResponse({"app": record_json(app)})

    async def retire(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        app = await ops.retire(registry, name)
        await changed(f"retire {name}")
        return JSONResponse({"app": record_json(app)})

    async def rollback(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        app = await ops.rollback(registry, name)
        await changed(f"rollback {name}")
        return JSONResponse({"app": record_json(app)})

    async def delete(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        await ops.delete_app(registry, name)
        await changed(f"delete {name}")
        return JSONResponse({"deleted": name})

    async def domains(request: Request) -> Response:
        name = check_name("app", request.path_params["name"])
        body = await body_of(request)
        _refuse_unknown(body, {"add", "remove", "clear"})
        clear = parse_bool(body.get("clear", False), "clear")
        add = parse_domains(body.get("add", []), "add")
        remove = parse_domains(body.get("remove", []), "remove")
        if clear == bool(add or remove):
            raise RequestInvalid(
                "add",
                'give {"add": ["d", ...]} and/or {"remove": ["d", ...]}, or {"clear": true}',
            )
        app = await ops.set_domains(registry, name, add=add, remove=remove, clear=clear)
        await changed(f"domains {name}")
        return JSONResponse({"app": record_json(app)})

    async def list_aliases(request: Request) -> Response:
        views, undecodable = await ops.list_aliases(registry)
        return JSONResponse(
            {
                "aliases": [view.to_json() for view in views],
                "undecodable": [{"key": u.key, "reason": u.reason} for u in undecodable],
            }
        )

    async def set_alias(request: Request) -> Response:
        domain = check_domain(request.path_params["domain"])
        body = await body_of(request)
        _refuse_unknown(body, {"app"})
        app = check_name("app", body.get("app"), field="app")
        view = await ops.set_alias(registry, domain, app)
        return JSONResponse({"alias": view.to_json()}, status_code=201)

    async def flip_alias(request: Request) -> Response:
        domain = check_domain(request.path_params["domain"])
        body = await body_of(request)
        verb = request.path_params["verb"]
        if verb == "flip":
            _refuse_unknown(body, {"app", "expect"})
            app = check_name("app", body.get("app"), field="app")
            result = await ops.flip_alias(registry, domain, app, expect=_expected_revision(body))
        elif verb == "rollback":
            _refuse_unknown(body, {"expect"})
            result = await ops.rollback_alias(registry, domain, expect=_expected_revision(body))
        else:
            raise NotFound(f"no alias operation {verb!r}; use flip or rollback")
        return JSONResponse({"alias": result.alias.to_json(), "flipped": result.flipped})

    async def remove_alias(request: Request) -> Response:
        domain = check_domain(request.path_params["domain"])
        app = await ops.remove_alias(registry, domain)
        return JSONResponse({"removed": domain, "app": app})

    async def node_operation(request: Request) -> Response:
        node = check_name("node", request.path_params["node"], field="node")
        verb = request.path_params["verb"]
        body = await body_of(request)
        if verb == "cordon":
            _refuse_unknown(body, set())
            intent = await ops.cordon(registry, node)
            interrupted: list[str] = []
        elif verb == "uncordon":
            _refuse_unknown(body, set())
            intent = await ops.uncordon(registry, node)
            interrupted = []
        elif verb == "drain":
            _refuse_unknown(body, {"force"})
            force = parse_bool(body.get("force", False), "force")
            intent, interrupted = await ops.drain(registry, node, force=force)
        else:
            raise NotFound(f"no node operation {verb!r}; use cordon, uncordon or drain")
        await changed(f"{verb} {node}")
        return JSONResponse(
            {"node": node, "intent": record_json(intent), "interrupted": interrupted}
        )

    async def artifact(request: Request) -> Response:
        digest = request.path_params["digest"]
        try:
            validate_digest(digest)
        except ValueError:
            raise RequestInvalid("digest", "is not a sha256 hex digest") from None
        copy = await trio.to_thread.run_sync(services.artifacts.open_copy, digest)
        if copy is None:
            raise NotFound(f"this node holds no artifact {digest}")
        # Streamed from the file in chunks: a 64 MiB copy is never held in memory whole.
        return _ArtifactCopy(copy)

    async def metrics(request: Request) -> Response:
        if services.metrics is None:
            raise NotFound("this node serves no metrics")
        return Response(await services.metrics(), media_type=METRICS_CONTENT_TYPE)

    async def on_request_invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestInvalid)
        return _error(400, str(exc), exc.field)

    async def on_not_found(request: Request, exc: Exception) -> Response:
        return _error(404, str(exc))

    async def on_refused(request: Request, exc: Exception) -> Response:
        return _error(409, str(exc))

    async def on_unavailable(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RegistryTooSlow):
            body = {
                "error": str(exc),
                "registry": exc.registry,
                "may_have_applied": exc.may_have_applied,
            }
            return JSONResponse(body, status_code=504)
        return _error(503, f"the registry is unavailable: {exc}")

    async def on_artifact(request: Request, exc: Exception) -> Response:
        return _error(502, str(exc))

    async def on_no_room(request: Request, exc: Exception) -> Response:
        return _error(507, str(exc))

    async def on_too_large(request: Request, exc: Exception) -> Response:
        response = _error(413, str(exc), "body")
        response.headers["Connection"] = "close"  # the rest of the body is not read
        return response

    async def on_disconnect(request: Request, exc: Exception) -> Response:
        return _error(400, "the client left before sending the whole body")

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = exc.detail if exc.status_code != 404 else f"no route {request.url.path}"
        return _error(exc.status_code, str(message))

    app = Starlette(
        routes=[
            Route("/v1/state", state, methods=["GET"]),
            Route("/v1/actors", actors, methods=["GET"]),
            Route("/v1/events", events, methods=["GET"]),
            Route("/v1/ps", ps, methods=["GET"]),
            Route("/v1/nodes", nodes, methods=["GET"]),
            Route("/v1/routes", routes, methods=["GET"]),
            Route("/v1/apps", list_apps, methods=["GET"]),
            Route("/v1/apps/{name}", get_app, methods=["GET"]),
            Route("/v1/apps/{name}", delete, methods=["DELETE"]),
            Route("/v1/apps/{name}/deploy", deploy, methods=["POST"]),
            Route("/v1/apps/{name}/selector", selector, methods=["POST"]),
            Route("/v1/apps/{name}/replicas", replicas, methods=["POST"]),
            Route("/v1/apps/{name}/retire", retire, methods=["POST"]),
            Route("/v1/apps/{name}/rollback", rollback, methods=["POST"]),
            Route("/v1/apps/{name}/domains", domains, methods=["POST"]),
            Route("/v1/aliases", list_aliases, methods=["GET"]),
            Route("/v1/aliases/{domain}", set_alias, methods=["POST"]),
            Route("/v1/aliases/{domain}", remove_alias, methods=["DELETE"]),
            Route("/v1/aliases/{domain}/{verb}", flip_alias, methods=["POST"]),
            Route("/v1/nodes/{node}/{verb}", node_operation, methods=["POST"]),
            Route("/v1/artifacts/{digest}", artifact, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={
            RequestInvalid: on_request_invalid,
            NotFound: on_not_found,
            OperationRefused: on_refused,
            Conflict: on_refused,
            RegistryUnavailable: on_unavailable,
            ArtifactError: on_artifact,
            InsufficientStorage: on_no_room,
            HTTPException: on_http,
            _BodyTooLarge: on_too_large,
            ClientDisconnect: on_disconnect,
        },
        middleware=[
            Middleware(ErrorIds),
            Middleware(BearerAuth, token=services.token, secret=services.secret),
        ],
    )
    return app


def build_metrics_app(scrape: Callable[[], Awaitable[bytes]]) -> ASGIApp:
    """``GET /metrics`` alone, without a token: for the loopback ``--metrics-listen``
    address (the configuration refuses any other)."""

    async def metrics(request: Request) -> Response:
        return Response(await scrape(), media_type=METRICS_CONTENT_TYPE)

    return Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"])], middleware=[Middleware(ErrorIds)]
    )
