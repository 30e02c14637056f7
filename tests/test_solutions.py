"""Every schedule in solutions/ still validates against its graph in graphs/."""

import json

import pytest
from conftest import ROOT, SOLUTIONS

from planner.formats import load_graph, read_json
from planner.schedule import validate_schedule

BUDGETS = json.loads((SOLUTIONS / "budgets.json").read_text())
SCHEDULES = sorted(SOLUTIONS.glob("*.schedule.json"))


def test_every_budget_entry_has_a_schedule():
    assert {p.name.removesuffix(".schedule.json") for p in SCHEDULES} == set(BUDGETS)


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: p.name)
def test_schedule_still_validates(path):
    entry = BUDGETS[path.name.removesuffix(".schedule.json")]
    graph = load_graph(ROOT / entry["graph"])
    report = validate_schedule(read_json(path), graph, str(path))
    assert report.ok, [v.describe() for v in report.timeline.violations[:5]] + list(report.mismatches)
