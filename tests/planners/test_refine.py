"""Greedy's refinement (planner/planners/refine.py): the compiled placement loop it uses on large plans places
every gap where the Python loop does."""

from __future__ import annotations

import pytest
from conftest import GRAPHS, fwd_bwd, simple_hardware

from planner import api
from planner.planners import refine


def _plan(graph, hw):
    planned = api.plan(graph, hw, planner="greedy")
    assert planned.timeline.valid
    return planned.plan, planned.timeline.metrics.makespan_ns


@pytest.mark.parametrize(("graph", "hbm"), [
    ("transformer_block", "1GB"),  # offloads and gives gaps up under the budget
    ("deepseek-v3-paper", "40GB"),
    ("fwd_bwd", 450),  # recompute gaps too
])
def test_the_compiled_placement_gives_the_plan_the_python_loop_gives(monkeypatch, graph, hbm):
    if graph == "fwd_bwd":
        g, hw = fwd_bwd(6), simple_hardware(hbm=hbm)
    else:
        g, hw = api.load_graph(GRAPHS / f"{graph}.json"), api.hardware("ascend-910c", hbm=hbm)
    monkeypatch.setattr(refine, "COMPILED_MIN", 10**9)
    python = _plan(g, hw)
    calls = []
    compiled_loop = refine.refine_kernel.place_gaps
    monkeypatch.setattr(refine, "COMPILED_MIN", 0)
    monkeypatch.setattr(refine.refine_kernel, "place_gaps", lambda *a: calls.append(1) or compiled_loop(*a))
    compiled = _plan(g, hw)
    assert calls
    assert compiled == python
