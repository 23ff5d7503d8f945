"""The dry-run document and ``corral plan FILE``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from corral.actors.planner import (
    AppSpec,
    InvalidPlanInput,
    NodeCapacity,
    NodeInfo,
    Placement,
    Policy,
    parse_plan_document,
)
from corral.node.cli._plan_command import plan_command

EXAMPLE: dict[str, Any] = {
    "now": 1000.0,
    "policy": {
        "grace_period_s": 300,
        "cooldown_s": 600,
        "disruption_budget": 5,
        "min_usable_fraction": 0.5,
    },
    "nodes": [
        {
            "id": "n1",
            "state": "alive",
            "labels": {"region": "eu"},
            "rack": "r1",
            "datacenter": "dc1",
            "down_since": None,
            "capacity": {
                "memory_mb": 8192,
                "memory_free_mb": 8192,
                "disk_mb": 102400,
                "disk_free_mb": 90000,
            },
        }
    ],
    "apps": [
        {
            "name": "shop",
            "replicas": "all",
            "selector": {"region": "eu"},
            "memory_mb": 0,
            "disk_mb": 0,
            "pinned": False,
            "retired": False,
            "blocked": False,
        }
    ],
    "placements": {"shop": {"nodes": ["n1"], "placed_at": {"n1": 900.0}}},
    "undecodable": [],
}


def run_cli(text: str, path: str = "-") -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    status = plan_command(path, io.StringIO(text), stdout, stderr)
    return status, stdout.getvalue(), stderr.getvalue()


# ---------------------------------------------------------------- parsing


def test_parse_the_documented_example() -> None:
    data = parse_plan_document(EXAMPLE)
    assert data.now == 1000.0
    assert data.policy == Policy(300, 600, 5, 0.5)
    assert data.nodes == (
        NodeInfo(
            "n1",
            labels={"region": "eu"},
            rack="r1",
            datacenter="dc1",
            capacity=NodeCapacity(8192, 8192, 102400, 90000),
        ),
    )
    assert data.apps == (AppSpec("shop", selector={"region": "eu"}),)
    assert data.placements == {"shop": Placement(nodes=("n1",), placed_at={"n1": 900.0})}
    assert data.undecodable == ()


def test_every_field_but_now_ids_and_names_has_a_default() -> None:
    data = parse_plan_document({"now": 5, "nodes": [{"id": "n1"}], "apps": [{"name": "a"}]})
    assert data.policy == Policy()
    assert data.nodes == (NodeInfo("n1"),)
    assert data.nodes[0].state == "alive"
    assert data.nodes[0].capacity is None
    assert data.apps == (AppSpec("a"),)
    assert data.apps[0].replicas == "all"
    assert data.placements == {}


def _with(path: str, value: object) -> dict[str, Any]:
    doc = json.loads(json.dumps(EXAMPLE))
    target: Any = doc
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("apps.0.replicas", 0, "apps[0].replicas"),
        ("apps.0.replicas", -2, "apps[0].replicas"),
        ("apps.0.replicas", "two", "apps[0].replicas"),
        ("apps.0.replicas", True, "apps[0].replicas"),
        ("apps.0.replicas", 1.5, "apps[0].replicas"),
        ("nodes.0.state", "zombie", "nodes[0].state"),
        ("nodes.0.id", 7, "nodes[0].id"),
        ("nodes.0.id", KeyError, "nodes[0].id"),
        ("apps.0.name", KeyError, "apps[0].name"),
        ("now", KeyError, "now"),
        ("now", "soon", "now"),
        ("nodes.0.capacity", {"memory_mb": 1}, "nodes[0].capacity.memory_free_mb"),
        (
            "nodes.0.capacity",
            {**EXAMPLE["nodes"][0]["capacity"], "disk_mb": -1},
            "nodes[0].capacity.disk_mb",
        ),
        ("nodes.0.labels", {"region": 1}, "nodes[0].labels.region"),
        ("nodes.0.colour", "red", "nodes[0].colour"),
        ("apps.0.memory_mb", -1, "apps[0].memory_mb"),
        ("apps.0.pinned", "yes", "apps[0].pinned"),
        ("policy.disruption_budget", -1, "policy.disruption_budget"),
        ("policy.min_usable_fraction", 2, "policy.min_usable_fraction"),
        ("placements.shop.nodes", ["n1", "n1"], "placements.shop.nodes[1]"),
        ("placements.shop.placed_at", {"n9": 1.0}, "placements.shop.placed_at.n9"),
        ("undecodable", [3], "undecodable[0]"),
        ("apps", {"name": "x"}, "apps"),
    ],
)
def test_invalid_fields_are_named(path: str, value: object, field: str) -> None:
    with pytest.raises(InvalidPlanInput) as info:
        parse_plan_document(_with(path, value))
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")


def test_duplicate_ids_and_names_are_refused() -> None:
    doc = _with("nodes", [{"id": "n1"}, {"id": "n2"}, {"id": "n1"}])
    with pytest.raises(InvalidPlanInput, match=r"nodes\[2\]\.id: duplicate node id 'n1'"):
        parse_plan_document(doc)
    doc = _with("apps", [{"name": "a"}, {"name": "a"}])
    with pytest.raises(InvalidPlanInput, match=r"apps\[1\]\.name: duplicate app name 'a'"):
        parse_plan_document(doc)


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(InvalidPlanInput, match="must be an object"):
        parse_plan_document([1, 2])


# -------------------------------------------------------------------- command


def test_command_prints_the_decisions(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(EXAMPLE))
    status, out, err = run_cli("", str(path))
    assert (status, err) == (0, "")
    assert json.loads(out) == {
        "placements": {"shop": ["n1"]},
        "removals": [],
        "additions": [],
        "deferred": [],
        "unplaced": [],
        "stranded": [],
        "refused": None,
        "paused": None,
        "stopped": {},
    }


def test_command_reads_standard_input_for_dash() -> None:
    doc = {"now": 0, "nodes": [{"id": "a"}, {"id": "b"}], "apps": [{"name": "web", "replicas": 1}]}
    status, out, _ = run_cli(json.dumps(doc))
    assert status == 0
    result = json.loads(out)
    assert len(result["placements"]["web"]) == 1
    assert result["additions"] == [["web", result["placements"]["web"][0]]]


def test_no_live_node_exits_1_with_placement_unavailable() -> None:
    doc = {"now": 0, "nodes": [{"id": "a", "state": "left"}], "apps": [{"name": "web"}]}
    status, out, err = run_cli(json.dumps(doc))
    assert status == 1
    assert out == ""
    assert "placement-unavailable" in err
    assert "no live node" in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"now": 0, "apps": [{"name": "a", "replicas": 0}]}', "apps[0].replicas"),
        ('{"now": 0, "apps": [{"name": "a", "replicas": -1}]}', "apps[0].replicas"),
        ('{"now": 0, "nodes": [{"id": "a", "state": "gone"}]}', "nodes[0].state"),
        ('{"now": 0, "nodes": [{"id": "a"}, {"id": "a"}]}', "nodes[1].id"),
        ('{"now": 0, "nodes": [', "not valid JSON"),
        ('{"now": 0, "now": 1}', "'now' appears twice"),
        ('{"now": NaN}', "not valid JSON"),
        ("[]", "must be an object"),
    ],
)
def test_invalid_input_exits_2_naming_the_field_and_prints_no_plan(text: str, needle: str) -> None:
    status, out, err = run_cli(text)
    assert status == 2
    assert out == ""
    assert needle in err
    assert err.startswith("corral plan: invalid plan document in standard input: ")


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    status, out, err = run_cli("", str(tmp_path / "missing.json"))
    assert status == 2
    assert out == ""
    assert "cannot read" in err
    assert "missing.json" in err


def test_cli_dispatches_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from corral.node.cli._cli import main

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(EXAMPLE))
    assert main(["plan", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["placements"] == {"shop": ["n1"]}
