"""The scan for dead adopted orphans runs only where orphans can be adopted.

Once a second per node is most of what an idle node does; a launcher that cannot
adopt orphans (not a child subreaper, or in-memory processes) has nothing to scan.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from corral.actors.process_supervisor import MemoryLauncher, ProcessSupervisor
from corral.supervision import ChildSpec, open_actor_system


class CountingLauncher(MemoryLauncher):
    def __init__(self, adopts: bool) -> None:
        super().__init__()
        self.adopts = adopts
        self.scans = 0

    @property
    def adopts_orphans(self) -> bool:
        return self.adopts

    async def reap_orphans(self) -> int:
        self.scans += 1
        return await super().reap_orphans()


@pytest.mark.parametrize(("adopts", "scans"), [(True, 10), (False, 0)])
async def test_orphans_are_scanned_for_each_second_only_by_a_launcher_that_adopts_them(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, adopts: bool, scans: int
) -> None:
    launcher = CountingLauncher(adopts)
    async with open_actor_system("node-a") as system:
        await system.spawn(
            ChildSpec(
                name="process_supervisor",
                factory=lambda: ProcessSupervisor(
                    node_id="node-a", data_dir=tmp_path, launcher=launcher, notify=None
                ),
            )
        )
        await trio.sleep(10.5)  # a scan a second, when any
    assert launcher.scans == scans
