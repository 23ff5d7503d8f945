"""``corral plan FILE``: run the placement planner on a JSON document, write nothing.

The document format is described in :mod:`corral.actors.planner._document`. The decisions
are printed to standard output as one JSON object (two-space indent), its keys in the
order the document format lists them.

Exit status:

* ``0``: the decisions were printed (a paused or refused pass is still a decision).
* ``1``: the pass failed with ``placement-unavailable`` (no live node at all); the error
  is printed to standard error and nothing to standard output.
* ``2``: the input could not be read or is invalid; the message names the file or the
  field. Nothing is printed to standard output: never a partial plan.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from corral.actors.planner import (
    InvalidPlanInput,
    PlacementUnavailable,
    decisions_to_json,
    parse_plan_document,
    plan_input,
)

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNAVAILABLE", "plan_command"]

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_INVALID = 2


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def plan_command(path_or_dash: str, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    """Read a planner document from ``path_or_dash`` (``-``: ``stdin``), print the decisions.

    Args:
        path_or_dash: the document's path, or ``-`` for standard input.
        stdin, stdout, stderr: the streams to use.

    Returns:
        The exit status: 0 printed, 1 placement-unavailable, 2 invalid input.
    """
    source = "standard input" if path_or_dash == "-" else path_or_dash
    try:
        if path_or_dash == "-":
            text = stdin.read()
        else:
            with open(path_or_dash, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        stderr.write(f"corral plan: cannot read {source}: {exc}\n")
        return EXIT_INVALID
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        stderr.write(
            f"corral plan: invalid plan document in {source}: the key {exc.args[0]!r} "
            "appears twice in one object\n"
        )
        return EXIT_INVALID
    except ValueError as exc:
        stderr.write(f"corral plan: invalid plan document in {source}: not valid JSON: {exc}\n")
        return EXIT_INVALID
    try:
        decisions = plan_input(parse_plan_document(doc))
    except InvalidPlanInput as exc:
        stderr.write(f"corral plan: invalid plan document in {source}: {exc}\n")
        return EXIT_INVALID
    except PlacementUnavailable as exc:
        stderr.write(f"corral plan: {exc}\n")
        return EXIT_UNAVAILABLE
    stdout.write(json.dumps(decisions_to_json(decisions), indent=2) + "\n")
    return EXIT_OK
