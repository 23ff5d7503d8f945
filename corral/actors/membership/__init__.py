"""SWIM membership with Lifeguard between nodes.

* :mod:`._swim` — the pure state machine (:class:`Swim`, :class:`SwimConfig`);
* :mod:`._messages` — the wire messages and their bounds;
* :mod:`._actor` — :class:`SwimMembership`, the thin actor over the transport;
* :mod:`._feed` — :class:`MembershipFeed`, the local view as the coordinator reads it;
* :mod:`._simulation` — :class:`SwimSimulation`, many machines on one virtual clock.
"""

from corral.actors.membership._actor import (
    MEMBERSHIP,
    GetMembership,
    SwimMembership,
    membership_child_spec,
    registry_seeds,
)
from corral.actors.membership._feed import MembershipFeed
from corral.actors.membership._simulation import SwimSimulation
from corral.actors.membership._swim import (
    MemberState,
    SwimConfig,
    suspicion_bounds,
    suspicion_timeout,
)

__all__ = [
    "MEMBERSHIP",
    "GetMembership",
    "MemberState",
    "MembershipFeed",
    "SwimConfig",
    "SwimMembership",
    "SwimSimulation",
    "membership_child_spec",
    "registry_seeds",
    "suspicion_bounds",
    "suspicion_timeout",
]
