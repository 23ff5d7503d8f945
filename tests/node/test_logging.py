"""--log-format json: one JSON object per line; and the settings it and --metrics-listen take."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from corral.node import ConfigError
from corral.node._config import resolve_node_config
from corral.node._logging import FIELDS_ATTRIBUTE, JsonFormatter, actor_of


def line(logger: str, message: str, node: str = "n1", **extra: object) -> dict[str, object]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(node))
    log = logging.getLogger(logger)
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning(message, extra=extra)
    finally:
        log.removeHandler(handler)
        log.propagate = True
    text = out.getvalue()
    assert text.count("\n") == 1
    parsed: dict[str, object] = json.loads(text)
    return parsed


def test_an_actors_line_names_the_node_and_the_actor() -> None:
    got = line("corral.actor.n1.agent.reconciler", "stopping app web")
    assert got["node"] == "n1"
    assert got["actor"] == "/agent/reconciler"
    assert got["level"] == "WARNING"
    assert got["logger"] == "corral.actor.n1.agent.reconciler"
    assert got["message"] == "stopping app web"
    assert isinstance(got["ts"], str)
    assert got["ts"].endswith("Z")
    assert line("corral.node", "up")["actor"] is None


def test_an_events_fields_go_into_the_line_and_never_shadow_its_keys() -> None:
    fields = {"event": "process.exited", "app": "web", "code": 3, "node": "x", "obj": object()}
    got = line(
        "corral.events",
        "process.exited",
        actor="/agent/process_supervisor",
        **{FIELDS_ATTRIBUTE: fields},
    )
    assert got["event"] == "process.exited"
    assert got["app"] == "web"
    assert got["code"] == 3
    assert got["node"] == "n1"  # the event's own "node" field is kept as field_node
    assert got["field_node"] == "x"
    assert str(got["obj"]).startswith("<object object")
    assert got["actor"] == "/agent/process_supervisor"


def test_actor_paths_from_logger_names() -> None:
    assert actor_of("corral.actor.n1.coordinator", "n1") == "/coordinator"
    assert actor_of("corral.actor.n1", "n1") == "/"
    assert actor_of("corral.actor.other.agent.ports", None) == "/agent/ports"
    assert actor_of("corral.transport", "n1") is None


def test_log_format_and_metrics_listen_settings(tmp_path: Path) -> None:
    config = resolve_node_config({}, {"CORRAL_LOG_FORMAT": "JSON"}, cwd=tmp_path)
    assert config.log_format == "json"
    assert resolve_node_config({}, {}, cwd=tmp_path).log_format == "text"
    with pytest.raises(ConfigError, match=r"--log-format: 'yaml' is not a log format; give text"):
        resolve_node_config({"log-format": "yaml"}, {}, cwd=tmp_path)
    config = resolve_node_config(
        {}, {}, {"metrics-listen": "127.0.0.1:9464"}, cwd=tmp_path, file_name="node.toml"
    )
    assert str(config.metrics_listen) == "127.0.0.1:9464"
    with pytest.raises(ConfigError, match=r"--metrics-listen: 0.0.0.0:9464 is not a loopback"):
        resolve_node_config({"metrics-listen": "0.0.0.0:9464"}, {}, cwd=tmp_path)
