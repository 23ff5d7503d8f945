"""Child and supervisor specifications (plain data; pure)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.supervision._actor import Actor

__all__ = ["Backoff", "ChildSpec", "Restart", "Strategy", "SupervisorSpec"]


class Restart(enum.Enum):
    """When a supervisor restarts a child that ended."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only if it crashed (not after a normal stop)
    TEMPORARY = "temporary"  # never; it is removed when it ends


class Strategy(enum.Enum):
    """Which children restart when one crashes."""

    ONE_FOR_ONE = "one_for_one"  # only the crashed one
    ONE_FOR_ALL = "one_for_all"  # all of them
    REST_FOR_ONE = "rest_for_one"  # the crashed one and those started after it


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the n-th consecutive restart of a child: initial * factor**(n-1), capped.

    A child that ran longer than ``reset_after`` seconds (default: the
    supervisor's ``within``) before crashing starts over at ``initial``.
    """

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 10.0
    reset_after: float | None = None

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0 or self.factor < 1:
            raise ValueError("Backoff needs initial >= 0, maximum >= 0 and factor >= 1")


def _name_ok(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..")


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to run one actor under a supervisor.

    Attributes:
        name: unique among its siblings; becomes the last part of its path.
        factory: builds a NEW actor instance; called on every (re)start.
        restart: PERMANENT, TRANSIENT or TEMPORARY.
        shutdown_grace: seconds ``stopping()`` may take (shielded) before cancellation.
        mailbox_size: bounded mailbox capacity; None takes the actor class's
            ``mailbox_size`` (default 64).
    """

    name: str
    factory: Callable[[], Actor]
    restart: Restart = Restart.PERMANENT
    shutdown_grace: float = 10.0
    mailbox_size: int | None = None

    def __post_init__(self) -> None:
        if not _name_ok(self.name):
            raise ValueError(f"child name {self.name!r} must be non-empty and contain no '/'")
        if self.shutdown_grace < 0:
            raise ValueError("shutdown_grace must be zero or more seconds")
        if self.mailbox_size is not None and self.mailbox_size < 1:
            raise ValueError("mailbox_size must be at least 1")


@dataclass(frozen=True, slots=True)
class SupervisorSpec:
    """A supervisor and its children (which may be supervisors themselves).

    Attributes:
        name: unique among its siblings.
        children: started in order, stopped in reverse.
        strategy: ONE_FOR_ONE, ONE_FOR_ALL or REST_FOR_ONE.
        max_restarts, within: more than ``max_restarts`` restarts within
            ``within`` seconds and the supervisor stops its children and fails,
            escalating to its parent.
        backoff: the delay before each restart.
        restart: how the parent treats this supervisor when it fails.
        shutdown_grace: extra bound on the whole subtree's shutdown; None means
            each child's own grace bounds it.
    """

    name: str
    children: Sequence[ChildSpec | SupervisorSpec] = field(default_factory=tuple)
    strategy: Strategy = Strategy.ONE_FOR_ONE
    max_restarts: int = 5
    within: float = 30.0
    backoff: Backoff = field(default_factory=Backoff)
    restart: Restart = Restart.PERMANENT
    shutdown_grace: float | None = None

    def __post_init__(self) -> None:
        if not _name_ok(self.name):
            raise ValueError(f"supervisor name {self.name!r} must be non-empty and contain no '/'")
        if self.max_restarts < 0 or self.within <= 0:
            raise ValueError("max_restarts must be >= 0 and within > 0 seconds")
        names = [c.name for c in self.children]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"supervisor {self.name!r} has duplicate child names: {dupes}")
        object.__setattr__(self, "children", tuple(self.children))
