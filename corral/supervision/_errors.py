"""Errors of the actor kernel.

::

    CorralError
    └── SupervisionError
        ├── AskTimeout         no reply before the ask's deadline
        ├── ActorNotFound      no actor lives at that path (locally or on the remote node)
        ├── ActorStopped       the actor stopped (or was never started) before it could reply
        ├── ActorCrashed       the actor crashed while handling the ask
        ├── MailboxFull        tell_nowait found the mailbox full
        ├── UnhandledMessage   the actor does not handle this message
        ├── ActorExists        a supervisor already has a child of that name
        ├── RemoteError        the remote side answered an ask with an error (code, message)
        └── EscalationError    a supervisor exceeded its restart intensity and gave up
"""

from __future__ import annotations

from corral._errors import CorralError


class SupervisionError(CorralError):
    """Base of actor kernel errors."""


class AskTimeout(SupervisionError):
    """No reply arrived before the ask's deadline."""


class ActorNotFound(SupervisionError):
    """No actor lives at the addressed path."""


class ActorStopped(SupervisionError):
    """The actor stopped before it could take or answer the message."""


class ActorCrashed(SupervisionError):
    """The actor crashed while handling the ask; its supervisor decides what happens next."""


class MailboxFull(SupervisionError):
    """The mailbox is full and the caller asked not to wait."""


class UnhandledMessage(SupervisionError):
    """The actor has no handling for this message.

    Raise it from ``Actor.handle``: the asker gets this error, the actor does not crash.
    """

    def __init__(self, message: object) -> None:
        self.unhandled = message
        super().__init__(
            message
            if isinstance(message, str)
            else f"no handling for a {type(message).__qualname__} message"
        )


class ActorExists(SupervisionError):
    """The supervisor already has a child with that name."""


class RemoteError(SupervisionError):
    """The remote side answered with an error.

    Attributes:
        code: a short machine-readable code (``"unknown-kind"``, ``"schema"``,
            ``"handler-error"``, ``"malformed-frame"``, ``"frame-too-large"``, ...).
        message: the human-readable explanation sent by the remote side.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"[{code}] {message}")


class EscalationError(SupervisionError):
    """A supervisor exceeded its restart intensity, stopped its children and failed."""
