"""The inspector's pure pane decisions: hostile or partial JSON never makes them raise."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from corral.inspector import _model as model

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "nodes",
                    "rows",
                    "apps",
                    "children",
                    "path",
                    "name",
                    "node",
                    "app",
                    "state",
                    "capacity",
                    "memory_mb",
                    "memory_free_mb",
                    "serving",
                    "coordination",
                    "unplaced",
                    "deferred",
                    "stranded",
                    "error",
                    "holder",
                    "until",
                    "messages_handled",
                    "mailbox_depth",
                    "pinned",
                    "reloc",
                    "seq",
                    "fields",
                    "kind",
                    "routes",
                    "proxies",
                ]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=30,
)
OBJECT = st.dictionaries(
    st.sampled_from(
        ["nodes", "rows", "apps", "coordination", "path", "children", "routes", "version"]
    ),
    JSON,
    max_size=4,
)


@given(OBJECT, OBJECT, OBJECT, st.sampled_from(["cordon", "uncordon", "drain"]))
def test_no_pane_raises_on_any_json(
    nodes: dict[str, Any], ps: dict[str, Any], other: dict[str, Any], verb: str
) -> None:
    for row in model.cluster_rows(nodes, ps):
        assert len(row) == len(model.CLUSTER_COLUMNS)
    model.cluster_summary(nodes)
    model.node_ids(nodes)
    for row in model.app_rows(ps):
        assert len(row) == len(model.APP_COLUMNS)
    model.app_specs(other)
    model.held_back(other, 0.0)
    model.route_lines(other)
    history = model.ActorHistory()
    history.observe(other, 1.0)
    history.observe(other, 2.0)
    for _, row in model.actor_rows(other, history):
        assert len(row) == len(model.ACTOR_COLUMNS)
    model.actor_details(other, "/", [e for e in model._list(ps.get("rows")) if isinstance(e, dict)])
    text, refused = model.action_preview(verb, "n1", ps, other)
    assert text
    assert isinstance(refused, bool)


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=40))
def test_sparkline_is_one_block_per_recent_value(values: list[float]) -> None:
    line = model.sparkline(values, width=20)
    assert len(line) == min(len(values), 20)
    assert set(line) <= set(model.SPARK)
    if values and max(values[-20:]) > 0:
        assert model.SPARK[-1] in line  # the largest recent value reaches the top


@given(st.floats(allow_nan=False), st.floats(allow_nan=False))
def test_bar_is_bounded(used: float, total: float) -> None:
    text = model.bar(used, total)
    if total > 0:
        assert text.startswith("[")
        assert text.count("#") + text.count("-") == model.BAR_WIDTH
    else:
        assert text == "-"


def test_handled_rate_and_a_restart_resetting_the_count() -> None:
    history = model.ActorHistory()
    history.observe({"path": "/a", "messages_handled": 10}, now=0.0)
    history.observe({"path": "/a", "messages_handled": 30}, now=4.0)
    assert history.rate("/a") == 5.0
    history.observe({"path": "/a", "messages_handled": 2}, now=5.0)  # restarted
    assert history.rate("/a") is None
    history.observe({"path": "/b"}, now=6.0)  # /a gone: forgotten
    assert history.depths("/a") == []


def test_drain_preview_names_pinned_work_and_what_moves() -> None:
    ps = {
        "rows": [
            {"app": "web", "node": "n2", "state": "running", "reloc": "yes"},
            {"app": "db", "node": "n2", "state": "running", "reloc": "no (pinned)"},
        ]
    }
    apps = {"apps": [{"name": "db", "pinned": True}, {"name": "web"}]}
    text, refused = model.action_preview("drain", "n2", ps, apps)
    assert refused
    assert "pinned app(s) db" in text
    text, refused = model.action_preview("drain", "n2", ps, {"apps": [{"name": "web"}]})
    assert not refused
    assert "Would move elsewhere: db, web." in text
