"""The actor kernel: actors, refs, supervisors, the actor system and its introspection.

The contract is in the docstrings of the names exported here (:class:`Actor`,
:class:`ActorRef`, :class:`SupervisorSpec`, :class:`ActorSystem`...);
``corral/supervision/_runtime.py`` says how it runs. Timers (actor timers, and
:func:`sleep` / :func:`sleep_until` / :func:`call_at`, trio's equivalents) share one
heap per trio run, served by one task (``corral/supervision/_timers.py`` says why).
"""

from corral.supervision._actor import Actor, ActorContext, TimerHandle
from corral.supervision._errors import (
    ActorCrashed,
    ActorExists,
    ActorNotFound,
    ActorStopped,
    AskTimeout,
    EscalationError,
    MailboxFull,
    RemoteError,
    SupervisionError,
    UnhandledMessage,
)
from corral.supervision._introspect import ActorSnapshot, ActorState, Event
from corral.supervision._ref import ActorRef
from corral.supervision._spec import Backoff, ChildSpec, Restart, Strategy, SupervisorSpec
from corral.supervision._system import ActorSystem, open_actor_system, run_actor_system
from corral.supervision._timers import call_at, sleep, sleep_until

__all__ = [
    "Actor",
    "ActorContext",
    "ActorCrashed",
    "ActorExists",
    "ActorNotFound",
    "ActorRef",
    "ActorSnapshot",
    "ActorState",
    "ActorStopped",
    "ActorSystem",
    "AskTimeout",
    "Backoff",
    "ChildSpec",
    "EscalationError",
    "Event",
    "MailboxFull",
    "RemoteError",
    "Restart",
    "Strategy",
    "SupervisionError",
    "SupervisorSpec",
    "TimerHandle",
    "UnhandledMessage",
    "call_at",
    "open_actor_system",
    "run_actor_system",
    "sleep",
    "sleep_until",
]
