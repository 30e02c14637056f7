"""What a plan is known to be worth (planner/quality.py), and where the user sees it: summary, --json, schedule."""

from __future__ import annotations

import json
from dataclasses import replace

from click.testing import CliRunner
from conftest import GRAPHS, small_case

from planner import api
from planner.bounds import makespan_bound
from planner.cli import main
from planner.quality import plan_quality, proof

TB = str(GRAPHS / "transformer_block.json")


def test_greedy_plan_quality_is_measured_against_a_bound_that_holds():
    g = api.load_graph(TB)
    hw = api.hardware("ascend-910c", hbm="1GB")
    r = api.plan(g, hw, planner="greedy")
    assert r.timeline.valid
    q = plan_quality(g, hw, r.plan, r.timeline)
    assert q.bound_ns == makespan_bound(g, hw).value
    assert q.bound_ns <= r.timeline.metrics.makespan_ns
    assert q.gap_vs_bound == (r.timeline.metrics.makespan_ns - q.bound_ns) / q.bound_ns
    assert q.proof == "heuristic"


def test_the_proof_says_what_each_planner_proved():
    g, hw = small_case("fwd-bwd-3", 0.8)
    exact = api.plan(g, hw, planner="exact")
    assert exact.timeline.valid and proof(exact.plan) == "optimal"
    q = plan_quality(g, hw, exact.plan, exact.timeline)
    assert q.gap_vs_bound is not None and q.gap_vs_bound >= 0
    # The exact search covers plans without recompute steps: cpsat runs it when it plans without them too.
    cp = api.plan(g, hw, planner="cpsat", time_limit=5, workers=1, recompute=False)
    assert cp.timeline.valid
    # A graph this small: cpsat runs the exact search over every order too, and its plan reaches the optimum.
    st = cp.plan.stats["cpsat"]
    assert st["exact_optimum_us"] == exact.plan.stats["exact"]["optimum_ns"] / 1000
    assert cp.timeline.metrics.makespan_ns / 1000 == st["exact_optimum_us"] and proof(cp.plan) == "optimal"
    # Without the exact optimum and the compute bound (a plan at it is optimal over every plan), CP-SAT's proof is
    # for its model only; a plan at the lower bound, which every plan meets, is optimal over every plan.
    unproven = dict(st, exact_optimum_us=None, compute_us=None, optimal=True, bound_us=st["makespan_us"] * 0.9)
    assert proof(replace(cp.plan, stats={"cpsat": unproven})) == "model-optimal"
    assert proof(replace(cp.plan, stats={"cpsat": dict(unproven, bound_us=st["makespan_us"])})) == "optimal"
    # cpsat's own bound is reused, not computed again.
    assert plan_quality(g, hw, cp.plan, cp.timeline).bound_ns == cp.plan.stats["cpsat"]["bound_us"] * 1000
    assert proof(replace(cp.plan, stats={"cpsat": {"optimal": False}})) == "feasible"


def test_the_summary_json_and_schedule_state_bound_gap_and_proof(tmp_path):
    out = tmp_path / "tb.schedule.json"
    args = [TB, "--hbm", "1GB", "--planner", "greedy", "--json", "-o", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["proof"] == "heuristic" and d["lower_bound_us"] <= d["makespan_us"]
    assert d["gap_vs_bound"] > 0 and d["lower_bound_reason"]
    doc = json.loads(out.read_text())
    assert doc["quality"] == {k: d[k] for k in ("lower_bound_us", "lower_bound_reason", "gap_vs_bound", "proof")}
    first = out.read_bytes()
    assert CliRunner().invoke(main, args).exit_code == 0
    assert out.read_bytes() == first
    table = CliRunner().invoke(main, [TB, "--hbm", "1GB", "--planner", "greedy", "--no-output"])
    assert "lower bound (every plan)" in table.output and "gap vs bound" in table.output
