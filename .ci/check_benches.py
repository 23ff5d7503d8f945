"""Run every benchmark's ``--quick`` mode and check what it printed, so no benchmark rots.

    python .ci/check_benches.py              # every bench/*.py
    python .ci/check_benches.py reconcile    # only the ones named

For each benchmark: it must exit 0 within its time limit, and the last line it prints
must be one JSON object holding every figure its docstring names. The names are the
double-backquoted words of the docstring's paragraph that begins ``Figures``; a name
with ``<placeholders>`` (``e2e_<kind>_<change>_ms``) must match at least one key. Prints
one line per benchmark (seconds taken, and what is wrong) and exits 1 when any failed.

CI (``.ci/run``) runs it after the tests. The benchmarks run one after another (their
figures are meant to be read alone, and some start real processes on fixed port
ranges), with ``sys.executable``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
#: The longest one quick run may take. The slowest (traffic) takes about 40 s alone on
#: this 2-core machine, and two minutes beside a full machine's other work.
TIMEOUT_S = 300.0
#: How long a run that overran has, after SIGINT, to stop what it started.
STOP_GRACE_S = 60.0
_NAME = re.compile(r"``([A-Za-z0-9_<>]+)``")
_PLACEHOLDER = re.compile(r"<[^<>]+>")


@dataclass(frozen=True)
class Outcome:
    """What one quick run showed: ``problems`` is empty when it passed."""

    bench: str
    seconds: float
    problems: tuple[str, ...]


def named_figures(docstring: str) -> list[str]:
    """The figure names in ``docstring``'s paragraph that begins ``Figures`` (a paragraph
    ends at a blank line); empty when there is no such paragraph."""
    for paragraph in re.split(r"\n\s*\n", docstring):
        if paragraph.lstrip().startswith("Figures"):
            return list(dict.fromkeys(_NAME.findall(paragraph)))
    return []


def missing_figures(figures: list[str], printed: dict[str, object]) -> list[str]:
    """The names in ``figures`` that no key of ``printed`` answers: a plain name must be
    a key; a name with ``<placeholders>`` must match at least one key (each placeholder
    stands for one or more characters)."""
    missing = []
    for name in figures:
        if "<" not in name:
            if name not in printed:
                missing.append(name)
            continue
        pattern = re.compile(
            ".+".join(re.escape(part) for part in _PLACEHOLDER.split(name)) + r"\Z"
        )
        if not any(pattern.match(key) for key in printed):
            missing.append(name)
    return missing


def last_json_object(stdout: str) -> dict[str, object] | str:
    """The last non-empty line of ``stdout`` as a JSON object, or why it is not one."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return "printed nothing"
    try:
        value = json.loads(lines[-1])
    except ValueError as exc:
        return f"the last line is not JSON ({exc}): {lines[-1][:200]!r}"
    if not isinstance(value, dict):
        return f"the last line is JSON but not an object: {lines[-1][:200]!r}"
    return value


def judge(figures: list[str], returncode: int, stdout: str, stderr: str) -> list[str]:
    """What is wrong with one quick run (nothing: it passed)."""
    problems = []
    if not figures:
        problems.append("its docstring names no figures (a paragraph beginning 'Figures')")
    if returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-5:])
        problems.append(f"exited {returncode}: {tail}")
    printed = last_json_object(stdout)
    if isinstance(printed, str):
        problems.append(printed)
    elif missing := missing_figures(figures, printed):
        problems.append(
            f"its last line lacks {len(missing)} of the {len(figures)} figures its "
            f"docstring names: {', '.join(missing)}"
        )
    return problems


def run_quick(path: Path, timeout: float = TIMEOUT_S) -> Outcome:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    figures = named_figures(docstring)
    started = time.perf_counter()
    # Its own session, so that stopping an overrun reaches only what it started.
    process = subprocess.Popen(
        [sys.executable, str(path), "--quick"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_overrun(process)
        seconds = time.perf_counter() - started
        return Outcome(path.stem, seconds, (f"still running after {timeout:g} s: stopped",))
    seconds = time.perf_counter() - started
    problems = judge(figures, process.returncode, stdout, stderr)
    return Outcome(path.stem, seconds, tuple(problems))


def stop_overrun(process: subprocess.Popen[str]) -> None:
    """SIGINT first, so the benchmark's own clean-up stops the nodes and proxies it
    started (each by pid); whatever is left of its process group is killed after
    ``STOP_GRACE_S``."""
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def benchmarks(names: list[str]) -> list[Path]:
    every = sorted(BENCH_DIR.glob("*.py"))
    if not names:
        return every
    known = {p.stem: p for p in every}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"no such benchmark: {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[name] for name in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    args = parser.parse_args()
    paths = benchmarks(args.names)
    started = time.perf_counter()
    failed = 0
    for path in paths:
        outcome = run_quick(path)
        verdict = "ok" if not outcome.problems else "FAILED"
        print(f"bench {outcome.bench:<12} {outcome.seconds:6.1f} s  {verdict}", flush=True)
        for problem in outcome.problems:
            print(f"    {problem}", flush=True)
        failed += bool(outcome.problems)
    total = time.perf_counter() - started
    print(f"{len(paths) - failed} of {len(paths)} benchmarks' quick runs passed in {total:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
