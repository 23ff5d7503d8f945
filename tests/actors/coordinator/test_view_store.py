"""The coordinator's mirror of its inputs: whatever order the watch's changes, its own
writes and snapshots arrive in, it hands out what a fresh read would give, and what is
built from it with the input cache (planner input, node states, digest) is exactly what
is built from a fresh read with no cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.coordinator._inputs import (
    InputCache,
    Section,
    inputs_digest,
    plan_input_from_view,
    states_from_view,
    view_from_kvs,
)
from corral.actors.coordinator._view import ViewStore
from corral.actors.planner import Policy
from corral.registry import (
    AppRecord,
    KeyValue,
    MeasuredCapacity,
    NodeDown,
    NodeIntent,
    NodeRecord,
    PlacementRecord,
    Record,
    app_key,
    down_key,
    intent_key,
    node_key,
    placement_key,
)

POLICY = Policy()
APPS = ["a", "b", "c", "d"]
NODES = ["n1", "n2", "n3"]


class Registry:
    """What a registry holds (key -> KeyValue), and every change in revision order."""

    def __init__(self) -> None:
        self.kvs: dict[str, KeyValue] = {}
        self.revision = 1
        self.log: list[tuple[str, KeyValue | None, int]] = []

    def put(self, key: str, value: bytes) -> tuple[str, KeyValue | None, int]:
        self.revision += 1
        before = self.kvs.get(key)
        kv = KeyValue(
            key,
            value,
            create_revision=self.revision if before is None else before.create_revision,
            mod_revision=self.revision,
            version=1 if before is None else before.version + 1,
        )
        self.kvs[key] = kv
        self.log.append((key, kv, self.revision))
        return self.log[-1]

    def delete(self, key: str) -> tuple[str, KeyValue | None, int] | None:
        if key not in self.kvs:
            return None
        self.revision += 1
        del self.kvs[key]
        self.log.append((key, None, self.revision))
        return self.log[-1]


def record_for(kind: int, which: int, step: int) -> tuple[str, Record | bytes]:
    app, node = APPS[which % len(APPS)], NODES[which % len(NODES)]
    if kind == 0:
        return app_key(app), AppRecord(app, replicas=1 + step % 3, memory_mb=step % 2)
    if kind == 1:
        nodes = sorted({NODES[(which + i) % len(NODES)] for i in range(1 + step % 2)})
        return placement_key(app), PlacementRecord(
            nodes=nodes, decided_at=float(step), fence=2, placed_at=dict.fromkeys(nodes, 1.0)
        )
    if kind == 2:
        return node_key(node), NodeRecord(
            node, rack=f"r{step % 2}", capacity=MeasuredCapacity(100, 50 + step, 1000, 900)
        )
    if kind == 3:
        return intent_key(node), NodeIntent(cordoned=bool(step % 2))
    if kind == 4:
        return down_key(node), NodeDown(node, down_since=float(step))
    if kind == 5:
        return app_key(app), b"{not json"  # undecodable
    return app_key(app), NodeRecord(node)  # a record of the wrong kind for its key


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "delete", "own", "load", "late", "stale"]),
        # Placements and apps most often: most of what is built from the view is theirs.
        st.sampled_from([0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 5, 6]),
        st.integers(0, 11),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations)
def test_the_store_ends_where_a_fresh_read_does_and_so_does_what_is_built_from_it(
    ops: list[tuple[str, int, int]],
) -> None:
    registry = Registry()
    store = ViewStore()
    cache = InputCache()
    held: list[tuple[str, KeyValue | None, int]] = []  # changes the watch delivers late
    for step, (op, kind, which) in enumerate(ops, start=2):
        key, record = record_for(kind, which, step)
        value = record if isinstance(record, bytes) else record.encode()
        if op == "load":
            store.load(list(registry.kvs.values()), registry.revision)
        elif op == "delete":
            change = registry.delete(key)
            if change is not None:
                store.apply(*change)
        elif op == "own":
            # The coordinator's own write: recorded first, delivered by the watch later.
            change = registry.put(key, value)
            if isinstance(record, bytes | NodeRecord) and key.startswith("apps/"):
                store.apply(*change)  # (the coordinator writes no such thing)
            else:
                store.record(key, record, change[2])
                held.append(change)
        elif op == "late":
            held.append(registry.put(key, value))  # delivered at the end
        elif op == "stale" and registry.log:
            store.apply(*registry.log[which % len(registry.log)])  # old news again
        else:
            store.apply(*registry.put(key, value))
        if not store.loaded or held:
            continue
        check(store, registry, cache)
    for change in held:
        store.apply(*change)
    if not store.loaded:
        store.load(list(registry.kvs.values()), registry.revision)
    check(store, registry, cache)


def check(store: ViewStore, registry: Registry, cache: InputCache) -> None:
    mirrored = store.view()
    fresh = view_from_kvs(list(registry.kvs.values()))
    assert mirrored == fresh
    for section in (mirrored.apps, mirrored.nodes, mirrored.placements, mirrored.down):
        assert list(section) == sorted(section)
    cached = plan_input_from_view(mirrored, policy=POLICY, now=50.0, cache=cache)
    plain = plan_input_from_view(fresh, policy=POLICY, now=50.0)
    assert cached == plain
    assert inputs_digest(cached, cache=cache) == inputs_digest(plain)
    assert states_from_view(mirrored, policy=POLICY, now=50.0, cache=cache) == states_from_view(
        fresh, policy=POLICY, now=50.0
    )


def test_a_change_delivered_while_the_snapshot_is_read_is_not_lost() -> None:
    registry = Registry()
    registry.put(app_key("a"), AppRecord("a").encode())
    store = ViewStore()
    snapshot = list(registry.kvs.values()), registry.revision
    # The watch delivers a change made after the snapshot, before it is loaded...
    store.apply(*registry.put(app_key("b"), AppRecord("b").encode()))
    # ...and one the snapshot already holds.
    store.apply(*registry.log[0])
    store.load(*snapshot)
    assert set(store.view().apps) == {"a", "b"}


def test_a_put_delivered_after_the_deletion_that_followed_it_is_old_news() -> None:
    registry = Registry()
    store = ViewStore()
    store.load([], registry.revision)
    put = registry.put(app_key("a"), AppRecord("a").encode())
    deletion = registry.delete(app_key("a"))
    assert deletion is not None
    assert not store.apply(*deletion)  # a key the store never held
    assert not store.apply(*put)  # late: the deletion came after it
    assert dict(store.view().apps) == {}


def test_an_unchanged_section_is_the_same_object_and_a_changed_one_names_its_changes() -> None:
    registry = Registry()
    for app in APPS:
        registry.put(app_key(app), AppRecord(app).encode())
    store = ViewStore()
    store.load(list(registry.kvs.values()), registry.revision)
    first = store.view()
    assert store.apply(*registry.put(node_key("n1"), NodeRecord("n1").encode()))
    second = store.view()
    assert second.apps is first.apps
    assert isinstance(second.nodes, Section)
    assert second.nodes.changes_since(first.nodes) == {"n1"}
    third_change = registry.put(app_key("b"), AppRecord("b", replicas=2).encode())
    assert store.apply(*third_change)
    assert not store.apply(*third_change)  # old news
    third = store.view()
    assert isinstance(third.apps, Section)
    assert third.apps.changes_since(second.apps) == {"b"}
    assert third.apps.changes_since(first.apps) == {"b"}
    assert third.nodes.changes_since(first.nodes) == {"n1"}
    assert third.apps["a"] is second.apps["a"]


def test_an_overflowing_backlog_that_lost_newer_changes_asks_for_a_new_read() -> None:
    registry = Registry()
    store = ViewStore(backlog=2)
    snapshot = list(registry.kvs.values()), registry.revision
    for app in APPS:  # four changes, newer than the snapshot: two are dropped
        store.apply(*registry.put(app_key(app), AppRecord(app).encode()))
    store.load(*snapshot)
    assert not store.loaded
    store.load(list(registry.kvs.values()), registry.revision)
    assert set(store.view().apps) == set(APPS)


def test_many_deleted_keys_ask_for_a_new_read_rather_than_piling_up() -> None:
    registry = Registry()
    for app in APPS:
        registry.put(app_key(app), AppRecord(app).encode())
    store = ViewStore(tombstones=3)
    store.load(list(registry.kvs.values()), registry.revision)
    for app in APPS[:3]:
        deletion = registry.delete(app_key(app))
        assert deletion is not None
        assert store.apply(*deletion)
    assert store.loaded
    deletion = registry.delete(app_key(APPS[3]))
    assert deletion is not None
    store.apply(*deletion)
    assert not store.loaded  # a fresh snapshot remembers no deletion
    store.load(list(registry.kvs.values()), registry.revision)
    assert dict(store.view().apps) == {}
