"""corral's key space and the records stored under it.

Theory of operation
-------------------
Every key corral writes belongs to one *kind*, recognised by :func:`parse_key`
from its shape (``apps/<name>``, ``ports/<node>/<port>``...). Anything else is
refused with :class:`InvalidKey`, so a typo never lands in the shared store.

Values are UTF-8 JSON objects carrying ``"v": 1`` (the schema version), except
``artifacts/<digest>`` whose value is the raw tar.gz. Each kind has one frozen
dataclass with ``encode() -> bytes``; :func:`decode_record` turns ``(key, value)``
back into that dataclass or, when the value breaks the schema (bad JSON, wrong
types, unknown ``v``, a name that disagrees with its key), into an
:class:`Undecodable` naming the key and the reason. Decoding never raises: the
coordinator pauses on undecodable keys instead of crashing on them.

Where artifacts live (the one place that says it): ``artifacts/<digest>`` holds the
bytes of a small artifact (at most 1 MiB, kept in the registry so any node can
read it); ``copies/<digest>`` holds the copy assignment the lease holder wrote
(holders, size, sha256, the apps that use it); ``held/<node>`` lists the copies a
node has on its disk. The assignment lives apart from the bytes so the bytes of
existing clusters keep their key and no decoder has to guess what a value is.

This module is pure: no trio, no clock, no I/O (except :func:`read_records`,
a thin async helper over a registry).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeAlias, TypeVar

from corral.registry._errors import InvalidKey, InvalidName

if TYPE_CHECKING:
    from corral.registry._base import KeyValue, Registry

SCHEMA_VERSION: Final = 1

COORDINATOR_LEASE_KEY: Final = "lease/coordinator"
ROUTING_KEY: Final = "routing"
#: HMAC of the cluster secret, set by the first node (never the secret itself).
SECRET_FINGERPRINT_KEY: Final = "cluster/secret-fingerprint"

# Prefixes for range reads and watches.
APPS_PREFIX: Final = "apps/"
NODES_PREFIX: Final = "nodes/"
INTENT_PREFIX: Final = "intent/"
PLACEMENT_PREFIX: Final = "placement/"
PORTS_PREFIX: Final = "ports/"
ALIAS_PREFIX: Final = "alias/"
DOMAIN_PREFIX: Final = "domain/"
ARTIFACTS_PREFIX: Final = "artifacts/"
DOWN_PREFIX: Final = "down/"
PROXIES_PREFIX: Final = "proxies/"
COPIES_PREFIX: Final = "copies/"
HELD_PREFIX: Final = "held/"
ASSIGN_PREFIX: Final = "assign/"


class KeyKind(enum.StrEnum):
    """What a key holds; the value is the key's first segment (or a tag for
    ``alias/<domain>/previous``)."""

    APP = "apps"
    NODE = "nodes"
    INTENT = "intent"
    PLACEMENT = "placement"
    COORDINATOR_LEASE = "lease"
    PORT = "ports"
    ALIAS = "alias"
    ALIAS_PREVIOUS = "alias-previous"
    DOMAIN = "domain"
    ROUTING = "routing"
    ARTIFACT = "artifacts"
    SECRET_FINGERPRINT = "cluster"
    DOWN = "down"
    PROXY = "proxies"
    COPIES = "copies"
    HELD = "held"
    ASSIGNMENT = "assign"


# --------------------------------------------------------------------------- names

# One DNS label (RFC 1123): app and node names, and each part of a domain.
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# The name part of a label key, and a non-empty label value (Kubernetes' syntax).
_LABEL_TEXT = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PORT = re.compile(r"[1-9][0-9]{0,4}")


def validate_name(kind: str, name: str) -> str:
    """Check an app or node name against the DNS-label rules.

    Args:
        kind: what the name names ("app", "node"), used in the message.
        name: the name.

    Returns:
        ``name`` unchanged.

    Raises:
        InvalidName: naming what is allowed.
    """
    if not isinstance(name, str) or _DNS_LABEL.fullmatch(name) is None:
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1-63 characters of a-z, 0-9 and '-', "
            "not starting or ending with '-'"
        )
    return name


_DOMAIN_RULES = (
    "use dot-separated labels of 1-63 characters of a-z, 0-9 and '-' (not starting or "
    "ending with '-'), 253 characters at most"
)
# The last label of a name a URL parser reads as an IPv4 address (WHATWG URL's "ends in
# a number": 127.0.0.1, 2130706433, 0x7f.1, 0x7f000001).
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


def _address_problem(domain: str) -> str | None:
    """Why ``domain`` (syntactically a host name) names an address rather than a
    site, or None."""
    last = domain.rsplit(".", 1)[-1]
    if _NUMERIC_LABEL.fullmatch(last):
        return (
            f"it is an IP address (its last label {last!r} is a number), and a tenant "
            "claiming an address would receive every request made to the proxy by it"
        )
    if last == "localhost":
        return (
            "localhost and its subdomains name this machine's loopback (RFC 6761), and a "
            "tenant claiming them would receive every request made to the proxy by that name"
        )
    return None


def validate_domain(domain: str) -> str:
    """Check a domain name: dot-separated DNS labels, 253 characters at most, and a
    name, not an address: neither an IP literal (a last label that is a number, as
    a URL parser reads ``127.0.0.1`` or ``0x7f.1``; IPv6 literals break the label
    syntax) nor ``localhost`` or a name under it. The one domain rule: the API, the
    command line and the routing renderer all check through it.

    Raises:
        InvalidName: naming the rule broken and what is allowed.
    """
    if (
        not isinstance(domain, str)
        or not 0 < len(domain) <= 253
        or not all(_DNS_LABEL.fullmatch(label) for label in domain.split("."))
    ):
        raise InvalidName(f"invalid domain {domain!r}: {_DOMAIN_RULES}")
    problem = _address_problem(domain)
    if problem is not None:
        raise InvalidName(
            f"invalid domain {domain!r}: {problem}; give a host name such as shop.example"
        )
    return domain


#: Labels a node, or pairs a selector, may have at most.
MAX_LABELS: Final = 64

_LABEL_RULES = (
    "a label key is a name of 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-' that "
    "starts and ends with a letter or digit, optionally after a DNS-subdomain prefix and "
    "'/' (zone, example.com/zone); a value is empty or follows the same rules as a name"
)


def validate_label(key: str, value: str, what: str = "label") -> None:
    """Check one label (or selector pair) against Kubernetes' label syntax.

    The key is an optional prefix (a DNS subdomain of at most 253 characters) and
    ``/``, then a name of 1-63 characters of ``A-Za-z0-9._-`` starting and ending
    with a letter or digit; the value is empty or follows the name's rules. So no
    label can carry a control character, a space or ``=`` into a log or a terminal.

    Args:
        key: the label key.
        value: its value.
        what: what the pair is ("label", "selector"), used in the message.

    Raises:
        InvalidName: naming the key (escaped, with ``repr``) and the rules.
    """
    if not isinstance(key, str) or not isinstance(value, str):
        raise InvalidName(f"{what} {key!r}: keys and values must be strings")
    prefix, slash, name = key.rpartition("/")
    if (
        _LABEL_TEXT.fullmatch(name) is None
        or (slash and not 0 < len(prefix) <= 253)
        or (slash and not all(_DNS_LABEL.fullmatch(part) for part in prefix.split(".")))
    ):
        raise InvalidName(f"{what} key {key!r} is invalid: {_LABEL_RULES}")
    if value and _LABEL_TEXT.fullmatch(value) is None:
        raise InvalidName(f"{what} {key!r} has an invalid value {value!r}: {_LABEL_RULES}")


def validate_labels(labels: Mapping[str, str], what: str = "label") -> dict[str, str]:
    """Check every pair of ``labels`` with :func:`validate_label`, and their count.

    Returns:
        The pairs as a new dict.

    Raises:
        InvalidName: more than :data:`MAX_LABELS` pairs, or the first invalid pair.
    """
    if len(labels) > MAX_LABELS:
        raise InvalidName(
            f"{len(labels)} {what} pairs, more than the {MAX_LABELS} allowed; drop some"
        )
    for key, value in labels.items():
        validate_label(key, value, what)
    return dict(labels)


def validate_digest(digest: str) -> str:
    """Check an artifact digest: 64 lowercase hex digits (sha256)."""
    if not isinstance(digest, str) or _DIGEST.fullmatch(digest) is None:
        raise InvalidName(
            f"invalid artifact digest {digest!r}: use the sha256 of the bytes as 64 lowercase "
            "hex digits"
        )
    return digest


def _validate_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidName(f"invalid port {port!r}: use an integer from 1 to 65535")
    return port


# --------------------------------------------------------------------------- keys


def app_key(name: str) -> str:
    return f"apps/{validate_name('app', name)}"


def node_key(node_id: str) -> str:
    return f"nodes/{validate_name('node', node_id)}"


def intent_key(node_id: str) -> str:
    return f"intent/{validate_name('node', node_id)}"


def placement_key(name: str) -> str:
    return f"placement/{validate_name('app', name)}"


def down_key(node_id: str) -> str:
    return f"down/{validate_name('node', node_id)}"


def assign_key(node_id: str) -> str:
    """``assign/<node>``: the apps placed on one node (see :class:`NodeAssignment`)."""
    return f"assign/{validate_name('node', node_id)}"


def port_key(node_id: str, port: int) -> str:
    return f"ports/{validate_name('node', node_id)}/{_validate_port(port)}"


def node_ports_prefix(node_id: str) -> str:
    """The prefix of every port claim held by ``node_id``."""
    return f"ports/{validate_name('node', node_id)}/"


def alias_key(domain: str) -> str:
    return f"alias/{validate_domain(domain)}"


def alias_previous_key(domain: str) -> str:
    return f"alias/{validate_domain(domain)}/previous"


def domain_key(domain: str) -> str:
    """``domain/<domain>``: the claim that gives a domain to one app."""
    return f"domain/{validate_domain(domain)}"


def proxy_key(proxy_id: str) -> str:
    """``proxies/<id>``: what the proxy of that name applied (written by ``corral proxy run``)."""
    return f"{PROXIES_PREFIX}{validate_name('proxy', proxy_id)}"


def artifact_key(digest: str) -> str:
    return f"artifacts/{validate_digest(digest)}"


def copies_key(digest: str) -> str:
    """``copies/<digest>``: which nodes are to hold a copy of the artifact."""
    return f"copies/{validate_digest(digest)}"


def held_key(node_id: str) -> str:
    """``held/<node>``: the artifact copies a node has on its disk."""
    return f"held/{validate_name('node', node_id)}"


def parse_key(key: str) -> tuple[KeyKind, tuple[str, ...]]:
    """Split a key into its kind and its parts.

    ``parse_key("ports/n1/24000") == (KeyKind.PORT, ("n1", "24000"))``;
    ``parse_key("alias/a.example/previous") == (KeyKind.ALIAS_PREVIOUS, ("a.example",))``.

    Raises:
        InvalidKey: the key is outside the key space; the message lists the shapes accepted.
    """
    if not isinstance(key, str):
        raise InvalidKey(f"registry keys are str, not {type(key).__name__}")
    try:
        return _parse_key(key)
    except (InvalidName, ValueError) as exc:
        raise InvalidKey(f"key {key!r} is outside the key space ({exc}); {_KEY_SHAPES}") from None


_KEY_SHAPES = (
    "accepted: apps/<app>, nodes/<node>, intent/<node>, placement/<app>, lease/coordinator, "
    "ports/<node>/<port>, alias/<domain>, alias/<domain>/previous, domain/<domain>, routing, "
    "artifacts/<sha256>, cluster/secret-fingerprint, down/<node>, proxies/<id>, "
    "copies/<sha256>, held/<node>, assign/<node>"
)


def _parse_key(key: str) -> tuple[KeyKind, tuple[str, ...]]:
    if key == ROUTING_KEY:
        return KeyKind.ROUTING, ()
    if key == COORDINATOR_LEASE_KEY:
        return KeyKind.COORDINATOR_LEASE, ("coordinator",)
    if key == SECRET_FINGERPRINT_KEY:
        return KeyKind.SECRET_FINGERPRINT, ("secret-fingerprint",)
    head, sep, rest = key.partition("/")
    if not sep:
        raise ValueError("no such key")
    parts = rest.split("/")
    if head == "apps" and len(parts) == 1:
        return KeyKind.APP, (validate_name("app", parts[0]),)
    if head == "nodes" and len(parts) == 1:
        return KeyKind.NODE, (validate_name("node", parts[0]),)
    if head == "intent" and len(parts) == 1:
        return KeyKind.INTENT, (validate_name("node", parts[0]),)
    if head == "down" and len(parts) == 1:
        return KeyKind.DOWN, (validate_name("node", parts[0]),)
    if head == "assign" and len(parts) == 1:
        return KeyKind.ASSIGNMENT, (validate_name("node", parts[0]),)
    if head == "placement" and len(parts) == 1:
        return KeyKind.PLACEMENT, (validate_name("app", parts[0]),)
    if head == "ports" and len(parts) == 2:
        node, port = parts
        if _PORT.fullmatch(port) is None:
            raise ValueError(f"port {port!r} is not a decimal from 1 to 65535")
        _validate_port(int(port))
        return KeyKind.PORT, (validate_name("node", node), port)
    if head == "alias" and len(parts) == 1:
        return KeyKind.ALIAS, (validate_domain(parts[0]),)
    if head == "alias" and len(parts) == 2 and parts[1] == "previous":
        return KeyKind.ALIAS_PREVIOUS, (validate_domain(parts[0]),)
    if head == "domain" and len(parts) == 1:
        return KeyKind.DOMAIN, (validate_domain(parts[0]),)
    if head == "artifacts" and len(parts) == 1:
        return KeyKind.ARTIFACT, (validate_digest(parts[0]),)
    if head == "proxies" and len(parts) == 1:
        return KeyKind.PROXY, (validate_name("proxy", parts[0]),)
    if head == "copies" and len(parts) == 1:
        return KeyKind.COPIES, (validate_digest(parts[0]),)
    if head == "held" and len(parts) == 1:
        return KeyKind.HELD, (validate_name("node", parts[0]),)
    raise ValueError("no such key")


def is_valid_key(key: str) -> bool:
    """Whether :func:`parse_key` accepts ``key``."""
    try:
        parse_key(key)
    except InvalidKey:
        return False
    return True


# --------------------------------------------------------------------------- field checks
# Each helper raises ValueError with the field named; decode_record turns that into
# an Undecodable.


def _field(obj: Mapping[str, Any], name: str, default: Any = ...) -> Any:
    if name in obj:
        return obj[name]
    if default is ...:
        raise ValueError(f"field {name!r} is missing")
    return default


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any, name: str) -> str | None:
    return None if value is None else _str(value, name)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {name!r} must be an integer, got {type(value).__name__}")
    return value


def _nonneg(value: Any, name: str) -> int:
    if _int(value, name) < 0:
        raise ValueError(f"field {name!r} must be >= 0, got {value}")
    return int(value)


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field {name!r} must be a number, got {type(value).__name__}")
    return float(value)


def _opt_float(value: Any, name: str) -> float | None:
    return None if value is None else _float(value, name)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"field {name!r} must be true or false, got {type(value).__name__}")
    return value


def _str_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"field {name!r} must be a list of strings")
    return [_str(item, name) for item in value]


def _str_dict(value: Any, name: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"field {name!r} must be an object of strings")
    return {_str(k, name): _str(v, name) for k, v in value.items()}


def _float_dict(value: Any, name: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"field {name!r} must be an object of numbers")
    return {_str(k, name): _float(v, name) for k, v in value.items()}


def _short_digest(text: str) -> str:
    """16 hex digits that change when ``text`` does (a change stamp, not a security
    digest)."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"field {name!r} must be an object")
    return value


def _one_of(value: Any, name: str, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"field {name!r} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps({"v": SCHEMA_VERSION, **obj}, separators=(",", ":"), sort_keys=True).encode()


# --------------------------------------------------------------------------- records


#: Bounds of a ``[health]`` check (``corral.toml``): interval and timeout in ms, path length.
HEALTH_INTERVAL_MS: Final = (100, 600_000)
HEALTH_TIMEOUT_MS: Final = (50, 60_000)
MAX_HEALTH_PATH: Final = 1024


@dataclass(frozen=True, slots=True)
class HealthSpec:
    """An app's readiness check, from ``corral.toml``'s ``[health]`` table.

    ``path`` empty: the public port accepting a TCP connection is the check; else
    an HTTP GET on ``path`` must answer 2xx or 3xx. ``interval_ms`` between checks,
    ``timeout_ms`` for one check.
    """

    path: str = ""
    interval_ms: int = 2000
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.path and (
            not self.path.startswith("/")
            or len(self.path) > MAX_HEALTH_PATH
            or any(not 0x21 <= ord(c) <= 0x7E for c in self.path)
        ):
            raise ValueError(
                f"health path {self.path[:80]!r} must start with '/' and be printable ASCII "
                f"without spaces, at most {MAX_HEALTH_PATH} characters (e.g. /healthz)"
            )
        for name, (low, high) in (
            ("interval_ms", HEALTH_INTERVAL_MS),
            ("timeout_ms", HEALTH_TIMEOUT_MS),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"health {name} must be an integer from {low} to {high}")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "interval_ms": self.interval_ms, "timeout_ms": self.timeout_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> HealthSpec:
        return cls(
            path=_str(_field(obj, "path", ""), "deployment.health.path"),
            interval_ms=_int(_field(obj, "interval_ms", 2000), "deployment.health.interval_ms"),
            timeout_ms=_int(_field(obj, "timeout_ms", 1000), "deployment.health.timeout_ms"),
        )


def deployment_revision(
    digest: str,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    memory_mb: int = 0,
    disk_mb: int = 0,
) -> str:
    """The revision id of a deployment: the sha256 of everything that changes how
    the app's process runs (the artifact digest, the command, the environment and
    the resources), as 64 lowercase hex digits.

    Pure: equal inputs give equal ids whatever order ``env`` lists its keys in, and
    any change of any input gives another id. So an env-only redeploy is a new
    revision (every node restarts into it), and an identical redeploy is not.
    """
    canonical = json.dumps(
        {
            "digest": validate_digest(digest),
            "command": list(command),
            "env": dict(env),
            "memory_mb": memory_mb,
            "disk_mb": disk_mb,
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Deployment:
    """What an app runs: its revision id, the artifact (by digest), its command and
    environment, and its readiness check (None: the default TCP check).

    ``revision`` is what nodes compare (a process running another revision is
    restarted): :func:`deployment_revision` of the digest, command, env and the
    app's resources. ``digest`` names the artifact nodes fetch and unpack; left
    empty it is ``revision``, which is what a record written before revisions
    covered more than the artifact holds (one field, the digest), so an old record
    decodes to the revision its processes already run and restarts nothing. The
    readiness check is not part of the revision: it changes how the node watches
    the process, not how the process runs.
    """

    revision: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    deployed_at: float = 0.0
    digest: str = ""
    #: The resources the revision was computed with (the app's, when deployed).
    memory_mb: int = 0
    disk_mb: int = 0
    health: HealthSpec | None = None

    def __post_init__(self) -> None:
        validate_digest(self.revision)
        if not self.digest:
            object.__setattr__(self, "digest", self.revision)
        validate_digest(self.digest)
        if self.memory_mb < 0 or self.disk_mb < 0:
            raise ValueError("deployment memory_mb and disk_mb must be >= 0")

    @classmethod
    def of(
        cls,
        digest: str,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        memory_mb: int = 0,
        disk_mb: int = 0,
        deployed_at: float = 0.0,
        health: HealthSpec | None = None,
    ) -> Deployment:
        """The deployment of artifact ``digest`` run as ``command`` with ``env`` and
        these resources, its revision computed by :func:`deployment_revision`."""
        revision = deployment_revision(digest, command, env, memory_mb=memory_mb, disk_mb=disk_mb)
        return cls(
            revision, list(command), dict(env), deployed_at, digest, memory_mb, disk_mb, health
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "revision": self.revision,
            "digest": self.digest,
            "command": list(self.command),
            "env": dict(self.env),
            "deployed_at": self.deployed_at,
            "memory_mb": self.memory_mb,
            "disk_mb": self.disk_mb,
        }
        if self.health is not None:
            out["health"] = self.health.to_json()
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Deployment:
        health = _field(obj, "health", None)
        return cls(
            revision=_str(_field(obj, "revision"), "deployment.revision"),
            command=_str_list(_field(obj, "command"), "deployment.command"),
            env=_str_dict(_field(obj, "env", {}), "deployment.env"),
            deployed_at=_float(_field(obj, "deployed_at", 0.0), "deployment.deployed_at"),
            digest=_str(_field(obj, "digest", ""), "deployment.digest"),
            memory_mb=_nonneg(_field(obj, "memory_mb", 0), "deployment.memory_mb"),
            disk_mb=_nonneg(_field(obj, "disk_mb", 0), "deployment.disk_mb"),
            health=None
            if health is None
            else HealthSpec.from_json(_obj(health, "deployment.health")),
        )


#: The bounds of each rollout option, inclusive: ``field -> (lowest, highest)``.
ROLLOUT_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "max_parallel": (1, 1000),
    "drain_ms": (0, 600_000),
    "ready_timeout_ms": (1, 3_600_000),
}


@dataclass(frozen=True, slots=True)
class RolloutOptions:
    """How a new revision of an app rolls across its nodes (kept with the app).

    Args:
        max_parallel: at most this many instances out of the routing table or
            restarting at any moment.
        drain_ms: how long an instance out of the table is left to finish its
            in-flight requests before it is stopped (also the longest wait for the
            proxies to apply the table without it).
        ready_timeout_ms: how long a restarted instance may take to become ready
            before the rollout halts.

    Changing them is not a new revision: they change how a revision rolls, not how
    the process runs.

    Raises:
        ValueError: a value outside :data:`ROLLOUT_BOUNDS`, naming the field.
    """

    max_parallel: int = 1
    drain_ms: int = 2000
    ready_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        for name, (low, high) in ROLLOUT_BOUNDS.items():
            value = _int(getattr(self, name), f"rollout.{name}")
            if not low <= value <= high:
                raise ValueError(f"field 'rollout.{name}' must be {low}..{high}, got {value}")

    def to_json(self) -> dict[str, Any]:
        return {
            "max_parallel": self.max_parallel,
            "drain_ms": self.drain_ms,
            "ready_timeout_ms": self.ready_timeout_ms,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RolloutOptions:
        defaults = cls()
        return cls(**{name: _field(obj, name, getattr(defaults, name)) for name in ROLLOUT_BOUNDS})


Replicas: TypeAlias = int | Literal["all"]


@dataclass(frozen=True, slots=True)
class AppRecord:
    """``apps/<name>``: what the operator asked for."""

    name: str
    replicas: Replicas = 1
    selector: dict[str, str] = field(default_factory=dict)
    memory_mb: int = 0
    disk_mb: int = 0
    pinned: bool = False
    retired: bool = False
    blocked: bool = False
    teardown_pending: bool = False
    deployment: Deployment | None = None
    domains: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    rollout: RolloutOptions = field(default_factory=RolloutOptions)
    #: The deployment before ``deployment`` (another revision), kept for a rollback
    #: and for the nodes a rollout has not reached yet.
    previous_deployment: Deployment | None = None

    def __post_init__(self) -> None:
        validate_name("app", self.name)
        if self.replicas != "all" and (
            isinstance(self.replicas, bool)
            or not isinstance(self.replicas, int)
            or self.replicas < 1
        ):
            raise ValueError(f"replicas must be 'all' or an integer >= 1, got {self.replicas!r}")
        if self.memory_mb < 0 or self.disk_mb < 0:
            raise ValueError("memory_mb and disk_mb must be >= 0")
        validate_labels(self.selector, "selector")
        validate_labels(self.labels)

    @property
    def key(self) -> str:
        return app_key(self.name)

    def deployment_at(self, revision: str) -> Deployment | None:
        """The app's deployment (current or previous) of ``revision``, or None: what
        a node a rollout has not reached yet runs."""
        for deployment in (self.deployment, self.previous_deployment):
            if deployment is not None and deployment.revision == revision:
                return deployment
        return None

    def node_spec(self) -> str:
        """A short digest of what a node serving the app reads of this record: the
        revisions it may run (current and previous deployment, with their readiness
        checks), the memory limit it starts them with, the flags it stops them for and
        the drain time. The coordinator keeps it in the app's placement
        (:attr:`PlacementRecord.spec`) and moves the assignment index of the app's
        nodes when it changes (:meth:`PlacementRecord.stamp_for`), so only they read
        the record again. A change of replicas, selector, labels or domains leaves it
        as it is: no node acts on those (the placement they lead to does move)."""
        parts = [
            "" if d is None else f"{d.revision}:{d.health!r}"
            for d in (self.deployment, self.previous_deployment)
        ]
        parts.append(
            f"{self.memory_mb}:{self.retired:d}{self.blocked:d}{self.teardown_pending:d}:"
            f"{self.rollout.drain_ms}"
        )
        return _short_digest("/".join(parts))

    def encode(self) -> bytes:
        return _dump(
            {
                "name": self.name,
                "replicas": self.replicas,
                "selector": dict(self.selector),
                "memory_mb": self.memory_mb,
                "disk_mb": self.disk_mb,
                "pinned": self.pinned,
                "retired": self.retired,
                "blocked": self.blocked,
                "teardown_pending": self.teardown_pending,
                "deployment": None if self.deployment is None else self.deployment.to_json(),
                "domains": list(self.domains),
                "labels": dict(self.labels),
                "rollout": self.rollout.to_json(),
                "previous_deployment": None
                if self.previous_deployment is None
                else self.previous_deployment.to_json(),
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AppRecord:
        replicas = _field(obj, "replicas")
        if replicas != "all":
            replicas = _int(replicas, "replicas")
        deployment = _field(obj, "deployment", None)
        previous = _field(obj, "previous_deployment", None)
        return cls(
            name=_str(_field(obj, "name"), "name"),
            replicas=replicas,
            selector=_str_dict(_field(obj, "selector", {}), "selector"),
            memory_mb=_nonneg(_field(obj, "memory_mb", 0), "memory_mb"),
            disk_mb=_nonneg(_field(obj, "disk_mb", 0), "disk_mb"),
            pinned=_bool(_field(obj, "pinned", False), "pinned"),
            retired=_bool(_field(obj, "retired", False), "retired"),
            blocked=_bool(_field(obj, "blocked", False), "blocked"),
            teardown_pending=_bool(_field(obj, "teardown_pending", False), "teardown_pending"),
            deployment=None
            if deployment is None
            else Deployment.from_json(_obj(deployment, "deployment")),
            domains=_str_list(_field(obj, "domains", []), "domains"),
            labels=_str_dict(_field(obj, "labels", {}), "labels"),
            rollout=RolloutOptions.from_json(_obj(_field(obj, "rollout", {}), "rollout")),
            previous_deployment=None
            if previous is None
            else Deployment.from_json(_obj(previous, "previous_deployment")),
        )


@dataclass(frozen=True, slots=True)
class MeasuredCapacity:
    """A node's resources in MiB, as it measured them and publishes them in its record
    (the planner's view of them is :class:`corral.actors.planner.NodeCapacity`)."""

    memory_mb: int
    memory_free_mb: int
    disk_mb: int
    disk_free_mb: int

    def to_json(self) -> dict[str, Any]:
        return {
            "memory_mb": self.memory_mb,
            "memory_free_mb": self.memory_free_mb,
            "disk_mb": self.disk_mb,
            "disk_free_mb": self.disk_free_mb,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> MeasuredCapacity:
        return cls(
            **{
                name: _nonneg(_field(obj, name), f"capacity.{name}")
                for name in ("memory_mb", "memory_free_mb", "disk_mb", "disk_free_mb")
            }
        )


ServingState: TypeAlias = Literal["starting", "running", "crash-loop", "failed", "stopped"]
SERVING_STATES: Final[tuple[str, ...]] = ("starting", "running", "crash-loop", "failed", "stopped")
#: Longest ``ServingEntry.reason`` kept (it is published in every node record).
MAX_SERVING_REASON: Final = 400


@dataclass(frozen=True, slots=True)
class ServingEntry:
    """One app a node serves: its revision, ports and process state; ``reason`` says
    why it is ``failed`` or in a ``crash-loop`` (empty otherwise).

    ``ready``: the instance passes its readiness check (the routing table lists
    only ready ones); None in records of builds that did not publish it, which
    count a ``running`` instance as ready."""

    revision: str
    public_port: int
    internal_port: int
    state: ServingState = "starting"
    restarts: int = 0
    reason: str = ""
    ready: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "revision": self.revision,
            "public_port": self.public_port,
            "internal_port": self.internal_port,
            "state": self.state,
            "restarts": self.restarts,
        }
        if self.reason:
            out["reason"] = self.reason[:MAX_SERVING_REASON]
        if self.ready is not None:
            out["ready"] = self.ready
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ServingEntry:
        return cls(
            revision=_str(_field(obj, "revision"), "serving.revision"),
            public_port=_int(_field(obj, "public_port"), "serving.public_port"),
            internal_port=_int(_field(obj, "internal_port"), "serving.internal_port"),
            state=_one_of(_field(obj, "state"), "serving.state", SERVING_STATES),
            restarts=_nonneg(_field(obj, "restarts", 0), "serving.restarts"),
            reason=_str(_field(obj, "reason", ""), "serving.reason")[:MAX_SERVING_REASON],
            ready=None
            if _field(obj, "ready", None) is None
            else _bool(_field(obj, "ready"), "serving.ready"),
        )


NodeState: TypeAlias = Literal["alive", "suspect", "down", "cordoned", "left"]
NODE_STATES: Final[tuple[str, ...]] = ("alive", "suspect", "down", "cordoned", "left")


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """``nodes/<id>`` (leased by the node): who it is, where, what it has and serves."""

    id: str
    state: NodeState = "alive"
    down_since: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    rack: str | None = None
    datacenter: str | None = None
    peer_address: str = ""
    api_address: str = ""
    advertise_host: str = ""
    capacity: MeasuredCapacity | None = None
    serving: dict[str, ServingEntry] = field(default_factory=dict)
    change_token: int = 0
    started_at: float = 0.0
    #: The process holding the record: a random token per node process ("" when
    #: written by a build without one), its pid and host name.
    instance: str = ""
    pid: int = 0
    hostname: str = ""

    def __post_init__(self) -> None:
        validate_name("node", self.id)
        _one_of(self.state, "state", NODE_STATES)
        validate_labels(self.labels)

    @property
    def key(self) -> str:
        return node_key(self.id)

    def encode(self) -> bytes:
        return _dump(
            {
                "id": self.id,
                "state": self.state,
                "down_since": self.down_since,
                "labels": dict(self.labels),
                "rack": self.rack,
                "datacenter": self.datacenter,
                "peer_address": self.peer_address,
                "api_address": self.api_address,
                "advertise_host": self.advertise_host,
                "capacity": None if self.capacity is None else self.capacity.to_json(),
                "serving": {app: entry.to_json() for app, entry in self.serving.items()},
                "change_token": self.change_token,
                "started_at": self.started_at,
                "instance": self.instance,
                "pid": self.pid,
                "hostname": self.hostname,
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NodeRecord:
        capacity = _field(obj, "capacity", None)
        serving = _obj(_field(obj, "serving", {}), "serving")
        return cls(
            id=_str(_field(obj, "id"), "id"),
            state=_one_of(_field(obj, "state"), "state", NODE_STATES),
            down_since=_opt_float(_field(obj, "down_since", None), "down_since"),
            labels=_str_dict(_field(obj, "labels", {}), "labels"),
            rack=_opt_str(_field(obj, "rack", None), "rack"),
            datacenter=_opt_str(_field(obj, "datacenter", None), "datacenter"),
            peer_address=_str(_field(obj, "peer_address", ""), "peer_address"),
            api_address=_str(_field(obj, "api_address", ""), "api_address"),
            advertise_host=_str(_field(obj, "advertise_host", ""), "advertise_host"),
            capacity=None
            if capacity is None
            else MeasuredCapacity.from_json(_obj(capacity, "capacity")),
            serving={
                _str(app, "serving"): ServingEntry.from_json(_obj(entry, f"serving.{app}"))
                for app, entry in serving.items()
            },
            change_token=_int(_field(obj, "change_token", 0), "change_token"),
            started_at=_float(_field(obj, "started_at", 0.0), "started_at"),
            instance=_str(_field(obj, "instance", ""), "instance"),
            pid=_nonneg(_field(obj, "pid", 0), "pid"),
            hostname=_str(_field(obj, "hostname", ""), "hostname"),
        )


@dataclass(frozen=True, slots=True)
class NodeIntent:
    """``intent/<node>`` (not leased): what the operator wants of a node."""

    cordoned: bool = False
    draining: bool = False
    force: bool = False

    def encode(self) -> bytes:
        return _dump({"cordoned": self.cordoned, "draining": self.draining, "force": self.force})

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NodeIntent:
        return cls(
            cordoned=_bool(_field(obj, "cordoned", False), "cordoned"),
            draining=_bool(_field(obj, "draining", False), "draining"),
            force=_bool(_field(obj, "force", False), "force"),
        )


@dataclass(frozen=True, slots=True)
class NodeDown:
    """``down/<node>`` (written by the coordinator, under its fence): a node that is
    ``down``, or whose leased record lapsed, as the coordinator last knew it.

    ``down_since`` is when the coordinator decided the node was down (None: its
    record lapsed but membership still reaches it, a registry blip). The spell that
    clock belongs to is told by ``incarnation``, the node's membership incarnation
    when it began (declared dead, or suspect with its record lapsed; None: membership
    had no view of it), and ``instance``, the life (the record's instance token) it
    began in: a node seen later at a higher incarnation or in another life came back
    since, and its next spell starts a clock of its own. The rest is the node's last
    known record, so a successor coordinator knows the node's labels, place and
    capacity after its record is gone.
    """

    node: str
    down_since: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    rack: str | None = None
    datacenter: str | None = None
    capacity: MeasuredCapacity | None = None
    incarnation: int | None = None
    instance: str = ""

    def __post_init__(self) -> None:
        validate_name("node", self.node)

    @property
    def key(self) -> str:
        return down_key(self.node)

    def encode(self) -> bytes:
        return _dump(
            {
                "node": self.node,
                "down_since": self.down_since,
                "labels": dict(self.labels),
                "rack": self.rack,
                "datacenter": self.datacenter,
                "capacity": None if self.capacity is None else self.capacity.to_json(),
                "incarnation": self.incarnation,
                "instance": self.instance,
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NodeDown:
        capacity = _field(obj, "capacity", None)
        return cls(
            node=_str(_field(obj, "node"), "node"),
            down_since=_opt_float(_field(obj, "down_since", None), "down_since"),
            labels=_str_dict(_field(obj, "labels", {}), "labels"),
            rack=_opt_str(_field(obj, "rack", None), "rack"),
            datacenter=_opt_str(_field(obj, "datacenter", None), "datacenter"),
            capacity=None
            if capacity is None
            else MeasuredCapacity.from_json(_obj(capacity, "capacity")),
            incarnation=_opt_int(_field(obj, "incarnation", None), "incarnation"),
            instance=_str(_field(obj, "instance", ""), "instance"),
        )


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """``placement/<app>``: the nodes chosen, when, and under which coordinator fence.

    ``nodes`` is kept sorted (and free of duplicates) whatever order it is given in.
    """

    nodes: list[str]
    decided_at: float
    fence: int
    placed_at: dict[str, float] = field(default_factory=dict)
    #: The app's rolling deploy in progress or halted (None: none), kept here so it
    #: is written under the fence and a coordinator taking over continues it.
    rollout: RolloutRecord | None = None
    #: The app's :meth:`AppRecord.node_spec` as the coordinator last wrote this record
    #: ("": not known, a record written before it was kept).
    spec: str = ""
    #: ``(memory_mb, disk_mb)`` each instance in ``nodes`` reserves: the app's declared
    #: resources when the coordinator placed (or resized) it. A redeploy that changes
    #: them is placed again by the planner, which compares the two. None: a record
    #: written before it was kept (its instances reserve what the app declares).
    reserved: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", sorted(set(self.nodes)))
        if self.reserved is not None:
            memory, disk = self.reserved
            if memory < 0 or disk < 0:
                raise ValueError(f"reserved memory_mb and disk_mb must be >= 0: {self.reserved}")
            object.__setattr__(self, "reserved", (int(memory), int(disk)))

    def out_of_table(self) -> frozenset[str]:
        """The nodes the rollout leaves out of the routing table (none without one)."""
        return frozenset() if self.rollout is None else self.rollout.out_of_table()

    def stamp_for(self, node: str) -> str:
        """What ``node`` reads again this placement and its app on, as a short digest:
        the app's :attr:`spec` and the revision the rollout names for the node (a
        rollout step that switches no revision leaves it as it is). The coordinator
        keeps it per app in ``assign/<node>`` (:class:`NodeAssignment`), so a change
        that concerns the node moves that one key, and no other node's."""
        named = None if self.rollout is None else self.rollout.revision_for(node)
        return _short_digest(f"{self.spec}/{named or ''}")

    def encode(self) -> bytes:
        out: dict[str, Any] = {
            "nodes": list(self.nodes),
            "decided_at": self.decided_at,
            "fence": self.fence,
            "placed_at": dict(self.placed_at),
        }
        if self.rollout is not None:
            out["rollout"] = self.rollout.to_json()
        if self.spec:
            out["spec"] = self.spec
        if self.reserved is not None:
            out["reserved"] = {"memory_mb": self.reserved[0], "disk_mb": self.reserved[1]}
        return _dump(out)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PlacementRecord:
        rollout = _field(obj, "rollout", None)
        reserved = _field(obj, "reserved", None)
        sizes = None if reserved is None else _obj(reserved, "reserved")
        return cls(
            nodes=_str_list(_field(obj, "nodes"), "nodes"),
            decided_at=_float(_field(obj, "decided_at"), "decided_at"),
            fence=_int(_field(obj, "fence"), "fence"),
            placed_at=_float_dict(_field(obj, "placed_at", {}), "placed_at"),
            rollout=None
            if rollout is None
            else RolloutRecord.from_json(_obj(rollout, "rollout")),
            spec=_str(_field(obj, "spec", ""), "spec"),
            reserved=None
            if sizes is None
            else (
                _nonneg(_field(sizes, "memory_mb"), "reserved.memory_mb"),
                _nonneg(_field(sizes, "disk_mb"), "reserved.disk_mb"),
            ),
        )


RolloutStep: TypeAlias = Literal["pending", "out-of-table", "draining", "restarting", "done"]
ROLLOUT_STEPS: Final[tuple[str, ...]] = (
    "pending",
    "out-of-table",
    "draining",
    "restarting",
    "done",
)
#: The steps in which a node's instance is out of the routing table.
OUT_OF_TABLE_STEPS: Final = frozenset({"out-of-table", "draining", "restarting"})
#: Most nodes one rollout record may list (a bound on hostile input).
MAX_ROLLOUT_NODES: Final = 10_000


@dataclass(frozen=True, slots=True)
class NodeRollout:
    """One node's part in a rollout: the revision it is to run, its step, and since
    when (wall-clock seconds) it is in that step.

    ``pending``: not touched yet (it runs ``revision``, the one it ran when the
    rollout began); ``out-of-table``: taken out of routing, waiting for the proxies;
    ``draining``: finishing its in-flight requests; ``restarting``: told to run
    ``revision`` (the target) and not yet ready on it; ``done``: on the target
    and back in the table.
    """

    revision: str
    step: RolloutStep = "pending"
    since: float = 0.0

    def __post_init__(self) -> None:
        validate_digest(self.revision)
        if self.step not in ROLLOUT_STEPS:
            raise ValueError(f"rollout step must be one of {', '.join(ROLLOUT_STEPS)}")

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "step": self.step, "since": self.since}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NodeRollout:
        return cls(
            revision=_str(_field(obj, "revision"), "rollout.node.revision"),
            step=_one_of(_field(obj, "step"), "rollout.node.step", ROLLOUT_STEPS),
            since=_float(_field(obj, "since", 0.0), "rollout.node.since"),
        )


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """An app's rollout in progress (or halted): the target revision, each placed
    node's part in it, when it began and, once halted, why.

    It is the coordinator's bookkeeping, meant to be kept in the app's placement
    record and written under the fence, so that a coordinator taking over reads it
    and continues where the last one stopped. ``nodes[n].revision`` is the revision
    node ``n`` is to run (:meth:`revision_for`); the nodes of :meth:`out_of_table`
    are left out of the routing table.
    """

    revision: str
    nodes: dict[str, NodeRollout]
    started_at: float = 0.0
    halted: str = ""

    def __post_init__(self) -> None:
        validate_digest(self.revision)
        if len(self.nodes) > MAX_ROLLOUT_NODES:
            raise ValueError(f"a rollout lists at most {MAX_ROLLOUT_NODES} nodes")
        for node in self.nodes:
            validate_name("node", node)
        object.__setattr__(self, "nodes", dict(sorted(self.nodes.items())))
        object.__setattr__(self, "halted", self.halted[:MAX_SERVING_REASON])

    def revision_for(self, node: str) -> str | None:
        """The revision ``node`` is to run, or None when the rollout does not name it."""
        entry = self.nodes.get(node)
        return None if entry is None else entry.revision

    def out_of_table(self) -> frozenset[str]:
        """The nodes whose instance is out of the routing table for the rollout."""
        return frozenset(n for n, entry in self.nodes.items() if entry.step in OUT_OF_TABLE_STEPS)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "revision": self.revision,
            "nodes": {node: entry.to_json() for node, entry in self.nodes.items()},
            "started_at": self.started_at,
        }
        if self.halted:
            out["halted"] = self.halted
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RolloutRecord:
        nodes = _obj(_field(obj, "nodes"), "rollout.nodes")
        if len(nodes) > MAX_ROLLOUT_NODES:
            raise ValueError(f"a rollout lists at most {MAX_ROLLOUT_NODES} nodes")
        return cls(
            revision=_str(_field(obj, "revision"), "rollout.revision"),
            nodes={
                _str(node, "rollout.nodes"): NodeRollout.from_json(_obj(entry, f"rollout.{node}"))
                for node, entry in nodes.items()
            },
            started_at=_float(_field(obj, "started_at", 0.0), "rollout.started_at"),
            halted=_str(_field(obj, "halted", ""), "rollout.halted"),
        )

    def encode(self) -> bytes:
        """The record as the JSON it is stored as (with the schema version)."""
        return _dump(self.to_json())

    @classmethod
    def decode(cls, value: bytes) -> RolloutRecord | Undecodable:
        """The record in ``value`` (:meth:`encode` 's bytes), or an
        :class:`Undecodable` (key ``rollout``) naming what breaks the schema."""
        return _decode_json("rollout", value, cls.from_json)


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """``assign/<node>`` (written by the coordinator, in the same fenced transaction as
    the placement records it follows): the apps whose placement names the node.

    A node's reconciler reads this one key first on every pass, and watches only it:
    its ``mod_revision`` moves only when something the node acts on does, so writes
    elsewhere in the cluster cost the node nothing. ``stamps`` maps each app to its
    placement's :meth:`PlacementRecord.stamp_for` the node: the node reads again only
    the apps whose stamp changed (a record written before stamps were kept has none).
    ``apps`` is kept sorted and free of duplicates; ``stamps`` names only apps of it.
    """

    node: str
    apps: list[str] = field(default_factory=list)
    stamps: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_name("node", self.node)
        for app in self.apps:
            validate_name("app", app)
        apps = sorted(set(self.apps))
        object.__setattr__(self, "apps", apps)
        listed = set(apps)
        stamps = {app: stamp for app, stamp in sorted(self.stamps.items()) if app in listed}
        object.__setattr__(self, "stamps", stamps)

    @property
    def key(self) -> str:
        return assign_key(self.node)

    def encode(self) -> bytes:
        out: dict[str, Any] = {"node": self.node, "apps": list(self.apps)}
        if self.stamps:
            out["stamps"] = dict(self.stamps)
        return _dump(out)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NodeAssignment:
        return cls(
            node=_str(_field(obj, "node"), "node"),
            apps=_str_list(_field(obj, "apps"), "apps"),
            stamps=_str_dict(_field(obj, "stamps", {}), "stamps"),
        )


@dataclass(frozen=True, slots=True)
class CoordinatorLease:
    """``lease/coordinator`` (leased): who coordinates. The fence is the key's
    ``create_revision``, not stored in the value."""

    holder: str
    acquired_at: float

    def encode(self) -> bytes:
        return _dump({"holder": self.holder, "acquired_at": self.acquired_at})

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CoordinatorLease:
        return cls(
            holder=_str(_field(obj, "holder"), "holder"),
            acquired_at=_float(_field(obj, "acquired_at"), "acquired_at"),
        )


@dataclass(frozen=True, slots=True)
class SecretFingerprint:
    """``cluster/secret-fingerprint``: HMAC-SHA256 of the cluster secret (hex), which
    node set it and when. Nodes whose secret gives another fingerprint refuse to start."""

    fingerprint: str
    set_by: str
    set_at: float

    def encode(self) -> bytes:
        return _dump(
            {"fingerprint": self.fingerprint, "set_by": self.set_by, "set_at": self.set_at}
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SecretFingerprint:
        fingerprint = _str(_field(obj, "fingerprint"), "fingerprint")
        if _DIGEST.fullmatch(fingerprint) is None:
            raise ValueError("field 'fingerprint' must be 64 lowercase hex digits")
        return cls(
            fingerprint=fingerprint,
            set_by=_str(_field(obj, "set_by"), "set_by"),
            set_at=_float(_field(obj, "set_at"), "set_at"),
        )


@dataclass(frozen=True, slots=True)
class PortClaim:
    """``ports/<node>/<port>``: a port held by an app on a node."""

    node: str
    port: int
    app: str
    claimed_at: float

    def __post_init__(self) -> None:
        validate_name("node", self.node)
        _validate_port(self.port)
        validate_name("app", self.app)

    @property
    def key(self) -> str:
        return port_key(self.node, self.port)

    def encode(self) -> bytes:
        return _dump(
            {"node": self.node, "port": self.port, "app": self.app, "claimed_at": self.claimed_at}
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PortClaim:
        return cls(
            node=_str(_field(obj, "node"), "node"),
            port=_int(_field(obj, "port"), "port"),
            app=_str(_field(obj, "app"), "app"),
            claimed_at=_float(_field(obj, "claimed_at"), "claimed_at"),
        )


@dataclass(frozen=True, slots=True)
class _AppPointer:
    """A value naming one app (``{"app": name}``)."""

    app: str

    def __post_init__(self) -> None:
        validate_name("app", self.app)

    def encode(self) -> bytes:
        return _dump({"app": self.app})

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls(app=_str(_field(obj, "app"), "app"))


@dataclass(frozen=True, slots=True)
class AliasRecord(_AppPointer):
    """``alias/<domain>`` and ``alias/<domain>/previous``: the app a domain points at."""


@dataclass(frozen=True, slots=True)
class DomainClaim(_AppPointer):
    """``domain/<domain>``: the app that owns a domain. Written in the same txn as
    the app record that lists the domain, guarded on the claim being absent (and on
    no ``alias/<domain>``), so one domain belongs to one app or one alias."""


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """``routing``: domain -> backend URLs, as pushed to proxies."""

    domains: dict[str, list[str]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"domains": {d: list(urls) for d, urls in self.domains.items()}})

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RoutingTable:
        domains = _obj(_field(obj, "domains"), "domains")
        return cls(domains={_str(d, "domains"): _str_list(u, d) for d, u in domains.items()})


def _opt_int(value: Any, name: str) -> int | None:
    return None if value is None else _nonneg(value, name)


#: Longest ``ProxyRecord.error`` kept.
MAX_PROXY_ERROR: Final = 1000

#: Reports a proxy may miss before its record counts as not reporting: one late
#: write (a slow registry) is not an outage, three in a row are.
PROXY_MISSED_REPORTS: Final = 3


@dataclass(frozen=True, slots=True)
class ProxyRecord:
    """``proxies/<id>`` (written by ``corral proxy run``): what one proxy serves.

    ``applied_fence``/``applied_revision``: the routing table version applied (None
    until one was); ``applied_at`` wall-clock seconds; ``error`` the last apply's
    failure (None once a later apply succeeded); ``seen_*`` the newest version
    offered; ``apply_s`` how long the last apply took; ``reloads`` of the process.

    Supervision: ``restarts`` counts the times the proxy process died and was
    started again, ``last_error`` says why it last died (or failed to start
    again), ``since`` is when the running process started serving (None while it
    is down). Liveness: ``reported_at`` is when the record was last written (it is
    rewritten every ``report_every`` seconds); ``pid``, ``host`` and
    ``started_at`` (the process's create time) name the ``corral proxy run`` that
    owns the id, so a second one can tell a live owner from a dead one.
    """

    id: str
    kind: str
    listen: str
    applied_fence: int | None = None
    applied_revision: int | None = None
    applied_at: float | None = None
    seen_fence: int | None = None
    seen_revision: int | None = None
    error: str | None = None
    apply_s: float | None = None
    reloads: int = 0
    restarts: int = 0
    last_error: str | None = None
    since: float | None = None
    reported_at: float | None = None
    report_every: float | None = None
    pid: int | None = None
    host: str | None = None
    started_at: float | None = None

    @property
    def key(self) -> str:
        return proxy_key(self.id)

    def not_reporting_for(self, now: float) -> float | None:
        """Seconds since this record was last written, when that is more than
        :data:`PROXY_MISSED_REPORTS` report intervals ago (its ``corral proxy run``
        is gone, hung or cut off from the registry); None while it reports, and for
        a record that does not say when it reports (written by an older version).
        """
        if self.reported_at is None or not self.report_every:
            return None
        silent = now - self.reported_at
        if silent <= PROXY_MISSED_REPORTS * self.report_every:
            return None
        return round(silent, 1)

    def encode(self) -> bytes:
        return _dump(
            {
                "id": self.id,
                "kind": self.kind,
                "listen": self.listen,
                "applied_fence": self.applied_fence,
                "applied_revision": self.applied_revision,
                "applied_at": self.applied_at,
                "seen_fence": self.seen_fence,
                "seen_revision": self.seen_revision,
                "error": None if self.error is None else self.error[:MAX_PROXY_ERROR],
                "apply_s": self.apply_s,
                "reloads": self.reloads,
                "restarts": self.restarts,
                "last_error": None
                if self.last_error is None
                else self.last_error[:MAX_PROXY_ERROR],
                "since": self.since,
                "reported_at": self.reported_at,
                "report_every": self.report_every,
                "pid": self.pid,
                "host": self.host,
                "started_at": self.started_at,
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ProxyRecord:
        return cls(
            id=_str(_field(obj, "id"), "id"),
            kind=_str(_field(obj, "kind"), "kind"),
            listen=_str(_field(obj, "listen", ""), "listen"),
            applied_fence=_opt_int(_field(obj, "applied_fence", None), "applied_fence"),
            applied_revision=_opt_int(_field(obj, "applied_revision", None), "applied_revision"),
            applied_at=_opt_float(_field(obj, "applied_at", None), "applied_at"),
            seen_fence=_opt_int(_field(obj, "seen_fence", None), "seen_fence"),
            seen_revision=_opt_int(_field(obj, "seen_revision", None), "seen_revision"),
            error=_opt_str(_field(obj, "error", None), "error"),
            apply_s=_opt_float(_field(obj, "apply_s", None), "apply_s"),
            reloads=_nonneg(_field(obj, "reloads", 0), "reloads"),
            restarts=_nonneg(_field(obj, "restarts", 0), "restarts"),
            last_error=_opt_str(_field(obj, "last_error", None), "last_error"),
            since=_opt_float(_field(obj, "since", None), "since"),
            reported_at=_opt_float(_field(obj, "reported_at", None), "reported_at"),
            report_every=_opt_float(_field(obj, "report_every", None), "report_every"),
            pid=_opt_int(_field(obj, "pid", None), "pid"),
            host=_opt_str(_field(obj, "host", None), "host"),
            started_at=_opt_float(_field(obj, "started_at", None), "started_at"),
        )


@dataclass(frozen=True, slots=True)
class Artifact:
    """``artifacts/<digest>``: the raw tar.gz; the digest is the sha256 of ``data``."""

    digest: str
    data: bytes = field(repr=False)

    @classmethod
    def of(cls, data: bytes) -> Artifact:
        return cls(hashlib.sha256(data).hexdigest(), data)

    @property
    def key(self) -> str:
        return artifact_key(self.digest)

    def encode(self) -> bytes:
        return self.data


#: The most holders one copy assignment may name, and copies one node may list.
MAX_COPY_HOLDERS: Final = 1024
MAX_HELD_COPIES: Final = 100_000


@dataclass(frozen=True, slots=True)
class CopyAssignment:
    """``copies/<digest>``: the nodes that are to hold a copy of an artifact, written
    by the lease holder under its fence; ``sha256`` is the digest the bytes must hash to."""

    digest: str
    holders: list[str]
    size: int = 0
    apps: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        validate_digest(self.digest)
        if len(self.holders) > MAX_COPY_HOLDERS:
            raise ValueError(f"holders: more than {MAX_COPY_HOLDERS} nodes")
        for holder in self.holders:
            validate_name("node", holder)
        for app in self.apps:
            validate_name("app", app)
        if self.size < 0:
            raise ValueError("size must be >= 0")

    @property
    def sha256(self) -> str:
        return self.digest

    @property
    def key(self) -> str:
        return copies_key(self.digest)

    def encode(self) -> bytes:
        return _dump(
            {
                "digest": self.digest,
                "sha256": self.digest,
                "holders": list(self.holders),
                "size": self.size,
                "apps": list(self.apps),
            }
        )

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CopyAssignment:
        digest = _str(_field(obj, "digest"), "digest")
        if _str(_field(obj, "sha256", digest), "sha256") != digest:
            raise ValueError("sha256 disagrees with digest")
        return cls(
            digest=digest,
            holders=_str_list(_field(obj, "holders"), "holders"),
            size=_nonneg(_field(obj, "size", 0), "size"),
            apps=_str_list(_field(obj, "apps", []), "apps"),
        )


@dataclass(frozen=True, slots=True)
class HeldCopies:
    """``held/<node>``: the artifact copies (digest -> size in bytes) on a node's disk."""

    node: str
    copies: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_name("node", self.node)
        if len(self.copies) > MAX_HELD_COPIES:
            raise ValueError(f"copies: more than {MAX_HELD_COPIES} artifacts")
        for digest, size in self.copies.items():
            validate_digest(digest)
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"copies: size of {digest} must be an integer >= 0")

    @property
    def key(self) -> str:
        return held_key(self.node)

    def encode(self) -> bytes:
        return _dump({"node": self.node, "copies": dict(sorted(self.copies.items()))})

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> HeldCopies:
        copies = _obj(_field(obj, "copies", {}), "copies")
        return cls(
            node=_str(_field(obj, "node"), "node"),
            copies={_str(d, "copies"): _nonneg(n, f"copies.{d}") for d, n in copies.items()},
        )


Record: TypeAlias = (
    AppRecord
    | NodeRecord
    | NodeIntent
    | PlacementRecord
    | CoordinatorLease
    | PortClaim
    | AliasRecord
    | DomainClaim
    | RoutingTable
    | Artifact
    | SecretFingerprint
    | NodeDown
    | ProxyRecord
    | CopyAssignment
    | HeldCopies
    | NodeAssignment
)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A key whose value breaks its schema; ``reason`` says how."""

    key: str
    reason: str


_JSON_DECODERS: Final[dict[KeyKind, Callable[[dict[str, Any]], Record]]] = {
    KeyKind.APP: AppRecord.from_json,
    KeyKind.NODE: NodeRecord.from_json,
    KeyKind.INTENT: NodeIntent.from_json,
    KeyKind.PLACEMENT: PlacementRecord.from_json,
    KeyKind.COORDINATOR_LEASE: CoordinatorLease.from_json,
    KeyKind.PORT: PortClaim.from_json,
    KeyKind.ALIAS: AliasRecord.from_json,
    KeyKind.ALIAS_PREVIOUS: AliasRecord.from_json,
    KeyKind.DOMAIN: DomainClaim.from_json,
    KeyKind.ROUTING: RoutingTable.from_json,
    KeyKind.SECRET_FINGERPRINT: SecretFingerprint.from_json,
    KeyKind.DOWN: NodeDown.from_json,
    KeyKind.PROXY: ProxyRecord.from_json,
    KeyKind.COPIES: CopyAssignment.from_json,
    KeyKind.HELD: HeldCopies.from_json,
    KeyKind.ASSIGNMENT: NodeAssignment.from_json,
}


def decode_record(key: str, value: bytes) -> Record | Undecodable:
    """Decode the value stored under ``key``.

    Returns:
        The record, or :class:`Undecodable` naming the key and the reason when the
        key is outside the key space or the value breaks its schema. Never raises.
    """
    try:
        kind, parts = parse_key(key)
    except InvalidKey as exc:
        return Undecodable(key, str(exc))
    if kind is KeyKind.ARTIFACT:
        digest = hashlib.sha256(value).hexdigest()
        if digest != parts[0]:
            return Undecodable(key, f"artifact bytes hash to {digest}, not to the key's digest")
        return Artifact(digest, bytes(value))
    record = _decode_json(key, value, _JSON_DECODERS[kind])
    if isinstance(record, Undecodable):
        return record
    mismatch = _name_mismatch(kind, parts, record)
    if mismatch is not None:
        return Undecodable(key, mismatch)
    return record


_Decoded = TypeVar("_Decoded")


def _decode_json(
    key: str, value: bytes, from_json: Callable[[dict[str, Any]], _Decoded]
) -> _Decoded | Undecodable:
    """``from_json`` of the versioned JSON object in ``value``, or an
    :class:`Undecodable` for ``key`` naming what breaks the schema. Never raises."""
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return Undecodable(key, f"not UTF-8 JSON: {exc}")
    if not isinstance(obj, dict):
        return Undecodable(key, f"not a JSON object but {type(obj).__name__}")
    version = obj.get("v")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        return Undecodable(key, f"unknown schema version v={version!r} (this build reads v=1)")
    try:
        return from_json(obj)
    except (ValueError, TypeError, InvalidName) as exc:
        return Undecodable(key, str(exc))


def _name_mismatch(kind: KeyKind, parts: tuple[str, ...], record: Record) -> str | None:
    if isinstance(record, AppRecord) and record.name != parts[0]:
        return f"record names app {record.name!r} but the key names {parts[0]!r}"
    if isinstance(record, ProxyRecord) and record.id != parts[0]:
        return f"record names proxy {record.id!r} but the key names {parts[0]!r}"
    if isinstance(record, NodeRecord) and record.id != parts[0]:
        return f"record names node {record.id!r} but the key names {parts[0]!r}"
    if isinstance(record, CopyAssignment) and record.digest != parts[0]:
        return f"record names artifact {record.digest} but the key names {parts[0]}"
    if isinstance(record, HeldCopies) and record.node != parts[0]:
        return f"record names node {record.node!r} but the key names {parts[0]!r}"
    if isinstance(record, NodeDown | NodeAssignment) and record.node != parts[0]:
        return f"record names node {record.node!r} but the key names {parts[0]!r}"
    if isinstance(record, PortClaim) and (record.node, str(record.port)) != parts:
        return (
            f"record claims port {record.port} on node {record.node!r} but the key names "
            f"port {parts[1]} on node {parts[0]!r}"
        )
    return None


async def read_records(
    registry: Registry, prefix: str
) -> tuple[dict[str, Record], list[Undecodable]]:
    """Range-read ``prefix`` and decode every key.

    Returns:
        ``(records by key, undecodable keys)``; a bad value never raises.
    """
    records: dict[str, Record] = {}
    undecodable: list[Undecodable] = []
    for kv in await registry.range(prefix):
        decoded = decode_record(kv.key, kv.value)
        if isinstance(decoded, Undecodable):
            undecodable.append(decoded)
        else:
            records[kv.key] = decoded
    return records, undecodable


class DecodedRecords:
    """Values read from the registry, each decoded once per version.

    A key read again at the mod revision it was decoded at gives back what that
    decode made (a record, or :class:`Undecodable`): a node reads the same records
    again on every refresh, they seldom change, and decoding was most of what
    reading them cost. One entry per key read, until :meth:`forget` or :meth:`clear`.
    """

    __slots__ = ("_known",)

    #: How a value is decoded (a class attribute: a test counts the decodes made).
    decode_value = staticmethod(decode_record)

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, Record | Undecodable]] = {}

    def decode(self, kv: KeyValue) -> Record | Undecodable:
        """:func:`decode_record` of ``kv``, decoded anew only when its version moved."""
        known = self._known.get(kv.key)
        if known is not None and known[0] == kv.mod_revision:
            return known[1]
        record = self.decode_value(kv.key, kv.value)
        self._known[kv.key] = (kv.mod_revision, record)
        return record

    def forget(self, key: str) -> None:
        """Drop what is kept of ``key`` (it is gone from the registry)."""
        self._known.pop(key, None)

    def clear(self) -> None:
        """Drop everything (the next reads decode anew)."""
        self._known.clear()
