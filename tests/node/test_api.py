"""The HTTP API against the in-memory registry (no sockets)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.actors.coordinator import CoordinatorState, NodeStatus
from corral.actors.planner import Deferred, Policy
from corral.node.artifacts._artifact_store import ArtifactStore, artifact_capability
from corral.node.cli._format import nodes_table
from corral.node.server._api import ApiServices, build_api
from corral.node.server._views import Coordination, CoordinatorUnavailable
from corral.registry import (
    COORDINATOR_LEASE_KEY,
    AppRecord,
    CoordinatorLease,
    MemoryRegistry,
    NodeIntent,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    app_key,
    artifact_key,
    decode_record,
    intent_key,
    node_key,
    placement_key,
)

from .conftest import b64, make_app_dir, packed_app

TOKEN = "sekrit-token"
SECRET = "cluster-secret"


class Fixture:
    def __init__(self, tmp_path: Path, registry_limit: int = 1024 * 1024) -> None:
        self.registry = MemoryRegistry()
        self.store = ArtifactStore(
            self.registry,
            tmp_path / "artifacts",
            node_id="n1",
            secret=SECRET,
            registry_limit=registry_limit,
        )
        self.changes: list[str] = []
        self.events: list[dict[str, Any]] = [
            {"seq": i, "kind": "test.event", "path": "/x", "fields": {}} for i in range(3)
        ]

        async def state() -> dict[str, Any]:
            return {"node": {"id": "n1"}}

        #: What the lease holder's coordinator answers (to GetCoordinatorState).
        self.coordinator_state: Coordination = CoordinatorState(
            node="n1", coordinating=False, holder="n1", fence=None, lease_ttl=45.0,
            policy=Policy(cooldown_s=600.0, grace_period_s=300.0),
        )

        async def coordinator() -> Coordination:
            return self.coordinator_state

        services = ApiServices(
            token=TOKEN,
            secret=SECRET,
            node_id="n1",
            registry=self.registry,
            artifacts=self.store,
            state=state,
            actors=lambda: {"path": "/", "children": []},
            events=lambda: list(self.events),
            wall_clock=lambda: 1_700_000_000.0,
            changed=self.record_change,
            coordinator=coordinator,
        )
        self.app = build_api(services)

    async def record_change(self, reason: str) -> None:
        self.changes.append(reason)

    def coordinator_changed(self, **changes: Any) -> None:
        """The holder's coordinator state with ``changes``."""
        assert isinstance(self.coordinator_state, CoordinatorState)
        self.coordinator_state = replace(self.coordinator_state, **changes)

    def client(self, token: str | None = TOKEN) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://node",
            headers=headers,
        )

    async def app_record(self, name: str) -> AppRecord | None:
        kv = await self.registry.get(app_key(name))
        if kv is None:
            return None
        record = decode_record(kv.key, kv.value)
        assert isinstance(record, AppRecord)
        return record


@pytest.fixture
async def fx(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path)


async def test_every_route_needs_the_token(fx: Fixture) -> None:
    async with fx.client(token=None) as client:
        for method, path in [("GET", "/v1/state"), ("POST", "/v1/apps/x/retire"), ("GET", "/x")]:
            response = await client.request(method, path)
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
    async with fx.client(token="wrong") as client:
        assert (await client.get("/v1/state")).status_code == 403
        assert (await client.get("/v1/actors")).status_code == 403
    async with fx.client() as client:
        response = await client.get("/v1/state")
        assert response.status_code == 200
        assert response.json() == {"node": {"id": "n1"}}


async def test_deploy_creates_the_app_and_stores_the_artifact(fx: Fixture, tmp_path: Path) -> None:
    packed = packed_app(tmp_path)
    async with fx.client() as client:
        response = await client.post(
            "/v1/apps/shop/deploy",
            json={
                "artifact": b64(packed.data),
                "replicas": 2,
                "selector": {"zone": "a"},
                "env": {"MODE": "x"},
            },
        )
    assert response.status_code == 201, response.text
    assert response.json()["stored_in_registry"] is True
    app = await fx.app_record("shop")
    assert app is not None
    assert app.deployment is not None
    assert (app.replicas, app.selector) == (2, {"zone": "a"})
    assert app.deployment.digest == packed.digest
    assert app.deployment.command == ["python3", "server.py"]
    assert app.deployment.env == {"MODE": "x"}
    assert app.deployment.deployed_at == 1_700_000_000.0
    kv = await fx.registry.get(artifact_key(packed.digest))
    assert kv is not None
    assert kv.value == packed.data


async def test_redeploy_leaves_unnamed_constraints_alone(fx: Fixture, tmp_path: Path) -> None:
    first = packed_app(tmp_path, "one")
    async with fx.client() as client:
        await client.post(
            "/v1/apps/shop/deploy",
            json={
                "artifact": b64(first.data),
                "replicas": 1,
                "selector": {"zone": "a"},
                "pinned": True,
            },
        )
        await client.post("/v1/apps/shop/retire")
        second_dir = make_app_dir(tmp_path / "two", command='["python3", "other.py"]')
        from corral.node.artifacts._artifacts import pack_directory

        second = pack_directory(second_dir)
        response = await client.post("/v1/apps/shop/deploy", json={"artifact": b64(second.data)})
    assert response.status_code == 200
    app = await fx.app_record("shop")
    assert app is not None
    assert app.deployment is not None
    assert (app.replicas, app.selector, app.pinned, app.retired) == (1, {"zone": "a"}, True, False)
    assert app.deployment.digest == second.digest


async def test_new_app_defaults_to_replicas_all(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        await client.post("/v1/apps/web/deploy", json={"artifact": b64(packed_app(tmp_path).data)})
    app = await fx.app_record("web")
    assert app is not None
    assert app.replicas == "all"
    assert app.selector == {}


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("shop", {"replicas": 0}, "replicas"),
        ("shop", {"replicas": -2}, "replicas"),
        ("shop", {"replicas": "some"}, "replicas"),
        ("Shop_1", {}, "name"),
        ("-shop", {}, "name"),
        ("shop", {"selector": {}}, "selector"),
        ("shop", {"memory_mb": -1}, "memory_mb"),
        ("shop", {"env": {"1X": "y"}}, "env"),
        ("shop", {"colour": "red"}, "colour"),
        ("shop", {"artifact": "%%%"}, "artifact"),
        ("shop", {"artifact": b64(b"not a tarball")}, "artifact"),
        ("shop", {"max_parallel": 0}, "max_parallel"),
        ("shop", {"max_parallel": True}, "max_parallel"),
        ("shop", {"drain_ms": -1}, "drain_ms"),
        ("shop", {"drain_ms": 10**9}, "drain_ms"),
        ("shop", {"ready_timeout_ms": 0}, "ready_timeout_ms"),
        ("shop", {"ready_timeout_ms": "soon"}, "ready_timeout_ms"),
    ],
)
async def test_bad_deploys_are_400_and_change_nothing(
    fx: Fixture, tmp_path: Path, name: str, body: dict[str, Any], field: str
) -> None:
    body = {"artifact": b64(packed_app(tmp_path).data), **body}
    before = await fx.registry.revision()
    async with fx.client() as client:
        response = await client.post(f"/v1/apps/{name}/deploy", json=body)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert field in response.json()["error"]
    assert await fx.registry.revision() == before


async def test_deploy_without_command_is_400_command(fx: Fixture, tmp_path: Path) -> None:
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("server.py")
        tar.addfile(info, io.BytesIO(b""))
    before = await fx.registry.revision()
    async with fx.client() as client:
        response = await client.post("/v1/apps/shop/deploy", json={"artifact": b64(raw.getvalue())})
    assert (response.status_code, response.json()["field"]) == (400, "command")
    assert await fx.registry.revision() == before
    assert fx.changes == []


async def test_app_operations(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        await client.post("/v1/apps/shop/deploy", json={"artifact": b64(packed_app(tmp_path).data)})
        response = await client.post("/v1/apps/shop/selector", json={"selector": {"disk": "ssd"}})
        assert response.json()["app"]["selector"] == {"disk": "ssd"}
        response = await client.post("/v1/apps/shop/replicas", json={"replicas": "3"})
        assert response.json()["app"]["replicas"] == 3
        response = await client.post("/v1/apps/shop/replicas", json={"replicas": 0})
        assert (response.status_code, response.json()["field"]) == (400, "replicas")
        response = await client.post("/v1/apps/shop/selector", json={"clear": True})
        assert response.json()["app"]["selector"] == {}
        response = await client.post("/v1/apps/shop/selector", json={})
        assert (response.status_code, response.json()["field"]) == (400, "selector")
        assert (await client.post("/v1/apps/shop/retire")).json()["app"]["retired"] is True
        listed = (await client.get("/v1/apps")).json()["apps"]
        assert [a["name"] for a in listed] == ["shop"]
        assert (await client.delete("/v1/apps/shop")).status_code == 200
        missing = await client.post("/v1/apps/shop/replicas", json={"replicas": 1})
        assert missing.status_code == 404
        assert "no app named 'shop'" in missing.json()["error"]
        assert (await client.get("/v1/apps/shop")).status_code == 404
    assert await fx.app_record("shop") is None
    assert fx.changes == [
        "deploy shop",
        "selector shop",
        "replicas shop",
        "selector shop",
        "retire shop",
        "delete shop",
    ]


async def put_node(fx: Fixture, node_id: str, **fields: Any) -> None:
    await fx.registry.put(node_key(node_id), NodeRecord(id=node_id, **fields).encode())


async def test_node_operations_and_drain_refusing_pinned(fx: Fixture) -> None:
    await put_node(fx, "n1")
    await put_node(fx, "n2")
    await fx.registry.put(app_key("db"), AppRecord(name="db", pinned=True).encode())
    await fx.registry.put(
        placement_key("db"), PlacementRecord(nodes=["n1"], decided_at=0.0, fence=1).encode()
    )
    async with fx.client() as client:
        response = await client.post("/v1/nodes/n1/cordon")
        assert response.json()["intent"] == {"cordoned": True, "draining": False, "force": False}
        before = await fx.registry.revision()
        refused = await client.post("/v1/nodes/n1/drain")
        assert refused.status_code == 409
        assert "db" in refused.json()["error"]
        assert "--force" in refused.json()["error"]
        assert await fx.registry.revision() == before
        forced = await client.post("/v1/nodes/n1/drain", json={"force": True})
        assert forced.json()["interrupted"] == ["db"]
        assert (await client.post("/v1/nodes/n2/drain")).status_code == 200
        await client.post("/v1/nodes/n1/uncordon")
        assert (await client.post("/v1/nodes/ghost/cordon")).status_code == 404
        assert (await client.post("/v1/nodes/n1/reboot")).status_code == 404
        bad = await client.post("/v1/nodes/N_1/cordon")
        assert (bad.status_code, bad.json()["field"]) == (400, "node")
    assert await fx.registry.get(intent_key("n1")) is None
    kv = await fx.registry.get(intent_key("n2"))
    assert kv is not None
    assert decode_record(kv.key, kv.value) == NodeIntent(cordoned=True, draining=True)


async def test_ps_lists_instances_with_reloc(fx: Fixture) -> None:
    entry = ServingEntry(revision="a" * 64, public_port=24001, internal_port=24500, state="running")
    await put_node(fx, "n1", serving={"web": entry}, labels={"disk": "ssd"})
    await put_node(fx, "n2", labels={"disk": "ssd"})
    await fx.registry.put(app_key("web"), AppRecord(name="web", replicas=1).encode())
    await fx.registry.put(
        placement_key("web"), PlacementRecord(nodes=["n1"], decided_at=0.0, fence=1).encode()
    )
    async with fx.client() as client:
        answer = (await client.get("/v1/ps")).json()
    assert answer["rows"] == [
        {
            "app": "web",
            "node": "n1",
            "state": "running",
            "public_port": 24001,
            "internal_port": 24500,
            "restarts": 0,
            "revision": "a" * 64,
            "reloc": "yes",
            "reason": None,
            "rollout": None,
            "rollout_step": None,
        }
    ]
    assert answer["coordinator"] == {"holder": "n1", "cooldown_s": 600.0}


async def test_artifacts_are_served_to_peers_with_the_capability(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, registry_limit=10)
    packed = packed_app(tmp_path)
    async with fx.client() as client:
        response = await client.post("/v1/apps/big/deploy", json={"artifact": b64(packed.data)})
        assert response.json()["stored_in_registry"] is False
    assert await fx.registry.get(artifact_key(packed.digest)) is None
    async with fx.client(token=artifact_capability(SECRET, packed.digest)) as peer:
        served = await peer.get(f"/v1/artifacts/{packed.digest}")
        assert served.status_code == 200
        assert served.content == packed.data
        assert (await peer.get("/v1/state")).status_code == 403
        assert (await peer.get(f"/v1/artifacts/{'0' * 64}")).status_code == 403
    async with fx.client(token=artifact_capability("other", packed.digest)) as stranger:
        assert (await stranger.get(f"/v1/artifacts/{packed.digest}")).status_code == 403


async def test_events_recent_and_follow(fx: Fixture) -> None:
    async with fx.client() as client:
        recent = (await client.get("/v1/events")).json()["events"]
        assert [e["seq"] for e in recent] == [0, 1, 2]
        response = await client.get("/v1/events", params={"follow": "1", "limit": "2"})
        lines = [line for line in response.text.splitlines() if line]
    assert len(lines) == 2
    assert all('"test.event"' in line for line in lines)


async def put_web_placed(fx: Fixture, ago: float) -> None:
    """web placed on n1 (serving it) ``ago`` seconds before the fixture's wall clock."""
    now = 1_700_000_000.0
    entry = ServingEntry(revision="a" * 64, public_port=24001, internal_port=24500, state="running")
    await put_node(fx, "n1", serving={"web": entry})
    await put_node(fx, "n2")
    await fx.registry.put(app_key("web"), AppRecord(name="web", replicas=1).encode())
    placed = PlacementRecord(
        nodes=["n1"], decided_at=now - ago, fence=1, placed_at={"n1": now - ago}
    )
    await fx.registry.put(placement_key("web"), placed.encode())


async def ps_answer(fx: Fixture) -> dict[str, Any]:
    async with fx.client() as client:
        response = await client.get("/v1/ps")
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


async def test_ps_takes_the_cooldown_from_the_coordinators_policy(fx: Fixture) -> None:
    # The fixture's wall clock reads 1_700_000_000; web was placed 30 s before.
    await put_web_placed(fx, ago=30)
    assert (await ps_answer(fx))["rows"][0]["reloc"] == (
        "yes (only if its node is lost: cooldown, 9m 30s left)"
    )
    # Not the planner's default: the coordinator's own cooldown.
    fx.coordinator_changed(policy=Policy(cooldown_s=60.0))
    answer = await ps_answer(fx)
    assert answer["rows"][0]["reloc"] == "yes (only if its node is lost: cooldown, 30s left)"
    assert answer["coordinator"] == {"holder": "n1", "cooldown_s": 60.0}
    fx.coordinator_changed(policy=Policy(cooldown_s=20.0))
    assert (await ps_answer(fx))["rows"][0]["reloc"] == "yes"


async def test_ps_takes_a_deferred_moves_until_from_the_coordinator(fx: Fixture) -> None:
    await put_web_placed(fx, ago=30)
    fx.coordinator_changed(deferred=(Deferred("web", "n1", "cooldown: ...", 1_700_000_045.0),))
    assert (await ps_answer(fx))["rows"][0]["reloc"] == (
        "yes (only if its node is lost: cooldown, 45s left)"
    )
    fx.coordinator_changed(deferred=(Deferred("web", "n1", "disruption budget: ...", None),))
    assert (await ps_answer(fx))["rows"][0]["reloc"] == (
        "yes (deferred by the disruption budget: moves on a later pass)"
    )


async def test_ps_says_the_cooldown_is_unknown_when_the_coordinator_cannot_be_asked(
    fx: Fixture,
) -> None:
    await put_web_placed(fx, ago=30)
    why = "cannot ask coordinator n2: peer 'n2' is unreachable"
    fx.coordinator_state = CoordinatorUnavailable("n2", why)
    answer = await ps_answer(fx)
    assert answer["rows"][0]["reloc"] == (
        "yes (cooldown unknown: coordinator n2 cannot be asked)"
    )
    assert answer["coordinator"] == {"holder": "n2", "error": why}


async def test_ps_shows_a_pinned_instance_a_forced_drain_stopped(fx: Fixture) -> None:
    await put_node(fx, "n1")
    await put_node(fx, "n2")
    await fx.registry.put(
        intent_key("n2"), NodeIntent(cordoned=True, draining=True, force=True).encode()
    )
    await fx.registry.put(app_key("db"), AppRecord(name="db", pinned=True).encode())
    # The coordinator keeps the stopped node in placed_at, not in nodes.
    stopped = PlacementRecord(nodes=[], decided_at=5.0, fence=1, placed_at={"n2": 1.0})
    await fx.registry.put(placement_key("db"), stopped.encode())
    rows = (await ps_answer(fx))["rows"]
    assert [(r["app"], r["node"], r["state"], r["reason"]) for r in rows] == [
        ("db", "n2", "stopped", "forced drain of n2; pinned, not started elsewhere")
    ]
    assert rows[0]["reloc"] == "no (forced drain of n2; pinned, not started elsewhere)"


async def test_nodes_lists_intents_and_the_coordinator(fx: Fixture) -> None:
    await put_node(fx, "n1", labels={"zone": "a"})
    await put_node(fx, "n2")
    await fx.registry.put(intent_key("n2"), NodeIntent(cordoned=True).encode())
    await fx.registry.put(
        intent_key("gone"), NodeIntent(cordoned=True, draining=True, force=True).encode()
    )
    await fx.registry.put(
        COORDINATOR_LEASE_KEY, CoordinatorLease(holder="n1", acquired_at=0.0).encode()
    )
    fence = (await fx.registry.get(COORDINATOR_LEASE_KEY)).create_revision  # type: ignore[union-attr]
    async with fx.client() as client:
        answer = (await client.get("/v1/nodes")).json()
    assert (answer["coordinator"], answer["fence"]) == ("n1", fence)
    assert [(n["node"], n["state"], n["coordinator"]) for n in answer["nodes"]] == [
        ("gone", "gone (draining, forced)", False),
        ("n1", "alive", True),
        ("n2", "cordoned", False),
    ]
    assert answer["nodes"][1]["labels"] == {"zone": "a"}


async def test_nodes_carry_the_lease_holders_node_states(fx: Fixture) -> None:
    await put_node(fx, "n1")
    await fx.registry.put(
        COORDINATOR_LEASE_KEY, CoordinatorLease(holder="n1", acquired_at=0.0).encode()
    )
    # Without node states (the fixture's holder does not report them): the records.
    async with fx.client() as client:
        answer = (await client.get("/v1/nodes")).json()
    assert answer["states"]["source"] == "records"
    assert "does not report node states" in answer["states"]["error"]
    assert [(n["node"], n["state"], n["since"]) for n in answer["nodes"]] == [
        ("n1", "alive", None)
    ]
    # The holder's states: n2's record lapsed, it is down in its grace.
    fx.coordinator_changed(
        coordinating=True,
        node_states=(
            NodeStatus("n1", "alive", since=1.0, down_since=None, grace_until=None,
                       incarnation=None, record=True, reason="live"),
            NodeStatus("n2", "down", since=1_699_999_990.0, down_since=1_699_999_990.0,
                       grace_until=1_700_000_290.0, incarnation=4, record=False,
                       reason="its registry record lapsed"),
        ),
    )
    async with fx.client() as client:
        answer = (await client.get("/v1/nodes")).json()
    assert answer["states"] == {"source": "coordinator", "holder": "n1"}
    assert answer["now"] == 1_700_000_000.0
    assert [
        (n["node"], n["state"], n["since"], n["down_since"], n["incarnation"])
        for n in answer["nodes"]
    ] == [
        ("n1", "alive", 1.0, None, None),
        ("n2", "down", 1_699_999_990.0, 1_699_999_990.0, 4),
    ]
    assert "down (moves in 4m 50s)" in nodes_table(answer)


async def test_rollout_options_are_kept_with_the_app(fx: Fixture, tmp_path: Path) -> None:
    packed = packed_app(tmp_path)
    async with fx.client() as client:
        response = await client.post("/v1/apps/shop/deploy", json={"artifact": b64(packed.data)})
        assert response.json()["app"]["rollout"] == {
            "max_parallel": 1,
            "drain_ms": 2000,
            "ready_timeout_ms": 60000,
        }
        first = await fx.app_record("shop")
        response = await client.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(packed.data), "max_parallel": 2, "drain_ms": 0},
        )
        assert response.status_code == 200, response.text
        # a redeploy naming only some options keeps the others
        await client.post(
            "/v1/apps/shop/deploy", json={"artifact": b64(packed.data), "ready_timeout_ms": 5000}
        )
    app = await fx.app_record("shop")
    assert app is not None
    assert first is not None
    assert (app.rollout.max_parallel, app.rollout.drain_ms, app.rollout.ready_timeout_ms) == (
        2,
        0,
        5000,
    )
    # how a revision rolls is not how it runs: still the same revision
    assert app.deployment == first.deployment


async def test_rollback_redeploys_the_previous_revision_or_says_there_is_none(
    fx: Fixture, tmp_path: Path
) -> None:
    from corral.node.artifacts._artifacts import pack_directory

    first = packed_app(tmp_path, "one")
    second = pack_directory(make_app_dir(tmp_path / "two", command='["python3", "other.py"]'))
    async with fx.client() as client:
        await client.post("/v1/apps/shop/deploy", json={"artifact": b64(first.data)})
        refused = await client.post("/v1/apps/shop/rollback")
        assert refused.status_code == 409
        assert "no previous revision" in refused.json()["error"]
        await client.post("/v1/apps/shop/deploy", json={"artifact": b64(second.data)})
        before = await fx.app_record("shop")
        response = await client.post("/v1/apps/shop/rollback")
        missing = await client.post("/v1/apps/nope/rollback")
    assert response.status_code == 200
    assert before is not None
    assert before.deployment is not None
    assert before.previous_deployment is not None
    app = await fx.app_record("shop")
    assert app is not None
    assert app.deployment == before.previous_deployment
    assert app.previous_deployment == before.deployment
    assert response.json()["app"]["deployment"]["revision"] == app.deployment.revision
    assert missing.status_code == 404
