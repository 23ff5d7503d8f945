"""Pure reconcile planning: what this node starts, stops and clears in one pass.

Theory of operation
-------------------
A node runs exactly one process per application it serves. Each pass it
compares what the registry asks of it with what runs, and plans:

=============================================  =====================================
situation                                      action
=============================================  =====================================
assigned, deployed, no process running         **start** on the ports the app holds
assigned, running another revision             **restart** with the one to run here
running, runtime teardown pending              **stop** ("runtime teardown is pending")
running, not assigned here (or retired,        **stop** ("application is no longer
blocked, deleted)                              served by this node")
assigned, never deployed                       nothing
deleted, nothing of it runs, state left here   **remove** its working directory and
                                               local state (ports to quarantine)
=============================================  =====================================

The revision to run here is the deployed one, except during a rolling deploy:
then it is the one the rollout (kept in the placement) names for this node, and
a node it has not reached keeps the previous deployment (:func:`desired_revision`).

Starts (and restarts) come first, then stops, then removals; each group sorted
by app name. Stopping keeps the working directory and ports; only deletion from
the registry clears them, on a later pass, once nothing of the app runs. An app
whose record or placement cannot be decoded is left exactly as it is.

A pass is **skipped** when the change token and the process table's generation
are those of the last full pass and no timer (a retry, the periodic full pass) is
due (:func:`should_skip`). The change token is the ``mod_revision`` of this node's
assignment index ``assign/<node>``, which the coordinator writes with the
placements it follows, so it moves only when this node's assignment does, not on
every write to the registry: the cost of an idle pass is that one read, whatever
the number of apps or of other nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from corral.actors.process_supervisor import LIVE_STATES
from corral.actors.reconciler._backoff import FailedRevision
from corral.registry import (
    AppRecord,
    NodeRecord,
    PlacementRecord,
    ServingEntry,
)

STOP_TEARDOWN: Final = "runtime teardown is pending"
STOP_NOT_SERVED: Final = "application is no longer served by this node"

Phase: TypeAlias = Literal["live", "stopping", "stopped"]


@dataclass(frozen=True, slots=True)
class AppView:
    """What the registry says about one app, from this node's point of view."""

    name: str
    assigned: bool
    revision: str | None
    teardown_pending: bool = False
    retired: bool = False
    blocked: bool = False

    @property
    def should_run(self) -> bool:
        return (
            self.assigned
            and self.revision is not None
            and not (self.teardown_pending or self.retired or self.blocked)
        )


@dataclass(frozen=True, slots=True)
class ProcessView:
    """What runs for one app: ``live`` (running, starting or backing off),
    ``stopping``, or ``stopped`` (an entry is kept, nothing runs)."""

    app: str
    revision: str
    phase: Phase


@dataclass(frozen=True, slots=True)
class PassInputs:
    """Everything one pass decides from.

    Args:
        apps: every app in the registry, by name.
        unknown: apps whose record or placement could not be decoded (left alone).
        processes: this node's process table, by app.
        local_state: apps with a working directory or port claims on this node.
    """

    apps: Mapping[str, AppView]
    unknown: frozenset[str] = frozenset()
    processes: Mapping[str, ProcessView] = dataclasses.field(default_factory=dict)
    local_state: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``app`` at ``revision``. ``after_stop``: its old process is still stopping
    (so its ports are its own and must not be probed)."""

    app: str
    revision: str
    after_stop: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"action": "start", "app": self.app, "revision": self.revision}


@dataclass(frozen=True, slots=True)
class Replace:
    """Replace ``app``'s process running ``previous`` with one running ``revision``."""

    app: str
    revision: str
    previous: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": "restart",
            "app": self.app,
            "revision": self.revision,
            "previous": self.previous,
            "reason": "the deployment revision changed",
        }


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop ``app``'s process for ``reason``; its directory and ports stay."""

    app: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"action": "stop", "app": self.app, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Remove:
    """``app`` was deleted and nothing of it runs: clear its local state."""

    app: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": "remove",
            "app": self.app,
            "reason": "application was deleted from the registry",
        }


Action: TypeAlias = Start | Replace | Stop | Remove


def plan_pass(inputs: PassInputs) -> tuple[Action, ...]:
    """Plan one reconcile pass (see the module docstring for the table).

    Returns:
        Starts and restarts, then stops, then removals; each sorted by app.
    """
    starts: list[Action] = []
    stops: list[Action] = []
    removals: list[Action] = []
    names = set(inputs.apps) | set(inputs.processes) | set(inputs.local_state)
    for name in sorted(names - inputs.unknown):
        view = inputs.apps.get(name)
        process = inputs.processes.get(name)
        phase = process.phase if process is not None else None
        if view is None:
            if phase == "live":
                stops.append(Stop(name, STOP_NOT_SERVED))
            elif phase != "stopping" and (process is not None or name in inputs.local_state):
                removals.append(Remove(name))
        elif view.should_run:
            assert view.revision is not None
            if phase == "live":
                assert process is not None
                if process.revision != view.revision:
                    starts.append(Replace(name, view.revision, process.revision))
            else:
                starts.append(Start(name, view.revision, after_stop=phase == "stopping"))
        elif phase == "live":
            if view.teardown_pending:
                stops.append(Stop(name, STOP_TEARDOWN))
            elif not (view.assigned and view.revision is None):
                stops.append(Stop(name, STOP_NOT_SERVED))
    return (*starts, *stops, *removals)


def should_skip(
    *,
    token: int,
    last_token: int | None,
    generation: str,
    last_generation: str | None,
    timer_due: bool,
) -> bool:
    """Whether a pass can stop after reading the change token (the ``mod_revision`` of
    ``assign/<node>``) and the process table's generation: nothing moved since the last
    full pass and no timer is due."""
    return not timer_due and token == last_token and generation == last_generation


# --------------------------------------------------------------------------- inputs


def desired_revision(
    node_id: str,
    app: AppRecord,
    placement: PlacementRecord | None,
    running: str | None = None,
) -> str | None:
    """The revision this node is to run of ``app`` (None: it was never deployed).

    * The revision the app's rollout names for the node, when the app still has
      that deployment (current or previous) or the node runs it already;
    * else, while no rollout lists the node, the previous deployment's revision
      when that is what the node runs: a new revision reaches a running node only
      through a rollout (the coordinator's next pass starts one), never all at once;
    * else the app's revision.

    Args:
        node_id: this node.
        app: the app's record.
        placement: its placement record (with the rollout it carries), if any.
        running: the revision of the app's live process on this node, if any.
    """
    if app.deployment is None:
        return None
    rollout = None if placement is None else placement.rollout
    named = None if rollout is None else rollout.revision_for(node_id)
    if named is not None and (app.deployment_at(named) is not None or named == running):
        return named
    previous = app.previous_deployment
    if named is None and previous is not None and running == previous.revision:
        return previous.revision
    return app.deployment.revision


def app_views(
    node_id: str,
    apps: Iterable[AppRecord],
    placements: Mapping[str, PlacementRecord],
    running: Mapping[str, str] | None = None,
) -> dict[str, AppView]:
    """One :class:`AppView` per app record; ``placements`` is keyed by app name (a
    missing placement means not assigned); ``running`` maps each app with a live
    process here to its revision (see :func:`desired_revision`)."""
    views = {}
    for app in apps:
        placement = placements.get(app.name)
        views[app.name] = AppView(
            name=app.name,
            assigned=placement is not None and node_id in placement.nodes,
            revision=desired_revision(
                node_id, app, placement, None if running is None else running.get(app.name)
            ),
            teardown_pending=app.teardown_pending,
            retired=app.retired,
            blocked=app.blocked,
        )
    return views


def process_views(rows: Iterable[Mapping[str, Any]]) -> dict[str, ProcessView]:
    """Process-table rows (``ProcessInfo.to_dict()``) as :class:`ProcessView` s."""
    views = {}
    for row in rows:
        state = row["state"]
        phase: Phase = (
            "live" if state in LIVE_STATES else "stopping" if state == "stopping" else "stopped"
        )
        views[row["app"]] = ProcessView(row["app"], row["revision"], phase)
    return views


# --------------------------------------------------------------------------- publishing


@dataclass(frozen=True, slots=True)
class BlockedStart:
    """A start of ``app``'s ``revision`` this node could not make for a reason of its
    own rather than the revision's: no pair of ports could be given (``reason`` says why,
    naming the range). It is tried again every pass, at no cost worth backing off from,
    and starts once ports free up; meanwhile the instance is published ``starting``
    with the reason."""

    app: str
    revision: str
    reason: str


def serving_set(
    rows: Iterable[Mapping[str, Any]],
    unpack_failures: Iterable[FailedRevision] = (),
    blocked: Iterable[BlockedStart] = (),
) -> dict[str, ServingEntry]:
    """What this node serves, from its process-table rows: every live process with its
    revision, ports, restarts and state (``failed`` when it could not be started,
    ``crash-loop`` when crash-looping, both with the reason; ``starting`` until it
    answers or while it waits to be restarted), and whether it is ``ready`` (running
    and passing its readiness check: only ready instances are routed to). An app
    with no live process whose revision could not be got onto disk
    (``unpack_failures``) is ``failed`` too, with the reason and no ports (0): it
    never got that far. One whose start is ``blocked`` (no ports) is ``starting``
    with the reason, and no ports."""
    serving = {}
    for row in rows:
        state = row["state"]
        if state not in LIVE_STATES:
            continue
        shown: Literal["starting", "running", "crash-loop", "failed"]
        if state == "failed":
            shown = "failed"
        elif row.get("crash_loop"):
            shown = "crash-loop"
        elif state == "running":
            shown = "running"
        else:
            shown = "starting"
        serving[row["app"]] = ServingEntry(
            revision=row["revision"],
            public_port=row["public_port"],
            internal_port=row["internal_port"],
            state=shown,
            restarts=row.get("restarts", 0),
            reason=_trouble(row) if shown in ("failed", "crash-loop") else "",
            ready=shown == "running" and bool(row.get("ready", False)),
        )
    for failure in unpack_failures:
        if failure.app not in serving:
            serving[failure.app] = ServingEntry(
                revision=failure.revision,
                public_port=0,
                internal_port=0,
                state="starting" if failure.starting else "failed",
                reason=f"cannot get revision {failure.revision[:12]} onto disk: {failure.reason}",
            )
    for start in blocked:
        if start.app not in serving:
            serving[start.app] = ServingEntry(
                revision=start.revision,
                public_port=0,
                internal_port=0,
                state="starting",
                reason=f"cannot start: {start.reason}",
            )
    return serving


def _trouble(row: Mapping[str, Any]) -> str:
    """Why a failed or crash-looping process is so, in one line."""
    if row.get("last_error"):
        return str(row["last_error"])
    return f"it keeps exiting (last exit code {row.get('last_exit_code')})"


def with_serving(record: NodeRecord, serving: Mapping[str, ServingEntry]) -> NodeRecord | None:
    """``record`` with ``serving`` and a new change token, or None when it already
    serves exactly that (nothing to write). Every other field is carried over."""
    if record.serving == dict(serving):
        return None
    return dataclasses.replace(
        record, serving=dict(sorted(serving.items())), change_token=record.change_token + 1
    )
