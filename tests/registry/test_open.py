"""Registry URLs and open_registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.registry import (
    EtcdRegistry,
    InvalidRegistryUrl,
    MemoryRegistry,
    RegistryUrl,
    SQLiteRegistry,
    open_registry,
    parse_registry_url,
)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("memory://", RegistryUrl("memory")),
        ("sqlite:///var/lib/corral/r.db", RegistryUrl("sqlite", "/var/lib/corral/r.db")),
        (
            "sqlite:///r.db?poll_interval=0.2&synchronous=full",
            RegistryUrl("sqlite", "/r.db", poll_interval=0.2, synchronous="FULL"),
        ),
        ("etcd://127.0.0.1:2379", RegistryUrl("etcd", endpoints=("127.0.0.1:2379",))),
        (
            "etcd://a:2379,b:2379/?prefix=corral/prod/",
            RegistryUrl("etcd", endpoints=("a:2379", "b:2379"), prefix="corral/prod/"),
        ),
    ],
)
def test_good_urls_parse(url: str, parsed: RegistryUrl) -> None:
    assert parse_registry_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("registry.db", "no scheme"),
        ("redis://localhost:6379", "unknown scheme 'redis'"),
        ("sqlite://relative.db", "must be absolute"),
        ("sqlite:///r.db?speed=fast", "unknown SQLite options"),
        ("sqlite:///r.db?poll_interval=-1", "poll_interval"),
        ("sqlite:///r.db?synchronous=off", "synchronous"),
        ("etcd://localhost", "is not host:port"),
        ("etcd://a:2379,", "is not host:port"),
        ("etcd://a:99999", "is not host:port"),
        ("etcd://a:2379/path", "no path"),
        ("memory://x", "takes no path"),
    ],
)
def test_bad_urls_say_what_is_accepted(url: str, why: str) -> None:
    with pytest.raises(InvalidRegistryUrl, match="accepted: memory://, sqlite:///") as caught:
        parse_registry_url(url)
    assert why in str(caught.value)
    assert repr(url) in str(caught.value)


async def test_open_registry_opens_each_backend(tmp_path: Path) -> None:
    async with open_registry("memory://") as memory:
        assert isinstance(memory, MemoryRegistry)
        await memory.put("apps/a", b"1")
    async with open_registry(f"sqlite://{tmp_path}/sub/registry.db") as sqlite:
        assert isinstance(sqlite, SQLiteRegistry)
        await sqlite.put("apps/a", b"1")
    assert (tmp_path / "sub" / "registry.db").exists()
    async with open_registry("etcd://127.0.0.1:1,127.0.0.1:2/?prefix=ns/") as etcd:
        assert isinstance(etcd, EtcdRegistry)  # opening makes no connection
        assert etcd.endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        assert etcd.prefix == "ns/"
