"""A draw picks what it picked when it listed the range: same seed, same ports.

The draw chooses over lazy :class:`FreePorts` sequences rather than lists of the whole
range (the lists were most of the cost of starting an instance). Tests, the fleet
simulator and its replayable fault schedules pin ports through seeded random sources,
so the new draw must make the very same choices: here it runs beside the draw as it
was (lists), on the same books, probes, registry claims and seeds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.port_allocator import PlacementUnavailable, PortProbeExhausted
from corral.actors.port_allocator._book import (
    FreePorts,
    PortBook,
    PortPair,
    PortRange,
    Quarantined,
    internal_candidates,
)
from corral.actors.port_allocator._ledger import PortLedger
from corral.registry import MemoryRegistry, PortClaim, port_key


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(1, 200),
    size=st.integers(1, 60),
    excluded=st.sets(st.integers(0, 300), max_size=80),
    more=st.sets(st.integers(0, 300), max_size=10),
)
def test_free_ports_equal_the_listed_range_item_by_item(
    start: int, size: int, excluded: set[int], more: set[int]
) -> None:
    port_range = PortRange(start, start + size - 1)
    listed = [p for p in range(port_range.start, port_range.end + 1) if p not in excluded]
    free = FreePorts(port_range, excluded)
    assert len(free) == len(listed)
    assert list(free) == listed
    assert [free[i] for i in range(len(free))] == listed
    assert [free[-i] for i in range(1, len(free) + 1)] == listed[::-1]
    assert free[1:-1:2] == listed[1:-1:2]
    for port in range(port_range.start - 2, port_range.end + 3):
        assert (port in free) == (port in listed)
    with pytest.raises(IndexError):
        free[len(listed)]
    fewer = free.without(more)
    assert list(fewer) == [p for p in listed if p not in more]


class ListedDraw(PortLedger):
    """The draw as it was before :class:`FreePorts`: lists of the whole range."""

    async def _draw(self, app: str, *, exclude: Sequence[int]) -> PortPair:
        now = self._clock()
        rejected = set(exclude)
        candidates = self.book.candidates(self.port_range, app, now)
        free = [p for p in candidates if p not in rejected]
        if len(free) < 2:
            raise self._unavailable(app, now, len(free), rejected)
        probes = 0
        unfit: set[int] = set()

        async def take(pool: list[int], skip: set[int]) -> int | None:
            nonlocal probes
            while probes < self.max_probes:
                options = [p for p in pool if p not in rejected and p not in skip]
                if not options:
                    return None
                port = self._random.choice(options)
                probes += 1
                if self._probe(self.bind_host, port) and await self._claim(app, port):
                    return port
                rejected.add(port)
            raise PortProbeExhausted("exhausted")

        while True:
            public = await take(candidates, unfit)
            if public is None:
                free = [p for p in candidates if p not in rejected]
                raise self._unavailable(app, now, len(free), rejected)
            internal = await take(internal_candidates(candidates, public), set())
            if internal is not None:
                return PortPair(public, internal)
            await self._unclaim(app, public)
            unfit.add(public)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(2, 40),
    held=st.sets(st.integers(0, 39), max_size=20),
    quarantined=st.sets(st.integers(0, 39), max_size=10),
    bound=st.sets(st.integers(0, 39), max_size=30),
    claimed=st.sets(st.integers(0, 39), max_size=30),
    recorded=st.one_of(st.none(), st.tuples(st.integers(0, 39), st.integers(0, 39))),
    apps=st.integers(1, 4),
)
def test_the_draw_picks_what_the_listed_draw_picked(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    size: int,
    held: set[int],
    quarantined: set[int],
    bound: set[int],
    claimed: set[int],
    recorded: tuple[int, int] | None,
    apps: int,
) -> None:
    """Same pairs (or the same error), the same random state after, the same claims."""
    port_range = PortRange(24000, 24000 + size - 1)
    base = port_range.start
    others = sorted(held)
    holdings = {
        f"other-{i}": PortPair(base + a, base + b)
        for i, (a, b) in enumerate(zip(others[::2], others[1::2], strict=False))
    }
    if recorded is not None and recorded[0] != recorded[1]:
        pair = PortPair(base + recorded[0], base + recorded[1])
        if not set(pair.ports) & {p for q in holdings.values() for p in q.ports}:
            holdings["app-0"] = pair
    quarantine = {base + p: Quarantined("gone", 2_000.0) for p in quarantined}

    async def run(kind: type[PortLedger]) -> tuple[list[object], object, dict[str, bytes]]:
        registry = MemoryRegistry()
        for port in sorted(claimed):
            await registry.put(
                port_key("node-a", base + port), PortClaim("node-a", base + port, "x", 0.0).encode()
            )
        rng = random.Random(seed)
        ledger = kind(
            node_id="node-a",
            data_dir=tmp_path_factory.mktemp("node"),
            registry=registry,
            port_range=port_range,
            clock=lambda: 1_000.0,
            random=rng,
            max_probes=16,
            probe=lambda host, port: port - base not in bound,
        )
        ledger.book = PortBook(dict(holdings), dict(quarantine))
        results: list[object] = []
        for i in range(apps):
            try:
                ensured = await ledger.ensure_pair(f"app-{i}")
                results.append((ensured.pair, ensured.replaced, ensured.fresh))
            except (PlacementUnavailable, PortProbeExhausted) as exc:
                results.append(type(exc).__name__)
        kept = {kv.key: kv.value for kv in await registry.range("ports/")}
        return results, rng.getstate(), kept

    assert trio.run(run, PortLedger) == trio.run(run, ListedDraw)


def test_a_choice_over_free_ports_is_uniform() -> None:
    """Every free port is chosen about equally often (chi-square, fixed seed)."""
    free = FreePorts(PortRange(24000, 24019), {24003, 24010, 30000})
    rng = random.Random(5)
    counts: dict[int, int] = {}
    for _ in range(3_600):
        port = rng.choice(free)
        counts[port] = counts.get(port, 0) + 1
    listed = [p for p in range(24000, 24020) if p not in (24003, 24010)]
    assert sorted(counts) == listed
    expected = 3_600 / len(listed)
    chi2 = sum((n - expected) ** 2 / expected for n in counts.values())
    assert chi2 < 40.8  # the 0.999 quantile of chi-square with 17 degrees of freedom
