"""``GET /v1/events?follow=1``: a node serves at most ``max_event_streams`` streams at
once; past it, 429 with Retry-After. Driven through the ASGI app with virtual time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from corral.node.artifacts._artifact_store import ArtifactStore
from corral.node.server._api import EVENT_POLL_INTERVAL, ApiServices, build_api
from corral.registry import MemoryRegistry

from .test_api import SECRET, TOKEN

CAP = 3


@dataclass
class Stream:
    """One client of the event stream: what the app sent it, and a way to leave."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    leave: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return int(starts[0]["status"]) if starts else None

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )


def services(tmp_path: Path, events: list[dict[str, Any]]) -> ApiServices:
    registry = MemoryRegistry()

    async def state() -> dict[str, Any]:
        return {}

    return ApiServices(
        token=TOKEN,
        secret=SECRET,
        node_id="n1",
        registry=registry,
        artifacts=ArtifactStore(registry, tmp_path / "artifacts", node_id="n1", secret=SECRET),
        state=state,
        actors=dict,
        events=lambda: list(events),
        wall_clock=lambda: 1_700_000_000.0,
        max_event_streams=CAP,
    )


async def follow(app: Any, stream: Stream) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/events",
        "raw_path": b"/v1/events",
        "query_string": b"follow=1",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()), (b"host", b"node")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 7400),
    }
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await stream.leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        stream.messages.append(message)

    try:
        await app(scope, receive, send)
    finally:
        stream.ended.set()


def event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "kind": "test.event", "path": "/x", "fields": {}}


async def test_streams_past_the_cap_get_a_429_and_a_slot_frees_when_a_reader_leaves(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    events = [event(1)]
    app = build_api(services(tmp_path, events))
    streams = [Stream() for _ in range(CAP + 2)]
    async with trio.open_nursery() as nursery:
        for stream in streams[:CAP]:
            nursery.start_soon(follow, app, stream)
        await trio.sleep(1)
        for stream in streams[CAP:]:
            await follow(app, stream)  # answered at once: refused
        assert [s.status for s in streams] == [200] * CAP + [429, 429]
        refused = streams[CAP]
        assert refused.headers["retry-after"] == "5"
        error = json.loads(refused.body)["error"]
        assert f"already serves {CAP} event streams" in error
        assert "try again in 5 s" in error
        # The open streams follow: a new event reaches every one.
        events.append(event(2))
        await trio.sleep(EVENT_POLL_INTERVAL * 2)
        for stream in streams[:CAP]:
            assert [json.loads(line)["seq"] for line in stream.body.splitlines()] == [1, 2]
        # One reader leaves: its slot is free again, and only one.
        streams[0].leave.set()
        await streams[0].ended.wait()
        again, past = Stream(), Stream()
        nursery.start_soon(follow, app, again)
        await trio.sleep(1)
        await follow(app, past)
        assert (again.status, past.status) == (200, 429)
        for stream in [*streams[1:CAP], again]:
            stream.leave.set()


async def test_readers_that_leave_hold_no_slot(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app = build_api(services(tmp_path, [event(1), event(2)]))
    for _ in range(CAP * 3):
        stream = Stream()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, app, stream)
            await trio.sleep(1)
            stream.leave.set()
        assert stream.status == 200
