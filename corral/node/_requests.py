"""Validation of operator requests, shared by the HTTP API and the command line.

Theory of operation: every request is checked completely before anything is
written, and the first field found wrong raises :class:`RequestInvalid` naming
it, so the API answers 400 with ``{"field": ...}`` and the command line exits 2
with the same words. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from corral.node._errors import RequestInvalid
from corral.registry import (
    MAX_LABELS,
    ROLLOUT_BOUNDS,
    InvalidName,
    validate_label,
    validate_labels,
    validate_name,
)

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


#: Most domains one app may own.
MAX_APP_DOMAINS = 64


def check_domain(value: object, field: str = "domain") -> str:
    """A domain as corral stores it (stripped, lowercased, one trailing dot dropped),
    checked by :func:`corral.actors.routing.normalize_domain`, which applies the one
    domain rule, :func:`corral.registry.validate_domain` (host names only: no IP
    literal, no ``localhost``).

    Raises:
        RequestInvalid: naming ``field`` and the rules.
    """
    from corral.actors.routing import normalize_domain

    if not isinstance(value, str):
        raise RequestInvalid(field, f"{value!r} is not a domain; give a name such as shop.example")
    try:
        return normalize_domain(value)
    except InvalidName as exc:
        raise RequestInvalid(field, str(exc)) from None


def parse_domains(value: object, field: str = "domains") -> tuple[str, ...]:
    """A list of domains, each checked by :func:`check_domain`; sorted, without
    duplicates, at most :data:`MAX_APP_DOMAINS`.

    Raises:
        RequestInvalid: naming ``field``.
    """
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise RequestInvalid(field, 'must be a list of domains, e.g. ["shop.example"]')
    if len(value) > MAX_APP_DOMAINS:
        raise RequestInvalid(
            field, f"{len(value)} domains, more than the {MAX_APP_DOMAINS} an app may own"
        )
    return tuple(sorted({check_domain(item, field) for item in value}))


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


def _string_pairs(value: object, field: str) -> dict[str, str]:
    """``["k=v", ...]`` or ``{k: v}`` as a dict of strings, checked for shape only."""
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


def parse_pairs(value: object, field: str, what: str = "selector") -> dict[str, str]:
    """A selector (or labels): ``{k: v}`` or ``["k=v", ...]`` under the label syntax.

    Raises:
        RequestInvalid: naming ``field``; the message names the key at fault (escaped)
            and the rules of :func:`corral.registry.validate_label`.
    """
    pairs = _string_pairs(value, field)
    try:
        return validate_labels(pairs, what)
    except InvalidName as exc:
        raise RequestInvalid(field, str(exc)) from None


def parse_selector_keys(value: object, field: str = "unset") -> tuple[str, ...]:
    """Selector keys to remove: a non-empty list of label keys; sorted, without
    duplicates.

    Raises:
        RequestInvalid: naming ``field``.
    """
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise RequestInvalid(field, 'must be a non-empty list of selector keys, e.g. ["zone"]')
    if len(value) > MAX_LABELS:
        raise RequestInvalid(field, f"{len(value)} keys, more than a selector has ({MAX_LABELS})")
    for key in value:
        if not isinstance(key, str):
            raise RequestInvalid(field, f"{key!r} is not a selector key")
        try:
            validate_label(key, "", "selector")
        except InvalidName as exc:
            raise RequestInvalid(field, str(exc)) from None
    return tuple(sorted(set(value)))


#: Bounds of an app's environment (Linux caps one string at 128 KiB and the
#: arguments and environment of an exec together at a quarter of the stack limit).
MAX_ENV_VARS = 256
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 256 * 1024

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def exec_string_problem(text: str) -> str | None:
    """Why ``text`` cannot be a process argument or environment value, or None.

    A NUL byte ends a C string, so ``exec`` refuses it (Python raises ValueError:
    embedded null byte); a lone surrogate cannot be encoded at all.
    """
    offset = text.find("\x00")
    if offset >= 0:
        return f"holds a NUL byte (at offset {offset}), which exec cannot pass; remove it"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode at offset {exc.start} (a lone surrogate); fix the text"
    return None


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an environment variable name, or None."""
    if _ENV_NAME.fullmatch(name) is None or len(name) > MAX_ENV_NAME_CHARS:
        return (
            f"{name!r} is not an environment variable name (use A-Z, a-z, 0-9 and _, "
            f"not starting with a digit, at most {MAX_ENV_NAME_CHARS} characters)"
        )
    return None


def parse_env(value: object, field: str = "env") -> dict[str, str]:
    """Environment variables for an app, checked so that exec can pass every one.

    Names are ASCII letters, digits and ``_``, not starting with a digit; values hold
    no NUL byte and are valid Unicode; counts and sizes are bounded by
    :data:`MAX_ENV_VARS`, :data:`MAX_ENV_NAME_CHARS`, :data:`MAX_ENV_VALUE_BYTES` and
    :data:`MAX_ENV_BYTES`.

    Raises:
        RequestInvalid: naming ``field`` (a bad name or count) or ``field.NAME`` (a bad
            value), with what to fix.
    """
    pairs = _string_pairs(value, field)
    if len(pairs) > MAX_ENV_VARS:
        raise RequestInvalid(
            field, f"{len(pairs)} variables, more than the {MAX_ENV_VARS} allowed; drop some"
        )
    total = 0
    for name, text in pairs.items():
        problem = env_name_problem(name)
        if problem is not None:
            raise RequestInvalid(field, problem)
        problem = exec_string_problem(text)
        if problem is not None:
            raise RequestInvalid(f"{field}.{name}", f"the value {problem}")
        size = len(text.encode("utf-8"))
        if size > MAX_ENV_VALUE_BYTES:
            raise RequestInvalid(
                f"{field}.{name}",
                f"the value is {size} bytes, more than the {MAX_ENV_VALUE_BYTES} allowed; "
                "ship large data as a file in the app's directory",
            )
        total += len(name) + size + 2  # NAME=VALUE and its NUL
    if total > MAX_ENV_BYTES:
        raise RequestInvalid(
            field,
            f"the variables take {total} bytes, more than the {MAX_ENV_BYTES} allowed; "
            "ship large data as a file in the app's directory",
        )
    return pairs


def parse_megabytes(value: object, field: str) -> int:
    """A whole number of MiB, >= 0."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestInvalid(field, f"{value!r} is not a whole number of MiB >= 0")
    return value


def parse_rollout_option(value: object, field: str) -> int:
    """A rollout option (``max_parallel``, ``drain_ms``, ``ready_timeout_ms``): a whole
    number within its :data:`~corral.registry.ROLLOUT_BOUNDS`."""
    low, high = ROLLOUT_BOUNDS[field]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestInvalid(field, f"{value!r} is not a whole number from {low} to {high}")
    return value


def parse_bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise RequestInvalid(field, f"{value!r} is not true or false")
    return value


#: How deep the objects and arrays of a request body may nest, and how many
#: there may be. Every corral request is a few levels deep with a few objects;
#: the bounds keep json's recursive decoder far from Python's recursion limit.
MAX_JSON_DEPTH = 64
MAX_JSON_CONTAINERS = 1024
MAX_JSON_STRINGS = 4096

# Every byte but the ones that shape JSON: brackets and string quotes.
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_OPENERS_AS_ONE = bytes.maketrans(b"{}", b"[]")
_STRING = re.compile(rb'"[^"]*"')


def json_shape_problem(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why the JSON text ``raw`` nests too deep or holds too many strings, arrays and
    objects (:data:`MAX_JSON_STRINGS`, :data:`MAX_JSON_CONTAINERS`), or None.

    Scans without parsing: escaped backslashes and quotes go first (backslashes
    pair up left to right, as in a string), then every byte but brackets and
    quotes, then the strings, each step at C speed; what is left is the brackets,
    counted and then walked. ``raw`` must be UTF-8, where every ASCII byte is a
    real character. A None answer does not mean the text is JSON.
    """
    shape = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    strings = shape.count(b'"') // 2
    if strings > MAX_JSON_STRINGS:
        return (
            f"holds {strings} strings, more than the {MAX_JSON_STRINGS} allowed "
            "(a corral request needs a few dozen)"
        )
    brackets = _STRING.sub(b"", shape).translate(_OPENERS_AS_ONE, b'"')
    opened = brackets.count(b"[")
    if opened > MAX_JSON_CONTAINERS:
        return (
            f"holds {opened} arrays and objects, more than the {MAX_JSON_CONTAINERS} allowed "
            "(a corral request needs a few)"
        )
    depth = 0
    for byte in brackets:
        depth += 1 if byte == 0x5B else -1
        if depth > max_depth:
            return f"nests arrays and objects deeper than the {max_depth} levels allowed"
    return None


def parse_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """A request body as a JSON object; an empty body is ``{}``.

    Raises:
        RequestInvalid: (field ``body``) not UTF-8, nested deeper than ``max_depth``,
            not JSON, or not an object.
    """
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestInvalid("body", f"is not UTF-8 (byte {exc.start}); send UTF-8 JSON") from None
    problem = json_shape_problem(raw, max_depth)
    if problem is not None:
        raise RequestInvalid("body", problem)
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RequestInvalid("body", f"is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestInvalid("body", "must be a JSON object")
    return body


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
    #: The app's domains, replacing the ones it has (None: keep them).
    domains: tuple[str, ...] | None = None
    #: Rollout options (see :class:`~corral.registry.RolloutOptions`); None: keep.
    max_parallel: int | None = None
    drain_ms: int | None = None
    ready_timeout_ms: int | None = None


DEPLOY_FIELDS = frozenset(
    {"artifact", "replicas", "selector", "memory_mb", "disk_mb", "pinned", "env", "domains"}
    | set(ROLLOUT_BOUNDS)
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
    domains = None if body.get("domains") is None else parse_domains(body["domains"])
    rollout = {
        field: None if body.get(field) is None else parse_rollout_option(body[field], field)
        for field in ROLLOUT_BOUNDS
    }
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
        domains=domains,
        max_parallel=rollout["max_parallel"],
        drain_ms=rollout["drain_ms"],
        ready_timeout_ms=rollout["ready_timeout_ms"],
    )
