"""SWIM membership with Lifeguard between nodes.

* :mod:`._swim` — the pure state machine (:class:`Swim`, :class:`SwimConfig`);
* :mod:`._messages` — the wire messages and their bounds;
* :mod:`._actor` — :class:`SwimMembership`, the thin actor over the transport;
* :mod:`._feed` — :class:`MembershipFeed`, the local view as the coordinator reads it;
* :mod:`._simulation` — :class:`SwimSimulation`, many machines on one virtual clock.
"""

from corral.actors.membership._actor import (
    DEFAULT_REJOIN_INTERVAL,
    MEMBERSHIP,
    GetMembership,
    Leave,
    MemberInfo,
    MembershipView,
    SeedSource,
    SwimMembership,
    membership_child_spec,
    registry_seeds,
)
from corral.actors.membership._feed import MembershipFeed, member_statuses
from corral.actors.membership._messages import (
    MAX_MEMBERS_PER_MESSAGE,
    MAX_UPDATES_PER_MESSAGE,
    Ack,
    Gossip,
    Nack,
    Ping,
    PingReq,
    StateSync,
    SwimMessage,
    Update,
)
from corral.actors.membership._simulation import Observed, SwimSimulation
from corral.actors.membership._swim import (
    MemberState,
    MemberView,
    Send,
    Step,
    Swim,
    SwimConfig,
    Transition,
    retransmit_limit,
    suspicion_bounds,
    suspicion_timeout,
)

__all__ = [
    "DEFAULT_REJOIN_INTERVAL",
    "MAX_MEMBERS_PER_MESSAGE",
    "MAX_UPDATES_PER_MESSAGE",
    "MEMBERSHIP",
    "Ack",
    "GetMembership",
    "Gossip",
    "Leave",
    "MemberInfo",
    "MemberState",
    "MemberView",
    "MembershipFeed",
    "MembershipView",
    "Nack",
    "Observed",
    "Ping",
    "PingReq",
    "SeedSource",
    "Send",
    "StateSync",
    "Step",
    "Swim",
    "SwimConfig",
    "SwimMembership",
    "SwimMessage",
    "SwimSimulation",
    "Transition",
    "Update",
    "member_statuses",
    "membership_child_spec",
    "registry_seeds",
    "retransmit_limit",
    "suspicion_bounds",
    "suspicion_timeout",
]
