"""The bad-input corpus (tests/bad_inputs/cases.json, made by its make_corpus.py): every case is a command line that
must exit 2 with exactly one line on stderr, naming the file or "command line", and no traceback.

Exit 1 means "no valid plan"; a bad input must never be read as one, nor crash.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main

HERE = Path(__file__).resolve().parents[1] / "bad_inputs"
CASES = json.loads((HERE / "cases.json").read_text())


def test_the_corpus_is_large_and_its_files_exist():
    assert len(CASES) >= 40
    for case in CASES:
        for arg in case["args"]:
            if arg.endswith(".json") and arg.startswith(("graph_", "schedule_", "hardware_", "tiny")):
                assert (HERE / arg).exists(), (case["name"], arg)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case, monkeypatch):
    monkeypatch.chdir(HERE)  # cases name their files relative to the corpus folder
    r = CliRunner().invoke(main, case["args"])
    shown = f"ho-plan {' '.join(case['args'])}\nstdout: {r.stdout!r}\nstderr: {r.stderr!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), shown + f"\n{r.exception!r}"
    assert r.exit_code == 2, shown
    lines = r.stderr.splitlines()
    assert len(lines) == 1, shown
    assert lines[0].startswith(f"error: {case['source']}: "), shown
    assert "Traceback" not in r.output and r.stdout == "", shown


def test_every_typed_planner_option_has_a_case():
    """A planner option added or retyped since the corpus was made: rerun tests/bad_inputs/make_corpus.py."""
    import sys

    sys.path.insert(0, str(HERE))
    try:
        from make_corpus import typed_options
    finally:
        sys.path.remove(str(HERE))
    names = {c["name"] for c in CASES}
    missing = [f"O_{p}_{k}" for p, k, _ in typed_options() if f"O_{p}_{k}" not in names]
    assert not missing, missing
