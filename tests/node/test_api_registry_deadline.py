"""A registry that stops answering is reported as such: the API answers 504 naming it
within the deadline, says whether a write may have been applied, and the command line
tells a stuck node from a missing one (in-memory registry, virtual time)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from corral.node.artifacts._artifact_store import ArtifactStore
from corral.node.cli import _client as client_module
from corral.node.cli._cli import main
from corral.node.cli._client import DEFAULT_TIMEOUT
from corral.node.server._api import ApiServices, build_api
from corral.node.server._deadline import REGISTRY_DEADLINE
from corral.registry import (
    AppRecord,
    Compare,
    KeyValue,
    MemoryRegistry,
    TxnOp,
    TxnResult,
    app_key,
    decode_record,
)

from .conftest import b64, packed_app
from .test_api import SECRET, TOKEN

NAME = "etcd://10.9.8.7:2379"
AUTH = ["--api", "http://127.0.0.1:9", "--token", "t"]
DEADLINE = 2.0


class FreezableRegistry(MemoryRegistry):
    """A memory registry that can stop answering, as a SIGSTOPped etcd does: while
    ``frozen`` reads never return; with ``frozen_after_write`` a txn is applied and
    then never answered."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = False
        self.frozen_after_write = False

    async def get(self, key: str) -> KeyValue | None:
        if self.frozen:
            await trio.sleep_forever()
        return await super().get(key)

    async def range(self, prefix: str) -> list[KeyValue]:
        if self.frozen:
            await trio.sleep_forever()
        return await super().range(prefix)

    async def txn(
        self,
        compares: Sequence[Compare],
        on_success: Sequence[TxnOp],
        on_failure: Sequence[TxnOp] = (),
    ) -> TxnResult:
        result = await super().txn(compares, on_success, on_failure)
        if self.frozen_after_write:
            self.frozen = True
            await trio.sleep_forever()
        return result


def api(tmp_path: Path, registry: FreezableRegistry) -> Any:
    async def state() -> dict[str, Any]:
        return {}

    store_registry = MemoryRegistry()  # artifacts: not what these tests freeze
    return build_api(
        ApiServices(
            token=TOKEN,
            secret=SECRET,
            node_id="n1",
            registry=registry,
            artifacts=ArtifactStore(
                store_registry, tmp_path / "artifacts", node_id="n1", secret=SECRET
            ),
            state=state,
            actors=dict,
            events=list,
            wall_clock=lambda: 1_700_000_000.0,
            registry_name=NAME,
            registry_deadline=DEADLINE,
        )
    )


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://node",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )


async def test_a_frozen_registry_is_a_504_naming_it_within_the_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = FreezableRegistry()
    app = api(tmp_path, registry)
    registry.frozen = True
    async with client(app) as http:
        for method, path in [("GET", "/v1/ps"), ("GET", "/v1/apps"), ("POST", "/v1/apps/a/retire")]:
            started = trio.current_time()
            response = await http.request(method, path)
            assert trio.current_time() - started == DEADLINE
            assert response.status_code == 504, response.text
            body = response.json()
            assert body["registry"] == NAME
            assert body["may_have_applied"] is False
            assert f"the registry {NAME} did not answer a read within 2 s" in body["error"]
            assert "changed nothing" in body["error"]
            assert "This node is up" in body["error"]


async def test_a_deploy_whose_write_is_not_answered_may_have_been_applied_and_repeating_it_is_safe(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    registry = FreezableRegistry()
    app = api(tmp_path, registry)
    body = {"artifact": b64(packed_app(tmp_path).data)}
    async with client(app) as http:
        registry.frozen_after_write = True
        response = await http.post("/v1/apps/shop/deploy", json=body)
        assert response.status_code == 504, response.text
        answer = response.json()
        assert answer["may_have_applied"] is True
        assert "the change may have been applied; `corral ps`" in answer["error"]
        assert "repeating the same request is safe" in answer["error"]
        # It was applied.
        registry.frozen = registry.frozen_after_write = False
        kv = await registry.get(app_key("shop"))
        assert kv is not None
        applied = decode_record(kv.key, kv.value)
        assert isinstance(applied, AppRecord)
        assert applied.deployment is not None
        # The same deploy again succeeds and keeps the revision the nodes run.
        again = await http.post("/v1/apps/shop/deploy", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["app"]["deployment"]["revision"] == applied.deployment.revision
    assert again.json()["app"]["previous_deployment"] is None


def test_the_command_line_waits_longer_than_the_node_s_registry_deadline() -> None:
    assert REGISTRY_DEADLINE * 2 <= DEFAULT_TIMEOUT


def test_a_node_that_takes_the_request_and_does_not_answer_is_not_called_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    monkeypatch.setattr(client_module, "client_transport", lambda: httpx.MockTransport(stuck))
    code = main(["ps", *AUTH])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot reach" not in err
    assert "took the request but did not answer within 30 s" in err
    assert "it is up but slow, or its registry is" in err
    assert "may have been applied, `corral ps` shows whether it was" in err


def test_the_command_line_prints_the_node_s_504_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.node.server._deadline import RegistryTooSlow

    error = RegistryTooSlow(NAME, 5.0, may_have_applied=True)

    def slow_registry(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            504, json={"error": str(error), "registry": NAME, "may_have_applied": True}
        )

    monkeypatch.setattr(
        client_module, "client_transport", lambda: httpx.MockTransport(slow_registry)
    )
    code = main(["app", "replicas", "--name", "shop", "--count", "2", *AUTH])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"corral: error: {error}\n"
    assert f"the registry {NAME} did not answer within 5 s after this node sent it" in err

