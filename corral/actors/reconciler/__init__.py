"""Reconciler: makes this node run what the registry assigns it, and publishes it.

Also home of :class:`AgentSpec`, the node agent's supervisor (ProcessSupervisor,
PortAllocator, Reconciler) that the node assembly drops into its actor tree.
"""

from corral.actors.reconciler._actor import LastPass, Reconciler, RunPass, Withdraw
from corral.actors.reconciler._agent import AgentSpec
from corral.actors.reconciler._errors import PassFailed, ReconcilerError

__all__ = [
    "AgentSpec",
    "LastPass",
    "PassFailed",
    "Reconciler",
    "ReconcilerError",
    "RunPass",
    "Withdraw",
]
