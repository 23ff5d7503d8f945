"""The pure parts of the proxy drivers: version order, HAProxy update plans, Caddy documents."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral.proxy
from corral.actors.routing import RouteTable, TableVersion
from corral.proxy import HaproxyState, InvalidProxySetup, ProxyTimeouts, desired_state, plan_update
from corral.proxy._caddy_plan import caddy_config_bytes, caddy_document
from corral.proxy._haproxy_plan import (
    HaproxyFiles,
    backend_name,
    render_config,
    render_map,
    server_name,
)
from corral.proxy._status import ProxyStatus, Verdict, verdict
from corral.transport import SchemaError

MAP = "/d/hosts.map"
DOMAINS = ["a.test", "b.test", "c.test", "d.test"]
URLS = [f"http://127.0.0.1:{24000 + i}" for i in range(6)] + ["http://[::1]:24100"]

versions = st.builds(TableVersion, st.integers(0, 5), st.integers(0, 5))


@given(st.one_of(st.none(), versions), versions, st.integers(0, 6))
def test_only_a_newer_table_under_a_trusted_fence_is_applied(
    applied: TableVersion | None, offered: TableVersion, min_fence: int
) -> None:
    decided = verdict(applied, offered, min_fence=min_fence)
    if offered.fence < min_fence:
        assert decided is Verdict.STALE_FENCE
    elif applied is None or (offered.fence, offered.revision) > (applied.fence, applied.revision):
        assert decided is Verdict.APPLY
    elif offered == applied:
        assert decided is Verdict.ALREADY_APPLIED
    else:
        assert decided is Verdict.OLDER


def test_a_larger_fence_wins_over_a_larger_revision() -> None:
    assert verdict(TableVersion(3, 90), TableVersion(4, 1)) is Verdict.APPLY
    assert verdict(TableVersion(4, 1), TableVersion(3, 90)) is Verdict.OLDER


tables = st.builds(
    lambda domains, rev: RouteTable(1, rev, domains),
    st.dictionaries(
        st.sampled_from(DOMAINS),
        st.lists(st.sampled_from(URLS), min_size=1, max_size=4, unique=True).map(
            lambda u: tuple(sorted(u))
        ),
        max_size=4,
    ),
    st.integers(1, 9),
)


def run(state: HaproxyState, commands: tuple[str, ...], refuse_delete: bool) -> HaproxyState:
    """A model of what HAProxy does with the plan's commands."""
    hosts = dict(state.hosts)
    backends = {b: dict(s) for b, s in state.backends.items()}
    ready: set[tuple[str, str]] = {
        (b, s) for b, ss in backends.items() for s in ss if (b, s) not in state.parked
    }
    unchecked: set[tuple[str, str]] = set()
    for line in commands:
        words = line.split()
        if words[:2] == ["add", "server"]:
            b, s = words[2].split("/")
            assert s not in backends[b], line
            assert "check" in words, f"{line}: a runtime server is never health-checked"
            backends[b][s] = words[3]
            unchecked.add((b, s))
        elif words[:2] == ["enable", "health"]:
            b, s = words[2].split("/")
            assert s in backends[b], line
            unchecked.discard((b, s))
        elif words[:2] == ["set", "server"]:
            b, s = words[2].split("/")
            assert s in backends[b], line
            if words[4] == "ready":
                ready.add((b, s))
            else:
                ready.discard((b, s))
        elif words[:2] == ["del", "server"]:
            b, s = words[2].split("/")
            assert (b, s) not in ready, f"{line} before maintenance"
            if not refuse_delete:
                del backends[b][s]
        elif words[:2] == ["add", "map"]:
            assert words[3] not in hosts
            hosts[words[3]] = words[4]
        elif words[:2] == ["set", "map"]:
            hosts[words[3]] = words[4]
        elif words[:2] == ["del", "map"]:
            del hosts[words[3]]
        else:
            raise AssertionError(line)
    # A server added at runtime starts with its checks off: each one is turned on.
    assert not unchecked, unchecked
    live = {b: {s: a for s, a in ss.items() if (b, s) in ready} for b, ss in backends.items()}
    return HaproxyState(hosts, live)


@settings(max_examples=200)
@given(st.lists(tables, min_size=1, max_size=5), st.booleans())
def test_runtime_plans_reach_the_desired_state_or_ask_for_a_reload(
    sequence: list[RouteTable], refuse_delete: bool
) -> None:
    running: HaproxyState | None = None
    for table in sequence:
        desired = desired_state(table)
        plan = plan_update(running, desired, MAP)
        if plan.reload is not None:
            assert (
                running is None
                or set(desired.backends) - set(running.backends)
                or any("::1" in a for ss in desired.backends.values() for a in ss.values())
            )
            running = desired
            continue
        assert running is not None
        served = run(running, plan.commands, refuse_delete)
        assert served.hosts == desired.hosts
        for backend, servers in desired.backends.items():
            assert served.backends[backend] == servers
        # Adds come before removals: a domain is never left without its old servers first.
        kinds = [c.split()[0] + " " + c.split()[1] for c in plan.commands]
        if "del server" in kinds and "add server" in kinds:
            assert kinds.index("add server") < kinds.index("del server")
        parked = frozenset(
            (c.split()[2].split("/")[0], c.split()[2].split("/")[1])
            for c in plan.commands
            if refuse_delete and c.startswith("del server")
        )
        if refuse_delete:  # parked servers stay known, in maintenance, and are retried
            backends = {b: dict(s) for b, s in plan.after.backends.items()}
            for b, s in parked:
                backends[b][s] = running.backends[b][s]
            running = HaproxyState(plan.after.hosts, backends, plan.after.parked | parked)
        else:
            running = plan.after


def test_unchanged_table_needs_no_command_and_a_new_domain_a_reload() -> None:
    first = desired_state(RouteTable(1, 1, {"a.test": (URLS[0],)}))
    assert plan_update(None, first, MAP).reload == "first start"
    assert plan_update(first, first, MAP).commands == ()
    second = desired_state(RouteTable(1, 2, {"a.test": (URLS[0],), "b.test": (URLS[1],)}))
    assert plan_update(first, second, MAP).reload == "new backend d_b.test"


def test_removal_drains_then_maintains_then_deletes() -> None:
    before = desired_state(RouteTable(1, 1, {"a.test": (URLS[0], URLS[1])}))
    after = desired_state(RouteTable(1, 2, {"a.test": (URLS[0],)}))
    s = server_name(URLS[1])
    assert plan_update(before, after, MAP).commands == (
        f"set server d_a.test/{s} state drain",
        f"set server d_a.test/{s} state maint",
        f"del server d_a.test/{s}",
    )


def test_a_host_name_backend_needs_a_reload_since_runtime_servers_never_resolve() -> None:
    before = desired_state(RouteTable(1, 1, {"a.test": (URLS[0],)}))
    after = desired_state(RouteTable(1, 2, {"a.test": (URLS[0], "http://web-1.internal:80")}))
    plan = plan_update(before, after, MAP)
    assert plan.reload is not None
    assert "host name" in plan.reload


def test_generated_config_has_retries_the_404_backend_and_every_server() -> None:
    files = HaproxyFiles("/d/haproxy.cfg", MAP, "/d/admin.sock", "/d/haproxy.pid", "127.0.0.1:8080")
    state = desired_state(RouteTable(1, 1, {"a.test": (URLS[0], URLS[6])}))
    text = render_config(state, files)
    for needle in (
        "retries 3",
        "option redispatch 1",
        "retry-on conn-failure empty-response response-timeout",
        "balance leastconn",
        "timeout server 3000ms",
        "timeout check 3000ms",  # a check has a request's bound, no tighter
        "option httpchk HEAD /",
        "default-server pool-purge-delay 1s check ",
        "http-request return status 404",
        "req.hdr(host),lower,field(1,:),regsub('[.]$','')," + f"map({MAP},corral-unknown)",
        f"backend {backend_name('a.test')}",
        f"server {server_name(URLS[0])} 127.0.0.1:24000",
        f"server {server_name(URLS[6])} [::1]:24100",
        'stats socket "/d/admin.sock" mode 600 level admin',
        "bind 127.0.0.1:8080",
    ):
        assert needle in text, needle
    assert render_map(state) == "a.test d_a.test\n"


@pytest.mark.parametrize("bad", ["/tmp/a b", "relative/dir", "/tmp/x,y", "/tmp/" + "x" * 120])
def test_paths_haproxy_cannot_read_are_refused(bad: str) -> None:
    with pytest.raises(InvalidProxySetup):
        HaproxyFiles(f"{bad}/c", f"{bad}/m", f"{bad}/admin.sock", f"{bad}/p", "127.0.0.1:1")


def test_caddy_document_ends_with_a_catch_all_404_and_retries() -> None:
    doc = caddy_document(
        RouteTable(1, 1, {"b.test": (URLS[1],), "a.test": (URLS[0], URLS[6])}),
        listen="127.0.0.1:8080",
        admin="127.0.0.1:2019",
        storage="/d/storage",
    )
    routes = doc["apps"]["http"]["servers"]["corral"]["routes"]
    # Caddy's host matcher ignores case and port but not a trailing dot: both spellings.
    assert [r["match"][0]["host"] for r in routes[:-1]] == [
        ["a.test", "a.test."],
        ["b.test", "b.test."],
    ]
    assert routes[-1] == {
        "handle": [
            {
                "handler": "static_response",
                "status_code": 404,
                "headers": {"Content-Type": ["text/plain; charset=utf-8"]},
                "body": "no route for this host",
            }
        ]
    }
    proxy = routes[0]["handle"][0]
    assert [u["dial"] for u in proxy["upstreams"]] == ["127.0.0.1:24000", "[::1]:24100"]
    balancing = proxy["load_balancing"]
    # A stalled backend: least connections leaves it, a safe request it held past the
    # response timeout is tried elsewhere (the try duration outlasts that timeout), and
    # one failure keeps it out for a while.
    assert balancing["selection_policy"] == {"policy": "least_conn"}
    assert balancing["try_duration"] == "5000ms"
    assert balancing["retry_match"] == [{"method": ["GET", "HEAD", "OPTIONS"]}]
    assert proxy["transport"]["response_header_timeout"] == "3000ms"
    assert proxy["health_checks"]["passive"]["max_fails"] == 1
    assert doc["admin"]["listen"] == "127.0.0.1:2019"


def test_proxy_status_round_trips_and_refuses_bad_records() -> None:
    status = ProxyStatus(
        id="edge-1",
        kind="haproxy",
        listen="127.0.0.1:80",
        applied_fence=3,
        applied_revision=7,
        applied_at=1.5,
        error=None,
    )
    assert ProxyStatus.decode(status.encode()) == status
    assert status.applied == TableVersion(3, 7)
    with pytest.raises(SchemaError):
        ProxyStatus.decode(b'{"v":1,"id":"x","kind":"caddy","listen":"a","reloads":"no"}')
    with pytest.raises(SchemaError):
        ProxyStatus.decode(b"[]")


def test_exports_are_sorted_and_resolve() -> None:
    names = corral.proxy.__all__
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))
    for name in names:
        assert hasattr(corral.proxy, name), name


def test_caddy_bytes_are_the_document_encoded() -> None:
    t = RouteTable(1, 1, {"b.test": (URLS[1],), "a.test": (URLS[0], URLS[6])})
    args = {"listen": "127.0.0.1:8080", "admin": "127.0.0.1:2019", "storage": "/d/s"}
    assert json.loads(caddy_config_bytes(t, **args)) == caddy_document(t, **args)
    empty = RouteTable(1, 2, {})
    assert json.loads(caddy_config_bytes(empty, **args)) == caddy_document(empty, **args)


def test_the_response_timeout_setting_reaches_both_proxies_configs() -> None:
    """``--response-timeout-ms 10000``: HAProxy's server and check timeouts, Caddy's
    response-header timeout and a try duration past it; the connect bound stays."""
    timeouts = ProxyTimeouts(response_ms=10_000)
    files = HaproxyFiles("/d/haproxy.cfg", MAP, "/d/admin.sock", "/d/haproxy.pid", "127.0.0.1:8080")
    state = desired_state(RouteTable(1, 1, {"a.test": (URLS[0],)}))
    text = render_config(state, files, timeouts=timeouts)
    for needle in ("timeout server 10000ms", "timeout check 10000ms", "timeout connect 500ms"):
        assert needle in text, needle
    assert "3000ms" not in text
    table = RouteTable(1, 1, {"a.test": (URLS[0],)})
    args = {"listen": "127.0.0.1:8080", "admin": "127.0.0.1:2019", "storage": "/d/storage"}
    for doc in (
        caddy_document(table, **args, timeouts=timeouts),
        json.loads(caddy_config_bytes(table, **args, timeouts=timeouts)),
    ):
        proxy = doc["apps"]["http"]["servers"]["corral"]["routes"][0]["handle"][0]
        assert proxy["transport"]["response_header_timeout"] == "10000ms"
        assert proxy["transport"]["dial_timeout"] == "500ms"
        assert proxy["load_balancing"]["try_duration"] == "12000ms"
    # Routes cached under one setting are not served under another.
    default = json.loads(caddy_config_bytes(table, **args))
    proxy = default["apps"]["http"]["servers"]["corral"]["routes"][0]["handle"][0]
    assert proxy["transport"]["response_header_timeout"] == "3000ms"


@pytest.mark.parametrize("bad", [0, 99, 86_400_001, -5, True, 2.5])
def test_a_response_timeout_out_of_range_is_refused_naming_the_flag(bad: object) -> None:
    with pytest.raises(InvalidProxySetup, match="--response-timeout-ms"):
        ProxyTimeouts(response_ms=bad)  # type: ignore[arg-type]
