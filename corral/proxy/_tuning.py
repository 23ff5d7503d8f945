"""How both proxies find out a stalled backend by themselves: the shared figures.

Theory of operation
-------------------
A backend can fail in two ways the routing table learns of only late or never:
it dies (its port refuses connections) or it *stalls* (a SIGSTOPped process, a
frozen VM, a node SWIM holds suspect before the table drops it): the kernel
still accepts connections into the listen backlog, nobody answers, and once the
backlog is full new connections are not even accepted. The proxies cope alone:

* **Least connections.** A stalled backend keeps every request sent to it in
  flight, so it soon has the most connections and gets no new request: only the
  one or two requests sent to it as it stopped wait on it.
* **A bounded wait.** A connection must be accepted within
  :data:`DIAL_TIMEOUT_MS` and the response must start within the response
  timeout (:class:`ProxyTimeouts`, ``corral proxy run --response-timeout-ms``,
  :data:`RESPONSE_TIMEOUT_MS` by default); then a request that is safe to repeat
  (:data:`SAFE_METHODS`) is sent to another backend. A POST that may have
  reached the backend is never sent twice: it gets 504. The price: a response
  whose first byte takes longer than the response timeout is cut, and on
  HAProxy one silent that long midway too (its ``timeout server`` is an
  inactivity timeout, and HAProxy 2.6 cannot lengthen it once the headers came:
  long polling and server-sent events need a larger setting); a websocket
  (HAProxy's tunnel) may idle for an hour. A larger setting lets such responses
  through and costs, on a stall, that long for the one or two requests a stalled
  backend holds (and for HAProxy's checks to take it out).
* **Health.** HAProxy checks each server every second (``HEAD /``: any HTTP
  answer, whatever the status, is alive; no answer within
  the response timeout, the bound a request has, twice in a row, is
  down; up again after two answers). Caddy marks a backend that failed one
  request unhealthy for :data:`FAIL_DURATION_S` (passive checks: an active one
  would insist on 2xx at ``/``, which many apps do not answer).

Measured (``tests/proxy/test_stalled_backend.py``: 3 backends, one SIGSTOPped,
100 req/s through the proxy): no request failed and p99 stayed within 3x the
p99 of requests sent straight to the healthy backends; before, HAProxy hung 8 of
1,200 past 5 s and Caddy answered 326 with 502.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from corral.proxy._errors import InvalidProxySetup

__all__ = [
    "DEFAULT_TIMEOUTS",
    "DIAL_TIMEOUT_MS",
    "FAIL_DURATION_S",
    "MAX_RESPONSE_TIMEOUT_MS",
    "MIN_RESPONSE_TIMEOUT_MS",
    "RESPONSE_TIMEOUT_MS",
    "SAFE_METHODS",
    "ProxyTimeouts",
]

#: How long a backend may take to accept a connection (a loopback or LAN connect takes
#: well under a millisecond; a full backlog drops the SYN and would cost a second).
DIAL_TIMEOUT_MS: Final = 500
#: How long a backend may take to start its response before the request goes elsewhere
#: (a safe method) or gets 504; below the 5 s after which a user calls a request hung.
RESPONSE_TIMEOUT_MS: Final = 3000
#: The range ``--response-timeout-ms`` takes: above a connect timeout, at most a day.
MIN_RESPONSE_TIMEOUT_MS: Final = 100
MAX_RESPONSE_TIMEOUT_MS: Final = 86_400_000
#: How long Caddy keeps a backend that failed a request out of its choice.
FAIL_DURATION_S: Final = 5
#: Methods replayed on another backend after one took the request and did not answer
#: (Caddy's ``retry_match``; HAProxy's spelling is ``_haproxy_plan.L7_RETRY_RULE``).
SAFE_METHODS: Final = ("GET", "HEAD", "OPTIONS")

#: Caddy's ``try_duration`` past the response timeout: a request a stalled backend held
#: for the whole timeout is still sent to another backend.
_RETRY_MARGIN_MS: Final = 2000


@dataclass(frozen=True, slots=True)
class ProxyTimeouts:
    """The waits both proxies put on a backend (an operator setting of ``corral proxy run``).

    ``response_ms``: how long a backend may take to start its response (and, on
    HAProxy, stay silent midway) before a safe request goes to another backend and
    any other gets 504.

    Raises:
        InvalidProxySetup: ``response_ms`` is not a whole number of milliseconds in
            :data:`MIN_RESPONSE_TIMEOUT_MS` .. :data:`MAX_RESPONSE_TIMEOUT_MS`.
    """

    response_ms: int = RESPONSE_TIMEOUT_MS

    def __post_init__(self) -> None:
        value = self.response_ms
        if (
            type(value) is not int
            or not MIN_RESPONSE_TIMEOUT_MS <= value <= MAX_RESPONSE_TIMEOUT_MS
        ):
            raise InvalidProxySetup(
                f"--response-timeout-ms: {value!r} is not a whole number from "
                f"{MIN_RESPONSE_TIMEOUT_MS} to {MAX_RESPONSE_TIMEOUT_MS}"
            )

    @property
    def dial_ms(self) -> int:
        """How long a backend may take to accept a connection."""
        return DIAL_TIMEOUT_MS

    @property
    def try_duration_ms(self) -> int:
        """How long Caddy may keep trying backends for one request."""
        return self.response_ms + _RETRY_MARGIN_MS


#: The timeouts a proxy gets when the operator sets none.
DEFAULT_TIMEOUTS: Final = ProxyTimeouts()
