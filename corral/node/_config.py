"""Node configuration: command-line flags, environment variables and a TOML file.

Theory of operation: every setting has one name. The flag is ``--<name>``, the
environment variable ``CORRAL_<NAME>`` (dashes become underscores, upper case),
the config-file key ``<name>`` (dashes or underscores). A flag beats the
environment, the environment beats the file, the file beats the default.
:func:`resolve_node_config` is pure: it is given the three sources as mappings
and returns a frozen :class:`NodeConfig` or raises :class:`ConfigError` naming
the setting, where it came from, and what is allowed.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.node._errors import ConfigError
from corral.registry import (
    InvalidName,
    InvalidRegistryUrl,
    RegistryOptions,
    default_registry_url,
    parse_registry_url,
    validate_labels,
)

DEFAULT_API = "127.0.0.1:7400"
DEFAULT_LISTEN = "127.0.0.1:7401"
DEFAULT_DATA_DIR = ".corral"
DEFAULT_PORT_RANGE_START = 24000
DEFAULT_PORT_RANGE_SPAN = 998
DEFAULT_PORT_QUARANTINE_MS = 600_000
DEFAULT_LEASE_TTL_MS = 45_000
DEFAULT_NODE_TTL_MS = 15_000
DEFAULT_SHUTDOWN_GRACE_MS = 10_000
DEFAULT_MAX_ARTIFACT_MB = 1024
# The coordinator's policy (the lease holder's values apply).
DEFAULT_GRACE_PERIOD_MS = 300_000
DEFAULT_COOLDOWN_MS = 600_000
DEFAULT_DISRUPTION_BUDGET = 5
#: Holders each live revision's artifact gets at least, and seconds between passes.
DEFAULT_ARTIFACT_COPIES = 3
DEFAULT_ARTIFACT_INTERVAL_MS = 20_000
DEFAULT_MIN_USABLE_PERCENT = 50
# SWIM membership between nodes (memberlist's LAN profile).
DEFAULT_PROBE_INTERVAL_MS = 1_000
DEFAULT_PROBE_TIMEOUT_MS = 500
DEFAULT_INDIRECT_CHECKS = 3
DEFAULT_SUSPICION_MULT = 4

# name -> kind; kind is how the raw text is parsed.
SETTINGS: dict[str, str] = {
    "data-dir": "path",
    "registry": "str",
    "registry-ca": "path",
    "registry-cert": "path",
    "registry-key": "path",
    "registry-user": "str",
    "registry-password": "secret",
    "registry-password-file": "path",
    "node-id": "str",
    "listen": "address",
    "api": "address",
    "advertise": "str",
    "label": "labels",
    "rack": "str",
    "datacenter": "str",
    "token": "str",
    "secret": "str",
    "port-range-start": "port",
    "port-range-end": "port",
    "port-quarantine-ms": "ms",
    "lease-ttl-ms": "ms",
    "node-ttl-ms": "ms",
    "shutdown-grace-ms": "ms",
    "max-artifact-mb": "mb",
    "artifact-copies": "count",
    "artifact-interval-ms": "ms",
    "grace-period-ms": "ms",
    "cooldown-ms": "ms",
    "disruption-budget": "count",
    "min-usable-percent": "percent",
    "metrics-listen": "address",
    "log-format": "str",
    "probe-interval-ms": "ms",
    "probe-timeout-ms": "ms",
    "indirect-checks": "count",
    "suspicion-mult": "count",
    "proxy": "proxies",
}
LOG_FORMATS = ("text", "json")


def env_name(setting: str) -> str:
    """The environment variable of a setting: ``data-dir`` -> ``CORRAL_DATA_DIR``.

    ``label`` reads ``CORRAL_LABELS`` (comma-separated ``k=v`` pairs).
    """
    if setting == "label":
        return "CORRAL_LABELS"
    return "CORRAL_" + setting.replace("-", "_").upper()


@dataclass(frozen=True)
class Address:
    """A ``host:port`` pair."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}"


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``corral node run`` needs, resolved and checked.

    ``node_id``, ``token`` and ``secret`` may be None: the node then reads or
    creates them under ``data_dir`` (see :mod:`corral.node._identity`).
    """

    data_dir: Path
    registry_url: str
    node_id: str | None
    listen: Address
    api: Address
    advertise: str
    labels: Mapping[str, str] = field(default_factory=dict)
    rack: str | None = None
    datacenter: str | None = None
    token: str | None = None
    secret: str | None = None
    port_range_start: int = DEFAULT_PORT_RANGE_START
    port_range_end: int = DEFAULT_PORT_RANGE_START + DEFAULT_PORT_RANGE_SPAN
    port_quarantine_ms: int = DEFAULT_PORT_QUARANTINE_MS
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    node_ttl_ms: int = DEFAULT_NODE_TTL_MS
    shutdown_grace_ms: int = DEFAULT_SHUTDOWN_GRACE_MS
    #: the most one artifact may unpack to, in MiB (checked at deploy and at unpack).
    max_artifact_mb: int = DEFAULT_MAX_ARTIFACT_MB
    #: holders each live revision's artifact gets at least (the lease holder assigns them).
    artifact_copies: int = DEFAULT_ARTIFACT_COPIES
    #: how often artifact copies are assigned, fetched and released.
    artifact_interval_ms: int = DEFAULT_ARTIFACT_INTERVAL_MS
    registry_options: RegistryOptions = field(default_factory=RegistryOptions)
    #: how long a down node keeps its work before it is relocated.
    grace_period_ms: int = DEFAULT_GRACE_PERIOD_MS
    #: an instance placed less than this long ago is not moved to rebalance.
    cooldown_ms: int = DEFAULT_COOLDOWN_MS
    #: most relocations per coordinator pass.
    disruption_budget: int = DEFAULT_DISRUPTION_BUDGET
    #: below this share of usable nodes (of those known) relocations are refused.
    min_usable_percent: int = DEFAULT_MIN_USABLE_PERCENT
    #: a loopback address serving ``GET /metrics`` without a token (None: only the API).
    metrics_listen: Address | None = None
    log_format: str = "text"
    #: SWIM: time between probes of one member.
    probe_interval_ms: int = DEFAULT_PROBE_INTERVAL_MS
    #: SWIM: wait for a direct ack before asking other members to probe (below the interval).
    probe_timeout_ms: int = DEFAULT_PROBE_TIMEOUT_MS
    #: SWIM: members asked to probe for us when a direct probe fails.
    indirect_checks: int = DEFAULT_INDIRECT_CHECKS
    #: SWIM: scales the suspicion timeout (min = mult * max(1, log10 N) * interval).
    suspicion_mult: int = DEFAULT_SUSPICION_MULT
    #: Caddy admin endpoints (``http://HOST:PORT``) the coordinator pushes each table to
    #: (``--proxy caddy=http://HOST:PORT``, repeatable).
    proxies: tuple[str, ...] = ()


def parse_proxy(text: str, where: str) -> str:
    """Parse one ``--proxy KIND=URL``; only ``caddy=http://HOST:PORT`` is pushed to.

    Returns:
        The admin URL.

    Raises:
        ConfigError: naming ``where`` and the accepted form.
    """
    kind, sep, url = text.strip().partition("=")
    if not sep or kind.strip() != "caddy":
        raise ConfigError(
            f"{where}: {text!r} is not a push target; write caddy=http://HOST:PORT (the "
            "coordinator pushes tables to Caddy admin endpoints; run HAProxy with "
            "`corral proxy run --kind haproxy`)"
        )
    host = parse_address(url, where)
    if not url.strip().startswith("http://"):
        raise ConfigError(f"{where}: {text!r}: the admin endpoint is http://HOST:PORT")
    return host.url


def parse_address(text: str, where: str) -> Address:
    """Parse ``host:port``, ``[v6]:port`` or ``http://host:port``.

    Raises:
        ConfigError: naming ``where`` (e.g. ``--api``) and the accepted forms.
    """
    raw = text.strip()
    for scheme in ("http://", "https://"):
        if raw.startswith(scheme):
            raw = raw[len(scheme) :].rstrip("/")
    host, sep, port_text = raw.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"{where}: {text!r} is not an address; write host:port, e.g. 127.0.0.1:7400"
        )
    return Address(host, int(port_text))


def parse_label(text: str, where: str) -> tuple[str, str]:
    """Parse one ``key=value`` label; the key must be non-empty."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{where}: {text!r} is not a label; write key=value, e.g. zone=a")
    return key, value.strip()


def load_config_file(path: Path) -> dict[str, object]:
    """Read a TOML config file into a mapping keyed by setting name.

    Raises:
        ConfigError: the file is missing, is not TOML, or has an unknown key.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; fix --config") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from exc
    values: dict[str, object] = {}
    for key, value in document.items():
        name = key.replace("_", "-")
        if name == "labels":
            name = "label"
        if name not in SETTINGS:
            known = ", ".join(sorted(SETTINGS))
            raise ConfigError(f"config file {path}: unknown key {key!r}; known keys: {known}")
        values[name] = value
    return values


def _file_text(name: str, value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(f"{where}: {name} must be a string or a number, not {value!r}")
    return str(value)


def _file_labels(value: object, where: str) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): _file_text("label", v, where) for k, v in value.items()}
    if isinstance(value, list):
        return dict(parse_label(_file_text("label", item, where), where) for item in value)
    raise ConfigError(f"{where}: labels must be a table or a list of key=value strings")


def resolve_node_config(
    flags: Mapping[str, object],
    env: Mapping[str, str],
    file_values: Mapping[str, object] | None = None,
    *,
    cwd: Path,
    file_name: str = "the config file",
) -> NodeConfig:
    """Merge flags, environment and config file into a :class:`NodeConfig`.

    Args:
        flags: setting name -> value given on the command line (None or absent =
            not given; ``label`` is a list of ``k=v`` strings).
        env: the process environment (only ``CORRAL_*`` names are read).
        file_values: the config file as returned by :func:`load_config_file`.
        cwd: the directory relative paths are resolved against.
        file_name: how to name the config file in messages.

    Raises:
        ConfigError: a value is malformed or out of range; the message names it.
    """
    file_values = file_values or {}

    def pick(name: str) -> tuple[object, str] | None:
        given = flags.get(name)
        if given is not None and given != []:
            return given, f"--{name}"
        if env_name(name) in env and env[env_name(name)] != "":
            return env[env_name(name)], env_name(name)
        if name in file_values:
            return file_values[name], f"{file_name} key {name!r}"
        return None

    def text(name: str) -> str | None:
        found = pick(name)
        if found is None:
            return None
        value, where = found
        return _file_text(name, value, where)

    def number(name: str, default: int, *, low: int, high: int) -> int:
        found = pick(name)
        if found is None:
            return default
        value, where = found
        raw = _file_text(name, value, where).strip()
        if not raw.isdigit() or not low <= int(raw) <= high:
            raise ConfigError(f"{where}: {raw!r} is not a whole number from {low} to {high}")
        return int(raw)

    def path_text(name: str) -> str | None:
        found = text(name)
        return None if found is None else str(cwd / Path(found).expanduser())

    def secret_text(name: str) -> str | None:
        found = pick(name)
        if found is None:
            return None
        value, where = found
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {name} must be a non-empty string")  # never echo it
        return value

    data_dir_text = text("data-dir") or DEFAULT_DATA_DIR
    data_dir = (cwd / Path(data_dir_text).expanduser()).resolve()

    registry_url = text("registry") or default_registry_url(data_dir)
    try:
        parsed_registry = parse_registry_url(registry_url)
    except InvalidRegistryUrl as exc:
        raise ConfigError(f"--registry: {exc}") from None
    registry_options = RegistryOptions(
        ca_file=path_text("registry-ca"),
        cert_file=path_text("registry-cert"),
        key_file=path_text("registry-key"),
        user=text("registry-user"),
        password=secret_text("registry-password"),
        password_file=path_text("registry-password-file"),
    )
    problems = registry_options.problems(parsed_registry)
    if problems:
        raise ConfigError(f"--registry {registry_url}: {'; '.join(problems)}")

    found = pick("listen")
    listen = parse_address(_file_text("listen", found[0], found[1]), found[1]) if found else None
    listen = listen or parse_address(DEFAULT_LISTEN, "default listen")
    found = pick("api")
    api = parse_address(_file_text("api", found[0], found[1]), found[1]) if found else None
    api = api or parse_address(DEFAULT_API, "default api")

    advertise = text("advertise")
    if advertise is None:
        advertise = listen.host if listen.host not in ("0.0.0.0", "::", "") else "127.0.0.1"

    labels: dict[str, str] = {}
    found = pick("label")
    if found is not None:
        value, where = found
        if isinstance(value, str):
            items = [item for item in value.split(",") if item.strip()]
            labels = dict(parse_label(item, where) for item in items)
        elif where.startswith("--"):
            assert isinstance(value, list)
            labels = dict(parse_label(str(item), where) for item in value)
        else:
            labels = _file_labels(value, where)
        try:
            labels = validate_labels(labels)
        except InvalidName as exc:
            raise ConfigError(f"{where}: {exc}") from None

    start = number("port-range-start", DEFAULT_PORT_RANGE_START, low=1, high=65535)
    end = number("port-range-end", min(start + DEFAULT_PORT_RANGE_SPAN, 65535), low=1, high=65535)
    if end - start < 1:
        raise ConfigError(
            f"port range {start}-{end} holds fewer than two ports; "
            "make --port-range-end larger than --port-range-start"
        )

    found = pick("metrics-listen")
    metrics_listen = None
    if found is not None:
        metrics_listen = parse_address(_file_text("metrics-listen", *found), found[1])
        if not _loopback(metrics_listen.host):
            raise ConfigError(
                f"{found[1]}: {metrics_listen} is not a loopback address; the metrics "
                "listener takes no token, so it serves only 127.0.0.1 or ::1 (scrape "
                "GET /metrics on --api with the token from elsewhere)"
            )
    log_format = (text("log-format") or "text").strip().lower()
    if log_format not in LOG_FORMATS:
        given = pick("log-format")
        raise ConfigError(
            f"{given[1] if given else '--log-format'}: {log_format!r} is not a log format; "
            f"give {' or '.join(LOG_FORMATS)}"
        )
    probe_interval_ms = number(
        "probe-interval-ms", DEFAULT_PROBE_INTERVAL_MS, low=10, high=60_000
    )
    probe_timeout_ms = number("probe-timeout-ms", DEFAULT_PROBE_TIMEOUT_MS, low=5, high=60_000)
    if probe_timeout_ms >= probe_interval_ms:
        raise ConfigError(
            f"--probe-timeout-ms {probe_timeout_ms} must be below --probe-interval-ms "
            f"{probe_interval_ms} (an ack waited for longer than the interval overlaps the "
            "next probe); lower the timeout or raise the interval"
        )
    proxies: list[str] = []
    found = pick("proxy")
    if found is not None:
        value, where = found
        if isinstance(value, str):
            items = [item for item in value.split(",") if item.strip()]
        elif isinstance(value, list):
            items = [_file_text("proxy", item, where) for item in value]
        else:
            raise ConfigError(f"{where}: proxy must be a list of caddy=http://HOST:PORT strings")
        for item in items:
            url = parse_proxy(item, where)
            if url not in proxies:
                proxies.append(url)

    return NodeConfig(
        data_dir=data_dir,
        registry_url=registry_url,
        node_id=text("node-id"),
        listen=listen,
        api=api,
        advertise=advertise,
        labels=labels,
        rack=text("rack"),
        datacenter=text("datacenter"),
        token=text("token"),
        secret=text("secret"),
        port_range_start=start,
        port_range_end=end,
        port_quarantine_ms=number(
            "port-quarantine-ms", DEFAULT_PORT_QUARANTINE_MS, low=0, high=86_400_000
        ),
        lease_ttl_ms=number("lease-ttl-ms", DEFAULT_LEASE_TTL_MS, low=300, high=3_600_000),
        node_ttl_ms=number("node-ttl-ms", DEFAULT_NODE_TTL_MS, low=300, high=3_600_000),
        shutdown_grace_ms=number(
            "shutdown-grace-ms", DEFAULT_SHUTDOWN_GRACE_MS, low=0, high=600_000
        ),
        max_artifact_mb=number("max-artifact-mb", DEFAULT_MAX_ARTIFACT_MB, low=1, high=1024 * 1024),
        artifact_copies=number("artifact-copies", DEFAULT_ARTIFACT_COPIES, low=1, high=1024),
        artifact_interval_ms=number(
            "artifact-interval-ms", DEFAULT_ARTIFACT_INTERVAL_MS, low=100, high=3_600_000
        ),
        registry_options=registry_options,
        grace_period_ms=number(
            "grace-period-ms", DEFAULT_GRACE_PERIOD_MS, low=0, high=604_800_000
        ),
        cooldown_ms=number("cooldown-ms", DEFAULT_COOLDOWN_MS, low=0, high=604_800_000),
        disruption_budget=number(
            "disruption-budget", DEFAULT_DISRUPTION_BUDGET, low=0, high=100_000
        ),
        min_usable_percent=number(
            "min-usable-percent", DEFAULT_MIN_USABLE_PERCENT, low=0, high=100
        ),
        metrics_listen=metrics_listen,
        log_format=log_format,
        probe_interval_ms=probe_interval_ms,
        probe_timeout_ms=probe_timeout_ms,
        indirect_checks=number("indirect-checks", DEFAULT_INDIRECT_CHECKS, low=0, high=16),
        suspicion_mult=number("suspicion-mult", DEFAULT_SUSPICION_MULT, low=1, high=100),
        proxies=tuple(proxies),
    )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
