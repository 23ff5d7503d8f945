"""What the Coordinator answers when asked for its state: one typed, frozen message.

:class:`CoordinatorState` is the answer to
:class:`~corral.actors.coordinator.GetCoordinatorState`, locally and over the peer
transport (it is a registered message, so the transport's schema checks it on the
way in). Readers use its attributes; :meth:`CoordinatorState.to_json` is the JSON
``GET /v1/state`` shows under ``coordinator`` and ``coordination``: the message's
own encoding, with lists for tuples.

The lists the last deciding pass reported are the planner's own types
(:class:`~corral.actors.planner.Unplaced`, :class:`~corral.actors.planner.Deferred`,
:class:`~corral.actors.planner.Stranded`, :class:`~corral.actors.planner.Refusal`,
:class:`~corral.actors.planner.Pause`), and the node states are
:class:`~corral.actors.coordinator.NodeStatus`: one shape per concept, from the
decision to the API. Pure: no trio, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.actors.coordinator._membership import NodeStatus
from corral.actors.planner import Deferred, Pause, Policy, Refusal, Stranded, Unplaced
from corral.registry import RolloutRecord
from corral.transport import encode_message, message

__all__ = ["AppRollout", "CoordinatorPass", "CoordinatorState", "PassCounts"]


@dataclass(frozen=True, slots=True)
class CoordinatorPass:
    """The coordinator's last pass.

    Attributes:
        time: when it started (trio time).
        duration: how long it took (trio seconds).
        wall_time: unix time when it was recorded.
        trigger: what ran it (``tick``, ``watch``, ``grace``, a kick's reason...).
        outcome: ``applied``, ``skipped``, ``paused``, ``placement-unavailable``,
            ``lost-lease``, ``conflict`` or ``registry-error``.
        skipped: the outcome is ``skipped`` (its inputs had not moved).
        digest: the digest of the inputs it decided from, when it got that far.
        fence: the fence it held, or None.
        counts: what it decided and wrote (``placed``, ``unplaced``, ``deferred``,
            ``stranded``; ``writes``, ``batches``, ``removals``, ``placements``,
            ``unchanged``; ``rollout_writes``, placement records a rollout moved on,
            which a pass the planner skipped writes too), for the parts it reached.
        error: why it failed, for the failed outcomes.
    """

    time: float
    duration: float
    wall_time: float
    trigger: str
    outcome: str
    skipped: bool
    digest: str | None = None
    fence: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PassCounts:
    """How many passes this node's coordinator ran, by outcome, and its lease changes."""

    applied: int = 0
    skipped: int = 0
    acquired: int = 0
    lost: int = 0


@dataclass(frozen=True, slots=True)
class AppRollout:
    """An app's rolling deploy, in progress or halted, as the last pass left it.

    Attributes:
        app: the app.
        status: ``rolling 2/3`` or ``halted: <reason>``
            (:func:`~corral.actors.coordinator.rollout_status`).
        rollout: the record kept in the app's placement.
    """

    app: str
    status: str
    rollout: RolloutRecord


@message("coordinator.state-reply")
@dataclass(frozen=True, slots=True)
class CoordinatorState:
    """One node's coordinator, as it answers :class:`GetCoordinatorState`.

    Attributes:
        node: the node it runs on.
        coordinating: it holds the lease now.
        holder: the lease holder it last saw (itself while coordinating), or None.
        fence: its fence while coordinating, else the holder's it last saw.
        lease_ttl: the lease TTL (seconds).
        policy: the brakes it plans with.
        last_pass: its last pass, or None before the first.
        passes: its pass and lease-change counts.
        unplaced: apps the last deciding pass could not place (fully).
        deferred: moves it held back, each with when it may go (``until``, wall-clock).
        stranded: instances kept on lost nodes, or stopped by a forced drain.
        refused: relocations or drains it refused, or None.
        paused: the undecodable keys that paused it, or None.
        membership: a membership (SWIM) view is wired in.
        node_states: every node's state as its last pass decided it; empty while it
            does not coordinate.
        rollouts: the rolling deploys in progress or halted, by app; empty while it
            does not coordinate.
    """

    node: str
    coordinating: bool
    holder: str | None
    fence: int | None
    lease_ttl: float
    policy: Policy
    last_pass: CoordinatorPass | None = None
    passes: PassCounts = PassCounts()
    unplaced: tuple[Unplaced, ...] = ()
    deferred: tuple[Deferred, ...] = ()
    stranded: tuple[Stranded, ...] = ()
    refused: Refusal | None = None
    paused: Pause | None = None
    membership: bool = False
    node_states: tuple[NodeStatus, ...] = ()
    rollouts: tuple[AppRollout, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON form (what ``GET /v1/state`` shows): the message's encoding."""
        body: dict[str, Any] = _lists(encode_message(self)[1])
        return body


def _lists(value: Any) -> Any:
    """The encoded body with every tuple a list, as JSON has it."""
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(item) for item in value]
    return value
