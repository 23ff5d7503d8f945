"""The coordinator's mirror of its input prefixes, kept current by a watch (pure).

Theory of operation
-------------------
A pass decides from every record under :data:`~._inputs.INPUT_PREFIXES`. Reading them
all on every pass costs O(records) in the registry and in the coordinator, and passes
come every tick and after every burst of changes: at fleet size that was most of what
a coordinator did. So the lease holder reads them once (:meth:`ViewStore.load`: one
snapshot at one revision) and from then on applies what its watch of those prefixes
delivers (:meth:`ViewStore.apply`), plus its own writes as they succeed
(:meth:`ViewStore.record`). :meth:`ViewStore.view` hands out a
:class:`~._inputs.RegistryView` whose sections (:class:`~._inputs.Section`) say what
changed since the last view, so what is built from them can be updated by the change
alone.

Each key keeps the revision it was last seen at — a write, or a deletion (a
tombstone). A change at or below the key's revision is old news and is dropped: the
snapshot already holds it, or the coordinator applied its own write first. So the
store ends where a fresh read would, whatever order the watch of each prefix and the
writes arrive in.

Until a snapshot is loaded, the changes that arrive are kept (bounded, oldest dropped
first) and those above the snapshot's revision are applied on load: a change the
watch delivers while the snapshot is being read is not lost. A watch that lost
changes (a compacted revision), a refused write and a lost lease make the store
:meth:`ViewStore.invalidate`: the next pass reads everything again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from corral.actors.coordinator._inputs import (
    INPUT_PREFIXES,
    RegistryView,
    Section,
    classify,
    view_of_sections,
)
from corral.registry import KeyValue, Record, Undecodable, decode_record

__all__ = ["ViewStore"]

#: Changes kept while no snapshot is loaded (the watch runs ahead of the first read).
BACKLOG = 100_000
#: Deleted keys remembered (each with the revision of its deletion) before the store
#: asks for a fresh snapshot, which needs none: a coordinator that outlives many
#: deleted apps keeps a bounded mirror.
TOMBSTONES = 10_000

_Entry = tuple[int, Record | Undecodable | None]  # (revision, record; None: deleted)


class ViewStore:
    """The records under the input prefixes as of the newest change applied.

    Args:
        backlog: changes kept while no snapshot is loaded.
    """

    def __init__(self, *, backlog: int = BACKLOG, tombstones: int = TOMBSTONES) -> None:
        self._entries: dict[str, _Entry] = {}
        self._tombstones = 0
        self._max_tombstones = tombstones
        self._pending: dict[str, _Entry] = {}  # changed since the last view
        self._backlog: deque[tuple[str, KeyValue | None, int]] = deque(maxlen=backlog)
        self._dropped_above = 0  # the newest revision the backlog lost
        self._sections: dict[str, Section[Any]] = {}
        self._view: RegistryView | None = None
        self.loaded = False
        #: The revision of the snapshot loaded (0: none).
        self.revision = 0
        #: How many changes from outside (the watch) the store took so far: a reader
        #: that noted it knows whether anything came since.
        self.changes = 0

    def invalidate(self) -> None:
        """Forget the snapshot: the next pass reads everything again. Changes from now
        on are kept for the next :meth:`load`."""
        self.loaded = False
        self.revision = 0
        self._backlog.clear()
        self._dropped_above = 0

    def load(self, kvs: Iterable[KeyValue], revision: int) -> None:
        """Take a snapshot read at ``revision`` as the store's content, then apply the
        changes kept since that are newer. Unchanged records stay the same objects."""
        before = self._entries
        entries: dict[str, _Entry] = {}
        for kv in kvs:
            known = before.get(kv.key)
            record = (
                known[1]
                if known is not None and known[0] == kv.mod_revision and known[1] is not None
                else decode_record(kv.key, kv.value)
            )
            entries[kv.key] = (kv.mod_revision, record)
        # What differs from what the store held is pending, so the next view's sections
        # name exactly those keys.
        pending = {
            key: entry
            for key, entry in entries.items()
            if (known := before.get(key)) is None or known[1] is not entry[1]
        }
        for key, known in before.items():
            if known[1] is not None and key not in entries:
                pending[key] = (revision, None)
        self._entries = entries
        self._tombstones = 0
        self._pending.update(pending)
        self.loaded = True
        self.revision = revision
        backlog, self._backlog = list(self._backlog), deque(maxlen=self._backlog.maxlen)
        lost_newer = self._dropped_above > revision
        self._dropped_above = 0
        for key, change, at in backlog:
            self._apply(key, change, at)
        if lost_newer:
            self.invalidate()  # the backlog overflowed with changes the snapshot lacks

    def apply(self, key: str, kv: KeyValue | None, revision: int) -> bool:
        """A change the watch delivered: ``kv`` put at ``revision``, or (``kv`` None) the
        key deleted at ``revision``. Returns whether the store changed (False for old
        news: the snapshot or one of the coordinator's own writes had it)."""
        if not self.loaded:
            if len(self._backlog) == self._backlog.maxlen:
                self._dropped_above = max(self._dropped_above, self._backlog[0][2])
            self._backlog.append((key, kv, revision))
            self.changes += 1
            return True
        changed = self._apply(key, kv, revision)
        self.changes += changed
        return changed

    def record(self, key: str, record: Record | None, revision: int) -> None:
        """One of the coordinator's own writes succeeded at ``revision`` (``record``
        None: a deletion); the watch delivers it again later, as old news."""
        if self.loaded:
            self._set(key, (revision, record))

    def _apply(self, key: str, kv: KeyValue | None, revision: int) -> bool:
        if revision <= self.revision:
            return False
        known = self._entries.get(key)
        if known is not None and known[0] >= revision:
            return False
        if kv is None:
            if known is None or known[1] is None:
                self._bury(key, revision)  # older puts are old news now
                return False
            self._set(key, (revision, None))
            return True
        self._set(key, (revision, decode_record(kv.key, kv.value)))
        return True

    def _set(self, key: str, entry: _Entry) -> None:
        known = self._entries.get(key)
        if entry[1] is None:
            self._bury(key, entry[0])
        else:
            if known is not None and known[1] is None:
                self._tombstones -= 1
            self._entries[key] = entry
        self._pending[key] = entry

    def _bury(self, key: str, revision: int) -> None:
        """Remember ``key`` deleted at ``revision``."""
        known = self._entries.get(key)
        if known is None or known[1] is not None:
            self._tombstones += 1
        self._entries[key] = (revision, None)
        if self._tombstones > self._max_tombstones:
            self.invalidate()  # the next pass reads a snapshot: it needs no tombstone

    def view(self) -> RegistryView:
        """The records as they stand: a section that nothing touched since the last view
        is the very same object; one that changed is derived from it (its ``changed``
        names the keys)."""
        if self._view is not None and not self._pending:
            return self._view
        updates: dict[str, dict[str, Any]] = {}
        for key, (revision, record) in self._pending.items():
            if record is None:
                # A deletion: the key leaves whichever section held it.
                for section in ("undecodable", _section_of(key)):
                    updates.setdefault(section, {})[_name_in(section, key)] = None
                continue
            section, name, value = classify(key, record, revision)
            updates.setdefault(section, {})[name] = value
            if section == "undecodable":
                updates.setdefault(_section_of(key), {})[_name_in(_section_of(key), key)] = None
            else:
                updates.setdefault("undecodable", {})[key] = None
        self._pending = {}
        sections = {name: self._sections.get(name, Section()) for name in _SECTION_NAMES}
        for name, changes in updates.items():
            sections[name] = sections[name].derive(changes)
        self._sections = sections
        self._view = view_of_sections(sections)
        return self._view


_SECTION_OF = {
    "apps/": "apps",
    "nodes/": "nodes",
    "intent/": "intents",
    "placement/": "placements",
    "down/": "down",
}
_SECTION_NAMES = (*_SECTION_OF.values(), "undecodable")
assert set(_SECTION_OF) == set(INPUT_PREFIXES)


def _section_of(key: str) -> str:
    """The section a well-formed record under ``key`` belongs to."""
    return _SECTION_OF.get(key.partition("/")[0] + "/", "undecodable")


def _name_in(section: str, key: str) -> str:
    """A key's name in ``section`` (the undecodable section is by key)."""
    return key if section == "undecodable" else key.partition("/")[2]
