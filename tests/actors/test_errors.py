"""One PlacementUnavailable for both of its causes (no live node; no port pair)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import CorralError
from corral.actors import planner, port_allocator
from corral.actors.planner import AppSpec, NodeInfo, Policy, plan
from corral.actors.planner._types import PLACEMENT_UNAVAILABLE
from corral.actors.port_allocator._book import PortRange
from corral.actors.port_allocator._ledger import PortLedger
from corral.registry import MemoryRegistry


def test_planner_and_port_allocator_share_one_placement_unavailable() -> None:
    assert planner.PlacementUnavailable is port_allocator.PlacementUnavailable
    assert issubclass(planner.PlacementUnavailable, CorralError)
    assert issubclass(port_allocator.PortProbeExhausted, planner.PlacementUnavailable)
    assert issubclass(port_allocator.PortProbeExhausted, port_allocator.PortAllocatorError)
    assert planner.PlacementUnavailable.code == PLACEMENT_UNAVAILABLE


async def test_one_except_clause_catches_both_causes(tmp_path: Path) -> None:
    caught: list[str] = []
    try:
        plan([AppSpec("shop")], [NodeInfo("n1", state="down")], {}, Policy(), 0.0)
    except planner.PlacementUnavailable as exc:
        caught.append(str(exc))
    ledger = PortLedger(
        node_id="n1",
        data_dir=tmp_path,
        registry=MemoryRegistry(clock=lambda: 0.0),
        port_range=PortRange(24000, 24000),
        probe=lambda host, port: True,
    )
    ledger.load()
    try:
        await ledger.ensure_pair("shop")
    except planner.PlacementUnavailable as exc:
        caught.append(str(exc))
    assert len(caught) == 2
    assert "no live node at all (1 known node(s)" in caught[0]
    assert "port range 24000-24000 has 1 free port(s) for app 'shop'" in caught[1]


def test_port_errors_other_than_placement_stay_port_allocator_errors() -> None:
    with pytest.raises(port_allocator.InvalidPortRange):
        PortRange(10, 5)
