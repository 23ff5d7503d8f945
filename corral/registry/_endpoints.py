"""Which etcd endpoint to ask next, how long to wait for it, and when a write may be repeated.

Theory of operation
-------------------
A client given several etcd members keeps one :class:`EndpointHealth` per
endpoint: how many calls in a row failed there, when the last one failed, and
how fast successful calls have been. :func:`endpoint_order` turns that into the
order in which one call tries the endpoints:

1. the *preferred* endpoint (the one that answered last) while it is healthy,
   so a client sticks to one member and its open connection;
2. the other healthy endpoints, fastest first (unmeasured ones after measured
   ones, by position);
3. failed endpoints whose backoff has passed (one probe each), fewest failures
   first;
4. failed endpoints still in backoff, soonest due first: a last resort, so a
   call never gives up without having tried every member.

A silent member (frozen, or its host cut off: TCP connects may even succeed
into its backlog, but nothing answers) therefore costs one short attempt —
:func:`request_timeout_for` — and is then skipped until its backoff passes:
twice the request timeout, doubling with each failed probe up to 30 s (a
member that comes back is used again within that).

Timeouts are sized from the shortest lease TTL the client keeps alive:
``request = clamp(ttl / 8, 0.2 s, 10 s)``. A holder renews at a third of the
TTL, so between a renewal and the lease lapsing there are two thirds of it;
one attempt at a silent member (ttl/8) plus the retry at a healthy one must
fit, with room for the pass that may run before the renewal: with a 4 s TTL
that is 0.5 s lost per silent member, against 2.67 s of slack. Each further
round over the endpoints doubles the timeout (a slow but alive cluster —
during an election, or under load — still gets answered). A watch stream
with no news for ``watch_idle_for(request)`` = ``4 * request`` (at least 1 s)
is opened again from its next revision, on the endpoint this order picks:
that is how a watch notices its member went silent.

Writes. A request that timed out after it was sent may still be applied (a
frozen member wakes up and runs it), so a write is only sent again when a
repeat cannot apply twice: :func:`repeat_is_harmless` — a txn whose success
branch writes a key it guards with an equality that the write itself breaks
(``version == v`` or ``mod_revision == r`` on a key it puts or deletes;
``create_revision == 0`` on a key it puts), and whose failure branch only
reads. If the first attempt did land, the repeat's guard fails; a late
landing of the first attempt after the repeat succeeded fails the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from corral.registry._base import Compare, CompareOp, CompareTarget, Delete, Get, Put, TxnOp

MIN_REQUEST_TIMEOUT: Final = 0.2
MAX_REQUEST_TIMEOUT: Final = 10.0
DEFAULT_REQUEST_TIMEOUT: Final = 2.0
"""Per-request timeout when no lease TTL is known (a 16 s TTL's)."""
TTL_FRACTION: Final = 8
MIN_UNREPEATABLE_TIMEOUT: Final = 2.0
"""An attempt that cannot be repeated elsewhere waits at least this long: cutting it
short gains no other endpoint, only a "may or may not have applied" on a member
that is slow (a loaded disk's fsync), not silent."""
WATCH_IDLE_FACTOR: Final = 4
MIN_WATCH_IDLE: Final = 1.0
PASS_OVER_FACTOR: Final = 2
"""A failed endpoint is first passed over for twice the request timeout..."""
MAX_PASS_OVER: Final = 30.0
"""...doubling with each failure in a row, up to this many seconds."""
LATENCY_WEIGHT: Final = 0.3
"""Weight of the newest sample in the moving average of an endpoint's latency."""


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """What one endpoint did lately.

    Attributes:
        failures: calls in a row that failed there (0: healthy).
        failed_at: when the last of them failed (the caller's clock).
        latency: moving average of successful calls, seconds (None: none yet).
    """

    failures: int = 0
    failed_at: float = 0.0
    latency: float | None = None

    @property
    def healthy(self) -> bool:
        return self.failures == 0


def request_timeout_for(ttl: float | None) -> float:
    """The per-request timeout for a client keeping alive leases of ``ttl`` seconds."""
    if ttl is None:
        return DEFAULT_REQUEST_TIMEOUT
    return min(MAX_REQUEST_TIMEOUT, max(MIN_REQUEST_TIMEOUT, ttl / TTL_FRACTION))


def round_timeout(request_timeout: float, round_index: int) -> float:
    """The timeout of one attempt in round ``round_index`` (0-based): doubled each round."""
    return float(min(max(MAX_REQUEST_TIMEOUT, request_timeout), request_timeout * 2**round_index))


def attempt_timeout(
    request_timeout: float, round_index: int, repeatable: bool, endpoints: int
) -> float:
    """How long one attempt waits: the round's timeout (:func:`round_timeout`); for a
    call that may not be sent again after it was sent (a plain put or delete, an
    unguarded txn) at least :data:`MIN_UNREPEATABLE_TIMEOUT`; and with a single
    endpoint :data:`MAX_REQUEST_TIMEOUT`, since cutting an attempt short only pays when
    there is another member to ask (against one etcd on a loaded machine a short
    attempt turns a slow fsync into a failed call, or a guarded write into a doubt)."""
    if endpoints <= 1:
        return MAX_REQUEST_TIMEOUT
    timeout = round_timeout(request_timeout, round_index)
    return timeout if repeatable else max(timeout, MIN_UNREPEATABLE_TIMEOUT)


def watch_idle_for(request_timeout: float) -> float:
    """How long a watch stream may stay silent before it is opened again."""
    return max(MIN_WATCH_IDLE, WATCH_IDLE_FACTOR * request_timeout)


def retry_after(failures: int, backoff: float, max_backoff: float) -> float:
    """Seconds a failed endpoint is passed over after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return float(min(max_backoff, backoff * 2 ** (failures - 1)))


def after_success(health: EndpointHealth, latency: float) -> EndpointHealth:
    """The endpoint answered in ``latency`` seconds."""
    average = (
        latency
        if health.latency is None
        else (1 - LATENCY_WEIGHT) * health.latency + LATENCY_WEIGHT * latency
    )
    return EndpointHealth(failures=0, failed_at=health.failed_at, latency=average)


def after_failure(health: EndpointHealth, now: float) -> EndpointHealth:
    """A call to the endpoint failed (refused, cut, timed out) at ``now``."""
    return replace(health, failures=health.failures + 1, failed_at=now)


def endpoint_order(
    health: Sequence[EndpointHealth],
    preferred: int,
    now: float,
    *,
    backoff: float,
    max_backoff: float,
) -> list[int]:
    """The indexes of ``health`` in the order one call should try them (see the
    module docstring). Every index appears exactly once."""

    def due_at(index: int) -> float:
        item = health[index]
        return item.failed_at + retry_after(item.failures, backoff, max_backoff)

    healthy = [i for i, item in enumerate(health) if item.healthy]
    due = [i for i, item in enumerate(health) if not item.healthy and due_at(i) <= now]
    waiting = [i for i, item in enumerate(health) if not item.healthy and due_at(i) > now]

    def by_speed(index: int) -> tuple[bool, bool, float, int]:
        latency = health[index].latency
        return (index != preferred, latency is None, latency or 0.0, index)

    healthy.sort(key=by_speed)
    due.sort(key=lambda i: (health[i].failures, i != preferred, i))
    waiting.sort(key=lambda i: (due_at(i), i))
    return healthy + due + waiting


def _breaks_its_guard(compare: Compare, write: Put | Delete) -> bool:
    """True when applying ``write`` makes ``compare`` false (whatever the key held)."""
    if compare.op is not CompareOp.EQUAL or isinstance(compare.value, bytes | bytearray):
        return False
    value = compare.value
    if isinstance(write, Put):
        # A put raises version and mod_revision, and gives an absent key a create revision.
        return compare.target in (CompareTarget.VERSION, CompareTarget.MOD_REVISION) or (
            compare.target is CompareTarget.CREATE_REVISION and value == 0
        )
    # A delete of a present key zeroes all three; of an absent one it changes nothing.
    return not write.prefix and value != 0


def repeat_is_harmless(
    compares: Sequence[Compare], on_success: Sequence[TxnOp], on_failure: Sequence[TxnOp]
) -> bool:
    """Whether a txn may be sent again after an attempt that may have applied:
    its failure branch only reads, and its success branch writes some key it
    guards so that its own write breaks the guard (a repeat after a landed
    attempt takes the failure branch)."""
    if any(not isinstance(op, Get) for op in on_failure):
        return False
    writes = [op for op in on_success if isinstance(op, Put | Delete)]
    if not writes:
        return True  # reads only: repeatable
    return any(
        compare.key == write.key and _breaks_its_guard(compare, write)
        for compare in compares
        for write in writes
    )
