"""The actor kernel: actors, refs, supervisors, the actor system and its introspection.

The contract is in the docstrings of the names exported here (:class:`Actor`,
:class:`ActorRef`, :class:`SupervisorSpec`, :class:`ActorSystem`...);
``corral/supervision/_runtime.py`` says how it runs.
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
    "open_actor_system",
    "run_actor_system",
]
