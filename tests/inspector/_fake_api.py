"""An in-process stand-in for a node's HTTP API, as an ``httpx.MockTransport``.

It answers the routes the inspector reads with JSON shaped like a real node's,
keeps cordon / uncordon / drain as intents (refusing a drain of pinned work with
409, as the node does), streams events until :meth:`FakeNode.go_away`, and
refuses every request while gone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

TOKEN = "t0ken"


def _tree(handled: int) -> dict[str, Any]:
    def actor(path: str, name: str, **extra: Any) -> dict[str, Any]:
        return {
            "path": path,
            "name": name,
            "kind": "actor",
            "state": "running",
            "mailbox_depth": 0,
            "messages_handled": handled,
            "restarts": 0,
            "last_error": None,
            "current_message": None,
            "children": [],
            **extra,
        }

    return {
        **actor("/", "node", kind="supervisor"),
        "children": [
            actor("/registration", "registration"),
            {
                **actor("/agent", "agent", kind="supervisor"),
                "children": [
                    actor("/agent/reconciler", "reconciler", restarts=2, last_error="boom"),
                    actor("/agent/processes", "processes", mailbox_depth=3),
                ],
            },
            actor("/coordinator", "coordinator", current_message="coordinator.tick"),
        ],
    }


class FakeNode:
    def __init__(self, node_id: str = "n1") -> None:
        self.node_id = node_id
        self.alive = True
        self.handled = 10
        self.intents: dict[str, str] = {}
        self.posts: list[str] = []
        self.events: list[dict[str, Any]] = [
            {"seq": 1, "kind": "node.started", "path": "/", "fields": {"node": node_id}},
            {
                "seq": 2,
                "kind": "actor.crashed",
                "path": "/agent/reconciler",
                "fields": {"error": "boom"},
            },
            {"seq": 3, "kind": "coordinator.pass", "path": "/coordinator", "fields": {"writes": 2}},
        ]
        self._gone = asyncio.Event()
        self.requests = 0

    def go_away(self) -> None:
        self.alive = False
        self._gone.set()

    def come_back(self) -> None:
        self.alive = True
        self._gone = asyncio.Event()

    # ------------------------------------------------------------------ views

    def nodes(self) -> dict[str, Any]:
        def node(node_id: str, labels: dict[str, str], serving: int) -> dict[str, Any]:
            intent = self.intents.get(node_id)
            return {
                "node": node_id,
                "state": intent or "alive",
                "serving": serving,
                "labels": labels,
                "rack": None,
                "datacenter": None,
                "api_address": f"127.0.0.1:{7400 if node_id == 'n1' else 7410}",
                "coordinator": node_id == "n1",
                "capacity": {
                    "memory_mb": 1000,
                    "memory_free_mb": 600,
                    "disk_mb": 2000,
                    "disk_free_mb": 1500,
                },
            }

        return {
            "nodes": [node("n1", {"zone": "a"}, 2), node("n2", {"zone": "b"}, 2)],
            "coordinator": "n1",
            "fence": 7,
        }

    def ps(self) -> dict[str, Any]:
        def row(app: str, node: str, reloc: str, port: int) -> dict[str, Any]:
            return {
                "app": app,
                "node": node,
                "state": "running",
                "public_port": port,
                "internal_port": port + 1,
                "restarts": 0,
                "revision": "d5d8146adc47ffff",
                "reloc": reloc,
                "reason": None,
            }

        return {
            "rows": [
                row("greeter", "n1", "no (replicas all: runs on every eligible node)", 24554),
                row("greeter", "n2", "no (replicas all: runs on every eligible node)", 25187),
                row("hello", "n1", "yes", 24399),
                row("keeper", "n2", "no (pinned)", 25371),
            ],
            "coordinator": {"holder": "n1", "cooldown_s": 600},
        }

    def apps(self) -> dict[str, Any]:
        return {
            "apps": [
                {"name": "greeter", "replicas": "all", "selector": {}, "pinned": False},
                {"name": "hello", "replicas": 1, "selector": {}, "pinned": False},
                {"name": "keeper", "replicas": 1, "selector": {"zone": "b"}, "pinned": True},
            ],
            "undecodable": [],
        }

    def state(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "coordination": {
                "node": "n1",
                "unplaced": [
                    {
                        "app": "db",
                        "reason": "placement-unavailable",
                        "message": "cannot place db: no node carries the required labels disk=nvme",
                    }
                ],
                "deferred": [],
                "stranded": [],
            },
        }

    # ------------------------------------------------------------------ transport

    async def _stream(self) -> AsyncIterator[bytes]:
        for event in self.events:
            yield (json.dumps(event) + "\n").encode()
        await self._gone.wait()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if not self.alive:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(403, json={"error": "wrong bearer token"})
        path = request.url.path
        if request.method == "GET":
            if path == "/v1/events" and request.url.params.get("follow") == "1":
                return httpx.Response(200, content=self._stream())
            if path == "/v1/events":
                # The other node (n2, on port 7410) has events of its own.
                remote = request.url.port == 7410
                event = {
                    "seq": 9,
                    "kind": "reconcile.stop",
                    "path": "/agent/reconciler",
                    "fields": {"app": "on-n2" if remote else "on-n1"},
                }
                return httpx.Response(200, json={"events": [event]})
            if path == "/v1/actors":
                self.handled += 5
                return httpx.Response(200, json=_tree(self.handled))
            views = {
                "/v1/state": self.state,
                "/v1/nodes": self.nodes,
                "/v1/ps": self.ps,
                "/v1/apps": self.apps,
            }
            if path in views:
                return httpx.Response(200, json=views[path]())
            return httpx.Response(404, json={"error": f"no route {path}"})
        parts = path.strip("/").split("/")
        if request.method == "POST" and len(parts) == 4 and parts[1] == "nodes":
            node, verb = parts[2], parts[3]
            self.posts.append(f"{verb} {node}")
            if verb == "drain" and node == "n2":
                return httpx.Response(
                    409, json={"error": f"drain of {node} refused: it runs pinned app(s) keeper"}
                )
            if verb == "uncordon":
                self.intents.pop(node, None)
            else:
                self.intents[node] = "cordoned" if verb == "cordon" else "draining"
            return httpx.Response(
                200, json={"node": node, "intent": {"cordoned": True}, "interrupted": []}
            )
        return httpx.Response(404, json={"error": f"no route {path}"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)
