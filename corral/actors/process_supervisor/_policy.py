"""Pure decisions of the process supervisor.

Theory of operation
-------------------
A supervised app runs as one process (the *leader*, alone in its own process
group). When the leader exits without being asked to, the supervisor restarts
it after a delay chosen here:

* every exit that came before the run was *stable* (up ``stable_after``
  seconds), and every start that failed outright, counts as one more
  *consecutive* failure; a stable run resets the count to zero;
* the delay grows exponentially with that count: ``initial * factor**(n-1)``,
  capped at ``max_backoff``;
* ``crash_loop_crashes`` consecutive failures make a **crash loop**: the app is
  reported as ``crash-loop`` and waits the maximum backoff instead of spinning.
  It stays one, however long the backoff, until a run lasts ``stable_after``
  seconds (a time window would forget a loop whose backoff outgrew it).

Every process this node starts carries ``CORRAL_APP_INSTANCE=<scope>/<app>/<token>``
in its environment, inherited by all it forks; the scope is the node id and a hash of
its data directory (:func:`marker_scope`), so two clusters on one machine that reuse a
node id (a demo and a test harness, say) never end each other's processes. A
descendant that escapes the process group (``setsid`` and a double fork) is still
found by that *marker*, on stop and by the next life of the node after a crash;
:func:`instance_marker` and :func:`parse_instance_marker` are the one place that
knows its shape. When the node is a child subreaper such orphans become its
children, and :func:`orphans_to_reap` decides which zombies it may collect without
stealing the exit status of a process someone in the node waits for.

Processes left running by a previous life of the node are recognised from
their pid file, never by pid alone: the pid must still exist with the same
start time, and its command line (or its corral environment) must be the one
recorded. :func:`is_leftover` decides; the shell only gathers the facts.

Nothing here reads a clock, the process table or the environment: callers pass
``now``, what psutil observed and the base environment in.
"""

from __future__ import annotations

import hashlib
import math
import os.path
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

ProcessState: TypeAlias = Literal["starting", "running", "backoff", "failed", "stopping", "stopped"]
"""``starting``: spawned, not answering yet; ``running``: answering on its port (or up
long enough); ``backoff``: exited on its own, waiting to be restarted; ``failed``: could
not be started (or watched, or stopped) at all, waiting to be tried again (the reason
is in ``last_error``); ``stopping``: being terminated; ``stopped``: nothing of it runs."""

LIVE_STATES: Final[frozenset[str]] = frozenset({"starting", "running", "backoff", "failed"})
"""States of an app the supervisor keeps running (or will try again)."""

#: The environment variable that ties a process, and all it forks, to one start of an app.
INSTANCE_VAR: Final = "CORRAL_APP_INSTANCE"

#: Environment variables of the node that an app never inherits (they may hold secrets
#: or describe the node rather than the app); every ``CORRAL_*`` the app sees is set here.
_PRIVATE_PREFIX: Final = "CORRAL_"


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a crashed process is restarted.

    Args:
        initial_backoff: seconds before the first restart after a stable run.
        backoff_factor: growth of the delay per further crash.
        max_backoff: the cap; also the delay of every restart in a crash loop.
        stable_after: seconds of uptime after which earlier failures are forgotten.
        crash_loop_crashes: this many consecutive failures (quick exits or failed
            starts, with no stable run between them) make a crash loop.
    """

    initial_backoff: float = 0.5
    backoff_factor: float = 2.0
    max_backoff: float = 30.0
    stable_after: float = 30.0
    crash_loop_crashes: int = 5

    def __post_init__(self) -> None:
        if not (0 <= self.initial_backoff <= self.max_backoff):
            raise ValueError("RestartPolicy needs 0 <= initial_backoff <= max_backoff")
        if self.backoff_factor < 1:
            raise ValueError("RestartPolicy.backoff_factor must be >= 1")
        if self.crash_loop_crashes < 1:
            raise ValueError("RestartPolicy.crash_loop_crashes must be >= 1")
        if self.stable_after <= 0:
            raise ValueError("RestartPolicy.stable_after must be positive")


@dataclass(frozen=True, slots=True)
class CrashHistory:
    """What the policy remembers of an app's failures: ``consecutive`` counts quick
    exits and failed starts since the last stable run (or since it was first started)."""

    consecutive: int = 0

    def crash_loop(self, policy: RestartPolicy) -> bool:
        """Whether these failures make a crash loop under ``policy``."""
        return self.consecutive >= policy.crash_loop_crashes


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """Restart after ``delay`` seconds; ``crash_loop`` says whether to report one."""

    delay: float
    crash_loop: bool
    history: CrashHistory


def decide_restart(
    policy: RestartPolicy, history: CrashHistory, *, uptime: float
) -> RestartDecision:
    """Decide when to restart a process that exited on its own (or failed to start).

    Args:
        policy: the restart policy.
        history: the app's failures before this one.
        uptime: how long this run lasted, seconds (0 for a start that failed).

    Returns:
        The delay before the restart, whether the app is now in a crash loop, and the
        history to keep for the next exit.
    """
    # A run that lasted stable_after seconds forgave what came before it: this exit is
    # the first of a new series.
    consecutive = 1 if uptime >= policy.stable_after else history.consecutive + 1
    kept = CrashHistory(consecutive)
    if kept.crash_loop(policy):
        return RestartDecision(policy.max_backoff, True, kept)
    # min() before the power keeps huge counts from overflowing the float.
    steps = min(consecutive - 1, 64)
    delay = min(policy.max_backoff, policy.initial_backoff * policy.backoff_factor**steps)
    return RestartDecision(delay, False, kept)


def backoff_schedule(policy: RestartPolicy, crashes: int, *, spacing: float) -> list[float]:
    """The delays of ``crashes`` exits, each after ``spacing`` seconds of uptime (for docs
    and tests)."""
    history, delays = CrashHistory(), []
    for _ in range(crashes):
        decision = decide_restart(policy, history, uptime=spacing)
        delays.append(decision.delay)
        history = decision.history
    return delays


# --------------------------------------------------------------------------- environment


def process_environment(
    base: Mapping[str, str],
    app_env: Mapping[str, str],
    *,
    app: str,
    node_id: str,
    public_port: int,
    internal_port: int,
    bind_host: str,
    instance: str = "",
) -> dict[str, str]:
    """The environment of an app's process.

    The node's own environment (``base``) minus its ``CORRAL_*`` variables, then the
    deployment's ``app_env``, then the variables corral sets, which win:
    ``PORT`` (= the public port), ``CORRAL_PUBLIC_PORT``, ``CORRAL_INTERNAL_PORT``,
    ``CORRAL_APP``, ``CORRAL_NODE``, ``CORRAL_BIND_HOST`` and, when ``instance`` is
    given, ``CORRAL_APP_INSTANCE`` (see :func:`instance_marker`).
    """
    env = {k: v for k, v in base.items() if not k.startswith(_PRIVATE_PREFIX)}
    env.update(app_env)
    env.update(
        {
            "PORT": str(public_port),
            "CORRAL_PUBLIC_PORT": str(public_port),
            "CORRAL_INTERNAL_PORT": str(internal_port),
            "CORRAL_APP": app,
            "CORRAL_NODE": node_id,
            "CORRAL_BIND_HOST": bind_host,
        }
    )
    if instance:
        env[INSTANCE_VAR] = instance
    return env


def marker_scope(node_id: str, data_dir: str | os.PathLike[str]) -> str:
    """The first part of the markers one node writes: ``<node_id>@<hash of data dir>``.

    Node ids are DNS labels (no ``@``); the data directory, made absolute, tells
    apart two nodes that share an id on one machine.
    """
    home = hashlib.sha256(os.path.abspath(data_dir).encode()).hexdigest()[:12]
    return f"{node_id}@{home}"


def instance_marker(scope: str, app: str, token: str) -> str:
    """The ``CORRAL_APP_INSTANCE`` value of one start of ``app`` by the node of ``scope``.

    Scopes (see :func:`marker_scope`) hold no ``/`` and app names are DNS labels, so
    ``/`` separates the parts unambiguously; ``token`` tells starts apart (a fresh one
    per spawn).
    """
    return f"{scope}/{app}/{token}"


def parse_instance_marker(value: str) -> tuple[str, str, str] | None:
    """``(scope, app, token)`` of a marker, or None when ``value`` is not one."""
    parts = value.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


# --------------------------------------------------------------------------- leftovers


@dataclass(frozen=True, slots=True)
class PidRecord:
    """What a pid file says about a process this node started."""

    app: str
    node_id: str
    pid: int
    create_time: float
    cmdline: tuple[str, ...]
    revision: str = ""
    instance: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "v": 1,
            "app": self.app,
            "node": self.node_id,
            "pid": self.pid,
            "create_time": self.create_time,
            "cmdline": list(self.cmdline),
            "revision": self.revision,
            "instance": self.instance,
        }

    @classmethod
    def from_json(cls, obj: object) -> PidRecord | None:
        """The record, or None when ``obj`` is not a pid record of this version."""
        if not isinstance(obj, dict) or obj.get("v") != 1:
            return None
        try:
            pid, create_time = obj["pid"], obj["create_time"]
            cmdline, app, node = obj["cmdline"], obj["app"], obj["node"]
            revision = obj.get("revision", "")
            instance = obj.get("instance", "")
        except KeyError:
            return None
        if (
            isinstance(pid, bool)
            or not isinstance(pid, int)
            or pid <= 1
            or isinstance(create_time, bool)
            or not isinstance(create_time, int | float)
            or not isinstance(cmdline, list)
            or not all(isinstance(a, str) for a in cmdline)
            or not isinstance(app, str)
            or not isinstance(node, str)
            or not isinstance(revision, str)
            or not isinstance(instance, str)
        ):
            return None
        return cls(app, node, pid, float(create_time), tuple(cmdline), revision, instance)


@dataclass(frozen=True, slots=True)
class ObservedProcess:
    """What psutil saw at a pid: start time, command line and (if readable) the
    ``CORRAL_APP`` / ``CORRAL_NODE`` / ``CORRAL_APP_INSTANCE`` of its environment."""

    create_time: float
    cmdline: tuple[str, ...]
    corral_app: str | None = None
    corral_node: str | None = None
    instance: str | None = None


#: psutil derives start times from clock ticks since boot: equal processes agree to
#: well under this.
CREATE_TIME_TOLERANCE: Final = 0.05


def is_leftover(record: PidRecord, observed: ObservedProcess | None) -> bool:
    """Whether the process at ``record.pid`` is the one the pid file describes.

    It is only when it still exists, started at the recorded time (a reused pid
    has another start time), and either carries the recorded instance marker, or
    runs the recorded command line (allowing a launcher that exec'd the real program
    with the same arguments, such as a version-manager shim), or carries this app's
    and node's corral environment.

    Args:
        record: the pid file's content.
        observed: what psutil saw at ``record.pid``, or None when no such process.

    Returns:
        True when the process is a leftover of ours and may be ended.
    """
    if observed is None:
        return False
    if not math.isclose(observed.create_time, record.create_time, abs_tol=CREATE_TIME_TOLERANCE):
        return False
    if record.instance and observed.instance == record.instance:
        return True
    if observed.corral_app == record.app and observed.corral_node == record.node_id:
        return True
    return _same_command(record.cmdline, observed.cmdline)


def _same_command(recorded: Sequence[str], observed: Sequence[str]) -> bool:
    if not recorded or not observed:
        return False
    if tuple(recorded) == tuple(observed):
        return True
    # A shim that exec's the real interpreter keeps the arguments and the program's
    # base name prefix ("python3" -> ".../python3.11").
    args = tuple(recorded[1:])
    program = os.path.basename(recorded[0])
    return (
        bool(args)
        and tuple(observed[-len(args) :]) == args
        and any(os.path.basename(part).startswith(program) for part in observed[: -len(args)])
    )


def is_marked_leftover(marker: str | None, *, scope: str, live: Set[str]) -> bool:
    """Whether a process whose environment carries ``marker`` was started by an earlier
    life of the node of ``scope`` (so the node may end it): the marker names this
    node's scope (its id and data directory), and is not the marker of a process this
    life started (``live``)."""
    if marker is None or marker in live:
        return False
    parsed = parse_instance_marker(marker)
    return parsed is not None and parsed[0] == scope


# --------------------------------------------------------------------------- orphans


@dataclass(frozen=True, slots=True)
class ChildProcess:
    """What ``/proc`` says of one child of the node.

    ``session`` is its session id; ``marker`` its ``CORRAL_APP_INSTANCE`` (None when it
    has none, or it is a zombie: a zombie's environment cannot be read).
    """

    pid: int
    start_ticks: int
    session: int
    zombie: bool
    marker: str | None = None


@dataclass(frozen=True, slots=True)
class OrphanScan:
    """What :func:`orphans_to_reap` decided: the zombies to collect, and the adopted
    children to remember (pid -> start ticks) for the next scan."""

    reap: tuple[int, ...]
    adopted: Mapping[int, int]


def orphans_to_reap(
    children: Iterable[ChildProcess],
    *,
    own_session: int,
    own_marker: str | None,
    launched: Set[int],
    adopted: Mapping[int, int],
) -> OrphanScan:
    """Which zombie children of a subreaper node are adopted orphans it must collect.

    A process the node forked itself starts in the node's session, or becomes the
    leader of a new one (``setsid``: its session id is its pid). A child in any other
    session was forked by someone else: it is an orphan the kernel handed to the node.
    A child seen alive carrying an app's marker (not the node's own, for a node that is
    itself someone's app) and not one of the launcher's processes is one too, and is
    remembered, so that once a zombie it is collected even if it was a session leader.
    Nothing else is touched: its parent in the node waits for it.

    Args:
        children: the node's children, as ``/proc`` showed them.
        own_session: the node's session id.
        own_marker: the node's own ``CORRAL_APP_INSTANCE``, if it has one.
        launched: pids of processes the launcher started and has not collected.
        adopted: what the previous scan remembered.

    Returns:
        The pids to collect and what to remember.
    """
    reap: list[int] = []
    keep: dict[int, int] = {}
    for child in sorted(children, key=lambda c: c.pid):
        if child.pid in launched:
            continue
        known = adopted.get(child.pid) == child.start_ticks
        if child.zombie:
            if known or child.session not in (own_session, child.pid):
                reap.append(child.pid)
        elif known or (child.marker is not None and child.marker != own_marker):
            keep[child.pid] = child.start_ticks
    return OrphanScan(tuple(reap), keep)
