"""The node's SWIM wiring, without a running node: the settings, where membership sits in
the supervision tree, and peers keeping a lapsed node's address."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from corral.actors.membership import SwimConfig
from corral.node import ConfigError
from corral.node._config import resolve_node_config
from corral.node.server._events import EventLog
from corral.node.server._node import NodeServices, prepare_runtime, root_spec, swim_config
from corral.node.server._peers import PeerDirectory
from corral.registry import MemoryRegistry, NodeRecord, node_key
from corral.supervision import ChildSpec, open_actor_system


def test_the_swim_settings_default_to_memberlists_lan_profile(tmp_path: Path) -> None:
    config = resolve_node_config({}, {}, cwd=tmp_path)
    assert (
        config.probe_interval_ms,
        config.probe_timeout_ms,
        config.indirect_checks,
        config.suspicion_mult,
    ) == (1000, 500, 3, 4)
    assert swim_config(config) == SwimConfig()


def test_the_swim_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    config = resolve_node_config(
        {"probe-interval-ms": "200"},
        {"CORRAL_PROBE_TIMEOUT_MS": "50", "CORRAL_INDIRECT_CHECKS": "0"},
        {"suspicion-mult": 6, "probe-interval-ms": 9000},
        cwd=tmp_path,
    )
    swim = swim_config(config)
    assert (swim.probe_interval, swim.probe_timeout) == (0.2, 0.05)
    assert (swim.indirect_checks, swim.suspicion_mult) == (0, 6)
    assert swim.gossip_interval == SwimConfig().gossip_interval  # the rest as memberlist


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"probe-timeout-ms": "1000"}, "--probe-timeout-ms 1000 must be below --probe-interval-ms"),
        ({"probe-interval-ms": "5"}, "--probe-interval-ms: '5' is not a whole number from 10"),
        ({"indirect-checks": "17"}, "--indirect-checks: '17' is not a whole number from 0 to 16"),
        ({"suspicion-mult": "0"}, "--suspicion-mult: '0' is not a whole number from 1"),
    ],
)
def test_bad_swim_settings_name_the_setting(
    tmp_path: Path, flags: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_node_config(flags, {}, cwd=tmp_path)


def test_membership_starts_after_peers_and_stops_after_the_agent(tmp_path: Path) -> None:
    config = resolve_node_config({"data-dir": str(tmp_path / "d")}, {}, cwd=tmp_path)
    runtime = prepare_runtime(config)
    registry = MemoryRegistry()
    children = root_spec(runtime, registry, NodeServices(runtime, registry, EventLog()), None)
    names = [child.name for child in children]
    # Children stop in reverse: the agent has stopped every app before the node leaves,
    # and the registration (its record) and peers (addresses) outlive the goodbyes.
    assert names == [
        "registration",
        "peers",
        "membership",
        "agent",
        "artifacts",
        "coordinator",
        "routing",
        "api",
    ]


class _Book:
    def __init__(self) -> None:
        self.peers: dict[str, str] = {}

    def add_peer(self, node_id: str, address: str) -> None:
        self.peers[node_id] = address

    def remove_peer(self, node_id: str) -> None:
        del self.peers[node_id]


async def test_peers_keep_a_lapsed_nodes_address_for_forget_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    book = _Book()
    await registry.put(node_key("b"), NodeRecord(id="b", peer_address="127.0.0.1:2").encode())
    spec = ChildSpec(
        name="peers", factory=lambda: PeerDirectory(registry, book, interval=1.0, forget_after=10)
    )
    async with open_actor_system("a", children=[spec]):
        assert book.peers == {"b": "127.0.0.1:2"}
        await registry.delete(node_key("b"))  # a registry blip: SWIM must still reach b
        await trio.sleep(5)
        assert book.peers == {"b": "127.0.0.1:2"}
        await registry.put(node_key("b"), NodeRecord(id="b", peer_address="127.0.0.1:2").encode())
        await trio.sleep(2)
        await registry.delete(node_key("b"))  # back, then gone again: the clock restarts
        await trio.sleep(8)
        assert book.peers == {"b": "127.0.0.1:2"}
        await trio.sleep(4)
        assert book.peers == {}
