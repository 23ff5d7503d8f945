"""``.ci/check_benches.py``, the CI step that runs every benchmark's ``--quick`` mode:
how it reads the figures a docstring names and judges what a run printed. (The runs
themselves are CI's step, not a test: they take a minute or two.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

CI_DIR = Path(__file__).resolve().parents[1] / ".ci"


def _load_check_benches() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_benches", CI_DIR / "check_benches.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check_benches = _load_check_benches()

DOC = """A bench.

Run it.

Figures (the last line, one JSON object): ``put_per_s``, ``put_ratio``,
``e2e_<kind>_ms`` and ``load_average``.

Not figures: ``--quick``.
"""

names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


def test_the_figures_paragraph_names_the_figures() -> None:
    assert check_benches.named_figures(DOC) == [
        "put_per_s",
        "put_ratio",
        "e2e_<kind>_ms",
        "load_average",
    ]
    assert check_benches.named_figures("A bench.\n\nThe last line is JSON.\n") == []


@given(st.lists(names, min_size=1, unique=True), st.data())
def test_a_plain_figure_is_missing_exactly_when_no_key_names_it(
    figures: list[str], data: st.DataObject
) -> None:
    printed = {name: 1 for name in data.draw(st.lists(st.sampled_from(figures), unique=True))}
    missing = check_benches.missing_figures(figures, printed)
    assert missing == [name for name in figures if name not in printed]


def test_a_placeholder_figure_needs_one_matching_key() -> None:
    figure = ["e2e_<kind>_<change>_ms"]
    assert check_benches.missing_figures(figure, {"e2e_caddy_flip_ms": 1.0}) == []
    assert check_benches.missing_figures(figure, {"e2e__ms": 1.0}) == figure
    assert check_benches.missing_figures(figure, {"e2e_caddy_flip_ms_median": 1.0}) == figure


def test_a_passing_run_has_no_problems() -> None:
    stdout = "a table\n" + json.dumps({"put_per_s": 1, "put_ratio": 0.9}) + "\n\n"
    assert check_benches.judge(["put_per_s", "put_ratio"], 0, stdout, "") == []


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "problem"),
    [
        (1, '{"put_per_s": 1}', "Traceback\nAssertionError: boom", "exited 1: Traceback"),
        (0, "", "", "printed nothing"),
        (0, '{"put_per_s": 1}\ndone', "", "the last line is not JSON"),
        (0, "[1, 2]", "", "not an object"),
        (0, '{"put_per_s": 1}', "", "lacks 1 of the 2 figures its docstring names: put_ratio"),
    ],
)
def test_a_broken_run_says_what_broke(
    returncode: int, stdout: str, stderr: str, problem: str
) -> None:
    problems = check_benches.judge(["put_per_s", "put_ratio"], returncode, stdout, stderr)
    assert any(problem in line for line in problems), problems


def test_every_benchmark_names_its_figures_and_has_a_quick_mode() -> None:
    benches = check_benches.benchmarks([])
    assert {p.stem for p in benches} >= {"reconcile", "registry", "routing", "traffic"}
    for path in benches:
        text = path.read_text()
        doc = check_benches.ast.get_docstring(check_benches.ast.parse(text)) or ""
        assert check_benches.named_figures(doc), f"{path.name}: no 'Figures' paragraph"
        assert '"--quick"' in text, f"{path.name}: no --quick option"
