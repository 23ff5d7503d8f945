"""A lease holder cut off from the registry steps down before its lease can lapse
there: it stops acting ``lease_ttl`` minus the step-down margin after its last
renewal was sent, while the registry hands the lease to another node only a whole
TTL after that renewal. The two never act at once."""

from __future__ import annotations

import pytest
import trio

from corral.actors.coordinator._actor import step_down_margin
from corral.testing import open_cluster

TTL = 4.0


def test_the_margin_is_a_tenth_of_the_ttl_at_most_a_second() -> None:
    assert step_down_margin(4.0) == pytest.approx(0.4)
    assert step_down_margin(45.0) == 1.0


@pytest.mark.parametrize("cut_after", [0.1, 0.7, 1.3])
async def test_a_holder_cut_off_stops_acting_a_margin_before_its_successor_starts(
    autojump_clock: object, cut_after: float
) -> None:
    async with open_cluster(3, lease_ttl=TTL) as cluster:
        old = await cluster.wait_for_coordinator()
        await trio.sleep(2 * TTL + cut_after)  # somewhere between two renewals
        cluster.cut_registry(old, hang=True)  # every call, a renewal too, hangs
        new = await cluster.wait_for_coordinator(exclude={old}, within=2 * TTL, poll=0.01)
        cluster.restore_registry(old)  # its hung calls land now, on a lapsed lease
        await trio.sleep(TTL)

        (acquired,) = [e for n, e in cluster.events("coordinator.acquired") if n == new]
        (lost,) = [e for n, e in cluster.events("coordinator.lost") if n == old]
        stopped = float(lost.fields["until"])
        assert stopped <= acquired.time - step_down_margin(TTL) + 1e-9
        intervals = cluster.assert_single_coordinator()
        assert [i.node for i in intervals] == [old, new]
