"""An instance whose revision a node cannot get onto disk is published failed, with the
reason and no ports, and every node's ps and state show it so."""

from __future__ import annotations

from typing import Any

import httpx

from corral.node.artifacts._artifact_store import ArtifactStore
from corral.node.cli._format import ps_table, state_summary
from corral.node.server._api import ApiServices, build_api
from corral.node.server._views import ps_rows
from corral.registry import (
    AppRecord,
    Deployment,
    MemoryRegistry,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
    app_key,
    node_key,
    placement_key,
)

REV = "b" * 64
WHY = "cannot get revision bbbbbbbbbbbb onto disk: artifact: refused: too large (member 'zeros')"


def records() -> tuple[dict[str, AppRecord], dict[str, PlacementRecord], dict[str, NodeRecord]]:
    apps = {"web": AppRecord(name="web", replicas=2, deployment=Deployment(REV, ["true"]))}
    placements = {"web": PlacementRecord(nodes=["n1", "n2"], decided_at=0.0, fence=1)}
    failed = ServingEntry(REV, 0, 0, "failed", 0, WHY)
    nodes = {"n1": NodeRecord(id="n1", serving={"web": failed}), "n2": NodeRecord(id="n2")}
    return apps, placements, nodes


def test_a_published_unpack_failure_is_a_failed_row_with_its_reason_and_no_ports() -> None:
    apps, placements, nodes = records()
    rows = ps_rows(apps, placements, nodes, {})
    assert [(r.node, r.state, r.reason, r.public_port, r.internal_port) for r in rows] == [
        ("n1", "failed", WHY, None, None),
        ("n2", "starting", None, None, None),
    ]


def test_the_ps_table_and_the_state_summary_say_why() -> None:
    apps, placements, nodes = records()
    rows = [r.to_json() for r in ps_rows(apps, placements, nodes, {})]
    assert f"failed web on n1: {WHY}" in ps_table(rows)
    state = {
        "node_id": "n1",
        "reconcile": {
            "time": 990.0,
            "token": 7,
            "skipped": True,
            "serving": 0,
            "errors": [],
            "failed": [
                {
                    "app": "web",
                    "revision": REV,
                    "reason": "artifact: refused: too large (member 'zeros')",
                    "attempts": 3,
                    "retry_in": 20.0,
                }
            ],
        },
    }
    text = state_summary(state, now=1000.0)
    assert (
        "failed      web revision bbbbbbbbbbbb: artifact: refused: too large (member 'zeros') "
        "(attempt 3, next try in 20s)"
    ) in text


async def test_get_ps_on_any_node_shows_the_failed_instance(tmp_path: Any) -> None:
    registry = MemoryRegistry()
    apps, placements, nodes = records()
    await registry.put(app_key("web"), apps["web"].encode())
    await registry.put(placement_key("web"), placements["web"].encode())
    for node in nodes.values():
        await registry.put(node_key(node.id), node.encode())

    async def state() -> dict[str, Any]:
        return {}

    app = build_api(
        ApiServices(
            token="t",
            secret="s",
            node_id="n2",  # not the node that failed
            registry=registry,
            artifacts=ArtifactStore(registry, tmp_path, node_id="n2", secret="s"),
            state=state,
            actors=dict,
            events=list,
            wall_clock=lambda: 1_700_000_000.0,
        )
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://node",
        headers={"Authorization": "Bearer t"},
    ) as client:
        response = await client.get("/v1/ps")
    rows = response.json()["rows"]
    assert [(r["node"], r["state"], r["reason"]) for r in rows] == [
        ("n1", "failed", WHY),
        ("n2", "starting", None),
    ]
