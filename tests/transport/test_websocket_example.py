"""The two-process example runs end to end (real processes on loopback, so slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two_processes.py"


async def test_the_two_process_example_runs() -> None:
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE)], capture_stdout=True, capture_stderr=True
        )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert "node-b's counter answers 12" in out
    assert "link to node-b: connected, dialed by node-a" in out
    assert "greeter got 'hello from the counter in process" in out
    assert "intruder | refused:" in out
    assert "close code 4001" in out
    assert "the counter is untouched: 12" in out
    assert "node-b exited with status 0" in out
    assert "the next ask fails at once" in out
