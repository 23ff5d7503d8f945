"""PortAllocator: a stable (public, internal) port pair per app on this node.

Pairs are drawn at random from the range, probed with a real bind, claimed in the
registry (``ports/<node>/<port>``, compare-and-swap on the absent key), recorded
in the node's local state and reused on every later start. A released port sits
in quarantine before another app may have it.
"""

from corral.actors.port_allocator._actor import EnsurePair, ListPorts, PortAllocator, ReleasePorts
from corral.actors.port_allocator._errors import (
    InvalidPortRange,
    PlacementUnavailable,
    PortAllocatorError,
    PortProbeExhausted,
)
from corral.actors.port_allocator._ledger import bind_probe

__all__ = [
    "EnsurePair",
    "InvalidPortRange",
    "ListPorts",
    "PlacementUnavailable",
    "PortAllocator",
    "PortAllocatorError",
    "PortProbeExhausted",
    "ReleasePorts",
    "bind_probe",
]
