"""The copy planner: rack spread, stability, never zero holders, determinism."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.node.artifacts._copy_plan import (
    KeepPlan,
    LiveRevision,
    Site,
    choose_holders,
    fetch_order,
    keep_plan,
    live_revisions,
    plan_copies,
    revisions_to_remove,
)
from corral.registry import AppRecord, Deployment, PlacementRecord


def digest(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


sites = st.dictionaries(
    st.from_regex(r"n[0-9]{1,2}", fullmatch=True),
    st.builds(Site, st.sampled_from(["r1", "r2", "r3"]), st.sampled_from(["d1", "d2"])),
    min_size=1,
    max_size=12,
)
digests = st.lists(st.integers(0, 10_000).map(digest), min_size=1, max_size=20, unique=True)


@given(sites, digests, st.integers(1, 5))
def test_holders_cover_as_many_racks_as_they_can(
    nodes: dict[str, Site], ds: list[str], copies: int
) -> None:
    racks = {s.rack_key for s in nodes.values()}
    for d in ds:
        holders = choose_holders(d, nodes, copies)
        assert len(holders) == min(copies, len(nodes))
        covered = {nodes[h].rack_key for h in holders}
        assert len(covered) == min(len(holders), len(racks))


@given(sites, digests, st.integers(1, 5))
def test_the_plan_is_deterministic(nodes: dict[str, Site], ds: list[str], copies: int) -> None:
    revisions = {d: LiveRevision(d) for d in ds}
    shuffled = dict(reversed(list(nodes.items())))
    assert plan_copies(revisions, nodes, {}, copies) == plan_copies(
        dict(reversed(list(revisions.items()))), shuffled, {}, copies
    )


@settings(max_examples=60)
@given(st.integers(3, 10), st.integers(1, 4), st.sampled_from(["r1", "r2"]))
def test_adding_a_node_in_a_known_rack_moves_few_copies(size: int, copies: int, rack: str) -> None:
    nodes = {f"n{i}": Site(f"r{1 + i % 2}", "d1") for i in range(size)}
    ds = [digest(i) for i in range(300)]
    before = {d: set(choose_holders(d, nodes, copies)) for d in ds}
    grown = {**nodes, "new": Site(rack, "d1")}
    after = {d: set(choose_holders(d, grown, copies)) for d in ds}
    moved = 0
    for d in ds:
        gained = after[d] - before[d]
        assert gained <= {"new"}  # no copy moves between old nodes
        assert len(before[d] - after[d]) <= len(gained)
        moved += len(gained)
    # The new node takes about its fair share of copies, not more than twice it.
    fair = len(ds) * min(copies, size + 1) / (size + 1)
    assert moved <= 2 * fair + 10


@given(sites, digests, st.integers(1, 4), st.data())
def test_a_live_revision_keeps_a_holder_that_has_it(
    nodes: dict[str, Site], ds: list[str], copies: int, data: st.DataObject
) -> None:
    held = {n: frozenset(data.draw(st.lists(st.sampled_from(ds), max_size=3))) for n in nodes}
    plan = plan_copies({d: LiveRevision(d) for d in ds}, nodes, held, copies)
    for d, holders in plan.items():
        having = {n for n in nodes if d in held[n]}
        assert len(holders) >= min(copies, len(nodes))
        if having:
            assert having & set(holders), (d, holders, having)
            assert len(having & set(holders)) >= min(copies, len(having))


@given(sites, st.integers(1, 4), st.data())
def test_every_runner_holds_its_revision(
    nodes: dict[str, Site], copies: int, data: st.DataObject
) -> None:
    runners = frozenset(data.draw(st.lists(st.sampled_from(sorted(nodes)), max_size=6)))
    d = digest(1)
    holders = plan_copies({d: LiveRevision(d, ("a",), runners)}, nodes, {}, copies)[d]
    assert runners <= set(holders)


def test_live_revisions_are_current_and_previous() -> None:
    app = AppRecord(
        "web",
        deployment=Deployment(digest(2), ["x"]),
        previous_deployment=Deployment(digest(1), ["x"]),
    )
    placement = PlacementRecord(nodes=["n1"], decided_at=0.0, fence=1)
    live = live_revisions({"web": app}, {"web": placement})
    assert live == {
        digest(2): LiveRevision(digest(2), ("web",), frozenset({"n1"})),
        digest(1): LiveRevision(digest(1), ("web",), frozenset()),
    }


def test_a_node_releases_after_the_grace_and_never_a_running_revision() -> None:
    a, b, c, d = digest(1), digest(2), digest(3), digest(4)
    assignments = {a: ["me"], b: ["other"], c: ["other"]}
    first = keep_plan(
        "me", assignments, [b, c], running=[c], live=[a, b, c, d], since={}, now=10.0, grace=5.0
    )
    assert first == KeepPlan(fetch=(a,), release=(), since={b: 10.0})
    later = keep_plan(
        "me",
        assignments,
        [b, c, d],
        running=[c],
        live=[a, b, c, d],
        since=first.since,
        now=15.0,
        grace=5.0,
    )
    # d is live and not assigned yet: kept; b waited out its grace; c runs here.
    assert later.release == (b,)
    assert later.fetch == (a,)


def test_fetches_go_to_the_same_rack_first() -> None:
    sites_ = {
        "me": Site("r1", "d1"),
        "far": Site("r9", "d2"),
        "near": Site("r1", "d1"),
        "mid": Site("r2", "d1"),
    }
    assert fetch_order(["far", "mid", "near", "me"], "me", sites_, digest(1)) == [
        "near",
        "mid",
        "far",
    ]


def test_live_copies_are_the_artifacts_digests_not_the_revisions() -> None:
    # An env-only redeploy is a new revision of the same artifact: one live copy.
    current = Deployment.of(digest(2), ["x"], {"GREETING": "hi"})
    previous = Deployment.of(digest(2), ["x"], {})
    assert current.revision != previous.revision
    app = AppRecord("web", deployment=current, previous_deployment=previous)
    assert list(live_revisions({"web": app}, {})) == [digest(2)]


def test_only_current_and_previous_revisions_stay_unpacked() -> None:
    app = AppRecord(
        "web",
        deployment=Deployment(digest(3), ["x"]),
        previous_deployment=Deployment(digest(2), ["x"]),
    )
    doomed = revisions_to_remove(
        {"web": [digest(1), digest(2), digest(3), digest(4)], "gone": [digest(5)]},
        {"web": app},
        {"web": [digest(4)]},
    )
    assert doomed == {"web": [digest(1)], "gone": [digest(5)]}


@given(
    st.lists(st.integers(0, 30).map(digest), max_size=12, unique=True),
    st.data(),
    st.floats(0, 100),
    st.floats(0, 10),
)
def test_a_node_never_releases_what_it_is_assigned_runs_or_waits_for(
    have: list[str], data: st.DataObject, now: float, grace: float
) -> None:
    pool = [digest(i) for i in range(31)]
    mine = set(data.draw(st.lists(st.sampled_from(pool), max_size=6)))
    running = set(data.draw(st.lists(st.sampled_from(pool), max_size=3)))
    live = set(data.draw(st.lists(st.sampled_from(pool), max_size=6)))
    assignments = {d: ["me"] for d in mine} | {
        d: ["other"] for d in live - mine if data.draw(st.booleans())
    }
    since = {d: data.draw(st.floats(0, now)) for d in have if data.draw(st.booleans())}
    plan = keep_plan(
        "me", assignments, have, running=running, live=live, since=since, now=now, grace=grace
    )
    released = set(plan.release)
    assert not released & (mine | running)
    assert not released & {d for d in live if d not in assignments}
    assert released <= set(have)
    for d in released:
        assert now - since.get(d, now) >= grace
    assert set(plan.fetch) == mine - set(have)
