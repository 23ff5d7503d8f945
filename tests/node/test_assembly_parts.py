"""Pieces of the node assembly that need no running node."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from corral.actors.coordinator import CoordinatorState
from corral.actors.planner import Policy
from corral.node import ConfigError
from corral.node._config import resolve_node_config
from corral.node.server._events import EventLog, jsonable
from corral.node.server._node import (
    HOLDER_ASK_BUDGET,
    HOLDER_ASK_TRIES,
    HOLDER_RETRY_PAUSE,
    NodeServices,
    check_bindable,
    check_node_id_free,
    prepare_runtime,
    run_node,
    single_error,
)
from corral.node.server._peers import PeerDirectory, peer_changes
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    CoordinatorLease,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    node_key,
    placement_key,
)
from corral.supervision import AskTimeout, ChildSpec, Event, open_actor_system
from corral.transport import PeerUnavailable


def test_peer_changes_adds_readdresses_and_forgets() -> None:
    records = {
        "nodes/a": NodeRecord(id="a", peer_address="127.0.0.1:1"),
        "nodes/b": NodeRecord(id="b", peer_address="127.0.0.1:2"),
        "nodes/me": NodeRecord(id="me", peer_address="127.0.0.1:3"),
        "nodes/c": NodeRecord(id="c"),
    }
    add, remove = peer_changes(
        {"a": "127.0.0.1:1", "b": "127.0.0.1:9", "gone": "x:1"}, records, "me"
    )
    assert add == {"b": "127.0.0.1:2"}
    assert remove == ["gone"]


async def test_event_log_numbers_events_and_stamps_wall_time() -> None:
    log = EventLog(size=2, wall_clock=lambda: 1000.0, clock=lambda: 50.0)
    for index in range(3):
        log.add(Event(48.0, f"k{index}", "/x", {"obj": object(), "n": index}))
    recent = log.recent()
    assert [e["seq"] for e in recent] == [2, 3]
    assert recent[0]["wall_time"] == 998.0
    assert isinstance(recent[0]["fields"]["obj"], str)
    assert jsonable({"t": (1, 2)}) == {"t": [1, 2]}
    assert trio.current_time() >= 0


def test_prepare_runtime_writes_private_files(tmp_path: Path) -> None:
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    runtime = prepare_runtime(config)
    assert runtime.node_id == "n1"
    assert (tmp_path / "d" / "token").read_text().strip() == runtime.token
    assert (tmp_path / "d" / "secret").stat().st_mode & 0o077 == 0
    assert runtime.api_address == "127.0.0.1:7400"
    again = prepare_runtime(config)
    assert (again.token, again.secret) == (runtime.token, runtime.secret)


def test_a_taken_api_address_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = resolve_node_config({"api": f"127.0.0.1:{port}"}, {}, cwd=tmp_path)
        with pytest.raises(ConfigError, match=f"--api 127.0.0.1:{port} cannot be used"):
            check_bindable(config)


async def test_a_live_node_with_the_same_id_is_refused(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    runtime = prepare_runtime(config)
    await check_node_id_free(runtime, registry)
    ours = NodeRecord(id="n1", peer_address=runtime.peer_address, api_address=runtime.api_address)
    await registry.put(node_key("n1"), ours.encode())
    await check_node_id_free(runtime, registry)  # our own previous life
    theirs = NodeRecord(id="n1", peer_address="10.0.0.9:7401", api_address="10.0.0.9:7400")
    await registry.put(node_key("n1"), theirs.encode())
    with pytest.raises(ConfigError, match="in use by a live node"):
        await check_node_id_free(runtime, registry)
    assert not (tmp_path / "d" / "node-id").exists()


def test_single_error_unwraps_one_leaf() -> None:
    error = ConfigError("bad")
    assert single_error(BaseExceptionGroup("x", [BaseExceptionGroup("y", [error])])) is error
    two = BaseExceptionGroup("x", [ValueError(), KeyError()])
    assert single_error(two) is two


async def test_a_taken_port_fails_before_anything_is_written(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = resolve_node_config(
            {"data-dir": "fresh", "api": f"127.0.0.1:{port}"}, {}, cwd=tmp_path
        )
        with pytest.raises(ConfigError, match="cannot be used"):
            await run_node(config, stop=trio.Event())
    assert not (tmp_path / "fresh").exists()


class _UnreachableRef:
    async def ask(self, message: object, timeout: float) -> object:
        raise PeerUnavailable("peer 'c' at 127.0.0.1:9 is unreachable: handshake refused")


class _UnreachableSystem:
    def ref(self, path: str, node: str | None = None) -> _UnreachableRef:
        return _UnreachableRef()


async def test_state_reports_an_unreachable_coordinator_instead_of_failing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = MemoryRegistry()
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    runtime = prepare_runtime(config)
    await registry.put(node_key("n1"), NodeRecord(id="n1").encode())
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder="c", acquired_at=0).encode())
    for app, nodes in (("web", ["c", "n1"]), ("db", ["c"])):
        record = PlacementRecord(nodes=nodes, decided_at=0.0, fence=1)
        await registry.put(placement_key(app), record.encode())
    services = NodeServices(runtime, registry, EventLog())
    services.system = _UnreachableSystem()  # type: ignore[assignment]
    state = await services.state()
    assert state["lease"]["holder"] == "c"
    assert state["coordinating"] is False
    assert state["assigned"] == ["web"]
    assert state["data_dir"] == str(tmp_path / "d")
    assert state["processes"] == {
        "error": "peer 'c' at 127.0.0.1:9 is unreachable: handshake refused"
    }
    assert state["unplaced"]["error"].startswith("cannot ask coordinator c: peer 'c'")
    # Asked a bounded number of times, a pause apart, before saying so.
    assert state["unplaced"]["error"].endswith(f"(asked {HOLDER_ASK_TRIES} times)")
    assert state["coordination"] == {"holder": "c", "error": state["unplaced"]["error"]}
    # What ps judges RELOC's cooldown by says the same.
    assert (await services.coordination()).to_json() == state["coordination"]


def holder_state(node: str) -> CoordinatorState:
    return CoordinatorState(
        node=node, coordinating=True, holder=node, fence=3, lease_ttl=45.0,
        policy=Policy(cooldown_s=60.0),
    )


class _AnsweringRef:
    def __init__(self, node: str | None) -> None:
        self.node = node

    async def ask(self, message: object, timeout: float) -> object:
        return holder_state(self.node or "n1")


class _AnsweringSystem:
    def __init__(self) -> None:
        self.asked: list[str | None] = []

    def ref(self, path: str, node: str | None = None) -> _AnsweringRef:
        self.asked.append(node)
        return _AnsweringRef(node)


async def test_coordination_asks_the_lease_holder_once(tmp_path: Path) -> None:
    registry = MemoryRegistry()
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    services = NodeServices(prepare_runtime(config), registry, EventLog())
    system = _AnsweringSystem()
    services.system = system  # type: ignore[assignment]
    assert (await services.coordination()).to_json() == {
        "holder": None,
        "error": "no coordinator holds the lease right now",
    }
    assert (await services.state())["unplaced"] == []
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder="c", acquired_at=0).encode())
    system.asked.clear()
    state = await services.state()
    assert state["coordination"]["node"] == "c"
    assert state["coordination"]["policy"]["cooldown_s"] == 60.0
    assert system.asked.count("c") == 1
    assert (await services.coordination()) == holder_state("c")
    # This node holds the lease: its own coordinator's answer is used, not asked again.
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder="n1", acquired_at=0).encode())
    system.asked.clear()
    state = await services.state()
    assert state["coordination"] == state["coordinator"]
    assert "c" not in system.asked


class _Book:
    def __init__(self) -> None:
        self.peers: dict[str, str] = {}

    def add_peer(self, node_id: str, address: str) -> None:
        self.peers[node_id] = address

    def remove_peer(self, node_id: str) -> None:
        del self.peers[node_id]


async def test_peer_directory_reports_nodes_joining_and_leaving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = MemoryRegistry()
    book = _Book()
    changes: list[str] = []
    await registry.put(node_key("b"), NodeRecord(id="b", peer_address="127.0.0.1:2").encode())
    spec = ChildSpec(
        name="peers",
        factory=lambda: PeerDirectory(registry, book, interval=2.0, on_change=changes.append),
    )
    async with open_actor_system("a", children=[spec]):
        assert book.peers == {"b": "127.0.0.1:2"}
        assert changes == ["node b joined"]
        await trio.sleep(5)
        assert changes == ["node b joined"]  # nothing moved: no kick
        await registry.put(node_key("c"), NodeRecord(id="c", peer_address="127.0.0.1:3").encode())
        await registry.delete(node_key("b"))
        await trio.sleep(2)
        assert changes == ["node b joined", "node c joined, node b left"]
        assert book.peers == {"c": "127.0.0.1:3"}


class _BusyOnceSystem:
    """A holder whose coordinator is busy with a pass the first time it is asked."""

    def __init__(self) -> None:
        self.asks = 0

    def ref(self, path: str, node: str | None = None) -> _BusyOnceSystem:
        return self

    async def ask(self, message: object, timeout: float) -> object:
        self.asks += 1
        if self.asks == 1:
            raise AskTimeout("no reply from c/coordinator within 2.0 s; the actor is busy")
        return holder_state("c")


async def test_a_busy_coordinator_is_asked_again_before_the_cooldown_is_called_unknown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = MemoryRegistry()
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    services = NodeServices(prepare_runtime(config), registry, EventLog())
    system = _BusyOnceSystem()
    services.system = system  # type: ignore[assignment]
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder="c", acquired_at=0).encode())
    started = trio.current_time()
    answer = await services.coordination()
    assert answer == holder_state("c")
    assert system.asks == 2
    assert trio.current_time() - started == HOLDER_RETRY_PAUSE


class _AlwaysBusySystem:
    def ref(self, path: str, node: str | None = None) -> _AlwaysBusySystem:
        return self

    async def ask(self, message: object, timeout: float) -> object:
        await trio.sleep(timeout)
        raise AskTimeout(f"no reply from c/coordinator within {timeout} s; the actor is busy")


async def test_asking_a_busy_coordinator_again_is_bounded_in_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = MemoryRegistry()
    config = resolve_node_config({"data-dir": "d", "node-id": "n1"}, {}, cwd=tmp_path)
    services = NodeServices(prepare_runtime(config), registry, EventLog())
    services.system = _AlwaysBusySystem()  # type: ignore[assignment]
    await registry.put(COORDINATOR_LEASE_KEY, CoordinatorLease(holder="c", acquired_at=0).encode())
    started = trio.current_time()
    answer = await services.coordination()
    # 2 s, a pause, then the 1.7 s left of the budget: never longer than the budget.
    assert trio.current_time() - started == pytest.approx(HOLDER_ASK_BUDGET)
    assert not isinstance(answer, CoordinatorState)
    assert answer.error.endswith("(asked 2 times)")
    assert "busy" in answer.error
