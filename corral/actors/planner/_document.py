"""The planner's JSON document: what ``corral plan`` reads and what it prints.

Input (every field but ``now``, ``nodes[].id`` and ``apps[].name`` may be left out)::

    {"now": 1000.0,
     "policy": {"grace_period_s": 300, "cooldown_s": 600, "disruption_budget": 5,
                "min_usable_fraction": 0.5},
     "nodes": [{"id": "n1", "state": "alive", "labels": {"region": "eu"}, "rack": "r1",
                "datacenter": "dc1", "down_since": null,
                "capacity": {"memory_mb": 8192, "memory_free_mb": 8192,
                             "disk_mb": 102400, "disk_free_mb": 90000}}],
     "apps": [{"name": "shop", "replicas": "all", "selector": {"region": "eu"},
               "memory_mb": 0, "disk_mb": 0, "pinned": false, "retired": false,
               "blocked": false}],
     "placements": {"shop": {"nodes": ["n1"], "placed_at": {"n1": 900.0}, "stopped": [],
                             "reserved": {"memory_mb": 0, "disk_mb": 0}}},
     "undecodable": []}

``capacity`` left out means the node has not reported any; ``state`` left out is
``alive``; ``replicas`` left out is ``"all"``.

A node being drained is ``"state": "left"``; a drain forced with ``--force`` adds
``"drain": "forced"`` (``state`` may then be left out: it can only be ``left``), and its
pinned instances are stopped instead of the drain being refused. A placement's
``stopped`` lists the nodes where a forced drain stopped an instance of that pinned app
(see ``Placement.stopped``); its ``reserved`` is what each of its instances reserves,
as placed (left out: what the app declares; an app declaring other resources is a
resource change, see ``Placement.reserved``). Parsing is strict: a field of the wrong
type, an unknown field, a replica count below one, an unknown node state or a duplicate
id raises :class:`InvalidPlanInput` naming the field (``apps[1].replicas``).

Output: see :func:`decisions_to_json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from corral.actors.planner._errors import InvalidPlanInput
from corral.actors.planner._types import (
    NODE_STATES,
    AppSpec,
    Decisions,
    NodeCapacity,
    NodeInfo,
    Placement,
    PlanInput,
    Policy,
    is_replicas,
    replicas_problem,
)

__all__ = ["decisions_to_json", "parse_plan_document"]

_T = TypeVar("_T")

_TOP = ("now", "policy", "nodes", "apps", "placements", "undecodable")
_POLICY = ("grace_period_s", "cooldown_s", "disruption_budget", "min_usable_fraction")
_NODE = ("id", "state", "labels", "rack", "datacenter", "down_since", "capacity", "drain")
_CAPACITY = ("memory_mb", "memory_free_mb", "disk_mb", "disk_free_mb")
_APP = ("name", "replicas", "selector", "memory_mb", "disk_mb", "pinned", "retired", "blocked")
_PLACEMENT = ("nodes", "placed_at", "stopped", "reserved")
_RESERVED = ("memory_mb", "disk_mb")
_DRAIN_FORCED = "forced"


def _object(value: object, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidPlanInput(where, f"must be an object, got {_kind(value)}")
    for key in value:
        if key not in allowed:
            raise InvalidPlanInput(
                f"{where}.{key}" if where else str(key),
                f"unknown field (expected one of {', '.join(allowed)})",
            )
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _number(value: object, where: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPlanInput(where, f"must be a number, got {_kind(value)}")
    if not math.isfinite(value):
        raise InvalidPlanInput(where, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidPlanInput(where, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPlanInput(where, f"must be a whole number >= 0, got {_kind(value)}")
    if value < 0:
        raise InvalidPlanInput(where, f"must be a whole number >= 0, got {value}")
    return value


def _string(value: object, where: str, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        expected = "a non-empty string or null" if nullable else "a non-empty string"
        raise InvalidPlanInput(where, f"must be {expected}, got {_kind(value)}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidPlanInput(where, f"must be true or false, got {_kind(value)}")
    return value


def _labels(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPlanInput(where, f"must be an object of strings, got {_kind(value)}")
    labels: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str):
            raise InvalidPlanInput(f"{where}.{key}", f"must be a string, got {_kind(item)}")
        labels[str(key)] = item
    return labels


def _array(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidPlanInput(where, f"must be an array, got {_kind(value)}")
    return value


def _policy(value: object) -> Policy:
    if value is None:
        return Policy()
    obj = _object(value, "policy", _POLICY)
    defaults = Policy()
    fraction = _number(
        obj.get("min_usable_fraction", defaults.min_usable_fraction),
        "policy.min_usable_fraction",
        minimum=0,
    )
    return Policy(  # which checks the ranges (min_usable_fraction <= 1, say)
        grace_period_s=_number(
            obj.get("grace_period_s", defaults.grace_period_s), "policy.grace_period_s", minimum=0
        ),
        cooldown_s=_number(
            obj.get("cooldown_s", defaults.cooldown_s), "policy.cooldown_s", minimum=0
        ),
        disruption_budget=_whole(
            obj.get("disruption_budget", defaults.disruption_budget), "policy.disruption_budget"
        ),
        min_usable_fraction=fraction,
    )


def _capacity(value: object, where: str) -> NodeCapacity | None:
    if value is None:
        return None
    obj = _object(value, where, _CAPACITY)
    sizes: dict[str, int] = {}
    for name in _CAPACITY:
        if name not in obj:
            raise InvalidPlanInput(f"{where}.{name}", "required (MiB, a whole number >= 0)")
        sizes[name] = _whole(obj[name], f"{where}.{name}")
    return NodeCapacity(**sizes)


def _node(value: object, where: str) -> NodeInfo:
    obj = _object(value, where, _NODE)
    if "id" not in obj:
        raise InvalidPlanInput(f"{where}.id", "required")
    node_id = _string(obj["id"], f"{where}.id")
    assert node_id is not None
    drain = obj.get("drain")
    if drain is not None and drain != _DRAIN_FORCED:
        raise InvalidPlanInput(
            f"{where}.drain", f'must be "{_DRAIN_FORCED}" or null, got {_kind(drain)}'
        )
    forced = drain == _DRAIN_FORCED
    state = obj.get("state", "left" if forced else "alive")
    if state not in NODE_STATES:
        raise InvalidPlanInput(
            f"{where}.state",
            f"unknown node state {_kind(state)} (expected one of {', '.join(NODE_STATES)})",
        )
    if forced and state != "left":
        raise InvalidPlanInput(
            f"{where}.drain",
            f'a drained node has left: its state must be "left" (or left out), got {state!r}',
        )
    down_since = obj.get("down_since")
    return NodeInfo(
        id=node_id,
        state=state,
        labels=_labels(obj.get("labels"), f"{where}.labels"),
        rack=_string(obj.get("rack"), f"{where}.rack", nullable=True),
        datacenter=_string(obj.get("datacenter"), f"{where}.datacenter", nullable=True),
        down_since=None if down_since is None else _number(down_since, f"{where}.down_since"),
        capacity=_capacity(obj.get("capacity"), f"{where}.capacity"),
        drain_forced=forced,
    )


def _app(value: object, where: str) -> AppSpec:
    obj = _object(value, where, _APP)
    if "name" not in obj:
        raise InvalidPlanInput(f"{where}.name", "required")
    name = _string(obj["name"], f"{where}.name")
    assert name is not None
    replicas = obj.get("replicas", "all")
    if not is_replicas(replicas):
        raise InvalidPlanInput(f"{where}.replicas", replicas_problem(_kind(replicas)))
    return AppSpec(
        name=name,
        replicas=replicas,
        selector=_labels(obj.get("selector"), f"{where}.selector"),
        memory_mb=_whole(obj.get("memory_mb", 0), f"{where}.memory_mb"),
        disk_mb=_whole(obj.get("disk_mb", 0), f"{where}.disk_mb"),
        pinned=_bool(obj.get("pinned", False), f"{where}.pinned"),
        retired=_bool(obj.get("retired", False), f"{where}.retired"),
        blocked=_bool(obj.get("blocked", False), f"{where}.blocked"),
    )


def _placement(value: object, where: str) -> Placement:
    obj = _object(value, where, _PLACEMENT)
    nodes: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(_array(obj.get("nodes", []), f"{where}.nodes")):
        node = _string(item, f"{where}.nodes[{i}]")
        assert node is not None
        if node in seen:
            raise InvalidPlanInput(
                f"{where}.nodes[{i}]", f"duplicate node {node!r}: one instance per node"
            )
        seen.add(node)
        nodes.append(node)
    placed_at: dict[str, float] = {}
    raw = obj.get("placed_at")
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise InvalidPlanInput(f"{where}.placed_at", f"must be an object, got {_kind(raw)}")
        for node, when in raw.items():
            if node not in seen:
                raise InvalidPlanInput(
                    f"{where}.placed_at.{node}", "names a node this placement does not list"
                )
            placed_at[node] = _number(when, f"{where}.placed_at.{node}")
    stopped: list[str] = []
    for i, item in enumerate(_array(obj.get("stopped", []), f"{where}.stopped")):
        node = _string(item, f"{where}.stopped[{i}]")
        assert node is not None
        if node in seen:
            raise InvalidPlanInput(
                f"{where}.stopped[{i}]",
                f"node {node!r} is listed twice (a stopped instance is not running anywhere)",
            )
        seen.add(node)
        stopped.append(node)
    reserved: tuple[int, int] | None = None
    if obj.get("reserved") is not None:
        sizes = _object(obj["reserved"], f"{where}.reserved", _RESERVED)
        reserved = (
            _whole(sizes.get("memory_mb", 0), f"{where}.reserved.memory_mb"),
            _whole(sizes.get("disk_mb", 0), f"{where}.reserved.disk_mb"),
        )
    return Placement(
        nodes=tuple(nodes), placed_at=placed_at, stopped=tuple(stopped), reserved=reserved
    )


def _unique(items: list[_T], where: str, problem: str, *, key: Callable[[_T], str]) -> list[_T]:
    """``items``, refused when two share a key: the error names the second (``where``
    formatted with its index) and the first (``problem`` with the key and its index)."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        k = key(item)
        if k in first:
            raise InvalidPlanInput(where.format(i), problem.format(k, first[k]))
        first[k] = i
    return items


def parse_plan_document(doc: object) -> PlanInput:
    """Validate a decoded ``corral plan`` document and build the planner's input.

    Args:
        doc: the decoded JSON value (it should be an object).

    Returns:
        The :class:`PlanInput` it describes.

    Raises:
        InvalidPlanInput: the document is malformed; the error names the field.
    """
    obj = _object(doc, "", _TOP)
    if "now" not in obj:
        raise InvalidPlanInput("now", "required (the time of the pass, in seconds)")
    now = _number(obj["now"], "now")
    policy = _policy(obj.get("policy"))

    raw_nodes = _array(obj.get("nodes", []), "nodes")
    nodes = _unique(
        [_node(item, f"nodes[{i}]") for i, item in enumerate(raw_nodes)],
        "nodes[{}].id",
        "duplicate node id {!r} (also nodes[{}])",
        key=lambda node: node.id,
    )
    raw_apps = _array(obj.get("apps", []), "apps")
    apps = _unique(
        [_app(item, f"apps[{i}]") for i, item in enumerate(raw_apps)],
        "apps[{}].name",
        "duplicate app name {!r} (also apps[{}])",
        key=lambda app: app.name,
    )

    placements: dict[str, Placement] = {}
    raw_placements = obj.get("placements", {})
    if raw_placements is None:
        raw_placements = {}
    if not isinstance(raw_placements, Mapping):
        raise InvalidPlanInput("placements", f"must be an object, got {_kind(raw_placements)}")
    for name, item in raw_placements.items():
        placements[str(name)] = _placement(item, f"placements.{name}")

    undecodable: list[str] = []
    for i, item in enumerate(_array(obj.get("undecodable", []), "undecodable")):
        key = _string(item, f"undecodable[{i}]")
        assert key is not None
        undecodable.append(key)

    return PlanInput(
        apps=tuple(apps),
        nodes=tuple(nodes),
        placements=placements,
        policy=policy,
        now=now,
        undecodable=tuple(undecodable),
    )


def decisions_to_json(decisions: Decisions) -> dict[str, Any]:
    """The JSON form of a pass's decisions (what ``corral plan`` prints).

    ::

        {"placements": {"shop": ["n1"]},
         "removals": [["app", "node"]], "additions": [["app", "node"]],
         "deferred": [{"app": ..., "node": ..., "reason": ..., "until": null or time}],
         "unplaced": [{"app": ..., "reason": "placement-unavailable", "message": ...}],
         "stranded": [{"app": ..., "node": ..., "reason": ...}],
         "refused": null or {"reason": ..., "message": ..., "drains": [{"node", "apps"}]},
         "paused": null or {"keys": [...], "message": ...},
         "stopped": {"db": ["n2"]}}

    ``stopped``: per pinned app, the nodes where a forced drain stopped its instance.
    """
    refused = decisions.refused
    paused = decisions.paused
    return {
        "placements": {app: list(nodes) for app, nodes in sorted(decisions.placements.items())},
        "removals": [[app, node] for app, node in decisions.removals],
        "additions": [[app, node] for app, node in decisions.additions],
        "deferred": [
            {"app": d.app, "node": d.node, "reason": d.reason, "until": d.until}
            for d in decisions.deferred
        ],
        "unplaced": [
            {"app": u.app, "reason": u.reason, "message": u.message} for u in decisions.unplaced
        ],
        "stranded": [
            {"app": s.app, "node": s.node, "reason": s.reason} for s in decisions.stranded
        ],
        "refused": None
        if refused is None
        else {
            "reason": refused.reason,
            "message": refused.message,
            "drains": [{"node": d.node, "apps": list(d.apps)} for d in refused.drains],
        },
        "paused": None
        if paused is None
        else {"keys": list(paused.keys), "message": paused.message},
        "stopped": {app: list(nodes) for app, nodes in sorted(decisions.stopped.items())},
    }
