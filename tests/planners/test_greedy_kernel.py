"""Greedy's compiled loops (planner/planners/greedy_kernel.py), used on large graphs: each gives what the Python
loop it stands for gives (the refinement's placement, the link calendar's booking)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import GRAPHS, fwd_bwd, simple_hardware

from planner import api
from planner.planners import greedy_kernel, greedy_select, refine
from planner.planners.greedy_select import LinkCalendar


def _plan(graph, hw):
    planned = api.plan(graph, hw, planner="greedy")
    assert planned.timeline.valid
    return planned.plan, planned.timeline.metrics.makespan_ns


@pytest.mark.parametrize(("graph", "hbm"), [
    ("transformer_block", "1GB"),  # offloads and gives gaps up under the budget
    ("deepseek-v3-paper", "40GB"),
    ("fwd_bwd", 450),  # recompute gaps too
])
def test_the_compiled_loops_give_the_plan_the_python_loops_give(monkeypatch, graph, hbm):
    if graph == "fwd_bwd":
        g, hw = fwd_bwd(6), simple_hardware(hbm=hbm)
    else:
        g, hw = api.load_graph(GRAPHS / f"{graph}.json"), api.hardware("ascend-910c", hbm=hbm)
    monkeypatch.setattr(refine, "COMPILED_MIN", 10**9)
    monkeypatch.setattr(greedy_select, "COMPILED_MIN_OPS", 10**9)
    python = _plan(g, hw)
    calls = []
    place_gaps, take_slots = greedy_kernel.place_gaps, greedy_kernel.take_slots
    monkeypatch.setattr(refine, "COMPILED_MIN", 0)
    monkeypatch.setattr(greedy_select, "COMPILED_MIN_OPS", 0)
    monkeypatch.setattr(greedy_kernel, "place_gaps", lambda *a: calls.append("place") or place_gaps(*a))
    monkeypatch.setattr(greedy_kernel, "take_slots", lambda *a: calls.append("take") or take_slots(*a))
    compiled = _plan(g, hw)
    assert {"place", "take"} <= set(calls)
    assert compiled == python


def test_booking_slots_takes_what_the_calendar_takes():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 300)  # past TAKE_CHUNK: the calendar sums its slots a chunk at a time
        free = np.array([rng.choice((0, rng.randint(1, 50))) for _ in range(n)], dtype=np.int64)
        lo = rng.randint(0, n)
        hi = rng.randint(lo, n)
        need = rng.randint(-5, 60 * (hi - lo) + 5)
        backward = rng.random() < 0.5
        expected = free.copy()
        LinkCalendar._take(expected[lo:hi][::-1] if backward else expected[lo:hi], need)
        got = free.copy()
        greedy_kernel.take_slots(got, lo, hi, need, backward)
        assert got.tolist() == expected.tolist()
