"""Pure decisions of the WebSocket transport: addresses, backoff, connection choice, control.

Theory of operation
-------------------
* **Addresses.** A peer address is ``"host:port"`` (``"[v6]:port"`` for IPv6).
  A node without a cluster secret may only listen on a loopback address.
* **Reconnect delay.** After ``failures`` consecutive failed attempts the next
  attempt waits ``min(maximum, initial * factor ** (failures - 1))`` shortened
  by up to ``jitter`` of itself, using one uniform draw ``u`` in ``[0, 1)``
  supplied by the caller (so tests inject the random source).
* **One connection per pair.** When both nodes dial each other at once, two
  authenticated connections exist for a moment. Both ends keep the same one:
  a connection from a newer incarnation of the peer beats one from an older;
  otherwise the connection dialed by the lower node id wins, and between two
  dials by the same node the later one (higher dial sequence) wins. The rule
  depends only on facts both ends learned in the handshake, so they agree.
* **Control messages.** Envelopes travel as binary WebSocket messages; the
  transport's own notices (a refused frame) travel as small JSON text messages,
  so the two can never be confused and envelopes stay opaque.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """Exponential backoff with jitter between connection attempts (seconds)."""

    initial: float = 0.05
    factor: float = 2.0
    maximum: float = 5.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError(
                f"ReconnectPolicy needs 0 < initial <= maximum, got initial={self.initial} "
                f"maximum={self.maximum}"
            )
        if self.factor < 1:
            raise ValueError(f"ReconnectPolicy.factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"ReconnectPolicy.jitter must be within [0, 1], got {self.jitter}")


def reconnect_delay(policy: ReconnectPolicy, failures: int, u: float) -> float:
    """Seconds to wait before the next attempt after ``failures`` consecutive failures.

    Args:
        policy: the backoff parameters.
        failures: consecutive failed attempts so far; 0 means "connect now".
        u: a uniform draw in ``[0, 1)`` from the injected random source.
    """
    if failures <= 0:
        return 0.0
    base = policy.initial
    for _ in range(failures - 1):
        base *= policy.factor
        if base >= policy.maximum:
            break
    base = min(base, policy.maximum)
    return base * (1.0 - policy.jitter * u)


def parse_peer_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) into its parts.

    Raises:
        ValueError: the address has no port or the port is out of range.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"peer address {address!r} must look like 'host:port'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"peer address {address!r} has port {port} outside 1..65535")
    return host, port


def format_address(host: str, port: int) -> str:
    """The inverse of :func:`parse_peer_address`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """True if ``host`` names this machine's loopback interface only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_address(host: str, has_secret: bool) -> None:
    """Refuse to listen beyond loopback without a cluster secret.

    Raises:
        ValueError: ``host`` is not loopback and no secret is configured.
    """
    if not has_secret and not is_loopback_host(host):
        raise ValueError(
            f"refusing to listen on {host!r} without a cluster secret: anyone who can reach "
            "it could talk to this node's actors. Configure a secret, or listen on 127.0.0.1"
        )


@dataclass(frozen=True, slots=True)
class ConnectionKey:
    """What both ends know about one authenticated connection between a pair."""

    initiator: str
    dial_seq: int
    peer_incarnation: bytes


def new_connection_wins(local: str, peer: str, new: ConnectionKey, current: ConnectionKey) -> bool:
    """Whether ``new`` should replace the live ``current`` connection to ``peer``."""
    if new.peer_incarnation != current.peer_incarnation:
        return True  # the peer restarted: its old connection is stale
    preferred = min(local, peer)
    new_preferred = new.initiator == preferred
    current_preferred = current.initiator == preferred
    if new_preferred != current_preferred:
        return new_preferred
    return new.dial_seq > current.dial_seq


@dataclass(frozen=True, slots=True)
class FrameRefusal:
    """The peer refused a frame we sent (it stays connected)."""

    reason: str
    size: int
    limit: int


def frame_refusal_message(size: int, limit: int) -> str:
    """The control message telling a sender its frame was too large."""
    return json.dumps({"t": "refused", "reason": "frame-too-large", "size": size, "limit": limit})


def parse_control_message(text: str) -> FrameRefusal | None:
    """Decode a control message; None if it is not one this version understands."""
    if len(text) > 4096:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("t") != "refused":
        return None
    reason, size, limit = value.get("reason"), value.get("size"), value.get("limit")
    if not isinstance(reason, str) or not isinstance(size, int) or not isinstance(limit, int):
        return None
    return FrameRefusal(reason, size, limit)
