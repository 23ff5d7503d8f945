"""The NodeRegistration actor: the node's lease and its ``nodes/<id>`` record."""

from corral.actors.node_record._actor import (
    DEFAULT_CAPACITY_INTERVAL,
    DEFAULT_NODE_LEASE_TTL,
    GetRegistration,
    NodeRegistration,
    node_registration_child_spec,
)
from corral.actors.node_record._record import (
    HeldElsewhere,
    NodeIdentity,
    StartClaim,
    capacity_update,
    claim_on_start,
    fresh_record,
    rewritten_record,
    taken_by,
)

__all__ = [
    "DEFAULT_CAPACITY_INTERVAL",
    "DEFAULT_NODE_LEASE_TTL",
    "GetRegistration",
    "HeldElsewhere",
    "NodeIdentity",
    "NodeRegistration",
    "StartClaim",
    "capacity_update",
    "claim_on_start",
    "fresh_record",
    "node_registration_child_spec",
    "rewritten_record",
    "taken_by",
]
