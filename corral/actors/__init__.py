"""The actors of a node, each a thin shell around a pure decision module.

This package only groups them; each sub-package exports its actor, messages and
errors, and is imported directly: ``corral.actors.coordinator``, ``.membership``,
``.node_record``, ``.planner``, ``.port_allocator``, ``.process_supervisor``,
``.reconciler`` and ``.routing``.
"""

__all__: list[str] = []
