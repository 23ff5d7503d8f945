"""ActorRef: the address of an actor, local or remote, and the ask reply slot."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import outcome
import trio

from corral.supervision._errors import (
    ActorNotFound,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    UnhandledMessage,
)

if TYPE_CHECKING:
    from corral.supervision._runtime import Cell

__all__ = ["ActorRef", "Ask", "Directory", "Remote"]

_CLOSED = (trio.ClosedResourceError, trio.BrokenResourceError)


class Ask:
    """A local ask in a mailbox: the message and a one-shot reply slot.

    The asker parks its task on the slot; the actor resolves it with an
    ``outcome`` and wakes the asker directly (no channel, no event object).
    """

    __slots__ = ("_result", "_task", "message")

    def __init__(self, message: object) -> None:
        self.message = message
        self._task: trio.lowlevel.Task | None = None
        self._result: outcome.Outcome[Any] | None = None

    def resolve(self, result: outcome.Outcome[Any]) -> None:
        """Deliver the reply (first call wins; a reply nobody waits for is dropped)."""
        if self._result is not None:
            return
        self._result = result
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task, result)

    async def wait(self) -> Any:
        """Wait for the reply; return its value or raise its error."""
        result = self._result
        if result is not None:
            return result.unwrap()
        self._task = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)


class Remote(Protocol):
    """What refs and asks from other nodes need of the link to other nodes.

    :class:`~corral.supervision._remote.RemoteBridge` is the implementation over a
    transport; a system without one uses :class:`~corral.supervision._remote.Unreachable`.
    """

    async def tell(self, address: str, node: str, message: object) -> None:
        """Send ``message`` to the actor at ``address`` (``"<node>/<path>"``) on ``node``."""

    def tell_nowait(self, address: str, node: str, message: object) -> None:
        """The same without waiting; raises MailboxFull when the outbound queue is full."""

    async def ask(self, address: str, node: str, message: object, timeout: float) -> Any:  # noqa: ASYNC109
        """Send ``message`` as an ask and return the reply (or raise its error)."""

    async def reply(self, peer: str, correlation_id: int, value: object) -> None:
        """Answer the ask ``correlation_id`` that came from ``peer`` with ``value``, now."""

    async def reply_error(self, peer: str, correlation_id: int, error: BaseException) -> None:
        """Answer it with ``error`` (the asker gets a typed error or RemoteError), now."""

    def queue_reply(self, peer: str, correlation_id: int, result: outcome.Outcome[Any]) -> None:
        """Answer it without waiting (queued behind earlier frames to ``peer``)."""


class Directory:
    """One node's actors by path: what local refs resolve against and frames are routed to."""

    __slots__ = ("cells",)

    def __init__(self) -> None:
        #: path -> cell (read it; change it with add and remove)
        self.cells: dict[str, Cell] = {}

    def get(self, path: str) -> Cell | None:
        return self.cells.get(path)

    def add(self, cell: Cell) -> None:
        self.cells[cell.path] = cell

    def remove(self, cell: Cell) -> None:
        """Forget ``cell`` (not a newer cell that took its path since)."""
        if self.cells.get(cell.path) is cell:
            del self.cells[cell.path]


class ActorRef:
    """Where to send messages to one actor. Cheap, hashable, compared by node and path.

    Get one from ``system.spawn(...)``, ``ctx.ref`` or ``system.ref("node-b/coordinator")``.
    ``tell`` and ``ask`` work the same for local and remote actors; local
    messages are passed as Python objects, remote ones are encoded.
    """

    __slots__ = ("_address", "_cell", "_directory", "_is_remote", "_link", "node_id", "path")

    def __init__(
        self,
        directory: Directory,
        link: Remote,
        node_id: str,
        path: str,
        cell: Cell | None,
        remote: bool,
    ) -> None:
        self._directory = directory
        self._link = link
        self.node_id = node_id
        self.path = path
        self._cell = cell
        self._is_remote = remote
        self._address = f"{node_id}{path}"  # built once: every remote message carries it

    @property
    def address(self) -> str:
        """``"<node>/<path>"``, e.g. ``"node-b/coordinator"``."""
        return self._address

    @property
    def is_remote(self) -> bool:
        """Whether the actor lives on another node."""
        return self._is_remote

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActorRef):
            return NotImplemented
        return self.node_id == other.node_id and self.path == other.path

    def __hash__(self) -> int:
        return hash((self.node_id, self.path))

    def __repr__(self) -> str:
        return f"<ActorRef {self.address}>"

    # ------------------------------------------------------------------ tell

    async def tell(self, message: object) -> None:
        """Send ``message`` without waiting for a reply; waits while the mailbox is full.

        Raises:
            ActorNotFound: no actor at this path.
            ActorStopped: the actor stopped.
            UnhandledMessage: the ref points at a supervisor.
            PeerUnavailable, PeerBusy, SchemaError, FrameError: remote only.
        """
        cell = self._cell
        if cell is not None:
            send = cell.mailbox_send
            if send is not None:
                try:
                    await send.send(message)
                    return
                except _CLOSED:
                    pass
        await self._tell_slow(message)

    def tell_nowait(self, message: object) -> None:
        """Send ``message`` if the mailbox has room, without waiting.

        Raises:
            MailboxFull: the mailbox is full (for a remote actor: the outbound queue).
            ActorNotFound, ActorStopped, UnhandledMessage: as for :meth:`tell`.
        """
        if self._is_remote:
            self._link.tell_nowait(self._address, self.node_id, message)
            return
        for _ in range(2):
            cell = self._resolve()
            send = cell.mailbox_send
            if send is None:
                raise _supervisor_takes_no_messages(cell.path)
            try:
                send.send_nowait(message)
                return
            except trio.WouldBlock:
                raise MailboxFull(
                    f"the mailbox of {self.address} is full ({cell.mailbox_size} messages); "
                    "use `await tell()` to wait for room"
                ) from None
            except _CLOSED:
                self._cell = None
        raise ActorStopped(f"actor {self.address} has stopped")

    async def _tell_slow(self, message: object) -> None:
        if self._is_remote:
            await self._link.tell(self._address, self.node_id, message)
            return
        for _ in range(2):
            self._cell = None
            cell = self._resolve()
            send = cell.mailbox_send
            if send is None:
                raise _supervisor_takes_no_messages(cell.path)
            try:
                await send.send(message)
                return
            except _CLOSED:
                continue
        raise ActorStopped(f"actor {self.address} has stopped")

    def _resolve(self) -> Cell:
        cell = self._cell
        if cell is None or cell.closed:
            cell = self._directory.get(self.path)
            if cell is None:
                raise ActorNotFound(
                    f"no actor at {self.path} on node {self.node_id!r}; "
                    "check the path (system.tree() lists them) or that it was spawned"
                )
            if cell.closed:
                raise ActorStopped(f"actor {self.address} has stopped")
            self._cell = cell
        return cell

    # ------------------------------------------------------------------ ask

    async def ask(self, message: object, timeout: float = 5.0) -> Any:  # noqa: ASYNC109
        """Send ``message`` and wait for the reply (the return value of the actor's ``handle``).

        Args:
            message: the request.
            timeout: seconds until :class:`AskTimeout`; the wait for mailbox room counts.

        Raises:
            AskTimeout: no reply within ``timeout``.
            ActorNotFound: no actor at this path (locally or on the remote node).
            ActorCrashed: the actor crashed handling this message.
            ActorStopped: the actor stopped before replying.
            UnhandledMessage: the actor does not handle this message.
            RemoteError: remote only: the remote side refused or failed (code, message).
            PeerUnavailable, PeerBusy, SchemaError, FrameError: remote only, sending side.
        """
        if self._is_remote:
            return await self._link.ask(self._address, self.node_id, message, timeout)
        cell = self._cell
        if cell is None or cell.closed:
            cell = self._resolve()
        send = cell.mailbox_send
        if send is None:
            raise _supervisor_takes_no_messages(cell.path)
        request = Ask(message)
        with trio.move_on_after(timeout if timeout is not None else math.inf):
            try:
                await send.send(request)
            except _CLOSED:
                self._cell = None
                raise ActorStopped(f"actor {self.address} has stopped") from None
            return await request.wait()
        raise AskTimeout(
            f"no reply from {self.address} within {timeout} s to a "
            f"{type(message).__qualname__} message; the actor is busy, stuck or overloaded"
        )


def _supervisor_takes_no_messages(path: str) -> UnhandledMessage:
    return UnhandledMessage(
        f"{path} is a supervisor; supervisors take no messages (address one of its children)"
    )
