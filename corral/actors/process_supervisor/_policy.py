"""Pure decisions of the process supervisor.

Theory of operation
-------------------
A supervised app runs as one process (the *leader*, alone in its own process
group). When the leader exits without being asked to, the supervisor restarts
it after a delay chosen here:

* the delay grows exponentially with the crashes since the last *stable* run
  (one that stayed up ``stable_after`` seconds): ``initial * factor**(n-1)``,
  capped at ``max_backoff``;
* ``crash_loop_crashes`` exits inside ``crash_loop_window`` seconds make a
  **crash loop**: the app is reported as ``crash-loop`` and waits the maximum
  backoff instead of spinning. A stable run clears the flag.

Processes left running by a previous life of the node are recognised from
their pid file, never by pid alone: the pid must still exist with the same
start time, and its command line (or its corral environment) must be the one
recorded. :func:`is_leftover` decides; the shell only gathers the facts.

Nothing here reads a clock, the process table or the environment: callers pass
``now``, what psutil observed and the base environment in.
"""

from __future__ import annotations

import math
import os.path
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

ProcessState: TypeAlias = Literal["starting", "running", "backoff", "stopping", "stopped"]
"""``starting``: spawned, not answering yet; ``running``: answering on its port (or up
long enough); ``backoff``: exited on its own, waiting to be restarted; ``stopping``:
being terminated; ``stopped``: nothing of it runs."""

LIVE_STATES: Final[frozenset[str]] = frozenset({"starting", "running", "backoff"})

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
        stable_after: seconds of uptime after which earlier crashes are forgotten.
        crash_loop_crashes: this many exits ...
        crash_loop_window: ... within this many seconds make a crash loop.
    """

    initial_backoff: float = 0.5
    backoff_factor: float = 2.0
    max_backoff: float = 30.0
    stable_after: float = 30.0
    crash_loop_crashes: int = 5
    crash_loop_window: float = 60.0

    def __post_init__(self) -> None:
        if not (0 <= self.initial_backoff <= self.max_backoff):
            raise ValueError("RestartPolicy needs 0 <= initial_backoff <= max_backoff")
        if self.backoff_factor < 1:
            raise ValueError("RestartPolicy.backoff_factor must be >= 1")
        if self.crash_loop_crashes < 1 or self.crash_loop_window <= 0:
            raise ValueError("RestartPolicy needs crash_loop_crashes >= 1 and a positive window")
        if self.stable_after <= 0:
            raise ValueError("RestartPolicy.stable_after must be positive")


@dataclass(frozen=True, slots=True)
class CrashHistory:
    """What the policy remembers of an app's recent exits.

    ``exits`` are the exit times (ascending) still inside the crash-loop window;
    ``consecutive`` counts exits since the last stable run.
    """

    exits: tuple[float, ...] = ()
    consecutive: int = 0


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """Restart after ``delay`` seconds; ``crash_loop`` says whether to report one."""

    delay: float
    crash_loop: bool
    history: CrashHistory


def decide_restart(
    policy: RestartPolicy, history: CrashHistory, *, exited_at: float, uptime: float
) -> RestartDecision:
    """Decide when to restart a process that exited on its own.

    Args:
        policy: the restart policy.
        history: the app's crash history before this exit.
        exited_at: when the process exited (any monotonic clock, seconds).
        uptime: how long this run lasted, seconds.

    Returns:
        The delay before the restart, whether the app is now in a crash loop, and the
        history to keep for the next exit.
    """
    consecutive = 1 if uptime >= policy.stable_after else history.consecutive + 1
    horizon = exited_at - policy.crash_loop_window
    exits = (*(t for t in history.exits if t > horizon), exited_at)
    crash_loop = len(exits) >= policy.crash_loop_crashes
    if crash_loop:
        delay = policy.max_backoff
    else:
        # min() before the power keeps huge crash counts from overflowing the float.
        steps = min(consecutive - 1, 64)
        delay = min(policy.max_backoff, policy.initial_backoff * policy.backoff_factor**steps)
    keep = exits[-policy.crash_loop_crashes :]
    return RestartDecision(delay, crash_loop, CrashHistory(keep, consecutive))


def backoff_schedule(policy: RestartPolicy, crashes: int, *, spacing: float) -> list[float]:
    """The delays of ``crashes`` quick crashes ``spacing`` seconds apart (for docs and tests)."""
    history, now, delays = CrashHistory(), 0.0, []
    for _ in range(crashes):
        decision = decide_restart(policy, history, exited_at=now, uptime=spacing)
        delays.append(decision.delay)
        history = decision.history
        now += spacing + decision.delay
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
) -> dict[str, str]:
    """The environment of an app's process.

    The node's own environment (``base``) minus its ``CORRAL_*`` variables, then the
    deployment's ``app_env``, then the variables corral sets, which win:
    ``PORT`` (= the public port), ``CORRAL_PUBLIC_PORT``, ``CORRAL_INTERNAL_PORT``,
    ``CORRAL_APP``, ``CORRAL_NODE`` and ``CORRAL_BIND_HOST``.
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
    return env


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

    def to_json(self) -> dict[str, object]:
        return {
            "v": 1,
            "app": self.app,
            "node": self.node_id,
            "pid": self.pid,
            "create_time": self.create_time,
            "cmdline": list(self.cmdline),
            "revision": self.revision,
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
        ):
            return None
        return cls(app, node, pid, float(create_time), tuple(cmdline), revision)


@dataclass(frozen=True, slots=True)
class ObservedProcess:
    """What psutil saw at a pid: start time, command line and (if readable) the
    ``CORRAL_APP`` / ``CORRAL_NODE`` of its environment."""

    create_time: float
    cmdline: tuple[str, ...]
    corral_app: str | None = None
    corral_node: str | None = None


#: psutil derives start times from clock ticks since boot: equal processes agree to
#: well under this.
CREATE_TIME_TOLERANCE: Final = 0.05


def is_leftover(record: PidRecord, observed: ObservedProcess | None) -> bool:
    """Whether the process at ``record.pid`` is the one the pid file describes.

    It is only when it still exists, started at the recorded time (a reused pid
    has another start time), and either runs the recorded command line (allowing
    a launcher that exec'd the real program with the same arguments, such as a
    version-manager shim) or carries this app's and node's corral environment.

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
