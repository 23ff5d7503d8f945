"""One process per node id: who may write ``nodes/<id>`` (pure decisions)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.actors.node_record import NodeIdentity, claim_on_start
from corral.actors.node_record._record import fresh_record, rewritten_record, taken_by
from corral.registry import NodeRecord, decode_record

ME = NodeIdentity(
    "n1",
    peer_address="127.0.0.1:7401",
    api_address="127.0.0.1:7400",
    instance="a" * 32,
    pid=100,
    hostname="box",
)


def held(instance: str, *, pid: int = 200, hostname: str = "box", **fields: str) -> NodeRecord:
    return NodeRecord(
        id="n1",
        instance=instance,
        pid=pid,
        hostname=hostname,
        peer_address=fields.get("peer", "127.0.0.1:7501"),
        api_address=fields.get("api", "127.0.0.1:7500"),
    )


OTHER = "b" * 32


@pytest.mark.parametrize(
    ("stored", "holder_running", "refused", "replaces"),
    [
        # Nobody holds it: take it.
        (None, False, False, ""),
        # Our own record (an actor restart within this process).
        (held("a" * 32), True, False, ""),
        # Another live process on this host: refuse.
        (held(OTHER), True, True, ""),
        # A previous life on this host whose process is gone: take it over.
        (held(OTHER), False, False, OTHER),
        # Another host: its process cannot be probed, so it counts as alive.
        (held(OTHER, hostname="elsewhere"), False, True, ""),
        # No pid recorded: cannot tell it is gone.
        (held(OTHER, pid=0), False, True, ""),
        # A build without instance tokens: the address rule.
        (held("", peer="127.0.0.1:7401", api="127.0.0.1:7400"), True, False, ""),
        (held("", peer="", api=""), True, False, ""),
        (held(""), True, True, ""),
    ],
)
def test_claim_on_start_table(
    stored: NodeRecord | None, holder_running: bool, refused: bool, replaces: str
) -> None:
    claim = claim_on_start(ME, stored, holder_running=holder_running)
    assert (claim.refused is not None, claim.replaces) == (refused, replaces)


def test_the_refusal_names_the_holder_and_the_fix() -> None:
    claim = claim_on_start(ME, held(OTHER, pid=4242), holder_running=True)
    assert claim.refused is not None
    message = claim.refused.refused_message()
    assert "\n" not in message
    for part in ("'n1'", "instance bbbbbbbbbbbb…", "pid 4242 on host box", "api 127.0.0.1:7500",
                 "--node-id", "--node-ttl-ms"):
        assert part in message


def test_the_taken_line_says_why_and_what_to_do() -> None:
    holder = taken_by(ME, held(OTHER, pid=4242))
    assert holder is not None
    assert holder.taken_message() == (
        "node n1: another corral process (instance bbbbbbbbbbbb…, pid 4242 on host box, "
        "peer 127.0.0.1:7501, api 127.0.0.1:7500) now holds nodes/n1; this process stops. "
        "Give each node its own --node-id, or stop the other one."
    )


@pytest.mark.parametrize(
    ("stored", "replaces", "free"),
    [
        (None, "", True),  # absent: the lease lapsed and nobody took it
        (held("a" * 32), "", True),  # ours
        (held(""), "", True),  # an older build's record: overwritten as before
        (held(OTHER), "", False),  # a newcomer took it while we were away
        (held(OTHER), OTHER, True),  # the gone previous life we were allowed to replace
        (held(OTHER), "c" * 32, False),
    ],
)
def test_taken_by_table(stored: NodeRecord | None, replaces: str, free: bool) -> None:
    assert (taken_by(ME, stored, replaces=replaces) is None) == free


instances = st.sampled_from(["", "a" * 32, OTHER, "c" * 32])
records = st.none() | st.builds(
    held,
    instances,
    pid=st.integers(0, 5),
    hostname=st.sampled_from(["box", "elsewhere", ""]),
)


@settings(max_examples=300, deadline=None)
@given(stored=records, holder_running=st.booleans(), replaces=instances)
def test_a_live_other_instance_is_never_overwritten(
    stored: NodeRecord | None, holder_running: bool, replaces: str
) -> None:
    claim = claim_on_start(ME, stored, holder_running=holder_running)
    # A starting process never claims a record of another instance whose process
    # may be running.
    if stored is not None and stored.instance not in ("", ME.instance):
        if holder_running or stored.hostname != ME.hostname or stored.pid == 0:
            assert claim.refused is not None
    # What the start allowed, the first write allows; what it refused is never written.
    if claim.refused is None:
        assert taken_by(ME, stored, replaces=claim.replaces) is None
    # The running process writes only absent, own, older-build or replaced records.
    holder = taken_by(ME, stored, replaces=replaces)
    writable = (
        stored is None
        or stored.instance in ("", ME.instance)
        or stored.instance == replaces
    )
    assert (holder is None) == writable
    if holder is not None:
        assert stored is not None
        assert (holder.instance, holder.pid, holder.hostname) == (
            stored.instance, stored.pid, stored.hostname,
        )


def test_every_record_written_carries_this_process() -> None:
    fresh = fresh_record(ME, capacity=None, started_at=5.0, previous=held(OTHER))
    assert (fresh.instance, fresh.pid, fresh.hostname) == ("a" * 32, 100, "box")
    again = rewritten_record(ME, capacity=None, last_seen=fresh, stored=None)
    assert again.instance == ME.instance


def test_the_instance_fields_round_trip_and_old_records_still_decode() -> None:
    record = held(OTHER, pid=42)
    assert decode_record(record.key, record.encode()) == record
    old = b'{"v":1,"id":"n1","state":"alive"}'
    decoded = decode_record("nodes/n1", old)
    assert isinstance(decoded, NodeRecord)
    assert (decoded.instance, decoded.pid, decoded.hostname) == ("", 0, "")
    bad = dataclasses.replace(record, pid=-1).encode()
    assert "pid" in getattr(decode_record("nodes/n1", bad), "reason", "")
