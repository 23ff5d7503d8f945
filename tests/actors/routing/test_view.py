"""What ``corral routes`` answers (pure)."""

from __future__ import annotations

from corral.actors.routing import RouteTable, TableVersion
from corral.actors.routing._render import HeldBack
from corral.actors.routing._view import proxy_lag, routes_answer
from corral.registry import ProxyRecord, decode_record, proxy_key


def test_the_answer_has_the_version_routes_held_back_and_proxies() -> None:
    table = RouteTable(
        4, 9, {"shop.test": ("http://h:1", "http://h:2")}, (HeldBack("shop", "n3", "not ready"),)
    )
    current = ProxyRecord("edge", "haproxy", "127.0.0.1:80", 4, 9, applied_at=100.0)
    behind = ProxyRecord("b-edge", "caddy", "127.0.0.1:81", 4, 8, applied_at=90.0, error="boom")
    never = ProxyRecord("c-edge", "caddy", "127.0.0.1:82")
    answer = routes_answer(table, [current, behind, never], now=100.5)
    assert answer["version"] == {"fence": 4, "revision": 9}
    assert answer["routes"] == {"shop.test": ["http://h:1", "http://h:2"]}
    assert answer["held_back"] == [{"app": "shop", "node": "n3", "why": "not ready"}]
    assert [p["id"] for p in answer["proxies"]] == ["b-edge", "c-edge", "edge"]
    by_id = {p["id"]: p for p in answer["proxies"]}
    assert by_id["edge"]["lag_s"] == 0.0
    assert by_id["edge"]["applied"] == {"fence": 4, "revision": 9}
    assert by_id["b-edge"]["lag_s"] == 10.5
    assert by_id["b-edge"]["error"] == "boom"
    assert by_id["c-edge"]["applied"] is None
    assert by_id["c-edge"]["lag_s"] is None


def test_no_table_yet() -> None:
    answer = routes_answer(None, [], now=0.0)
    assert answer == {"version": None, "routes": {}, "held_back": [], "proxies": []}


def test_a_newer_fence_counts_as_current() -> None:
    proxy = ProxyRecord("p", "haproxy", "l", applied_fence=5, applied_revision=1, applied_at=0.0)
    assert proxy_lag(proxy, TableVersion(4, 30), now=50.0) == 0.0
    assert proxy_lag(proxy, TableVersion(5, 2), now=50.0) == 50.0


def test_the_proxy_record_is_a_registry_key_kind() -> None:
    record = ProxyRecord("edge-1", "caddy", "127.0.0.1:80", 1, 2, 3.0, error="x" * 5000)
    decoded = decode_record(proxy_key("edge-1"), record.encode())
    assert isinstance(decoded, ProxyRecord)
    assert decoded.applied_revision == 2
    assert decoded.error == "x" * 1000  # bounded
    wrong = decode_record(proxy_key("other"), record.encode())
    assert "names proxy 'edge-1'" in getattr(wrong, "reason", "")
