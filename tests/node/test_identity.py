"""Node id, token and secret files; the capacity probe."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.node import ConfigError
from corral.node._identity import (
    ensure_node_id,
    ensure_secret_file,
    node_id_from_hostname,
    probe_capacity,
)
from corral.registry import validate_name


@settings(max_examples=60)
@given(st.text(max_size=80))
def test_hostname_always_gives_a_valid_node_id(hostname: str) -> None:
    assert validate_name("node", node_id_from_hostname(hostname))


def test_hostname_examples() -> None:
    assert node_id_from_hostname("Web_01.example.com") == "web-01"
    assert node_id_from_hostname("---") == "node"


def test_node_id_is_persisted_and_guarded(tmp_path: Path) -> None:
    assert ensure_node_id(tmp_path, None, "box.lan") == "box"
    assert (tmp_path / "node-id").read_text().strip() == "box"
    assert ensure_node_id(tmp_path, None, "other-host") == "box"
    with pytest.raises(ConfigError, match="belongs to node 'box'"):
        ensure_node_id(tmp_path, "web-2", "box")


def test_bad_node_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid node name"):
        ensure_node_id(tmp_path, "Web_2", "box")


def test_token_file_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "token"
    first = ensure_secret_file(path, None)
    assert len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_secret_file(path, None) == first
    assert ensure_secret_file(path, "given") == "given"


def test_capacity_probe_reports_mebibytes(tmp_path: Path) -> None:
    capacity = probe_capacity(tmp_path)
    assert 0 < capacity.memory_free_mb <= capacity.memory_mb
    assert 0 < capacity.disk_free_mb <= capacity.disk_mb
