"""tests/conftest.py: the turns tests take on the shared etcd (sharers together, a test
that needs it alone by itself, sharers arriving while it waits queue behind it), and the
order that starts every xdist worker on long tests."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path

from .conftest import deal_tests, shared_etcd_turn, worker_chunks

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


class FakeItem:
    """Just enough of a pytest item for the ordering: a name and its markers."""

    def __init__(self, name: str, *markers: str) -> None:
        self.name = name
        self.markers = set(markers)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None

    def __repr__(self) -> str:
        return self.name


def test_every_worker_starts_on_its_share_of_the_slow_tests() -> None:
    alone = [FakeItem("alone", "etcd", "etcd_alone")]
    slow = [FakeItem(f"slow{i}", "slow") for i in range(6)]
    rest = [FakeItem(f"fast{i}") for i in range(20)]
    order = deal_tests(alone, slow, rest, 3)
    assert sorted(map(repr, order)) == sorted(map(repr, alone + slow + rest))
    sizes = worker_chunks(len(order), 3)
    assert sizes == [9, 9, 9]
    chunks = [order[:9], order[9:18], order[18:]]
    assert [repr(item) for item in chunks[0][:3]] == ["alone", "slow0", "slow3"]
    assert [repr(item) for item in chunks[1][:2]] == ["slow1", "slow4"]
    assert [repr(item) for item in chunks[2][:2]] == ["slow2", "slow5"]
    # Without workers: alone, then slow, then the rest, each in collection order.
    assert deal_tests(alone, slow, rest, 1) == [*alone, *slow, *rest]
