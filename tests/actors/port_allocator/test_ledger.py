"""The port ledger: local state, bind probes and registry claims."""

from __future__ import annotations

import json
import logging
import random
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.port_allocator import PlacementUnavailable, PortProbeExhausted, bind_probe
from corral.actors.port_allocator._book import PortPair, PortRange
from corral.actors.port_allocator._ledger import PortLedger
from corral.registry import MemoryRegistry, PortClaim, decode_record, port_key


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_ledger(
    data_dir: Path,
    registry: MemoryRegistry,
    clock: Clock,
    *,
    port_range: PortRange | None = None,
    seed: int = 1,
    probe: Callable[[str, int], bool] = lambda host, port: True,
    quarantine_ms: int = 600_000,
    bind_host: str = "127.0.0.1",
) -> PortLedger:
    ledger = PortLedger(
        node_id="node-a",
        data_dir=data_dir,
        registry=registry,
        port_range=port_range or PortRange(24000, 24998),
        quarantine_ms=quarantine_ms,
        clock=clock,
        random=random.Random(seed),
        bind_host=bind_host,
        probe=probe,
    )
    ledger.load()
    return ledger


async def claims(registry: MemoryRegistry) -> dict[int, str]:
    found = {}
    for kv in await registry.range("ports/node-a/"):
        claim = decode_record(kv.key, kv.value)
        assert isinstance(claim, PortClaim)
        found[claim.port] = claim.app
    return found


async def test_a_fresh_pair_is_recorded_claimed_and_reused_after_a_restart(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), Clock()
    ledger = make_ledger(tmp_path, registry, clock)
    first = await ledger.ensure_pair("hello")
    assert first.fresh
    pair = first.pair
    assert pair.public in PortRange()
    assert pair.internal in PortRange()
    assert pair.internal not in (pair.public, pair.public + 1)
    saved = json.loads((tmp_path / "apps" / "hello" / "ports.json").read_text())
    assert (saved["public"], saved["internal"]) == pair.ports
    assert await claims(registry) == {pair.public: "hello", pair.internal: "hello"}

    again = make_ledger(tmp_path, registry, clock, seed=99)  # a new life of the node
    reused = await again.ensure_pair("hello")
    assert (reused.pair, reused.fresh, reused.replaced) == (pair, False, None)


async def test_a_recorded_port_held_by_a_foreign_listener_gets_a_new_pair_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry, clock = MemoryRegistry(), Clock()
    ledger = make_ledger(tmp_path, registry, clock, probe=lambda h, p: True)
    old = (await ledger.ensure_pair("hello")).pair
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", old.public))
        foreign.listen()
        real = make_ledger(tmp_path, registry, clock, probe=bind_probe)
        with caplog.at_level(logging.WARNING, logger="corral.actors.port_allocator"):
            moved = await real.ensure_pair("hello")
    assert moved.replaced == old
    assert moved.pair != old
    assert old.public not in moved.pair.ports
    message = caplog.records[-1].getMessage()
    assert "hello" in message
    assert str(old) in message
    assert str(moved.pair) in message
    current = await claims(registry)
    assert current.get(moved.pair.public) == "hello"
    assert old.public not in current
    # without verification (the app's own process holds its ports) nothing moves
    assert (await real.ensure_pair("hello", verify=False)).pair == moved.pair


async def test_released_ports_stay_out_of_other_apps_reach_until_quarantine_ends(
    tmp_path: Path,
) -> None:
    registry, clock = MemoryRegistry(), Clock()
    tiny = PortRange(24000, 24003)
    ledger = make_ledger(tmp_path, registry, clock, port_range=tiny, quarantine_ms=60_000)
    first = (await ledger.ensure_pair("one")).pair
    second = (await ledger.ensure_pair("two")).pair
    assert set(first.ports) | set(second.ports) == {24000, 24001, 24002, 24003}
    assert await ledger.release("one") == first
    assert not (tmp_path / "apps" / "one" / "ports.json").exists()
    assert set(await claims(registry)) == set(second.ports)
    with pytest.raises(PlacementUnavailable, match="24000-24003") as info:
        await ledger.ensure_pair("three")
    assert "2 in quarantine" in str(info.value)

    # the quarantine survives a restart of the node
    clock.now += 59.9
    restarted = make_ledger(tmp_path, registry, clock, port_range=tiny, quarantine_ms=60_000)
    with pytest.raises(PlacementUnavailable):
        await restarted.ensure_pair("three")
    clock.now += 0.1
    assert set((await restarted.ensure_pair("three")).pair.ports) == set(first.ports)


async def test_a_port_claimed_by_another_app_in_the_registry_is_never_given(
    tmp_path: Path,
) -> None:
    registry, clock = MemoryRegistry(), Clock()
    await registry.put(port_key("node-a", 24001), PortClaim("node-a", 24001, "other", 1.0).encode())
    for seed in range(10):
        ledger = make_ledger(
            tmp_path / str(seed), registry, clock, port_range=PortRange(24000, 24003), seed=seed
        )
        pair = (await ledger.ensure_pair(f"app-{seed}")).pair
        assert 24001 not in pair.ports
        await ledger.release(f"app-{seed}")
    assert (await claims(registry))[24001] == "other"


async def test_fewer_than_two_free_ports_is_placement_unavailable(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), Clock()
    ledger = make_ledger(tmp_path, registry, clock, port_range=PortRange(24000, 24002))
    await ledger.ensure_pair("one")
    with pytest.raises(
        PlacementUnavailable, match="placement-unavailable: port range 24000-24002"
    ) as info:
        await ledger.ensure_pair("two")
    assert "for app 'two'" in str(info.value)


async def test_the_probe_is_bounded(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), Clock()
    probed: list[int] = []

    def taken(host: str, port: int) -> bool:
        probed.append(port)
        return False

    ledger = make_ledger(tmp_path, registry, clock, probe=taken)
    with pytest.raises(PortProbeExhausted, match="tried 64 ports"):
        await ledger.ensure_pair("hello")
    assert len(probed) == 64
    assert await claims(registry) == {}


async def test_only_the_holder_releases(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), Clock()
    ledger = make_ledger(tmp_path, registry, clock, port_range=PortRange(24000, 24003))
    pair = (await ledger.ensure_pair("hello")).pair
    # someone rewrote the claim of our public port: our release must not delete it
    key = port_key("node-a", pair.public)
    await registry.put(key, PortClaim("node-a", pair.public, "intruder", 2.0).encode())
    await ledger.release("hello")
    assert (await claims(registry)) == {pair.public: "intruder"}


async def test_release_also_drops_claims_the_local_state_lost(tmp_path: Path) -> None:
    registry, clock = MemoryRegistry(), Clock()
    await registry.put(port_key("node-a", 24001), PortClaim("node-a", 24001, "gone", 1.0).encode())
    await registry.put(port_key("node-a", 24002), PortClaim("node-a", 24002, "kept", 1.0).encode())
    ledger = make_ledger(tmp_path, registry, clock)
    assert await ledger.release("gone") is None
    assert await claims(registry) == {24002: "kept"}


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["assign", "unassign", "delete", "restart", "wait"]),
            st.sampled_from(["a", "b", "c", "d"]),
        ),
        max_size=25,
    ),
    seed=st.integers(0, 1000),
)
def test_random_histories_never_share_a_port_nor_move_one_inside_quarantine(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str]], seed: int
) -> None:
    data_dir = tmp_path_factory.mktemp("node")
    quarantine = 100.0
    port_range = PortRange(24000, 24007)

    async def main() -> None:
        registry, clock = MemoryRegistry(), Clock(0.0)
        rng = random.Random(seed)

        def ledger() -> PortLedger:
            return make_ledger(
                data_dir,
                registry,
                clock,
                port_range=port_range,
                seed=rng.randrange(1000),
                quarantine_ms=int(quarantine * 1000),
            )

        current = ledger()
        released: dict[int, tuple[str, float]] = {}
        for kind, app in ops:
            if kind == "assign":
                try:
                    pair = (await current.ensure_pair(app)).pair
                except PlacementUnavailable:
                    continue
                for port in pair.ports:
                    if port in released and released[port][0] != app:
                        assert clock.now - released[port][1] >= quarantine
            elif kind == "delete":
                pair_or_none = await current.release(app)
                if pair_or_none is not None:
                    for port in pair_or_none.ports:
                        released[port] = (app, clock.now)
            elif kind == "restart":
                current = ledger()
            elif kind == "wait":
                clock.now += rng.choice([10.0, 60.0, 150.0])
            holdings = current.book.holdings
            held = [p for pair in holdings.values() for p in pair.ports]
            assert len(held) == len(set(held))
            on_registry = await claims(registry)
            for holder, pair in holdings.items():
                assert all(on_registry[p] == holder for p in pair.ports)

    trio.run(main)


def test_pairs_are_drawn_independently_across_the_range(tmp_path: Path) -> None:
    async def main() -> set[PortPair]:
        pairs = set()
        for seed in range(20):
            ledger = make_ledger(tmp_path / str(seed), MemoryRegistry(), Clock(), seed=seed)
            pairs.add((await ledger.ensure_pair("hello")).pair)
        return pairs

    pairs = trio.run(main)
    assert len(pairs) == 20
    assert any(abs(p.public - p.internal) > 100 for p in pairs)
