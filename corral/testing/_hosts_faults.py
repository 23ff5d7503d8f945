"""Which packets the many-hosts test bed drops: cuts and loss, decided in pure code.

Theory of operation: every host of a bed hangs off one bridge, the *switch*, in a
network namespace of its own. A :class:`LinkFaults` value says which directed pairs
of hosts are cut (every packet from the first to the second is dropped) and how
lossy each host's link to the switch is (that percent of the packets it sends, and
of those sent to it, dropped at random). :func:`render_ruleset` turns one value into
the whole nftables ruleset of the switch, which the shell loads in one transaction:
the switch holds exactly the rules of the last value, never a mix of two.

Traffic inside one host (to its own address or loopback) never crosses the switch,
so a cut host still reaches itself. A packet between two lossy hosts crosses two
lossy links, so it is dropped with probability ``1 - (1 - a)(1 - b)``.

A one-way cut drops packets one way only, as a broken route does. TCP needs both
ways (a handshake, acknowledgements), so over TCP a one-way cut stalls connections
opened from either side; datagrams show the asymmetry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Direction", "LinkFaults", "render_ruleset"]

#: ``"both"``: nothing passes between the host and the others; ``"out"``: the host's
#: packets to the others are dropped (it hears them, they do not hear it); ``"in"``:
#: their packets to it are dropped (they hear it, it hears nothing).
Direction = Literal["both", "out", "in"]

#: The nftables table the switch's rules live in.
TABLE = "corral_bed"


@dataclass(frozen=True)
class LinkFaults:
    """The cuts and losses in force between the hosts of a bed (host names only).

    Every method returns a new value; none changes this one.
    """

    #: ``(sender, receiver)`` pairs whose packets are all dropped.
    blocked: frozenset[tuple[str, str]] = frozenset()
    #: ``(host, percent)`` sorted by host, percent in 1..100.
    loss: tuple[tuple[str, int], ...] = ()

    def cut(self, host: str, others: Iterable[str], direction: Direction = "both") -> LinkFaults:
        """Cut ``host`` from each of ``others`` (adding to the cuts in force).

        Raises:
            ValueError: ``others`` names ``host`` itself, or ``direction`` is unknown.
        """
        peers = sorted(set(others))
        if host in peers:
            raise ValueError(
                f"host {host!r} cannot be cut from itself (its own traffic never crosses "
                "the switch); leave it out of the hosts to cut it from"
            )
        if direction not in ("both", "out", "in"):
            raise ValueError(f"direction {direction!r} is not one of 'both', 'out', 'in'")
        pairs: set[tuple[str, str]] = set()
        if direction in ("both", "out"):
            pairs |= {(host, peer) for peer in peers}
        if direction in ("both", "in"):
            pairs |= {(peer, host) for peer in peers}
        return replace(self, blocked=self.blocked | pairs)

    def heal(self, host: str | None = None) -> LinkFaults:
        """Undo every cut touching ``host`` (every cut when None); losses stay."""
        if host is None:
            return replace(self, blocked=frozenset())
        kept = frozenset(pair for pair in self.blocked if host not in pair)
        return replace(self, blocked=kept)

    def lossy(self, host: str, percent: int) -> LinkFaults:
        """Drop ``percent`` of the packets on ``host``'s link (0 makes it clean again).

        Raises:
            ValueError: ``percent`` is not a whole number from 0 to 100.
        """
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise ValueError(f"loss must be a whole percent from 0 to 100, not {percent!r}")
        others = tuple(entry for entry in self.loss if entry[0] != host)
        chosen = ((host, percent),) if percent else ()
        return replace(self, loss=tuple(sorted(others + chosen)))

    def loss_of(self, host: str) -> int:
        """The percent of packets dropped on ``host``'s link (0: none)."""
        return dict(self.loss).get(host, 0)

    def delivers(self, sender: str, receiver: str) -> bool:
        """Whether packets from ``sender`` to ``receiver`` pass (unless lost at random)."""
        return sender == receiver or (sender, receiver) not in self.blocked

    def hosts(self) -> set[str]:
        """Every host these faults name."""
        named = {host for pair in self.blocked for host in pair}
        return named | {host for host, _ in self.loss}


def render_ruleset(faults: LinkFaults, addresses: Mapping[str, str]) -> str:
    """The switch's whole nftables ruleset for ``faults`` (for ``nft -f -``).

    It begins by flushing the switch's ruleset, so loading it replaces whatever was
    there in the same transaction.

    Args:
        faults: the cuts and losses to put in force.
        addresses: host name -> its IPv4 address on the switch.

    Raises:
        ValueError: ``faults`` names a host ``addresses`` lacks.
    """
    unknown = sorted(faults.hosts() - set(addresses))
    if unknown:
        raise ValueError(
            f"{len(unknown)} host(s) in the faults are not on this switch: {unknown}; "
            f"its hosts are {sorted(addresses)}"
        )
    rules = [
        f"ip saddr {addresses[sender]} ip daddr {addresses[receiver]} drop"
        for sender, receiver in sorted(faults.blocked)
    ]
    for host, percent in faults.loss:
        # numgen's "< N" takes 0..99: a link losing everything drops without it.
        chance = f"numgen random mod 100 < {percent} " if percent < 100 else ""
        for match in ("saddr", "daddr"):
            rules.append(f"ip {match} {addresses[host]} {chance}drop")
    body = "".join(f"\t\t{rule}\n" for rule in rules)
    return (
        "flush ruleset\n"
        f"table bridge {TABLE} {{\n"
        "\tchain forward {\n"
        "\t\ttype filter hook forward priority 0; policy accept;\n"
        f"{body}"
        "\t}\n"
        "}\n"
    )
