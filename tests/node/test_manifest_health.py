"""``[health]`` in corral.toml: parsed into the manifest, carried on the deployment."""

from __future__ import annotations

import pytest

from corral.node import ArtifactInvalid
from corral.node.artifacts import parse_manifest
from corral.registry import Deployment, HealthSpec

BASE = b'command = ["python3", "server.py"]\n'


def test_health_table_is_read_with_defaults() -> None:
    manifest = parse_manifest(BASE + b'[health]\npath = "/healthz"\n', None)
    assert manifest.health == HealthSpec(path="/healthz", interval_ms=2000, timeout_ms=1000)
    manifest = parse_manifest(
        BASE + b'[health]\npath = "/ok"\ninterval_ms = 500\ntimeout_ms = 200\n', None
    )
    assert manifest.health == HealthSpec("/ok", 500, 200)
    assert parse_manifest(BASE, None).health is None


@pytest.mark.parametrize(
    ("table", "words"),
    [
        (b'health = "x"\n', "must be a table"),
        (b'[health]\npath = "healthz"\n', "must start with '/'"),
        (b"[health]\npath = 5\n", "must be a string"),
        (b'[health]\npath = "/h"\ninterval_ms = 0\n', "interval_ms"),
        (b'[health]\npath = "/h"\ntimeout_ms = "1s"\n', "timeout_ms"),
        (b'[health]\npath = "/h"\nport = 80\n', "unknown keys 'port'"),
    ],
)
def test_a_bad_health_table_is_refused_naming_the_field(table: bytes, words: str) -> None:
    with pytest.raises(ArtifactInvalid, match=words):
        parse_manifest(BASE + table, None)


def test_the_deployment_carries_health_and_old_records_read_without_it() -> None:
    deployment = Deployment("a" * 64, ["x"], health=HealthSpec("/healthz"))
    assert Deployment.from_json(deployment.to_json()) == deployment
    plain = Deployment("a" * 64, ["x"])
    assert "health" not in plain.to_json()
    assert Deployment.from_json(plain.to_json()).health is None
