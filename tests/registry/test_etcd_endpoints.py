"""Which etcd endpoint next, how long to wait, which writes may be repeated
(the pure policy of ``corral.registry._endpoints``), and the client acting on it
over a transport whose first endpoint is silent (issue 26: one silent endpoint
must cost one short attempt, not stall every call)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from corral.registry import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EtcdRegistry,
    Get,
    Put,
    RegistryUnavailable,
    open_registry,
)
from corral.registry._endpoints import (
    MAX_PASS_OVER,
    MAX_REQUEST_TIMEOUT,
    MIN_UNREPEATABLE_TIMEOUT,
    EndpointHealth,
    after_failure,
    after_success,
    attempt_timeout,
    endpoint_order,
    repeat_is_harmless,
    request_timeout_for,
    retry_after,
    round_timeout,
    watch_idle_for,
)

# ---------------------------------------------------------------- timeouts


def test_the_request_timeout_is_an_eighth_of_the_lease_ttl_within_bounds() -> None:
    assert request_timeout_for(4.0) == 0.5
    assert request_timeout_for(15.0) == 1.875
    assert request_timeout_for(0.3) == 0.2  # never below 0.2 s
    assert request_timeout_for(3600.0) == 10.0  # never above the old fixed 10 s
    assert request_timeout_for(None) == 2.0


@given(st.floats(min_value=0.3, max_value=3600.0))
def test_a_silent_member_and_a_retry_fit_in_a_renewal_window(ttl: float) -> None:
    """Renewed at a third of the TTL, a lease has two thirds left: one timed-out
    attempt at a silent member plus a full attempt elsewhere must fit (for TTLs
    that are not below the 0.2 s floor's reach)."""
    timeout = request_timeout_for(ttl)
    if ttl >= 8 * 0.2:
        assert 2 * timeout <= ttl * 2 / 3 - timeout


@given(st.floats(min_value=0.2, max_value=10.0), st.integers(min_value=0, max_value=20))
def test_each_round_waits_longer_up_to_a_cap(timeout: float, round_index: int) -> None:
    this, following = round_timeout(timeout, round_index), round_timeout(timeout, round_index + 1)
    assert timeout <= this <= following <= 10.0
    assert watch_idle_for(timeout) >= max(1.0, timeout)


# ---------------------------------------------------------------- endpoint order

healths = st.builds(
    EndpointHealth,
    failures=st.integers(min_value=0, max_value=8),
    failed_at=st.floats(min_value=0, max_value=100),
    latency=st.none() | st.floats(min_value=0, max_value=5),
)


@given(st.lists(healths, min_size=1, max_size=6), st.data(), st.floats(0, 200))
def test_every_endpoint_is_tried_once_healthy_ones_first(
    health: list[EndpointHealth], data: st.DataObject, now: float
) -> None:
    preferred = data.draw(st.integers(min_value=0, max_value=len(health) - 1))
    order = endpoint_order(health, preferred, now, backoff=1.0, max_backoff=MAX_PASS_OVER)
    assert sorted(order) == list(range(len(health)))
    kinds = [health[i].healthy for i in order]
    assert kinds == sorted(kinds, reverse=True), "a failed endpoint came before a healthy one"
    if health[preferred].healthy:
        assert order[0] == preferred


def test_a_failed_endpoint_is_passed_over_until_its_backoff_then_probed() -> None:
    failed = after_failure(EndpointHealth(), now=10.0)
    health = [failed, EndpointHealth(latency=0.01), EndpointHealth()]
    assert endpoint_order(health, 0, 10.5, backoff=1.0, max_backoff=30.0) == [1, 2, 0]
    # Backoff passed, but healthy ones still go first; it is probed before any
    # endpoint still in backoff.
    health[2] = after_failure(EndpointHealth(), now=10.9)
    assert endpoint_order(health, 1, 11.0, backoff=1.0, max_backoff=30.0) == [1, 0, 2]


def test_failures_in_a_row_lengthen_the_pass_over_and_a_success_ends_it() -> None:
    assert [retry_after(n, 1.0, 30.0) for n in range(7)] == [0, 1, 2, 4, 8, 16, 30]
    health = EndpointHealth()
    for now in (1.0, 2.0, 3.0):
        health = after_failure(health, now)
    assert health.failures == 3
    recovered = after_success(health, 0.02)
    assert recovered.healthy
    assert recovered.latency == 0.02


def test_the_faster_healthy_endpoint_is_preferred_when_the_preferred_one_fails() -> None:
    health = [
        after_failure(EndpointHealth(), 5.0),
        EndpointHealth(latency=0.2),
        EndpointHealth(latency=0.01),
    ]
    assert endpoint_order(health, 0, 5.0, backoff=1.0, max_backoff=30.0) == [2, 1, 0]


# ---------------------------------------------------------------- repeating writes


@pytest.mark.parametrize(
    ("compares", "success", "failure", "harmless"),
    [
        # Guards its own write: a landed first attempt makes the repeat fail.
        ([Compare.absent("a")], [Put("a", b"1")], [], True),
        ([Compare.mod_revision_is("a", 7)], [Put("a", b"1"), Put("b", b"1")], [], True),
        ([Compare.version_is("a", 3)], [Delete("a")], [Get("a")], True),
        ([Compare.create_revision_is("a", 5)], [Delete("a")], [], True),
        # Reads only: repeatable.
        ([], [Get("a")], [Get("b")], True),
        # A repeat could apply again.
        ([], [Put("a", b"1")], [], False),
        ([Compare.absent("a")], [Put("b", b"1")], [], False),
        ([Compare.create_revision_is("a", 5)], [Put("a", b"1")], [], False),
        ([Compare.absent("a")], [Delete("a")], [], False),
        ([Compare.value_is("a", b"x")], [Put("a", b"y")], [], False),
        ([Compare("a", CompareTarget.VERSION, CompareOp.GREATER, 1)], [Put("a", b"1")], [], False),
        ([Compare.absent("a")], [Put("a", b"1")], [Put("c", b"1")], False),
        ([Compare.version_is("a", 2)], [Delete("a", prefix=True)], [], False),
    ],
)
def test_a_txn_is_repeated_only_when_its_own_guard_stops_a_second_landing(
    compares: list[Compare],
    success: list[Put | Delete | Get],
    failure: list[Get | Put],
    harmless: bool,
) -> None:
    assert repeat_is_harmless(compares, success, failure) is harmless


# ---------------------------------------------------------------- the client


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class SilentFirst(httpx.AsyncBaseTransport):
    """``e1`` takes every request and never answers (a SIGSTOPped member: the
    connection opens, the read times out); the others answer, counting writes."""

    def __init__(self) -> None:
        self.silent = True
        self.refusing: set[str] = set()
        self.seen: list[tuple[str, str]] = []
        self.applied_txns = 0
        self.revision = 10

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.seen.append((host, path))
        timeout = request.extensions["timeout"]["read"]
        if host in self.refusing:
            raise httpx.ConnectError("connection refused", request=request)
        if host == "e1" and self.silent:
            await trio.sleep(timeout)
            raise httpx.ReadTimeout("timed out", request=request)
        await trio.sleep(0.001)
        header = {"header": {"revision": str(self.revision)}}
        if path == "/v3/kv/range":
            kv = {"key": b64("apps/a"), "value": b64("1"), "mod_revision": "3", "version": "1"}
            return httpx.Response(200, json={**header, "kvs": [kv]})
        if path == "/v3/kv/txn":
            body = json.loads(await request.aread())
            self.applied_txns += 1
            self.revision += 1
            return httpx.Response(
                200, json={**header, "succeeded": True, "responses": [{}] * len(body["success"])}
            )
        if path == "/v3/lease/keepalive":
            return httpx.Response(200, text=json.dumps({"result": {"ID": "5", "TTL": "4"}}))
        return httpx.Response(200, json=header)


def silent_first_client(transport: SilentFirst) -> EtcdRegistry:
    return EtcdRegistry(["e1:2379", "e2:2379", "e3:2379"], transport=transport, lease_ttl=4.0)


async def test_a_silent_first_endpoint_costs_one_short_attempt(autojump_clock: object) -> None:
    transport = SilentFirst()
    registry = silent_first_client(transport)
    try:
        started = trio.current_time()
        assert await registry.get("apps/a") is not None
        assert trio.current_time() - started == pytest.approx(0.5 + 0.001)
        # Then e1 is passed over: later calls go straight to e2.
        for _ in range(3):
            started = trio.current_time()
            assert await registry.keepalive(5) == 4.0
            assert trio.current_time() - started == pytest.approx(0.001)
        assert [host for host, _ in transport.seen] == ["e1", "e2", "e2", "e2", "e2"]
    finally:
        await registry.aclose()


async def test_a_guarded_txn_is_repeated_on_the_next_endpoint(autojump_clock: object) -> None:
    transport = SilentFirst()
    registry = silent_first_client(transport)
    try:
        result = await registry.txn([Compare.mod_revision_is("apps/a", 3)], [Put("apps/a", b"2")])
        assert result.succeeded
        assert transport.applied_txns == 1
        assert [host for host, _ in transport.seen] == ["e1", "e2"]
    finally:
        await registry.aclose()


@given(st.floats(0.2, 10.0), st.integers(0, 6))
def test_a_write_that_cannot_be_repeated_waits_at_least_the_floor(
    request_timeout: float, round_index: int
) -> None:
    repeatable = attempt_timeout(request_timeout, round_index, True, 3)
    assert repeatable == round_timeout(request_timeout, round_index)
    unrepeatable = attempt_timeout(request_timeout, round_index, False, 3)
    assert unrepeatable == max(repeatable, MIN_UNREPEATABLE_TIMEOUT)
    # With one endpoint there is nowhere else to go: every attempt waits the longest.
    for repeat in (True, False):
        assert attempt_timeout(request_timeout, round_index, repeat, 1) == MAX_REQUEST_TIMEOUT


async def test_an_unguarded_write_that_may_have_landed_says_so(autojump_clock: object) -> None:
    transport = SilentFirst()
    registry = silent_first_client(transport)
    try:
        started = trio.current_time()
        with pytest.raises(RegistryUnavailable, match="may or may not have applied"):
            await registry.put("apps/a", b"2")
        # A slow member (a loaded disk) gets the floor, not the read's short attempt:
        # giving up sooner would reach no other endpoint, only a doubtful answer.
        assert trio.current_time() - started == pytest.approx(MIN_UNREPEATABLE_TIMEOUT, abs=0.01)
        assert [host for host, _ in transport.seen] == ["e1"], "sent again blindly"
        # The endpoint is now passed over: the next write goes to a healthy one.
        await registry.put("apps/a", b"3")
        assert transport.seen[-1][0] == "e2"
    finally:
        await registry.aclose()


async def test_a_passed_over_endpoint_is_still_tried_when_the_others_fail(
    autojump_clock: object,
) -> None:
    transport = SilentFirst()
    registry = silent_first_client(transport)
    try:
        await registry.get("apps/a")  # e1 times out: passed over for a while
        transport.silent = False
        transport.refusing = {"e2", "e3"}
        started = trio.current_time()
        assert await registry.get("apps/a") is not None
        assert trio.current_time() - started < 0.01
        assert [host for host, _ in transport.seen] == ["e1", "e2", "e2", "e3", "e1"]
        # It answered: healthy and preferred again.
        assert registry.endpoint_health[0][1].healthy
        transport.refusing = set()
        await registry.get("apps/a")
        assert transport.seen[-1][0] == "e1"
    finally:
        await registry.aclose()


async def test_a_granted_lease_shrinks_the_timeout_to_fit_its_ttl(autojump_clock: object) -> None:
    registry = silent_first_client(SilentFirst())
    try:
        assert registry.request_timeout == 0.5
        await registry.grant(1.6)
        assert registry.request_timeout == 0.2
    finally:
        await registry.aclose()


async def test_open_registry_sizes_etcd_timeouts_from_the_lease_ttl() -> None:
    async with open_registry("etcd://e1:2379,e2:2379", lease_ttl=4.0) as registry:
        assert isinstance(registry, EtcdRegistry)
        assert registry.request_timeout == 0.5


class WatchFeed(httpx.AsyncByteStream):
    """A ``/v3/watch`` stream from one mock member: "created", then the events from
    its start revision on as they are appended; silent (a read timeout) once its
    member goes silent."""

    def __init__(self, cluster: WatchCluster, host: str, start: int, request: httpx.Request):
        self._cluster, self._host, self._next, self._request = cluster, host, start, request
        self._created = False
        self._read = request.extensions["timeout"]["read"]

    def __aiter__(self) -> WatchFeed:
        return self

    async def __anext__(self) -> bytes:
        if not self._created:
            self._created = True
            return json.dumps({"result": {"created": True}}).encode() + b"\n"
        while True:
            if self._host in self._cluster.silent:
                await trio.sleep(self._read)
                raise httpx.ReadTimeout("timed out", request=self._request)
            pending = [(r, k) for r, k in self._cluster.events if r >= self._next]
            if pending:
                self._next = pending[-1][0] + 1
                events = [
                    {"kv": {"key": b64(k), "value": b64("v"), "mod_revision": str(r)}}
                    for r, k in pending
                ]
                return json.dumps({"result": {"events": events}}).encode() + b"\n"
            with trio.move_on_after(self._read):
                await self._cluster.changed.wait()
                continue
            raise httpx.ReadTimeout("timed out", request=self._request)


class WatchCluster(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.silent = {"e1"}
        self.events: list[tuple[int, str]] = []
        self.changed = trio.Event()
        self.opened: list[str] = []

    def append(self, revision: int, key: str) -> None:
        self.events.append((revision, key))
        self.changed.set()
        self.changed = trio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.silent:
            await trio.sleep(request.extensions["timeout"]["read"])
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path != "/v3/watch":
            return httpx.Response(200, json={"header": {"revision": "1"}})
        self.opened.append(host)
        body = json.loads(await request.aread())
        start = int(body["create_request"]["start_revision"])
        return httpx.Response(200, stream=WatchFeed(self, host, start, request))


async def test_a_watch_moves_off_a_silent_member_and_misses_nothing(
    autojump_clock: object,
) -> None:
    transport = WatchCluster()
    registry = EtcdRegistry(["e1:2379", "e2:2379", "e3:2379"], transport=transport, lease_ttl=4.0)
    try:
        started = trio.current_time()
        async with registry.watch("apps/", start_revision=2) as events:
            # e1 is silent: opening there costs one 0.5 s attempt, then e2 answers.
            assert trio.current_time() - started == pytest.approx(0.5)
            transport.append(2, "apps/a")
            assert (await events.__anext__()).kv.key == "apps/a"
            # e2 goes silent mid-stream: after 2 s (4 x 0.5 s) with no news the
            # watch opens again, e2 does not answer within 0.5 s, e3 does, from
            # revision 3: the event written meanwhile is delivered.
            transport.silent = {"e1", "e2"}
            transport.append(3, "apps/b")
            silent_at = trio.current_time()
            event = await events.__anext__()
            assert (event.kv.key, event.kv.mod_revision) == ("apps/b", 3)
            assert trio.current_time() - silent_at == pytest.approx(2.0 + 0.5)
            assert transport.opened == ["e2", "e3"]
    finally:
        await registry.aclose()
