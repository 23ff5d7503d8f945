"""The node's log: text for people, or JSON lines for a log pipeline (``--log-format``).

A JSON line is one object: ``ts`` (ISO 8601, UTC, milliseconds), ``level``,
``logger``, ``node``, ``actor`` (the actor's path when an actor logged it, else
null), ``message``, then the fields of the event the line is about (``event``
and its fields, for lines made from the actor system's events), and ``error``
with the traceback when there is one. Every value is JSON-able (others are
turned into strings), so a line never fails to be written.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Loggers the actor kernel names per actor: ``corral.actor.<node>.<dotted path>``.
ACTOR_LOGGER_PREFIX = "corral.actor."
#: Where the node writes its actor system's events as log lines in the JSON format.
EVENTS_LOGGER = "corral.events"
#: The attribute of a log record that carries an event's fields.
FIELDS_ATTRIBUTE = "corral_fields"
#: Keys of a JSON line the event's fields may not take.
RESERVED = frozenset({"ts", "level", "logger", "node", "actor", "message", "error"})
MAX_FIELD_CHARS = 4096


def _jsonable(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value[:MAX_FIELD_CHARS]
    if depth < 8 and isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in list(value.items())[:100]}
    if depth < 8 and isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in list(value)[:100]]
    return str(value)[:MAX_FIELD_CHARS]


def actor_of(logger_name: str, node: str | None) -> str | None:
    """The actor path a kernel logger name stands for (``corral.actor.n1.agent.reconciler``
    -> ``/agent/reconciler``), or None for other loggers."""
    if not logger_name.startswith(ACTOR_LOGGER_PREFIX):
        return None
    rest = logger_name.removeprefix(ACTOR_LOGGER_PREFIX)
    if node and rest.startswith(node + "."):
        rest = rest.removeprefix(node + ".")
    elif node and rest == node:
        return "/"
    else:
        rest = rest.partition(".")[2]
    return "/" + rest.replace(".", "/")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring).

    Args:
        node: the node id, or a callable giving it (it is known only once the node
            has resolved it).
    """

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "actor": getattr(record, "actor", None) or actor_of(record.name, self.node),
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS_ATTRIBUTE, None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                name = str(key)
                line[f"field_{name}" if name in RESERVED else name] = _jsonable(value)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(stream: TextIO, log_format: str = "text") -> JsonFormatter | None:
    """Send the node's log to ``stream`` in ``log_format`` (``text`` or ``json``), at the
    level ``CORRAL_LOG_LEVEL`` names (INFO by default).

    Returns:
        The JSON formatter (to be told the node id once known), or None for text.
    """
    handler = logging.StreamHandler(stream)
    formatter: JsonFormatter | None = None
    if log_format == "json":
        formatter = JsonFormatter()
        handler.setFormatter(formatter)
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    # As logging.basicConfig: a process (or test run) that set up logging keeps it.
    logging.basicConfig(
        level=os.environ.get("CORRAL_LOG_LEVEL", "INFO").upper(), handlers=[handler]
    )
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return formatter


def log_event(kind: str, path: str, fields: Mapping[str, Any]) -> None:
    """Write one actor-system event as a log line (``corral.events``, INFO): the message
    is its kind, and its path and fields go into the JSON line."""
    logging.getLogger(EVENTS_LOGGER).info(
        "%s", kind, extra={"actor": path, FIELDS_ATTRIBUTE: {"event": kind, **fields}}
    )


def set_log_node(node: str) -> None:
    """Name the node in every JSON line from now on (its id is known once resolved)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.node = node
