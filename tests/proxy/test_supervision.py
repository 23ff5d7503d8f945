"""Proxy supervision without a real proxy: the restart backoff and the ownership rule
(pure), the engine restarting a driver whose process dies (virtual time), the id
claim on the in-memory registry, and how a silent proxy is shown and told."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from corral.actors.routing import RouteTable
from corral.actors.routing._view import newly_silent, routes_answer
from corral.node.cli._format import routes_text
from corral.proxy import ProxyEngine, ProxyInUse, ProxyStartFailed
from corral.proxy._claim import DataDirLock, Owner, claim_id, release_id
from corral.proxy._driver import Applied, ProxyDriver
from corral.proxy._status import ProxyStatus, RestartPolicy, claim_refusal, restart_delay
from corral.registry import MemoryRegistry, ProxyRecord, decode_record, proxy_key

POLICY = RestartPolicy(base=0.5, cap=30.0, stable=60.0)


# ---------------------------------------------------------------- restart backoff (pure)


def test_the_first_exit_restarts_at_once_then_waits_double_up_to_the_cap() -> None:
    exits: list[float] = []
    delays = []
    for now in range(0, 80, 5):  # dies every 5 s: a crash loop
        exits.append(float(now))
        delays.append(restart_delay(exits, POLICY))
    assert delays[:8] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert set(delays[8:]) == {30.0}


def test_a_process_that_stayed_up_for_the_stable_period_restarts_at_once() -> None:
    assert restart_delay([0.0, 1.0, 2.0], POLICY) == 1.0
    assert restart_delay([0.0, 1.0, 2.0, 62.0], POLICY) == 0.0
    assert restart_delay([0.0, 1.0, 2.0, 62.0, 63.0], POLICY) == 0.5


@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), max_size=40))
def test_the_delay_is_bounded_and_never_shrinks_within_a_crash_loop(gaps: list[float]) -> None:
    exits: list[float] = []
    now = 0.0
    previous = 0.0
    for gap in gaps:
        now += gap
        exits.append(now)
        delay = restart_delay(exits, POLICY)
        assert 0.0 <= delay <= POLICY.cap
        if gap >= POLICY.stable or len(exits) == 1:
            assert delay == 0.0  # stable (or first): at once
        else:
            assert delay >= previous  # still looping: never shorter
        previous = delay


# ---------------------------------------------------------------- who owns an id (pure)


def owned(**fields: Any) -> ProxyRecord:
    base: dict[str, Any] = {
        "pid": 4242,
        "host": "h1",
        "started_at": 10.0,
        "reported_at": 100.0,
        "report_every": 5.0,
    }
    return ProxyRecord("edge", "haproxy", "127.0.0.1:8080", **(base | fields))


def test_a_live_owner_on_this_host_refuses_with_its_pid_and_address() -> None:
    refusal = claim_refusal(owned(), host="h1", now=100.0, owner_alive=True)
    assert refusal is not None
    assert "pid 4242" in refusal
    assert "127.0.0.1:8080" in refusal
    assert "\n" not in refusal


def test_a_dead_owner_an_unowned_or_no_record_never_blocks() -> None:
    # Dead on this host: free even though its record is fresh (killed a moment ago).
    assert claim_refusal(owned(), host="h1", now=100.0, owner_alive=False) is None
    assert claim_refusal(owned(pid=None), host="h1", now=100.0, owner_alive=None) is None
    assert claim_refusal(None, host="h1", now=100.0, owner_alive=None) is None


def test_an_owner_on_another_host_blocks_while_it_reports() -> None:
    assert claim_refusal(owned(), host="h2", now=101.0, owner_alive=None) is not None
    assert "on host h1" in (claim_refusal(owned(), host="h2", now=101.0, owner_alive=None) or "")
    assert claim_refusal(owned(), host="h2", now=200.0, owner_alive=None) is None  # silent


# ---------------------------------------------------------------- not reporting (pure)


def test_a_record_not_refreshed_for_three_reports_is_not_reporting() -> None:
    record = owned()
    assert record.not_reporting_for(110.0) is None  # two reports late: a slow registry
    assert record.not_reporting_for(115.0) is None
    assert record.not_reporting_for(132.0) == 32.0
    legacy = ProxyRecord("old", "caddy", "127.0.0.1:1")  # written before reported_at existed
    assert legacy.not_reporting_for(1e9) is None


def test_the_new_fields_survive_the_registry_codec() -> None:
    record = owned(restarts=2, last_error="haproxy killed by SIGKILL", since=99.0)
    decoded = decode_record(proxy_key("edge"), record.encode())
    assert decoded == record


def test_a_silent_proxy_is_told_once_per_silence() -> None:
    silent = owned(reported_at=0.0)
    fine = ProxyRecord("fine", "caddy", "127.0.0.1:2", reported_at=99.0, report_every=5.0)
    told, flagged = newly_silent([silent, fine], now=100.0, flagged=frozenset())
    assert [(r.id, s) for r, s in told] == [("edge", 100.0)]
    again, flagged = newly_silent([silent, fine], now=110.0, flagged=flagged)
    assert again == []
    back, flagged = newly_silent([owned(reported_at=109.0)], now=110.0, flagged=flagged)
    assert back == []
    assert flagged == frozenset()
    told, _ = newly_silent([silent], now=200.0, flagged=flagged)
    assert [r.id for r, _ in told] == ["edge"]  # silent again after it reported: told again


def test_routes_shows_a_silent_proxy_and_restarts() -> None:
    table = RouteTable(1, 3, {"shop.test": ("http://h:1",)})
    silent = owned(applied_fence=1, applied_revision=3, applied_at=50.0, reported_at=68.0)
    restarted = ProxyRecord(
        "r-edge",
        "caddy",
        "127.0.0.1:81",
        1,
        3,
        applied_at=50.0,
        restarts=1,
        last_error="caddy killed by SIGKILL",
        since=90.0,
        reported_at=99.0,
        report_every=5.0,
    )
    answer = routes_answer(table, [silent, restarted], now=100.0)
    by_id = {p["id"]: p for p in answer["proxies"]}
    assert by_id["edge"]["not_reporting_s"] == 32.0
    assert by_id["r-edge"]["not_reporting_s"] is None
    assert by_id["r-edge"]["restarts"] == 1
    text = routes_text(answer)
    edge_line = next(line for line in text.splitlines() if line.startswith("edge"))
    assert "not reporting for 32 s" in edge_line
    restarted_line = next(line for line in text.splitlines() if line.startswith("r-edge"))
    assert "serving" in restarted_line
    assert "caddy killed by SIGKILL" in restarted_line
    assert " 1 " in restarted_line


# ---------------------------------------------------------------- the engine supervising


class DyingDriver(ProxyDriver):
    """A driver whose process dies when told, and fails its next ``fail_starts`` starts."""

    kind = "memory"

    def __init__(self) -> None:
        self.served: RouteTable | None = None
        self.die = trio.Event()
        self.fail_starts = 0
        self.starts: list[float] = []
        self.started_with: list[RouteTable | None] = []
        self.running = True

    @property
    def listen(self) -> str:
        return "127.0.0.1:1"

    @property
    def reloads(self) -> int:
        return len(self.starts)

    async def apply(self, table: RouteTable) -> Applied:
        self.served = table
        return Applied("memory", 0.0)

    async def wait_exit(self) -> int:
        if self.running:
            await self.die.wait()
            self.die = trio.Event()
            self.running = False
        return -9

    async def restart(self) -> Applied | None:
        self.starts.append(trio.current_time())
        if self.fail_starts:
            self.fail_starts -= 1
            raise ProxyStartFailed("cannot bind 127.0.0.1:1 (test)")
        self.running = True
        self.started_with.append(self.served)
        return Applied("start", 0.0)


async def test_a_dead_process_is_started_again_with_its_table_and_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    statuses: list[ProxyStatus] = []
    driver = DyingDriver()
    engine = ProxyEngine(
        driver,
        proxy_id="p1",
        wall_clock=trio.current_time,
        emit=lambda k, **f: events.append((k, f)),
    )
    table = RouteTable(1, 1, {"a.test": ("http://127.0.0.1:1001",)})
    await engine.offer(table)

    async def record(status: ProxyStatus) -> None:
        statuses.append(status)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: engine.supervise(on_status=record, policy=POLICY))
        await trio.sleep(1)
        died_at = trio.current_time()
        driver.die.set()
        await trio.sleep(0.001)
        assert driver.starts == [died_at]  # at once
        assert driver.started_with == [table]
        status = engine.status
        assert (status.restarts, status.since) == (1, died_at)
        assert status.last_error == "memory killed by SIGKILL"
        assert [s.since for s in statuses] == [None, died_at]  # the outage, then the restart
        assert [k for k, _ in events] == ["proxy.applied", "proxy.failed", "proxy.restarted"]
        assert events[2][1]["restarts"] == 1

        # A crash loop: it dies again at once and its next two starts fail.
        driver.fail_starts = 2
        t0 = trio.current_time()
        driver.die.set()
        await trio.sleep(10)
        assert [s - t0 for s in driver.starts[1:]] == pytest.approx([0.5, 1.5, 3.5])
        assert engine.status.restarts == 2
        assert engine.status.since == pytest.approx(t0 + 3.5)
        assert engine.status.last_error is not None
        assert "did not start again" in engine.status.last_error
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- owning a data dir and an id


def test_a_second_lock_on_a_data_dir_names_the_first_pid_and_address(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path, "127.0.0.1:8080")
    try:
        # flock locks belong to the open file: a second open in this process conflicts too.
        with pytest.raises(ProxyInUse) as caught:
            DataDirLock(tmp_path, "127.0.0.1:9090")
        message = str(caught.value)
        assert f"pid {os.getpid()}" in message
        assert "127.0.0.1:8080" in message
        assert "\n" not in message
    finally:
        first.release()
    DataDirLock(tmp_path, "127.0.0.1:9090").release()  # free again once released


async def test_an_id_owned_by_a_live_process_is_refused_and_kept() -> None:
    registry = MemoryRegistry()
    me = Owner.this_process()
    # The record of a live owner on this host: the test's parent process.
    parent = Owner(os.getppid(), me.host, _create_time(os.getppid()))
    theirs = _stamped(ProxyStatus("edge", "haproxy", "127.0.0.1:8080"), parent)
    await registry.put(proxy_key("edge"), theirs.encode())
    mine = _stamped(ProxyStatus("edge", "haproxy", "127.0.0.1:9090"), me)
    with pytest.raises(ProxyInUse, match=f"pid {parent.pid} "):
        await claim_id(registry, mine, now=100.0)
    await release_id(registry, "edge", me)  # not its record: left alone
    kv = await registry.get(proxy_key("edge"))
    assert kv is not None
    assert ProxyStatus.decode(kv.value).pid == parent.pid


async def test_a_record_left_by_a_dead_process_is_taken_over() -> None:
    registry = MemoryRegistry()
    me = Owner.this_process()
    dead = Owner(_a_dead_pid(), me.host, 1.0)
    await registry.put(
        proxy_key("edge"), _stamped(ProxyStatus("edge", "haproxy", "l:1"), dead).encode()
    )
    mine = _stamped(ProxyStatus("edge", "haproxy", "127.0.0.1:9090"), me)
    await claim_id(registry, mine, now=100.0)
    kv = await registry.get(proxy_key("edge"))
    assert kv is not None
    assert ProxyStatus.decode(kv.value).pid == me.pid
    await release_id(registry, "edge", me)
    assert await registry.get(proxy_key("edge")) is None


def _stamped(status: ProxyStatus, owner: Owner) -> ProxyStatus:
    return ProxyStatus(
        status.id,
        status.kind,
        status.listen,
        pid=owner.pid,
        host=owner.host,
        started_at=owner.started_at,
        reported_at=99.0,
        report_every=5.0,
    )


def _create_time(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).create_time())


def _a_dead_pid() -> int:
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
