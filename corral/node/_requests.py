"""Validation of operator requests, shared by the HTTP API and the command line.

Theory of operation: every request is checked completely before anything is
written, and the first field found wrong raises :class:`RequestInvalid` naming
it, so the API answers 400 with ``{"field": ...}`` and the command line exits 2
with the same words. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from corral.node._errors import RequestInvalid
from corral.registry import InvalidName, validate_name

#: What ``AppRecord.replicas`` holds: "all" or a whole number >= 1.
Replicas: TypeAlias = int | Literal["all"]

REPLICAS_ZERO = (
    "0 is refused: an app that nothing runs is expressed by retiring it (corral app retire) "
    "or deleting it (corral app delete); give all or a whole number >= 1"
)


def check_name(kind: str, name: object, field: str = "name") -> str:
    """An app or node name under the DNS-label rules, or RequestInvalid naming ``field``."""
    if not isinstance(name, str):
        raise RequestInvalid(field, f"the {kind} name must be a string")
    try:
        return validate_name(kind, name)
    except InvalidName as exc:
        raise RequestInvalid(field, str(exc)) from None


def parse_replicas(value: object, field: str = "replicas") -> Replicas:
    """``"all"`` or a whole number >= 1 (given as int or decimal text)."""
    if value == "all":
        return "all"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestInvalid(field, f"{value!r} is not all or a whole number >= 1")
    if value == 0:
        raise RequestInvalid(field, REPLICAS_ZERO)
    if value < 0:
        raise RequestInvalid(field, f"{value} is negative; give all or a whole number >= 1")
    return value


def parse_pairs(value: object, field: str) -> dict[str, str]:
    """A mapping of non-empty string keys to string values (labels, selectors)."""
    if isinstance(value, list | tuple):
        pairs: dict[str, str] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep or not key.strip():
                raise RequestInvalid(field, f"{item!r} is not key=value, e.g. zone=a")
            pairs[key.strip()] = val.strip()
        return pairs
    if not isinstance(value, Mapping):
        raise RequestInvalid(field, "must be an object of key: value strings")
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise RequestInvalid(field, f"key {key!r} must be a non-empty string without '='")
        if not isinstance(val, str):
            raise RequestInvalid(field, f"the value of {key!r} must be a string")
    return dict(value)


def parse_env(value: object, field: str = "env") -> dict[str, str]:
    """Environment variables: names of letters, digits and '_' not starting with a digit."""
    pairs = parse_pairs(value, field)
    for name in pairs:
        if not (name[0].isalpha() or name[0] == "_") or not all(
            c.isalnum() or c == "_" for c in name
        ):
            raise RequestInvalid(
                field, f"{name!r} is not an environment variable name (use A-Z, 0-9, _)"
            )
    return pairs


def parse_megabytes(value: object, field: str) -> int:
    """A whole number of MiB, >= 0."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestInvalid(field, f"{value!r} is not a whole number of MiB >= 0")
    return value


def parse_bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise RequestInvalid(field, f"{value!r} is not true or false")
    return value


@dataclass(frozen=True)
class DeployRequest:
    """A checked deploy. None means "not named: leave the app's current value"."""

    name: str
    artifact: bytes
    replicas: Replicas | None = None
    selector: Mapping[str, str] | None = None
    memory_mb: int | None = None
    disk_mb: int | None = None
    pinned: bool | None = None
    env: Mapping[str, str] | None = None


DEPLOY_FIELDS = frozenset(
    {"artifact", "replicas", "selector", "memory_mb", "disk_mb", "pinned", "env"}
)


def parse_deploy(name: object, body: object) -> DeployRequest:
    """Check a deploy body (``artifact`` is base64 of the tar.gz).

    Raises:
        RequestInvalid: naming the first wrong field.
    """
    checked_name = check_name("app", name)
    if not isinstance(body, Mapping):
        raise RequestInvalid("body", "must be a JSON object")
    unknown = sorted(set(body) - DEPLOY_FIELDS)
    if unknown:
        raise RequestInvalid(
            unknown[0], f"is not a deploy field; known: {', '.join(sorted(DEPLOY_FIELDS))}"
        )
    replicas = None if body.get("replicas") is None else parse_replicas(body["replicas"])
    selector = None
    if body.get("selector") is not None:
        selector = parse_pairs(body["selector"], "selector")
        if not selector:
            raise RequestInvalid(
                "selector",
                "an empty selector would lift the constraint; a deploy cannot do that, "
                "use corral app selector --clear",
            )
    memory = (
        None if body.get("memory_mb") is None else parse_megabytes(body["memory_mb"], "memory_mb")
    )
    disk = None if body.get("disk_mb") is None else parse_megabytes(body["disk_mb"], "disk_mb")
    pinned = None if body.get("pinned") is None else parse_bool(body["pinned"], "pinned")
    env = None if body.get("env") is None else parse_env(body["env"])
    encoded = body.get("artifact")
    if not isinstance(encoded, str) or not encoded:
        raise RequestInvalid("artifact", "missing; send the app's tar.gz as base64")
    try:
        artifact = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise RequestInvalid("artifact", "is not valid base64") from None
    return DeployRequest(
        name=checked_name,
        artifact=artifact,
        replicas=replicas,
        selector=selector,
        memory_mb=memory,
        disk_mb=disk,
        pinned=pinned,
        env=env,
    )
