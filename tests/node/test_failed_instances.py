"""An instance whose revision this node cannot get onto disk is shown failed, with the
reason, in ps (rows, API, table) and in state."""

from __future__ import annotations

from typing import Any

import httpx

from corral.node._api import ApiServices, build_api
from corral.node._artifact_store import ArtifactStore
from corral.node._format import ps_table, state_summary
from corral.node._views import ps_rows
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

REV, OLD = "b" * 64, "a" * 64
WHY = "revision bbbbbbbbbbbb: artifact: refused: too large (member 'zeros')"


def records() -> tuple[dict[str, AppRecord], dict[str, PlacementRecord], dict[str, NodeRecord]]:
    apps = {"web": AppRecord(name="web", replicas=2, deployment=Deployment(REV, ["true"]))}
    placements = {"web": PlacementRecord(nodes=["n1", "n2"], decided_at=0.0, fence=1)}
    nodes = {"n1": NodeRecord(id="n1"), "n2": NodeRecord(id="n2")}
    return apps, placements, nodes


def test_a_placed_instance_that_cannot_unpack_is_failed_with_its_reason() -> None:
    apps, placements, nodes = records()
    rows = ps_rows(apps, placements, nodes, {}, failed={("web", "n1"): WHY})
    assert [(r.node, r.state, r.reason) for r in rows] == [
        ("n1", "failed", WHY),
        ("n2", "starting", None),  # another node's failure is not known here
    ]
    assert [r.state for r in ps_rows(apps, placements, nodes, {})] == ["starting", "starting"]


def test_an_old_revision_still_running_keeps_its_state_and_shows_why_the_new_one_waits() -> None:
    apps, placements, nodes = records()
    nodes["n1"] = NodeRecord(
        id="n1", serving={"web": ServingEntry(OLD, 24001, 24002, "running", 0)}
    )
    (row, _) = ps_rows(apps, placements, nodes, {}, failed={("web", "n1"): WHY})
    assert (row.state, row.revision, row.reason) == ("running", OLD, WHY)


def test_the_ps_table_and_the_state_summary_say_why() -> None:
    apps, placements, nodes = records()
    rows = [r.to_json() for r in ps_rows(apps, placements, nodes, {}, failed={("web", "n1"): WHY})]
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


async def test_get_ps_shows_this_nodes_failed_instances(tmp_path: Any) -> None:
    registry = MemoryRegistry()
    apps, placements, nodes = records()
    await registry.put(app_key("web"), apps["web"].encode())
    await registry.put(placement_key("web"), placements["web"].encode())
    for node in nodes.values():
        await registry.put(node_key(node.id), node.encode())

    async def state() -> dict[str, Any]:
        return {}

    async def failed_here() -> dict[str, str]:
        return {"web": WHY}

    app = build_api(
        ApiServices(
            token="t",
            secret="s",
            node_id="n1",
            registry=registry,
            artifacts=ArtifactStore(registry, tmp_path, node_id="n1", secret="s"),
            state=state,
            actors=dict,
            events=list,
            wall_clock=lambda: 1_700_000_000.0,
            failed_here=failed_here,
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
