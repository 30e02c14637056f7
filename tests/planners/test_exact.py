"""The exact reference (planner/planners/exact.py): proven optima on small graphs, which every bound stays under
and no planner beats."""

from __future__ import annotations

import pytest
from conftest import GRAPHS, small_case
from hypothesis import given
from hypothesis import strategies as st
from test_properties import SMALL_PROPERTY, at_fraction, graphs

from planner import api, bench
from planner.bounds import makespan_bounds
from planner.errors import InputError
from planner.executor import simulate
from planner.planners.exact import MAX_OPS, exact_scale, plan_exact
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
@given(graphs(max_ops=5), st.floats(0.5, 1.0))
def test_bounds_and_planners_never_cross_a_proven_optimum(g, fraction):
    hw = at_fraction(g, fraction)
    if hw is None:
        return  # below the floor: no plan exists
    plan = plan_exact(g, hw, time_limit=10)
    optimum = plan.stats["exact"]["optimum_ns"]
    if optimum is None:
        return  # not proven within the limit: nothing to compare against
    for b in makespan_bounds(g, hw):
        assert b.value <= optimum + 1e-6, (b.reason, b.value, optimum)
    for fn in (plan_greedy, plan_reactive):
        tl = simulate(g, hw, fn(g, hw))
        if tl.valid:
            assert tl.metrics.makespan_ns >= optimum, (fn.__name__, tl.metrics.makespan_ns, optimum)


def test_bench_small_suite_reports_true_gaps():
    case = next(c for c in bench.suite(["small"]) if c.name == "fwd-bwd-3")
    rows = bench.run_case(case, (0.8,), ("greedy", "exact"), time_limit=10)
    gaps = bench.true_gaps(rows)
    assert [g["planner"] for g in gaps] == ["greedy"] and gaps[0]["gap"] >= 0
