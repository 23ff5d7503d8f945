"""The routing renderer: omission rules, full URLs, aliases, determinism, versions, codecs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral.actors.routing
from corral.actors.routing import (
    Instance,
    NodeRoutes,
    RouteTable,
    RoutingInputs,
    decode_table_json,
    encode_table_json,
    next_table,
    normalize_domain,
    render_routes,
)
from corral.actors.routing._render import (
    HeldBack,
    changed,
    decode_table_cbor,
    encode_table_cbor,
    node_routes_from_record,
)
from corral.registry import InvalidName, NodeRecord, ServingEntry, decode_record
from corral.registry._records import RoutingTable
from corral.transport import SchemaError

APPS = ["shop", "blog", "api", "www"]
NODES = ["n1", "n2", "n3", "n4"]
DOMAINS = ["shop.test", "blog.test", "api.test", "www.test", "a.test", "b.test", "c.test"]
REV = "0" * 64

instances = st.builds(
    Instance,
    public_port=st.one_of(st.none(), st.integers(24000, 24010)),
    running=st.booleans(),
    ready=st.booleans(),
)


@st.composite
def routing_inputs(draw: st.DrawFn) -> RoutingInputs:
    apps = draw(st.lists(st.sampled_from(APPS), unique=True, max_size=4))
    pool = list(DOMAINS)
    app_domains: dict[str, list[str]] = {}
    for app in apps:
        app_domains[app] = draw(st.lists(st.sampled_from(pool), unique=True, max_size=3))
    aliases = draw(
        st.dictionaries(st.sampled_from(DOMAINS), st.sampled_from([*APPS, "ghost"]), max_size=3)
    )
    placements = {
        app: draw(st.lists(st.sampled_from(NODES), unique=True, max_size=4)) for app in apps
    }
    nodes: dict[str, NodeRoutes] = {}
    for node in draw(st.lists(st.sampled_from(NODES), unique=True, max_size=4)):
        host = draw(st.sampled_from(["127.0.0.1", "10.0.0.7", "", "::1"]))
        served = draw(st.dictionaries(st.sampled_from(APPS), instances, max_size=4))
        nodes[node] = NodeRoutes(host, served)
    return RoutingInputs(app_domains, aliases, placements, nodes)


def expected_backends(inputs: RoutingInputs, app: str) -> set[str]:
    """The rules, written out the slow way."""
    urls = set()
    for node_id in inputs.placements.get(app, ()):
        node = inputs.nodes.get(node_id)
        if node is None or not node.advertise_host:
            continue
        inst = node.instances.get(app)
        if inst is None or not inst.running or not inst.ready or inst.public_port is None:
            continue
        host = f"[{node.advertise_host}]" if ":" in node.advertise_host else node.advertise_host
        urls.add(f"http://{host}:{inst.public_port}")
    return urls


@settings(max_examples=200)
@given(routing_inputs())
def test_every_listed_backend_is_placed_running_ready_and_a_full_url(inputs: RoutingInputs) -> None:
    rendered = render_routes(inputs)
    owners = owners_of(inputs)
    expected = {
        d: tuple(sorted(expected_backends(inputs, app)))
        for d, app in owners.items()
        if expected_backends(inputs, app)
    }
    assert rendered.domains == expected
    for urls in rendered.domains.values():
        assert urls, "never an empty list"
        assert list(urls) == sorted(set(urls))
        for url in urls:
            assert url.startswith("http://")
            assert url.rsplit(":", 1)[1].isdigit()


@settings(max_examples=100)
@given(routing_inputs(), st.randoms(use_true_random=False))
def test_render_is_deterministic_whatever_the_input_order(
    inputs: RoutingInputs, rnd: random.Random
) -> None:
    def shuffled_dict(d):  # type: ignore[no-untyped-def]
        items = list(d.items())
        rnd.shuffle(items)
        return dict(items)

    def shuffled_list(xs):  # type: ignore[no-untyped-def]
        xs = list(xs)
        rnd.shuffle(xs)
        return xs

    other = RoutingInputs(
        shuffled_dict({a: shuffled_list(ds) for a, ds in inputs.app_domains.items()}),
        shuffled_dict(inputs.aliases),
        shuffled_dict({a: shuffled_list(ns) for a, ns in inputs.placements.items()}),
        shuffled_dict(inputs.nodes),
    )
    first, second = render_routes(inputs), render_routes(other)
    assert first == second
    assert list(first.domains) == sorted(first.domains)
    assert list(first.held_back) == sorted(
        first.held_back, key=lambda h: (h.app, h.node or "", h.why)
    )


@settings(max_examples=100)
@given(routing_inputs())
def test_a_second_render_over_unchanged_inputs_writes_nothing(inputs: RoutingInputs) -> None:
    first = next_table(None, render_routes(inputs), fence=4)
    assert first is not None
    assert first.version.revision == 1
    assert next_table(first, render_routes(inputs), fence=4) is None
    # A stale coordinator (smaller fence) writes nothing either.
    assert next_table(first, render_routes(RoutingInputs()), fence=3) is None


def owners_of(inputs: RoutingInputs) -> dict[str, str]:
    """domain -> serving app, by the claim rules: apps in name order, then aliases."""
    owners: dict[str, str] = {}
    for app in sorted(inputs.app_domains):
        for d in inputs.app_domains[app]:
            owners.setdefault(d, app)
    for d, target in inputs.aliases.items():
        if d not in owners and target in inputs.app_domains:
            owners[d] = target
    return owners


@settings(max_examples=200)
@given(routing_inputs())
def test_every_placed_instance_left_out_is_held_back_with_a_reason(inputs: RoutingInputs) -> None:
    rendered = render_routes(inputs)
    held = {(h.app, h.node) for h in rendered.held_back}
    for app in set(owners_of(inputs).values()):
        for node_id in inputs.placements.get(app, ()):
            alone = RoutingInputs(placements={app: [node_id]}, nodes=inputs.nodes)
            if not expected_backends(alone, app):
                assert (app, node_id) in held
            else:
                assert (app, node_id) not in held


def node(host: str, **apps: Instance) -> NodeRoutes:
    return NodeRoutes(host, apps)


def ok(port: int) -> Instance:
    return Instance(port, running=True, ready=True)


def test_not_running_or_not_ready_instances_are_absent_and_held_back() -> None:
    inputs = RoutingInputs(
        app_domains={"shop": ["shop.test"]},
        placements={"shop": ["n1", "n2", "n3", "n4"]},
        nodes={
            "n1": node("10.0.0.1", shop=ok(24001)),
            "n2": node(
                "10.0.0.2", shop=Instance(24002, running=False, ready=False, state="crash-loop")
            ),
            "n3": node("10.0.0.3", shop=Instance(24003, running=True, ready=False)),
        },
    )
    rendered = render_routes(inputs)
    assert rendered.domains == {"shop.test": ("http://10.0.0.1:24001",)}
    assert [(h.app, h.node) for h in rendered.held_back] == [
        ("shop", "n2"),
        ("shop", "n3"),
        ("shop", "n4"),
    ]
    assert "crash-loop" in rendered.held_back[0].why
    assert "not ready" in rendered.held_back[1].why
    assert "no record" in rendered.held_back[2].why


def test_a_domain_without_backend_is_omitted_not_empty() -> None:
    inputs = RoutingInputs(
        app_domains={"shop": ["shop.test"], "blog": ["blog.test"]},
        placements={"shop": ["n1"], "blog": ["n1"]},
        nodes={"n1": node("127.0.0.1", shop=ok(24001), blog=Instance(24002, True, False))},
    )
    assert render_routes(inputs).domains == {"shop.test": ("http://127.0.0.1:24001",)}


def test_an_alias_serves_its_target_apps_backends_and_follows_a_flip() -> None:
    base = dict(
        app_domains={"v1": ["v1.test"], "v2": ["v2.test"]},
        placements={"v1": ["n1"], "v2": ["n2"]},
        nodes={"n1": node("127.0.0.1", v1=ok(24001)), "n2": node("127.0.0.1", v2=ok(24002))},
    )
    before = render_routes(RoutingInputs(aliases={"shop.test": "v1"}, **base))  # type: ignore[arg-type]
    after = render_routes(RoutingInputs(aliases={"shop.test": "v2"}, **base))  # type: ignore[arg-type]
    assert before.domains["shop.test"] == ("http://127.0.0.1:24001",)
    assert after.domains["shop.test"] == ("http://127.0.0.1:24002",)
    old = next_table(None, before, fence=1)
    assert old is not None
    new = next_table(old, after, fence=1)
    assert new is not None
    assert new.version > old.version
    diff = changed(old, new)
    assert diff.domains_added == ()
    assert diff.domains_removed == ()
    assert diff.backends_added == {"shop.test": ("http://127.0.0.1:24002",)}
    assert diff.backends_removed == {"shop.test": ("http://127.0.0.1:24001",)}
    assert not diff.empty


def test_conflicts_and_bad_names_are_held_back_not_fatal() -> None:
    inputs = RoutingInputs(
        app_domains={"a": ["Shop.Test.", "bad_name!"], "b": ["shop.test", "b.test"]},
        aliases={"shop.test": "b", "x.test": "ghost"},
        placements={"a": ["n1"], "b": ["n1"]},
        nodes={"n1": node("127.0.0.1", a=ok(24001), b=ok(24002))},
    )
    rendered = render_routes(inputs)
    assert rendered.domains == {
        "b.test": ("http://127.0.0.1:24002",),
        "shop.test": ("http://127.0.0.1:24001",),
    }
    whys = " | ".join(h.why for h in rendered.held_back)
    assert "already claimed by app a" in whys
    assert "bad_name!" in whys
    assert "ghost, which does not exist" in whys
    assert "app a claims the domain itself" in whys


def test_ipv6_hosts_are_bracketed() -> None:
    inputs = RoutingInputs(
        app_domains={"a": ["a.test"]},
        placements={"a": ["n1"]},
        nodes={"n1": node("::1", a=ok(24001))},
    )
    assert render_routes(inputs).domains == {"a.test": ("http://[::1]:24001",)}


@pytest.mark.parametrize(
    ("given_name", "expected"),
    [("Shop.Example", "shop.example"), (" a-b.c1. ", "a-b.c1"), ("x" * 63, "x" * 63)],
)
def test_normalize_domain_accepts(given_name: str, expected: str) -> None:
    assert normalize_domain(given_name) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "-a.test",
        "a-.test",
        "a..test",
        "a_b.test",
        "x" * 64,
        ".".join(["a" * 50] * 5) + "x" * 10,
        "a b",
    ],
)
def test_normalize_domain_refuses(bad: str) -> None:
    with pytest.raises(InvalidName, match="invalid domain"):
        normalize_domain(bad)


def test_node_record_becomes_routing_input() -> None:
    record = NodeRecord(
        id="n1",
        advertise_host="10.1.1.1",
        serving={
            "a": ServingEntry(REV, 24001, 24501, state="running"),
            "b": ServingEntry(REV, 24002, 24502, state="starting"),
        },
    )
    routes = node_routes_from_record(record)
    assert routes.advertise_host == "10.1.1.1"
    assert routes.instances["a"] == Instance(24001, True, True, "running")
    assert routes.instances["b"].running is False
    told = node_routes_from_record(record, ready={"b": True})
    assert told.instances["a"].ready is False  # readiness as told, not guessed


@settings(max_examples=100)
@given(routing_inputs(), st.integers(0, 2**40), st.integers(1, 2**40))
def test_codecs_round_trip_and_stay_readable_by_the_registry_record(
    inputs: RoutingInputs, fence: int, revision: int
) -> None:
    rendered = render_routes(inputs)
    table = RouteTable(fence, revision, rendered.domains, rendered.held_back)
    assert decode_table_json(encode_table_json(table)) == table
    assert decode_table_cbor(encode_table_cbor(table)) == table
    legacy = decode_record("routing", encode_table_json(table))
    assert isinstance(legacy, RoutingTable)
    assert legacy.domains == {d: list(u) for d, u in table.domains.items()}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xff", "not UTF-8 JSON"),
        (b"[]", "not a JSON object"),
        (b'{"v":2,"fence":1,"revision":1}', "schema version"),
        (b'{"v":1,"fence":"1","revision":1}', "fence"),
        (b'{"v":1,"fence":1,"revision":1,"domains":{"a.test":[]}}', "lists no backend"),
        (b'{"v":1,"fence":1,"revision":1,"domains":{"A_B":["http://x:1"]}}', "invalid domain"),
        (
            b'{"v":1,"fence":1,"revision":1,"domains":{"a.test":["ftp://x:1"]}}',
            "not http://host:port",
        ),
        (b'{"v":1,"fence":1,"revision":1,"extra":1}', "no field 'extra'"),
    ],
)
def test_decode_refuses_bad_tables_naming_the_cause(data: bytes, match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        decode_table_json(data)


def test_changed_reports_added_and_removed_domains() -> None:
    old = RouteTable(1, 1, {"a.test": ("http://h:1",), "b.test": ("http://h:2",)})
    new = RouteTable(1, 2, {"b.test": ("http://h:2", "http://h:3"), "c.test": ("http://h:4",)})
    diff = changed(old, new)
    assert diff.domains_added == ("c.test",)
    assert diff.domains_removed == ("a.test",)
    assert diff.backends_added == {"b.test": ("http://h:3",), "c.test": ("http://h:4",)}
    assert diff.backends_removed == {"a.test": ("http://h:1",)}
    assert changed(new, new).empty


def test_held_back_is_a_plain_record() -> None:
    assert HeldBack("a", None, "why") < HeldBack("b", "n1", "why")


def test_exports_are_sorted_and_resolve() -> None:
    names = corral.actors.routing.__all__
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))
    for name in names:
        assert hasattr(corral.actors.routing, name), name
