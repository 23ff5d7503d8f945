"""The NodeRegistration actor: the node's lease and its ``nodes/<id>`` record."""

from corral.actors.node_record._actor import (
    GetRegistration,
    NodeRegistration,
    node_registration_child_spec,
)
from corral.actors.node_record._record import HeldElsewhere, NodeIdentity, claim_on_start

__all__ = [
    "GetRegistration",
    "HeldElsewhere",
    "NodeIdentity",
    "NodeRegistration",
    "claim_on_start",
    "node_registration_child_spec",
]
