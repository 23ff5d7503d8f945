"""The actors of a node, each a thin shell around a pure decision module.

The subpackages carry the full surface (messages, pure functions, errors):
``corral.actors.coordinator``, ``.node_record``, ``.planner``, ``.port_allocator``,
``.process_supervisor``, ``.reconciler`` and ``.routing``. This package re-exports the names a node
assembly needs.
``corral.actors.coordinator``, ``.membership``, ``.node_record``, ``.planner``,
``.port_allocator``, ``.process_supervisor`` and ``.reconciler``. This package
re-exports the names a node assembly needs.
"""

from corral.actors.coordinator import Coordinator, coordinator_child_spec
from corral.actors.membership import SwimMembership, membership_child_spec
from corral.actors.node_record import NodeRegistration, node_registration_child_spec
from corral.actors.planner import Decisions, PlanInput, Policy, plan
from corral.actors.port_allocator import PortAllocator
from corral.actors.process_supervisor import ProcessSupervisor
from corral.actors.reconciler import AgentSpec, Reconciler
from corral.actors.routing import RouteTable, RoutingInputs, render_routes

__all__ = [
    "AgentSpec",
    "Coordinator",
    "Decisions",
    "NodeRegistration",
    "PlanInput",
    "Policy",
    "PortAllocator",
    "ProcessSupervisor",
    "Reconciler",
    "RouteTable",
    "RoutingInputs",
    "SwimMembership",
    "coordinator_child_spec",
    "membership_child_spec",
    "node_registration_child_spec",
    "plan",
    "render_routes",
]
