import corral.actors.membership as membership
from corral.actors.membership import GetMembership
from corral.actors.membership._actor import Leave, MemberInfo, MembershipView
from corral.actors.membership._messages import (
    Ack,
    Gossip,
    Nack,
    Ping,
    PingReq,
    StateSync,
    Update,
)
from corral.transport import decode_message, encode_message


def isort_order(name: str) -> tuple[int, str]:
    """ruff's __all__ order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert membership.__all__ == sorted(membership.__all__, key=isort_order)
    for name in membership.__all__:
        assert hasattr(membership, name), name
    assert {"SwimMembership", "membership_child_spec"} <= set(membership.__all__)


def test_every_wire_message_round_trips_through_its_schema() -> None:
    update = Update("n1", "suspect", 3, "n2")
    samples = [
        Ping(1, "n2", "n1", (update,)),
        Ack(1, "n1", (update,)),
        PingReq(2, "n2", "n1", True, (update,)),
        Nack(2, "n3"),
        Gossip("n2", (update,)),
        StateSync("n2", (update,), reply=True),
        GetMembership(),
        Leave(),
        MembershipView(
            "n1", 4, 2, (MemberInfo("n1", "alive", 4, 1.5e9, "n1"),)
        ),
    ]
    for msg in samples:
        kind, body = encode_message(msg)
        assert kind.startswith("membership.")
        assert decode_message(kind, body) == msg
