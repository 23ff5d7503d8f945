"""MembershipFeed: the local SWIM view, handed to this node's coordinator.

The membership actor calls :meth:`MembershipFeed.on_view` after every change
of its view; the coordinator calls :meth:`MembershipFeed.statuses` once per
pass and gets node id -> :class:`~corral.actors.coordinator.MemberStatus`
(SWIM's ``alive``, ``suspect``, ``dead``, ``left``, with the incarnation and
since when). Until the actor has published a first view the feed knows no
node, which the coordinator treats as "membership has no view": the records
alone decide.

So that a change is acted on now and not at the coordinator's next tick, the
membership actor also tells the actors named by its ``notify`` argument
(:func:`~._actor.membership_child_spec`) a message of the caller's choosing;
the node assembly passes the coordinator's path and a ``KickCoordinator``.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.actors.coordinator import MemberStatus
from corral.actors.membership._actor import MembershipView

__all__ = ["MembershipFeed", "member_statuses"]


def member_statuses(view: MembershipView) -> dict[str, MemberStatus]:
    """Node id -> MemberStatus of every member of ``view`` (the node itself included)."""
    return {
        member.node: MemberStatus(member.state, member.incarnation, member.since)
        for member in view.members
    }


class MembershipFeed:
    """The latest view of one node's membership actor (one per node life)."""

    def __init__(self) -> None:
        self._view: MembershipView | None = None
        self._statuses: dict[str, MemberStatus] = {}

    @property
    def view(self) -> MembershipView | None:
        """The last view published, or None before the first."""
        return self._view

    def on_view(self, view: MembershipView) -> None:
        """Keep ``view`` (the membership actor's ``on_view`` hook)."""
        self._view = view
        self._statuses = member_statuses(view)

    def statuses(self) -> Mapping[str, MemberStatus]:
        """Node id -> status as the last view has it (empty before the first)."""
        return dict(self._statuses)
