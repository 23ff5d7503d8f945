"""The etcd backend: a real etcd v3 cluster through its JSON gateway, with httpx on Trio.

Theory of operation
-------------------
etcd 3.4 serves gRPC-gateway JSON under ``/v3/...``. Keys and values travel as
base64; 64-bit integers (revisions, lease ids, TTLs) come back as JSON strings;
fields that are false or zero are left out (``succeeded`` is absent when a
txn's compare fails, ``kvs`` when a range is empty, an event's ``type`` when it
is a PUT). Watch and keepalive answer one JSON object per line.

Every key is stored under an optional namespace ``prefix`` so clusters and test
runs can share one etcd; callers never see it.

Security. ``tls`` (an :class:`ssl.SSLContext`) makes every endpoint ``https``;
the context carries the CA to trust and, when etcd requires one, the client
certificate. With ``user`` and ``password`` the client authenticates
(``/v3/auth/authenticate``) before its first call and sends the token etcd
gives back as the ``Authorization`` header. etcd forgets unused tokens (five
minutes by default) and on restart: a call refused with "invalid auth token"
authenticates again once (one task does it for all) and is sent again; it was
refused before it ran, so that is safe for writes too. The password is kept
only in this object, and never shows in its ``repr``, in a message or a log.

Failures. Which endpoint a call tries first, how long it waits for it and
which writes may be sent again is decided in :mod:`._endpoints`: each attempt
waits at most a timeout sized from the shortest lease TTL this client keeps
alive (an eighth of it; doubled each further round), so a silent member (frozen,
or its host cut off) costs one short attempt, is then passed over while its
backoff lasts, and healthy members are preferred. A connection that could not
be opened never carried the request, so any call moves on to the next endpoint;
an attempt that failed after the request was sent is repeated elsewhere only
for calls that are safe to repeat (reads, keepalive, grant, revoke, txns whose
own guard fails on a repeat, watch resumption from the next revision). Rounds
over the endpoints are separated by an exponential backoff; when every round
fails the call raises :class:`RegistryUnavailable` saying whether a write may
have applied.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import math
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from typing import Any, Final

import httpx
import trio

from corral.registry._base import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    Put,
    Registry,
    TxnOp,
    TxnResult,
    WatchEvent,
)
from corral.registry._endpoints import (
    MAX_PASS_OVER,
    PASS_OVER_FACTOR,
    EndpointHealth,
    after_failure,
    after_success,
    attempt_timeout,
    endpoint_order,
    repeat_is_harmless,
    request_timeout_for,
    watch_idle_for,
)
from corral.registry._errors import (
    InvalidTxn,
    LeaseNotFound,
    RegistryAuthError,
    RegistryError,
    RegistryUnavailable,
    RevisionCompacted,
)
from corral.registry._logic import KeyCheck, check_txn_branch, prefix_end
from corral.registry._records import parse_key

_log = logging.getLogger(__name__)

DEFAULT_RETRY_ROUNDS: Final = 4
DEFAULT_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 1.0

_TARGETS: Final = {
    CompareTarget.VERSION: ("VERSION", "version"),
    CompareTarget.CREATE_REVISION: ("CREATE", "create_revision"),
    CompareTarget.MOD_REVISION: ("MOD", "mod_revision"),
    CompareTarget.VALUE: ("VALUE", "value"),
}
_RESULTS: Final = {
    CompareOp.EQUAL: "EQUAL",
    CompareOp.NOT_EQUAL: "NOT_EQUAL",
    CompareOp.LESS: "LESS",
    CompareOp.GREATER: "GREATER",
}
# gRPC codes the gateway returns that mean "try again later / elsewhere".
_UNAVAILABLE_CODES: Final = frozenset({4, 8, 10, 13, 14})
_AUTHENTICATE: Final = "/v3/auth/authenticate"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


class _JsonBody(httpx.AsyncByteStream):
    """A request body whose iterator is a plain object, not an async generator.

    httpx's own ``ByteStream.__aiter__`` is an async generator; when a request is
    cancelled mid-send (a timeout, a shutdown) the half-used generator is garbage
    collected and trio reports it (httpx issue #3686). This body has nothing to
    leave suspended.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._sent = False

    def __aiter__(self) -> _JsonBody:
        self._sent = False
        return self

    async def __anext__(self) -> bytes:
        if self._sent:
            raise StopAsyncIteration
        self._sent = True
        return self._data


class _HandshakeGuard:
    """An httpcore ``trace`` hook that closes a socket whose TLS handshake was cut short.

    httpcore (1.0.9) closes the TCP stream when ``start_tls`` raises an ``Exception``,
    but not when an outer cancel scope interrupts it (``trio.Cancelled`` is a
    ``BaseException``): the connected socket is dropped unclosed and reported when it
    is collected. Registry calls are cancelled mid-flight as a matter of course (a
    caller's deadline, a watch ended, a node stopping), so every TLS request carries
    this hook: it remembers the stream ``connect_tcp`` returned until the handshake
    completes, and closes its socket if the handshake fails in any way.
    """

    __slots__ = ("_stream",)

    def __init__(self) -> None:
        self._stream: Any = None

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self._stream = info.get("return_value")
        elif event == "connection.start_tls.complete":
            self._stream = None
        elif event == "connection.start_tls.failed" and self._stream is not None:
            stream, self._stream = self._stream, None
            # Synchronous on purpose: this runs inside the cancelled scope.
            sock = stream.get_extra_info("socket")
            if sock is not None:
                sock.close()


def _json_request(
    client: httpx.AsyncClient, url: str, content: str, **kwargs: Any
) -> httpx.Request:
    data = content.encode()
    if url.startswith("https:"):
        kwargs["extensions"] = {"trace": _HandshakeGuard()}
    request = client.build_request("POST", url, content=data, **kwargs)
    request.stream = _JsonBody(data)
    return request


class _Retryable(Exception):
    """Internal: this attempt failed in a way another endpoint may not."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _TokenRefused(Exception):
    """Internal: etcd no longer knows the auth token (expired, or etcd restarted)."""


class EtcdRegistry(Registry):
    """A :class:`Registry` backed by an etcd v3 cluster (3.4+, JSON gateway).

    Args:
        endpoints: ``host:port`` of one or more cluster members (or full
            ``http://host:port`` URLs).
        prefix: a namespace every key is stored under (invisible to callers).
        key_check: refuses keys outside the key space (default :func:`parse_key`).
        lease_ttl: the shortest lease TTL (seconds) the caller keeps alive; the
            per-request timeout is sized from it (see :mod:`._endpoints`), and
            shrinks further if a shorter lease is granted or kept alive.
        timeout: seconds for one attempt, overriding the size from ``lease_ttl``.
        retry_rounds: how many times to go round the endpoints before giving up.
        backoff: the first pause between rounds (doubled each round, at most 1 s).
        transport: an httpx transport, for tests.
        tls: speak TLS to every endpoint, trusting and presenting what this
            context holds (see :meth:`RegistryOptions.ssl_context`).
        user: the etcd user to authenticate as (needs ``password``).
        password: its password (kept out of ``repr`` and every message).

    Raises:
        ValueError: no endpoint, or a user without a password (or the reverse).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = "",
        key_check: KeyCheck | None = None,
        lease_ttl: float | None = None,
        timeout: float | None = None,
        retry_rounds: int = DEFAULT_RETRY_ROUNDS,
        backoff: float = DEFAULT_BACKOFF,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("give at least one etcd endpoint host:port")
        if (user is None) != (password is None):
            raise ValueError("etcd auth needs both a user and a password")
        scheme = "https" if tls is not None else "http"
        self._endpoints = [e if "://" in e else f"{scheme}://{e}" for e in endpoints]
        self._user = user
        self.__password = password
        self._token: str | None = None  # None: not authenticated (yet)
        self._auth_lock = trio.Lock()
        self.authentications = 0  # how many tokens were fetched (for tests and stats)
        self._health = [EndpointHealth() for _ in self._endpoints]
        self._preferred = 0
        self._fixed_timeout = timeout
        self._request_timeout = timeout if timeout is not None else request_timeout_for(lease_ttl)
        self._prefix = prefix.encode()
        self._key_check: KeyCheck = functools.lru_cache(maxsize=4096)(
            key_check if key_check is not None else parse_key
        )
        self._retry_rounds = max(1, retry_rounds)
        self._backoff = backoff
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._request_timeout),
            transport=transport,
            headers={"Content-Type": "application/json"},
            verify=tls if tls is not None else True,
        )
        self._closed = False

    def __repr__(self) -> str:
        user = f", user={self._user!r}" if self._user is not None else ""
        return f"EtcdRegistry({self._endpoints!r}, prefix={self.prefix!r}{user})"

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    @property
    def request_timeout(self) -> float:
        """Seconds one attempt waits in the first round (see :mod:`._endpoints`)."""
        return self._request_timeout

    @property
    def endpoint_health(self) -> list[tuple[str, EndpointHealth]]:
        """Each endpoint with what it did lately (for ``node status`` and tests)."""
        return list(zip(self._endpoints, self._health, strict=True))

    @property
    def user(self) -> str | None:
        return self._user

    @property
    def prefix(self) -> str:
        return self._prefix.decode()

    # ------------------------------------------------------------------ keys

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _range_fields(self, key: str, is_prefix: bool) -> dict[str, str]:
        full = self._key(key)
        if not is_prefix:
            return {"key": _b64(full)}
        if not full:
            return {"key": _b64(b"\0"), "range_end": _b64(b"\0")}
        return {"key": _b64(full), "range_end": _b64(prefix_end(full))}

    def _kv(self, obj: dict[str, Any]) -> KeyValue:
        key = _unb64(obj.get("key"))[len(self._prefix) :].decode()
        lease = _int(obj.get("lease"))
        return KeyValue(
            key=key,
            value=_unb64(obj.get("value")),
            create_revision=_int(obj.get("create_revision")),
            mod_revision=_int(obj.get("mod_revision")),
            version=_int(obj.get("version")),
            lease=lease or None,
        )

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        reply = await self._call("/v3/kv/range", self._range_fields(key, False), safe=True)
        kvs = reply.get("kvs") or []
        return self._kv(kvs[0]) if kvs else None

    async def range(self, prefix: str) -> list[KeyValue]:
        reply = await self._call("/v3/kv/range", self._range_fields(prefix, True), safe=True)
        return [self._kv(kv) for kv in reply.get("kvs") or []]

    async def revision(self) -> int:
        body = {"key": _b64(self._prefix + b"\0"), "count_only": True}
        reply = await self._call("/v3/kv/range", body, safe=True)
        return _int(reply["header"].get("revision"))

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        self._key_check(key)
        reply = await self._call(
            "/v3/kv/put", self._put_fields(Put(key, value, lease)), lease=lease
        )
        return _int(reply["header"].get("revision"))

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        reply = await self._call("/v3/kv/deleterange", self._range_fields(key, prefix))
        return _int(reply.get("deleted"))

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        check_txn_branch(on_success, self._key_check)
        check_txn_branch(on_failure, self._key_check)
        body = {
            "compare": [self._compare(c) for c in compares],
            "success": [self._request_op(op) for op in on_success],
            "failure": [self._request_op(op) for op in on_failure],
        }
        leases = [op.lease for op in (*on_success, *on_failure) if isinstance(op, Put) and op.lease]
        harmless = repeat_is_harmless(compares, on_success, on_failure)
        reply, repeated = await self._request(
            "/v3/kv/txn", body, safe=harmless, lease=leases[0] if leases else None
        )
        succeeded = bool(reply.get("succeeded", False))
        if repeated and not succeeded and any(isinstance(op, Put | Delete) for op in on_success):
            # The guard failed on the repeat: because the first attempt landed, or
            # because another client wrote; no way to tell which from here.
            raise RegistryUnavailable(
                f"etcd txn: an attempt timed out after it was sent and its repeat found the "
                f"guard failed ({', '.join(c.key for c in compares)}): the write may or may "
                "not have applied; read before retrying"
            )
        ops = on_success if succeeded else on_failure
        raw = reply.get("responses") or []
        responses: list[list[KeyValue] | int | None] = []
        for op, response in zip(ops, raw, strict=True):
            if isinstance(op, Get):
                kvs = (response.get("response_range") or {}).get("kvs") or []
                responses.append([self._kv(kv) for kv in kvs])
            elif isinstance(op, Delete):
                responses.append(_int((response.get("response_delete_range") or {}).get("deleted")))
            else:
                responses.append(None)
        return TxnResult(succeeded, _int(reply["header"].get("revision")), tuple(responses))

    def _put_fields(self, op: Put) -> dict[str, str]:
        fields = {"key": _b64(self._key(op.key)), "value": _b64(bytes(op.value))}
        if op.lease is not None:
            fields["lease"] = str(op.lease)
        return fields

    def _request_op(self, op: TxnOp) -> dict[str, Any]:
        if isinstance(op, Put):
            return {"request_put": self._put_fields(op)}
        if isinstance(op, Delete):
            return {"request_delete_range": self._range_fields(op.key, op.prefix)}
        return {"request_range": self._range_fields(op.key, op.prefix)}

    def _compare(self, compare: Compare) -> dict[str, str]:
        target, field = _TARGETS[compare.target]
        if compare.target is CompareTarget.VALUE:
            if not isinstance(compare.value, bytes | bytearray):
                raise TypeError("a VALUE compare needs bytes")
            value = _b64(bytes(compare.value))
        else:
            if isinstance(compare.value, bool) or not isinstance(compare.value, int):
                raise TypeError(f"a {compare.target.name} compare needs an int")
            value = str(compare.value)
        return {
            "key": _b64(self._key(compare.key)),
            "target": target,
            "result": _RESULTS[compare.op],
            field: value,
        }

    # ------------------------------------------------------------------ leases

    async def grant(self, ttl: float) -> Lease:
        if not ttl > 0 or not math.isfinite(ttl):
            raise ValueError(f"a lease TTL must be a finite number of seconds > 0, got {ttl}")
        self._serves_ttl(ttl)
        # Safe to repeat: a lease granted twice leaves one unused, which expires.
        reply = await self._call("/v3/lease/grant", {"TTL": str(math.ceil(ttl))}, safe=True)
        return Lease(_int(reply.get("ID")), float(_int(reply.get("TTL"))))

    async def keepalive(self, lease_id: int) -> float:
        reply = await self._call(
            "/v3/lease/keepalive", {"ID": str(lease_id)}, safe=True, first_line=True
        )
        result = reply.get("result") or {}
        ttl = _int(result.get("TTL"))
        if ttl <= 0:
            raise LeaseNotFound(lease_id)
        self._serves_ttl(ttl)
        return float(ttl)

    def _serves_ttl(self, ttl: float) -> None:
        """Shrink the per-request timeout to fit a lease of ``ttl`` seconds kept alive."""
        if self._fixed_timeout is None:
            self._request_timeout = min(self._request_timeout, request_timeout_for(ttl))

    async def revoke(self, lease_id: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease_id)}, safe=True, lease=lease_id)
        except LeaseNotFound:
            pass

    # ------------------------------------------------------------------ watch

    @asynccontextmanager
    async def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        # Resolve "from now on" to a revision here, so that every write after
        # watch() is entered is seen even if the stream takes a while to open.
        start = await self.revision() + 1 if start_revision is None else max(1, start_revision)
        stream = self._stream(prefix, start)
        events = _events_only(stream)
        try:
            await stream.__anext__()  # None once the stream is open
            yield events
        finally:
            await events.aclose()
            await stream.aclose()

    async def _stream(
        self, prefix: str, next_revision: int
    ) -> AsyncGenerator[WatchEvent | None, None]:
        """Events from ``next_revision`` on, resuming on another endpoint when a
        stream breaks or stays silent too long (resuming from the next revision
        is always safe); yields ``None`` once, when the first stream is open."""
        opened = False
        failures = 0
        while True:
            index = self._order()[0]
            endpoint = self._endpoints[index]
            request = {
                "create_request": {
                    **self._range_fields(prefix, True),
                    "start_revision": str(next_revision),
                }
            }
            token = self._token
            timeout = attempt_timeout(
                self._request_timeout,
                failures // len(self._endpoints),
                True,
                len(self._endpoints),
            )
            idle = watch_idle_for(self._request_timeout)
            streaming = False
            try:
                await self._ensure_token()
                token = self._token
                async with AsyncExitStack() as stack:
                    started = trio.current_time()
                    # Opening is bounded like any request: a silent member costs
                    # one short attempt, not a whole idle period.
                    with trio.fail_after(timeout):
                        response = await stack.enter_async_context(
                            self._open_stream(
                                endpoint + "/v3/watch",
                                json.dumps(request),
                                httpx.Timeout(timeout, read=idle),
                            )
                        )
                        results = await stack.enter_async_context(
                            aclosing(self._watch_results(response, next_revision))
                        )
                        first = await results.__anext__()
                    if not first.get("created"):
                        raise _Retryable("the watch stream did not confirm it", sent=True)
                    self._succeeded(index, started)
                    failures = 0
                    streaming = True
                    if not opened:
                        opened = True
                        yield None
                    async for result in results:
                        events = [self._event(raw) for raw in result.get("events") or []]
                        for event in events:
                            yield event
                        if events:
                            next_revision = events[-1].kv.mod_revision + 1
            except _TokenRefused:
                failures += 1
                if failures > self._retry_rounds * len(self._endpoints):
                    raise self._token_keeps_failing("/v3/watch") from None
                await self._refresh_token(token)
                continue
            except httpx.ReadTimeout as exc:
                if streaming:
                    # No news for ``idle`` seconds: quiet, or its member went silent.
                    # Open it again (bounded as above) to find out.
                    _log.debug("watch on %s idle for %g s; opening it again", endpoint, idle)
                    continue
                failures += 1
                self._failed(index)
                if failures > self._retry_rounds * len(self._endpoints):
                    raise self._unavailable("/v3/watch", exc) from exc
                continue
            except (httpx.TransportError, _Retryable, trio.TooSlowError, StopAsyncIteration) as exc:
                failures += 1
                self._failed(index)
                if failures > self._retry_rounds * len(self._endpoints):
                    raise self._unavailable("/v3/watch", exc) from exc
                if failures % len(self._endpoints) == 0:
                    await trio.sleep(self._pause(failures // len(self._endpoints) - 1))
                continue
            # The server ended the stream (e.g. it is shutting down): resume elsewhere.
            failures += 1
            self._failed(index)
            if failures > self._retry_rounds * len(self._endpoints):
                raise RegistryUnavailable(f"etcd at {endpoint} keeps closing the watch stream")

    @asynccontextmanager
    async def _open_stream(
        self, url: str, content: str, http_timeout: httpx.Timeout
    ) -> AsyncIterator[httpx.Response]:
        request = _json_request(
            self._client, url, content, timeout=http_timeout, headers=self._auth_headers()
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.ConnectError as exc:
            self._raise_if_tls_failed(url, exc)
            raise
        try:
            yield response
        finally:
            await response.aclose()

    async def _watch_results(
        self, response: httpx.Response, next_revision: int
    ) -> AsyncGenerator[dict[str, Any], None]:
        if response.status_code != 200:
            await response.aread()
            raise self._error(response, "/v3/watch")
        async with _open_lines(response) as lines:
            async for line in lines:
                if not line.strip():
                    continue
                result = self._parse_line(line, "/v3/watch")
                if result.get("canceled"):
                    compacted = _int(result.get("compact_revision"))
                    if compacted:
                        raise RevisionCompacted(next_revision, compacted - 1)
                    reason = str(result.get("cancel_reason") or "no reason given")
                    # etcd 3.4 answers a watch sent with a lapsed token with a
                    # stream that says so, not with an HTTP error.
                    refused = self._auth_error(reason, 16, "/v3/watch")
                    if refused is not None:
                        raise refused
                    raise RegistryUnavailable(f"etcd cancelled the watch: {reason}")
                yield result

    def _event(self, raw: dict[str, Any]) -> WatchEvent:
        kv = self._kv(raw.get("kv") or {})
        if raw.get("type") == "DELETE":
            return WatchEvent(EventType.DELETE, KeyValue(kv.key, b"", 0, kv.mod_revision, 0))
        return WatchEvent(EventType.PUT, kv)

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.aclose()
        else:
            await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ HTTP

    def _pause(self, round_index: int) -> float:
        return float(min(self._backoff * (2**round_index), _MAX_BACKOFF))

    def _order(self) -> list[int]:
        """Endpoint indexes in the order a call tries them now (see :mod:`._endpoints`)."""
        return endpoint_order(
            self._health,
            self._preferred,
            trio.current_time(),
            backoff=PASS_OVER_FACTOR * self._request_timeout,
            max_backoff=MAX_PASS_OVER,
        )

    def _succeeded(self, index: int, started: float) -> None:
        self._health[index] = after_success(self._health[index], trio.current_time() - started)
        self._preferred = index

    def _failed(self, index: int) -> None:
        health = after_failure(self._health[index], trio.current_time())
        if health.failures == 1:
            _log.info("etcd %s failed; trying the other endpoints first", self._endpoints[index])
        self._health[index] = health

    async def _call(
        self,
        path: str,
        body: dict[str, Any],
        *,
        safe: bool = False,
        first_line: bool = False,
        lease: int | None = None,
    ) -> dict[str, Any]:
        """POST ``body`` to ``path``, moving over endpoints and retrying as the
        module docstring says. ``safe`` marks calls that may be repeated;
        ``lease`` names the lease a "lease not found" refers to."""
        reply, _ = await self._request(path, body, safe=safe, first_line=first_line, lease=lease)
        return reply

    async def _request(
        self,
        path: str,
        body: dict[str, Any],
        *,
        safe: bool = False,
        first_line: bool = False,
        lease: int | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """:meth:`_call`, also saying whether the answer came from a repeat after
        an attempt that may have applied."""
        if self._closed:
            raise trio.ClosedResourceError("this EtcdRegistry is closed")
        if path != _AUTHENTICATE:
            await self._ensure_token()
        content = json.dumps(body)
        last: _Retryable | None = None
        token_refused = False
        repeated = False
        for round_index in range(self._retry_rounds):
            if round_index:
                await trio.sleep(self._pause(round_index - 1))
            timeout = attempt_timeout(
                self._request_timeout, round_index, safe, len(self._endpoints)
            )
            for index in self._order():
                endpoint = self._endpoints[index]
                started = trio.current_time()
                try:
                    while True:
                        token = self._token
                        try:
                            reply = await self._attempt(
                                endpoint + path, content, path, first_line, timeout
                            )
                            break
                        except _TokenRefused:
                            # Refused before it ran: safe to send again, once.
                            if token_refused:
                                raise self._token_keeps_failing(path) from None
                            token_refused = True
                            await self._refresh_token(token)
                except LeaseNotFound:
                    self._succeeded(index, started)  # the member answered
                    raise LeaseNotFound(lease if lease is not None else 0) from None
                except _Retryable as exc:
                    last = exc
                    self._failed(index)
                    if exc.sent and not safe:
                        raise RegistryUnavailable(
                            f"etcd {endpoint}{path} failed after the request was sent ({exc}); "
                            "the write may or may not have applied: read before retrying"
                        ) from exc
                    repeated = repeated or exc.sent
                    continue
                self._succeeded(index, started)
                return reply, repeated
        raise RegistryUnavailable(
            f"no etcd endpoint answered {path} after {self._retry_rounds} rounds over "
            f"{', '.join(self._endpoints)}: {last}; check that etcd is running and reachable"
            + self._tls_hint()
        )

    async def _attempt(
        self, url: str, content: str, path: str, first_line: bool, within: float
    ) -> dict[str, Any]:
        request = _json_request(
            self._client,
            url,
            content,
            headers=self._auth_headers(path),
            timeout=httpx.Timeout(within),
        )
        try:
            # A streaming call (keepalive) sent one request: the gateway answers one
            # line and ends the response, so a plain POST reads it whole.
            response = await self._client.send(request)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            if isinstance(exc, httpx.ConnectError):
                self._raise_if_tls_failed(url, exc)
            raise _Retryable(f"{type(exc).__name__}: {exc}", sent=False) from exc
        except httpx.TimeoutException as exc:
            raise _Retryable(
                f"no answer within {within:g} s ({type(exc).__name__})", sent=True
            ) from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}", sent=True) from exc
        if response.status_code != 200:
            raise self._error(response, path)
        if first_line:
            for line in response.text.splitlines():
                if line.strip():
                    return self._parse_line(line, path, wrapped=False)
            raise _Retryable(f"{path} answered nothing", sent=True)
        try:
            reply: dict[str, Any] = response.json()
        except ValueError as exc:
            raise _Retryable(f"{path} answered non-JSON: {exc}", sent=True) from exc
        return reply

    def _parse_line(self, line: str, path: str, *, wrapped: bool = True) -> dict[str, Any]:
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise _Retryable(f"{path} streamed non-JSON: {exc}", sent=True) from exc
        if "error" in message and "result" not in message:
            raise self._error_from(message.get("error"), path)
        result: dict[str, Any] = (message.get("result") or {}) if wrapped else message
        return result

    def _error(self, response: httpx.Response, path: str) -> Exception:
        try:
            body = response.json()
        except ValueError:
            body = {"message": response.text[:200]}
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"]  # a streaming call's error envelope
        if not isinstance(body, dict):
            body = {"message": str(body)}
        code = _int(body.get("code"))
        message = str(body.get("message") or body.get("error") or response.reason_phrase)
        if code in _UNAVAILABLE_CODES or response.status_code >= 502:
            return _Retryable(f"{path}: {message}", sent=True)
        return self._error_from(body, path)

    def _error_from(self, body: Any, path: str) -> Exception:
        if not isinstance(body, dict):
            body = {"message": str(body)}
        message = str(body.get("message") or body.get("error") or "unknown error")
        code = _int(body.get("code"))
        if "lease not found" in message:
            return LeaseNotFound(0)  # _call names the lease
        auth = self._auth_error(message, code, path)
        if auth is not None:
            return auth
        if "compacted" in message:
            return RevisionCompacted(0, 0)
        if "duplicate key" in message:
            return InvalidTxn(f"etcd refused the txn: {message}")
        if code in _UNAVAILABLE_CODES:
            return _Retryable(f"{path}: {message}", sent=True)
        return RegistryError(f"etcd refused {path}: {message} (gRPC code {code})")

    # ------------------------------------------------------------------ auth

    def _auth_headers(self, path: str = "") -> dict[str, str]:
        if self._token and path != _AUTHENTICATE:
            return {"Authorization": self._token}
        return {}

    async def _ensure_token(self) -> None:
        if self._user is not None and self._token is None:
            await self._refresh_token(None)

    async def _refresh_token(self, stale: str | None) -> None:
        """Authenticate, unless another task already replaced the ``stale`` token."""
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return
            self._token = None
            reply = await self._call(
                _AUTHENTICATE, {"name": self._user, "password": self.__password}, safe=True
            )
            token = reply.get("token")
            if not isinstance(token, str) or not token:
                raise RegistryAuthError(
                    f"etcd answered the authentication of user {self._user!r} without a token"
                )
            self._token = token
            self.authentications += 1
            _log.debug("authenticated to etcd as user %r", self._user)

    def _auth_error(self, message: str, code: int, path: str) -> Exception | None:
        """The error an auth refusal from etcd stands for, or None if it is none."""
        user = self._user
        if "invalid auth token" in message or "invalid auth management" in message:
            return _TokenRefused(message)
        if "authentication failed" in message or "invalid user ID or password" in message:
            return RegistryAuthError(
                f"etcd refused user {user!r}: wrong user name or password; check "
                "--registry-user and --registry-password (or CORRAL_REGISTRY_PASSWORD, "
                "--registry-password-file)"
            )
        if "authentication is not enabled" in message and path == _AUTHENTICATE:
            return RegistryAuthError(
                f"etcd has authentication turned off, but user {user!r} was given; enable "
                "auth in etcd, or drop --registry-user and --registry-password"
            )
        if "user name is empty" in message or "user name not found" in message:
            if user is None:
                return RegistryAuthError(
                    "etcd requires authentication; give --registry-user and "
                    "--registry-password (or --registry-password-file)"
                )
            return RegistryAuthError(
                f"etcd does not know user {user!r} (it may have been deleted); check "
                "--registry-user"
            )
        if "CommonName of client" in message:
            return RegistryAuthError(
                "etcd refuses this client certificate because it has a Common Name, which "
                "etcd's JSON gateway does not accept while auth is on; issue the client "
                "certificate (--registry-cert) without a CN, naming the client in its SAN"
            )
        if "permission denied" in message or code == 7:
            who = f"user {user!r}" if user is not None else "this client"
            return RegistryAuthError(
                f"etcd denied {who} {path} under {self.prefix or 'the whole key space'!r}: "
                "grant its role read-write on that key prefix (etcdctl role grant-permission "
                "--prefix)"
            )
        return None

    def _token_keeps_failing(self, path: str) -> RegistryAuthError:
        return RegistryAuthError(
            f"etcd refused the auth token of user {self._user!r} for {path} again right after "
            "authenticating; check that every endpoint is a member of the same etcd cluster"
        )

    def _raise_if_tls_failed(self, url: str, exc: httpx.ConnectError) -> None:
        """A TLS handshake failure is a configuration error: say which files to fix."""
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ssl.SSLError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            return
        raise RegistryAuthError(
            f"TLS with etcd {url} failed: {cause}; check that etcd serves TLS there (etcd:// "
            "for plain HTTP), that --registry-ca holds the CA that signed its certificate, and "
            "(if etcd requires client certificates) --registry-cert and --registry-key"
        ) from None

    def _unavailable(self, path: str, exc: BaseException) -> RegistryUnavailable:
        return RegistryUnavailable(
            f"etcd {path} failed on every endpoint ({', '.join(self._endpoints)}): {exc}; "
            "check that etcd is running and reachable" + self._tls_hint()
        )

    def _tls_hint(self) -> str:
        if any(e.startswith("https://") for e in self._endpoints):
            return (
                " (over TLS: a connection closed at once may mean etcd wants a client "
                "certificate: --registry-cert and --registry-key)"
            )
        return " (if etcd serves TLS, use an etcds:// URL)"


async def _events_only(
    stream: AsyncGenerator[WatchEvent | None, None],
) -> AsyncGenerator[WatchEvent, None]:
    async for event in stream:
        if event is not None:
            yield event


@asynccontextmanager
async def _open_lines(response: httpx.Response) -> AsyncIterator[AsyncIterator[str]]:
    """The response's lines; on exit the response is closed and the line iterator
    run to its end, so none of httpx's nested async generators is left suspended
    (trio warns about each one the garbage collector finds)."""
    lines = response.aiter_lines()
    try:
        yield lines
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await response.aclose()
            try:
                async for _ in lines:
                    pass
            except (httpx.HTTPError, httpx.StreamError):
                pass
