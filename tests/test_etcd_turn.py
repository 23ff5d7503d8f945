"""The turns tests take on the shared etcd (tests/conftest.py): sharers together, a test
that needs it alone by itself, and sharers arriving while it waits queue behind it."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path

from .conftest import shared_etcd_turn

#: Long enough for a thread that could take its turn to have taken it.
SETTLE_S = 0.3


class Holder:
    """A thread that takes a turn and holds it until released."""

    def __init__(self, turn: AbstractContextManager[None]) -> None:
        self.turn = turn
        self.holding = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.turn:
            self.holding.set()
            self.release.wait(10)

    def done(self) -> None:
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


ENDPOINT = "127.0.0.1:2379"


def test_sharers_hold_their_turns_together(tmp_path: Path) -> None:
    first = Holder(shared_etcd_turn(ENDPOINT, alone=False, directory=tmp_path))
    second = Holder(shared_etcd_turn(ENDPOINT, alone=False, directory=tmp_path))
    assert first.holding.wait(5)
    assert second.holding.wait(5)
    first.done()
    second.done()


def test_a_test_alone_waits_for_the_sharers_and_later_sharers_wait_for_it(
    tmp_path: Path,
) -> None:
    # The lock files in tmp_path: a real etcd's are not touched.
    sharer = Holder(shared_etcd_turn(ENDPOINT, alone=False, directory=tmp_path))
    assert sharer.holding.wait(5)
    alone = Holder(shared_etcd_turn(ENDPOINT, alone=True, directory=tmp_path))
    assert not alone.holding.wait(SETTLE_S)  # a sharer is still at work
    late = Holder(shared_etcd_turn(ENDPOINT, alone=False, directory=tmp_path))
    assert not late.holding.wait(SETTLE_S)  # queued behind the one waiting to be alone
    sharer.done()
    assert alone.holding.wait(5)
    assert not late.holding.wait(SETTLE_S)  # not while it is alone
    alone.done()
    assert late.holding.wait(5)
    late.done()
