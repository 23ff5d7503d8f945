"""Node configuration: flags beat environment beat file beat defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.node import ConfigError
from corral.node._config import (
    Address,
    load_config_file,
    parse_address,
    resolve_node_config,
)


def test_defaults(tmp_path: Path) -> None:
    config = resolve_node_config({}, {}, cwd=tmp_path)
    assert config.data_dir == tmp_path / ".corral"
    assert config.registry_url == f"sqlite://{tmp_path / '.corral' / 'registry.db'}"
    assert config.api == Address("127.0.0.1", 7400)
    assert config.listen == Address("127.0.0.1", 7401)
    assert config.advertise == "127.0.0.1"
    assert (config.port_range_start, config.port_range_end) == (24000, 24998)
    assert config.port_quarantine_ms == 600_000
    assert config.lease_ttl_ms == 45_000
    assert config.node_id is None
    assert config.token is None


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    file_values = {"api": "127.0.0.1:9000", "rack": "r-file", "datacenter": "dc-file"}
    env = {"CORRAL_API": "http://127.0.0.1:9100", "CORRAL_RACK": "r-env"}
    flags = {"api": "127.0.0.1:9200"}
    config = resolve_node_config(flags, env, file_values, cwd=tmp_path)
    assert config.api == Address("127.0.0.1", 9200)
    assert config.rack == "r-env"
    assert config.datacenter == "dc-file"


def test_labels_from_each_source(tmp_path: Path) -> None:
    from_flags = resolve_node_config({"label": ["zone=a", "disk=ssd"]}, {}, cwd=tmp_path)
    assert dict(from_flags.labels) == {"zone": "a", "disk": "ssd"}
    from_env = resolve_node_config({}, {"CORRAL_LABELS": "zone=b,tier=web"}, cwd=tmp_path)
    assert dict(from_env.labels) == {"zone": "b", "tier": "web"}
    from_file = resolve_node_config({}, {}, {"label": {"zone": "c"}}, cwd=tmp_path)
    assert dict(from_file.labels) == {"zone": "c"}


def test_config_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        'data_dir = "state"\nnode-id = "web-1"\nlease-ttl-ms = 3000\n'
        'port_range_start = 25000\n[labels]\nzone = "a"\n'
    )
    config = resolve_node_config({}, {}, load_config_file(path), cwd=tmp_path)
    assert config.data_dir == tmp_path / "state"
    assert config.node_id == "web-1"
    assert config.lease_ttl_ms == 3000
    assert (config.port_range_start, config.port_range_end) == (25000, 25998)
    assert dict(config.labels) == {"zone": "a"}


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('colour = "blue"\n')
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_config_file(path)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"api": "nowhere"}, "--api: 'nowhere' is not an address"),
        ({"lease-ttl-ms": "soon"}, "--lease-ttl-ms"),
        ({"port-range-start": "30000", "port-range-end": "30000"}, "fewer than two ports"),
        ({"registry": "ftp://x"}, "--registry"),
        ({"label": ["novalue"]}, "not a label"),
    ],
)
def test_bad_values_name_the_setting(tmp_path: Path, flags: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_node_config(flags, {}, cwd=tmp_path)


def test_parse_address_forms() -> None:
    assert parse_address("http://127.0.0.1:7400/", "x") == Address("127.0.0.1", 7400)
    assert parse_address("[::1]:80", "x") == Address("::1", 80)
    assert str(Address("::1", 80)) == "[::1]:80"
    assert Address("127.0.0.1", 7400).url == "http://127.0.0.1:7400"


def test_policy_settings_from_each_source(tmp_path: Path) -> None:
    from corral.node.server._node import policy_from_config

    defaults = resolve_node_config({}, {}, cwd=tmp_path)
    assert (
        defaults.grace_period_ms,
        defaults.cooldown_ms,
        defaults.disruption_budget,
        defaults.min_usable_percent,
    ) == (300_000, 600_000, 5, 50)
    policy = policy_from_config(defaults)
    assert (policy.grace_period_s, policy.cooldown_s) == (300.0, 600.0)
    assert (policy.disruption_budget, policy.min_usable_fraction) == (5, 0.5)
    config = resolve_node_config(
        {"grace-period-ms": "2000"},
        {"CORRAL_COOLDOWN_MS": "1500", "CORRAL_DISRUPTION_BUDGET": "0"},
        {"min-usable-percent": 75, "grace-period-ms": 9},
        cwd=tmp_path,
    )
    policy = policy_from_config(config)
    assert (policy.grace_period_s, policy.cooldown_s) == (2.0, 1.5)
    assert (policy.disruption_budget, policy.min_usable_fraction) == (0, 0.75)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"grace-period-ms": "-1"}, "--grace-period-ms: '-1' is not a whole number"),
        ({"min-usable-percent": "101"}, "from 0 to 100"),
        ({"disruption-budget": "many"}, "--disruption-budget"),
    ],
)
def test_bad_policy_settings_name_the_setting(
    tmp_path: Path, flags: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_node_config(flags, {}, cwd=tmp_path)
