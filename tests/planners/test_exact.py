"""The exact reference (planner/planners/exact.py): proven optima on small graphs, which every bound stays under
and no planner beats."""

from __future__ import annotations

import pytest
from conftest import GRAPHS, simple_hardware, small_case, weight_read_twice
from hypothesis import given
from hypothesis import strategies as st
from test_properties import SMALL_PROPERTY, at_fraction, graphs_and_hardware

from planner import api, bench
from planner.bounds import makespan_bounds
from planner.errors import InputError
from planner.executor import simulate
from planner.plan import StepKind
from planner.planners.exact import MAX_OPS, exact_scale, incumbent, plan_exact, search_exact
from planner.planners.greedy import plan_greedy
from planner.planners.reactive import plan_reactive


@pytest.mark.parametrize("name", ["free-weights-6", "fwd-bwd-3", "transformer_block-10"])
def test_exact_proves_the_optimum_and_no_planner_or_bound_crosses_it(name):
    g, hw = small_case(name, 0.8)
    plan = plan_exact(g, hw, time_limit=30)
    tl = simulate(g, hw, plan)
    assert tl.valid and plan.status == "optimal", plan.notes
    optimum = plan.stats["exact"]["optimum_ns"]
    assert tl.metrics.makespan_ns == optimum
    for b in makespan_bounds(g, hw):
        assert b.value <= optimum + 1e-6, b.reason
    for fn in (plan_greedy, plan_reactive):
        other = simulate(g, hw, fn(g, hw))
        if other.valid:
            assert other.metrics.makespan_ns >= optimum
    cpsat = api.plan(g, hw, planner="cpsat", time_limit=10, workers=1).timeline
    assert cpsat.valid and cpsat.metrics.makespan_ns >= optimum


def test_the_exact_scale_rounds_nothing():
    g, hw = small_case("free-weights-6", 0.8)
    scale = exact_scale(g, hw)
    assert scale.tick_ns > 1 and all(t.bytes % scale.unit_bytes == 0 for t in g.tensors.values())


def test_exact_refuses_large_graphs():
    g = api.load_graph(GRAPHS / "transformer_block.json")
    assert len(g.ops) > MAX_OPS
    with pytest.raises(InputError, match="up to 12 ops"):
        plan_exact(g, api.hardware("ascend-910c", hbm="1GB"))


@SMALL_PROPERTY
@given(graphs_and_hardware(max_ops=5), st.floats(0.5, 1.0))
def test_bounds_and_planners_never_cross_a_proven_optimum(case, fraction):
    g, base = case
    hw = at_fraction(g, fraction, base)
    if hw is None:
        return  # below the floor: no plan exists
    plan = plan_exact(g, hw, time_limit=10)
    optimum = plan.stats["exact"]["optimum_ns"]
    if optimum is None:
        return  # not proven within the limit: nothing to compare against
    for b in makespan_bounds(g, hw):
        assert b.value <= optimum + 1e-6, (b.reason, b.value, optimum)
    for fn in (plan_greedy, plan_reactive):
        other = fn(g, hw)
        tl = simulate(g, hw, other)
        # The exact search has no re-runs: a plan with some may be faster than its optimum.
        if tl.valid and not other.count(StepKind.RECOMPUTE):
            assert tl.metrics.makespan_ns >= optimum, (fn.__name__, tl.metrics.makespan_ns, optimum)


def test_bench_small_suite_reports_true_gaps():
    case = next(c for c in bench.suite(["small"]) if c.name == "fwd-bwd-3")
    rows = bench.run_case(case, (0.8,), ("greedy", "exact"), time_limit=10)
    gaps = bench.true_gaps(rows)
    assert [g["planner"] for g in gaps] == ["greedy"] and gaps[0]["gap"] >= 0


def test_an_incumbent_no_order_beats_is_returned_as_the_optimum():
    # At 80% greedy (without re-runs) already runs at the compute bound: both orders of the cut-down block are only
    # asked for something faster, and CP-SAT proves there is nothing.
    g, hw = small_case("transformer_block-10", 0.8)
    start = incumbent(g, hw)
    plan = plan_exact(g, hw, time_limit=30)
    st = plan.stats["exact"]
    assert plan.status == "optimal" and st["orders_pruned"] == st["orders"] == 2
    tl = simulate(g, hw, plan)
    assert tl.valid and tl.metrics.makespan_ns == st["optimum_ns"] == start[0]


def test_a_start_plan_hints_the_search_and_bounds_it():
    # At 60% the greedy incumbent (6.0 ms) is 4% above the optimum; cpsat's own plan, given as the start, hints its
    # order's model, and the proof that no order beats 5.755 ms follows.
    g, hw = small_case("transformer_block-10", 0.6)
    cpsat = api.plan(g, hw, planner="cpsat", time_limit=10, workers=1, recompute=False)
    plan = search_exact(g, hw, time_limit=30, start=cpsat.plan)
    st = plan.stats["exact"]
    assert st["proven"] and st["optimum_ns"] <= cpsat.timeline.metrics.makespan_ns
    tl = simulate(g, hw, plan)
    assert tl.valid and tl.metrics.makespan_ns <= cpsat.timeline.metrics.makespan_ns


def test_a_free_weight_nothing_writes_is_dropped_and_fetched_back_with_no_store():
    # A 100 B weight left to the planner, read by op0 and op2; op1's workspace leaves no room for it, and the links
    # move 1 B per 20 ns. Placed on HBM it keeps its master copy on the host (planner/placement.py): drop it after
    # op0, fetch it back after op1 (2,000 ns), 5,000 ns in all. With a Store first (2,000 ns, longer than op0) it
    # would be 6,000 ns. The exact search, cpsat and greedy all find the plan with no Store.
    g, hw = weight_read_twice(op1_workspace=100), simple_hardware(hbm=130, bw=0.05e9)
    plan = plan_exact(g, hw, time_limit=30)
    assert plan.status == "optimal" and plan.stats["exact"]["optimum_ns"] == 5000
    for name in ("exact", "cpsat", "greedy"):
        options = {"time_limit": 10, "workers": 1} if name == "cpsat" else {}
        got = plan if name == "exact" else api.plan(g, hw, planner=name, **options).plan
        tl = simulate(g, hw, got)
        assert tl.valid and tl.metrics.makespan_ns == 5000 and tl.metrics.bytes_moved["d2h"] == 0, name
        assert got.placement["w"] == "hbm", name
