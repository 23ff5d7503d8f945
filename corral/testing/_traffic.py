"""An open-loop HTTP load generator for loopback end-to-end tests and benchmarks.

What a user of a proxy sees during a deploy is a stream of independent
requests arriving at a steady rate, whatever the service does: a closed loop
(send, wait, send) slows down when the service stalls and so hides the very
stalls it should count. :class:`TrafficGenerator` sends at a fixed rate, each
request on a connection of its own (no keep-alive, so every request is routed
afresh), each bounded by a timeout, and records every outcome in the phase
that was current when it was sent.

Usage::

    traffic = TrafficGenerator(("127.0.0.1", proxy_port), host="shop.test", rate=50)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(traffic.run)
        traffic.mark("redeploy")
        ...  # do the thing under load
        traffic.stop()
    report = traffic.report()
    assert report.phase("redeploy").failed == 0, report.phase("redeploy").failures

Only loopback addresses are accepted: this is a test tool, not a load tester
to point at somebody else's service. Latencies are measured from the moment a
request was due (not when the generator got round to it), so a generator that
falls behind shows up as latency, never as a quietly lower rate.
"""

from __future__ import annotations

import errno
import ipaddress
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

__all__ = [
    "PhaseSummary",
    "RequestOutcome",
    "TrafficGenerator",
    "TrafficReport",
    "percentile",
    "summarize",
]

#: Most bytes read of one response (status line, headers and body).
MAX_RESPONSE_BYTES = 1 << 20
#: Most requests a generator may have in flight; one more is recorded as failed
#: (``saturated``) instead of being sent, so a stalled service cannot make the
#: generator itself grow without bound.
DEFAULT_MAX_IN_FLIGHT = 2000


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 < q <= 100) of ``values`` by nearest rank; None if empty.

    Nearest rank always returns one of the values: p99 of 100 latencies is the
    99th smallest, never an interpolation between two.
    """
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q!r} is not in (0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request: when it was due (seconds since the run started), its phase, how
    long it took, the HTTP status (None when none was read) and, for a failure
    that is not an HTTP status, the kind of error (``refused``, ``reset``,
    ``timeout``, ``empty-response``, ``bad-response``, ``saturated``, ``os-error``)."""

    due: float
    phase: str
    latency: float
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.error is None and self.status is not None and 200 <= self.status < 300

    @property
    def failure_kind(self) -> str | None:
        """None for a success; else the error kind, or ``http-<status>``."""
        if self.ok:
            return None
        return self.error if self.error is not None else f"http-{self.status}"


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    """The requests sent during one phase.

    ``p50`` and ``p99`` (seconds) are over the successful requests only (None
    when there were none); ``failures`` counts the failed ones by kind.
    """

    phase: str
    sent: int
    failed: int
    p50: float | None
    p99: float | None
    max_latency: float | None
    failures: Mapping[str, int] = field(default_factory=dict)
    first_failure: float | None = None
    last_failure: float | None = None

    @property
    def failure_window(self) -> float:
        """Seconds from the first failed request's due time to the last one's (0 if
        fewer than two failed): how long the service was seen failing."""
        if self.first_failure is None or self.last_failure is None:
            return 0.0
        return self.last_failure - self.first_failure

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "sent": self.sent,
            "failed": self.failed,
            "p50_ms": _ms(self.p50),
            "p99_ms": _ms(self.p99),
            "max_ms": _ms(self.max_latency),
            "failures": dict(sorted(self.failures.items())),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def summarize(phase: str, outcomes: Iterable[RequestOutcome]) -> PhaseSummary:
    """Summarize ``outcomes`` (all of them, whatever their phase) under the name ``phase``:
    several runs' outcomes together, say."""
    rows = list(outcomes)
    good = [row.latency for row in rows if row.ok]
    bad = sorted((row for row in rows if not row.ok), key=lambda row: row.due)
    kinds = Counter(row.failure_kind for row in bad)
    return PhaseSummary(
        phase=phase,
        sent=len(rows),
        failed=len(bad),
        p50=percentile(good, 50),
        p99=percentile(good, 99),
        max_latency=max(good) if good else None,
        failures={str(kind): count for kind, count in sorted(kinds.items(), key=str)},
        first_failure=bad[0].due if bad else None,
        last_failure=bad[-1].due if bad else None,
    )


@dataclass(frozen=True, slots=True)
class TrafficReport:
    """Every outcome of one run, in due order, and the phases in the order marked."""

    outcomes: tuple[RequestOutcome, ...]
    phases: tuple[str, ...]
    rate: float

    def phase(self, name: str) -> PhaseSummary:
        """The summary of the requests sent while ``name`` was the current phase.

        Raises:
            KeyError: no phase of that name was marked.
        """
        if name not in self.phases:
            raise KeyError(f"no phase {name!r} was marked; phases: {', '.join(self.phases)}")
        return summarize(name, (row for row in self.outcomes if row.phase == name))

    def total(self, *, phases: Iterable[str] | None = None) -> PhaseSummary:
        """All requests (or those of ``phases``) as one summary named ``all``."""
        wanted = None if phases is None else set(phases)
        return summarize(
            "all", (row for row in self.outcomes if wanted is None or row.phase in wanted)
        )

    @property
    def failed(self) -> list[RequestOutcome]:
        return [row for row in self.outcomes if not row.ok]


def _check_loopback(address: tuple[str, int]) -> tuple[str, int]:
    host, port = address
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"traffic target {host!r} is not an IP address: give a loopback one (127.0.0.1)"
        ) from None
    if not ip.is_loopback:
        raise ValueError(f"traffic target {host} is not a loopback address: only those are served")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"traffic target port {port!r} is not in 1..65535")
    return str(ip), int(port)


def _status_of(head: bytes) -> int | None:
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return None
    code = int(parts[1])
    return code if 100 <= code <= 599 else None


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"content-length":
            text = value.strip()
            return int(text) if text.isdigit() else None
    return None


class TrafficGenerator:
    """Sends ``GET path`` with ``Host: host`` to a loopback ``address`` at ``rate`` per second.

    Args:
        address: ``(ip, port)`` of a loopback listener (a proxy, or a backend).
        host: the ``Host`` header (default: the address).
        path: the request path.
        rate: requests per second (> 0), each on a new connection.
        timeout: seconds one request may take, connect to last byte.
        max_requests: stop after sending this many (None: no count bound).
        max_seconds: stop sending this long after :meth:`run` started (None: no bound).
            At least one of the two bounds, or a call to :meth:`stop`, ends a run.
        max_in_flight: requests in flight at most (see :data:`DEFAULT_MAX_IN_FLIGHT`).
        phase: the phase name of requests sent before the first :meth:`mark`.
    """

    def __init__(
        self,
        address: tuple[str, int],
        *,
        host: str | None = None,
        path: str = "/",
        rate: float = 200.0,
        timeout: float = 2.0,
        max_requests: int | None = None,
        max_seconds: float | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        phase: str = "start",
    ) -> None:
        self._address = _check_loopback(address)
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate {rate!r} is not a positive number of requests per second")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout {timeout!r} is not a positive number of seconds")
        if max_requests is not None and max_requests < 0:
            raise ValueError(f"max_requests {max_requests!r} is negative")
        if max_seconds is not None and not max_seconds >= 0:
            raise ValueError(f"max_seconds {max_seconds!r} is not a number of seconds >= 0")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight {max_in_flight!r} is below 1")
        if not path.startswith("/") or any(c in path for c in " \r\n"):
            raise ValueError(f"path {path!r} must start with / and hold no spaces or newlines")
        host_header = host if host is not None else f"{self._address[0]}:{self._address[1]}"
        if not host_header or any(c in host_header for c in " \r\n"):
            raise ValueError(f"host {host_header!r} is not a valid Host header")
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n"
            "User-Agent: corral-traffic\r\n\r\n"
        ).encode()
        self.rate = float(rate)
        self.timeout = float(timeout)
        self._max_requests = max_requests
        self._max_seconds = max_seconds
        self._max_in_flight = max_in_flight
        self._phase = phase
        self._phases: list[str] = [phase]
        self._outcomes: list[RequestOutcome] = []
        self._in_flight = 0
        self._stopping = trio.Event()
        self._started: float | None = None

    @property
    def current_phase(self) -> str:
        return self._phase

    @property
    def sent(self) -> int:
        """Requests recorded so far (finished or failed)."""
        return len(self._outcomes)

    def mark(self, phase: str) -> None:
        """From now on, requests belong to ``phase`` (a name marked again continues it)."""
        if not phase:
            raise ValueError("a phase needs a name")
        self._phase = phase
        if phase not in self._phases:
            self._phases.append(phase)

    def stop(self) -> None:
        """Send no more requests; :meth:`run` returns once those in flight end."""
        self._stopping.set()

    def report(self) -> TrafficReport:
        """What was recorded so far (call it after :meth:`run` returned for the whole run)."""
        return TrafficReport(
            outcomes=tuple(sorted(self._outcomes, key=lambda row: row.due)),
            phases=tuple(self._phases),
            rate=self.rate,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send at the fixed rate until a bound is reached or :meth:`stop` is called, then
        wait for the requests in flight (each ends within ``timeout``). Started at once.
        """
        if self._started is not None:
            raise RuntimeError("a TrafficGenerator runs once; make another for another run")
        start = self._started = trio.current_time()
        interval = 1.0 / self.rate
        # The bounds as a count of requests: comparing due times against the
        # duration would let float rounding (start + 20 * 0.005 - start < 0.1) add one.
        limits = [self._max_requests] if self._max_requests is not None else []
        if self._max_seconds is not None:
            limits.append(math.ceil(round(self._max_seconds * self.rate, 6)))
        limit = min(limits) if limits else None
        task_status.started()
        async with trio.open_nursery() as nursery:
            index = 0
            while not self._stopping.is_set():
                if limit is not None and index >= limit:
                    break
                due = start + index * interval
                with trio.move_on_at(due):
                    await self._stopping.wait()
                if self._stopping.is_set():
                    break
                if self._in_flight >= self._max_in_flight:
                    self._record(due, start, self._phase, None, "saturated", now=due)
                else:
                    self._in_flight += 1
                    nursery.start_soon(self._one, due, start, self._phase)
                index += 1

    def _record(
        self,
        due: float,
        start: float,
        phase: str,
        status: int | None,
        error: str | None,
        *,
        now: float | None = None,
    ) -> None:
        ended = trio.current_time() if now is None else now
        self._outcomes.append(RequestOutcome(due - start, phase, ended - due, status, error))

    async def _one(self, due: float, start: float, phase: str) -> None:
        status: int | None = None
        error: str | None = None
        try:
            with trio.move_on_after(self.timeout) as scope:
                status, error = await self._exchange()
            if scope.cancelled_caught:
                status, error = None, "timeout"
        finally:
            self._in_flight -= 1
        self._record(due, start, phase, status, error)

    async def _exchange(self) -> tuple[int | None, str | None]:
        family = trio.socket.AF_INET6 if ":" in self._address[0] else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            try:
                await sock.connect(self._address)
            except OSError as exc:
                return None, _os_error_kind(exc, connecting=True)
            stream = trio.SocketStream(sock)
            try:
                await stream.send_all(self._request)
                return await _read_response(stream)
            except (OSError, trio.BrokenResourceError) as exc:
                cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
                return None, _os_error_kind(cause, connecting=False)
            finally:
                await trio.aclose_forcefully(stream)
        finally:
            sock.close()


async def _read_response(stream: trio.SocketStream) -> tuple[int | None, str | None]:
    """Read one response to its end (Content-Length, or until the server closes)."""
    data = b""
    head_end = -1
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_RESPONSE_BYTES:
            return _status_of(data), "bad-response"
        if head_end < 0:
            head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            length = _content_length(data[:head_end])
            if length is not None and len(data) - head_end - 4 >= length:
                break
    if not data:
        return None, "empty-response"
    status = _status_of(data)
    if status is None or head_end < 0:
        return status, "bad-response"
    return status, None


def _os_error_kind(exc: BaseException | None, *, connecting: bool) -> str:
    code = getattr(exc, "errno", None)
    if code == errno.ECONNREFUSED:
        return "refused"
    if code in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return "reset"
    if code == errno.ETIMEDOUT:
        return "timeout"
    return "connect-error" if connecting else "os-error"
