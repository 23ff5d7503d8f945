"""A deploy's --node-selector only adds or narrows; removing a key is
``corral app selector --unset`` or ``--clear``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.node import RequestInvalid
from corral.node.server._operations import deploy_selector

from .conftest import b64, packed_app
from .test_api import Fixture
from .test_domains_cli import fx as cli_fx  # noqa: F401 (a fixture)
from .test_domains_cli import run

KEYS = st.sampled_from(["a", "b", "c", "zone", "disk"])
VALUES = st.sampled_from(["1", "2", "ssd"])
SELECTORS = st.dictionaries(KEYS, VALUES, max_size=4)


@given(SELECTORS, SELECTORS)
def test_a_deploy_selector_keeps_every_constraint_or_is_refused(
    current: dict[str, str], requested: dict[str, str]
) -> None:
    conflicting = {k for k in requested if k in current and current[k] != requested[k]}
    if conflicting:
        with pytest.raises(RequestInvalid) as caught:
            deploy_selector("shop", current, requested)
        assert caught.value.field == "selector"
        assert all(f"{k}={current[k]}" in caught.value.message for k in conflicting)
        assert "corral app selector --name shop" in caught.value.message
        return
    after = deploy_selector("shop", current, requested)
    assert current.items() <= after.items()  # no constraint lifted or changed
    assert requested.items() <= after.items()  # every one asked for is there
    assert after.keys() == current.keys() | requested.keys()


@given(SELECTORS)
def test_a_deploy_naming_no_selector_keeps_it(current: dict[str, str]) -> None:
    assert deploy_selector("shop", current, None) == current


@pytest.fixture
async def fx(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path)


async def test_a_redeploy_with_part_of_the_selector_keeps_the_rest(
    fx: Fixture, tmp_path: Path
) -> None:
    artifact = b64(packed_app(tmp_path).data)
    async with fx.client() as client:
        first = await client.post(
            "/v1/apps/shop/deploy", json={"artifact": artifact, "selector": ["a=1", "b=2"]}
        )
        assert first.status_code == 201, first.text
        again = await client.post(
            "/v1/apps/shop/deploy", json={"artifact": artifact, "selector": ["a=1"]}
        )
        assert again.status_code == 200, again.text
        assert again.json()["app"]["selector"] == {"a": "1", "b": "2"}
        narrowed = await client.post(
            "/v1/apps/shop/deploy", json={"artifact": artifact, "selector": {"c": "3"}}
        )
        assert narrowed.json()["app"]["selector"] == {"a": "1", "b": "2", "c": "3"}
    app = await fx.app_record("shop")
    assert app is not None
    assert app.selector == {"a": "1", "b": "2", "c": "3"}


async def test_a_deploy_changing_a_selector_value_is_a_400_that_writes_nothing(
    fx: Fixture, tmp_path: Path
) -> None:
    async with fx.client() as client:
        first = await client.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(packed_app(tmp_path).data), "selector": {"a": "1", "b": "2"}},
        )
        assert first.status_code == 201
        before = await fx.registry.revision()
        other = packed_app(tmp_path, "other")  # a new artifact: nothing of it is stored
        changed = await client.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(other.data), "selector": {"a": "2"}},
        )
    assert changed.status_code == 400
    assert changed.json()["field"] == "selector"
    error = changed.json()["error"]
    assert "app shop is constrained to a=1 (the deploy says a=2)" in error
    assert "corral app selector --name shop --set a=2 --set b=2" in error
    assert await fx.registry.revision() == before


async def test_unset_removes_only_the_keys_named(fx: Fixture, tmp_path: Path) -> None:
    async with fx.client() as client:
        await client.post(
            "/v1/apps/shop/deploy",
            json={"artifact": b64(packed_app(tmp_path).data), "selector": ["a=1", "b=2", "c=3"]},
        )
        unset = await client.post("/v1/apps/shop/selector", json={"unset": ["b", "c"]})
        assert unset.status_code == 200, unset.text
        assert unset.json()["app"]["selector"] == {"a": "1"}
        missing = await client.post("/v1/apps/shop/selector", json={"unset": ["zone"]})
        assert missing.status_code == 404
        assert "has no key zone (its selector: a=1)" in missing.json()["error"]
        for body in ({"unset": []}, {"unset": "a"}, {"unset": ["a"], "clear": True}):
            refused = await client.post("/v1/apps/shop/selector", json=body)
            assert refused.status_code == 400, body
    app = await fx.app_record("shop")
    assert app is not None
    assert app.selector == {"a": "1"}


def test_cli_deploy_narrows_and_app_selector_unset_widens(
    cli_fx: Fixture,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        ["deploy", "APP", "--name", "shop", "--node-selector", "a=1", "--node-selector", "b=2"],
        capsys,
    )
    assert code == 0, err
    code, out, err = run(["deploy", "APP", "--name", "shop", "--node-selector", "a=1"], capsys)
    assert code == 0, err
    assert "selector a=1, b=2" in out
    code, out, err = run(["deploy", "APP", "--name", "shop", "--node-selector", "b=3"], capsys)
    assert code == 2
    assert "selector: app shop is constrained to b=2" in err
    code, out, err = run(["app", "selector", "--name", "shop", "--unset", "b"], capsys)
    assert code == 0, err
    assert out == "shop: selector a=1\n"
    code, out, err = run(["app", "selector", "--name", "shop", "--clear"], capsys)
    assert out == "shop: selector cleared: every node may serve it\n"


def test_deploy_help_says_the_selector_only_narrows(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.node.cli._cli import main

    for argv, needle in (
        (["deploy", "--help"], "a deploy narrows where an app runs and never lifts a constraint"),
        (["app", "selector", "--help"], "remove key K from the selector, keeping the others"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert needle in " ".join(capsys.readouterr().out.split())
