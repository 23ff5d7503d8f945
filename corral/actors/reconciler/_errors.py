"""Errors of the reconciler.

::

    CorralError
    └── ReconcilerError
        └── PassFailed     one step of a pass failed; the pass goes on and retries it later

A reconcile pass never raises for what it meets in the registry or on disk: each
failed step is recorded (``LastPass().errors``, and the failed action's ``error``),
emitted as a ``reconcile.failed`` event (``app``, ``action``, ``error``), and retried
on the next pass — except getting a revision onto disk, which backs off per revision
(5 s doubling to 5 min, see ``_backoff``) and is published ``failed`` meanwhile.
"""

from __future__ import annotations

from corral._errors import CorralError


class ReconcilerError(CorralError):
    """Base of the reconciler's errors."""


class PassFailed(ReconcilerError):
    """A step of a reconcile pass failed; the message names the app, the step and why."""
