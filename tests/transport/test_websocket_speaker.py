"""Over real WebSocket connections, a peer speaks only as the node it authenticated as.

The handshake binds a connection to the node id the peer proved the secret under;
the kernel refuses a SWIM message whose ``source`` names any other node, and the
membership machine admits only node ids that have a registry record (here: the
seed source's answer). Loopback sockets, real time, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import trio

from corral.actors.membership import MEMBERSHIP, GetMembership, SwimConfig, membership_child_spec
from corral.actors.membership._actor import MembershipView
from corral.actors.membership._messages import MAX_INCARNATION, Gossip, Update
from corral.supervision import open_actor_system
from corral.transport import ReconnectPolicy, WebSocketConfig, open_websocket_transport

SECRET = b"test-cluster-secret"
# Generous connect and handshake times: on two cores shared by four test workers a
# handshake has been seen to take over 3 s; nothing here waits on them when all is well.
FAST = WebSocketConfig(
    connect_timeout=10.0,
    handshake_timeout=10.0,
    close_timeout=1.0,
    reconnect=ReconnectPolicy(initial=0.02, maximum=0.2),
)
LOOPBACK = ("127.0.0.1", 0)
REGISTERED = ("node-a", "node-b")


async def registered() -> Iterable[str]:
    """The node ids with a registry record."""
    return REGISTERED


async def test_a_peer_cannot_speak_as_another_node_nor_join_unregistered() -> None:
    membership = membership_child_spec(
        seeds=registered, config=SwimConfig(), rng_factory=lambda: random.Random(1)
    )
    with trio.fail_after(40):
        async with (
            open_websocket_transport("node-b", LOOPBACK, secret=SECRET, config=FAST) as b_net,
            open_actor_system("node-b", b_net, children=[membership]) as b,
            open_websocket_transport("node-a", LOOPBACK, secret=SECRET, config=FAST) as a_net,
            open_websocket_transport("evil", LOOPBACK, secret=SECRET, config=FAST) as evil_net,
            open_actor_system("node-a", a_net) as a,
            open_actor_system("evil", evil_net) as evil,
        ):
            assert b_net.address is not None
            a_net.add_peer("node-b", b_net.address)
            evil_net.add_peer("node-b", b_net.address)
            forged = Update("node-c", "left", MAX_INCARNATION, "node-c")
            b_membership = f"/{MEMBERSHIP}"
            # node-a authenticated as node-a; it sends frames that claim to be node-c's.
            await a.ref(b_membership, node="node-b").tell(Gossip("node-c", (forged,)))
            # node-a speaking as itself is admitted (it has a record), once node-b has
            # read its seeds.
            while True:
                await a.ref(b_membership, node="node-b").tell(Gossip("node-a", (), 5))
                view = await a.ref(b_membership, node="node-b").ask(GetMembership())
                assert isinstance(view, MembershipView)
                if view.state_of("node-a") is not None:
                    break
                await trio.sleep(0.05)
            # evil holds the secret but has no record: it is not admitted as a member.
            await evil.ref(b_membership, node="node-b").tell(
                Gossip("evil", (Update("evil", "alive", 1, "evil"),), 1)
            )
            # An ask comes back after the tells before it were handled (one mailbox).
            view = await evil.ref(b_membership, node="node-b").ask(GetMembership())
            assert isinstance(view, MembershipView)
            members = {m.node: (m.state, m.incarnation) for m in view.members}
            assert members.keys() == {"node-a", "node-b"}
            assert members["node-a"] == ("alive", 5)
            refused = [
                e.fields
                for e in b.events()
                if e.kind == "transport.rejected" and "speak only as itself" in str(e.fields)
            ]
            assert [f["peer"] for f in refused] == ["node-a"]
