"""cpsat with recompute: per gap keep, offload or drop and re-run; remat only; chains of re-runs; the LNS path;
plans with recompute steps as hints. Every plan is checked by the executor."""

from __future__ import annotations

import pytest
from conftest import checkmate_source_graph, fwd_bwd, simple_hardware

from planner import bounds
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.plan import PlanStatus, StepKind
from planner.planners.cpsat import plan_cpsat_timed
from planner.planners.cpsat.data import RECOMPUTE
from planner.planners.cpsat.decode import plan_from_assignment
from planner.planners.cpsat.hint import assignment_from_plan, check, tick_times
from planner.planners.cpsat.run import Run
from planner.planners.cpsat.solve import prepare
from planner.planners.none import plan_none

SLOW = 1e6  # bytes/s: a 100-byte activation takes 100 us each way, far longer than the 1-2 us ops


def at_fraction(g: Graph, fraction: float, bw: float):
    peak = simulate(g, simple_hardware(hbm=10**9), plan_none(g, simple_hardware(hbm=10**9))).metrics.peak_bytes[HBM]
    return simple_hardware(hbm=int(peak * fraction), bw=bw)


def checked(g: Graph, hw, **options):
    planned = plan_cpsat_timed(g, hw, time_limit=10, **options)
    assert simulate(g, hw, planned.plan) == planned.timeline
    return planned.plan, planned.timeline


def test_remat_only_drops_and_reruns_within_the_budget():
    g = fwd_bwd()
    hw = at_fraction(g, 0.8, SLOW)
    plan, tl = checked(g, hw, offload=False)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    m = tl.metrics
    assert sum(m.bytes_moved.values()) == 0
    assert plan.count(StepKind.RECOMPUTE) >= 1 and m.recompute_ns > 0
    # Nothing waits on a link: the step is its compute, re-runs included.
    assert m.makespan_ns == m.compute_ns == 19_000 + m.recompute_ns
    # Two activations must be off HBM at the loss; each re-run is a 1 us forward op.
    assert m.makespan_ns == 21_000
    assert plan.options["offload"] is False and plan.options["recompute"] is True
    assert m.makespan_ns >= bounds.makespan_bound(g, hw, recompute=True).value


def test_with_neither_answer_nothing_fits():
    g = fwd_bwd()
    hw = at_fraction(g, 0.8, SLOW)
    plan, tl = checked(g, hw, offload=False, recompute=False)
    assert not tl.valid or plan.status is PlanStatus.INFEASIBLE


def test_joint_recomputes_on_a_slow_link_and_offloads_on_a_fast_one():
    g = fwd_bwd()
    slow = at_fraction(g, 0.8, SLOW)
    _plan, tl = checked(g, slow)
    assert tl.valid and tl.metrics.makespan_ns == 21_000 and tl.metrics.recompute_ns == 2_000
    # Offload only on the slow link is far slower: each Store and Prefetch takes 100 us.
    _plan, off = checked(g, slow, recompute=False)
    assert off.valid and off.metrics.makespan_ns > 100_000
    # On a fast link the transfers hide behind compute: no re-run is worth its time.
    fast = at_fraction(g, 0.8, 1e11)
    plan, tl = checked(g, fast)
    assert tl.valid and tl.metrics.makespan_ns == 19_000 and plan.count(StepKind.RECOMPUTE) == 0


def chain_graph() -> Graph:
    """f1: a0 -> a1 (200 B); f2: a1 -> a2; m1: a2 -> h1, m2: h1 -> h2 (300 B each) while a1 and a2 wait; u reads
    a1, a2 and h2.

    At m2 (h1, h2 and a0, the only source of a1: 700 B) a1 and a2 must be off HBM, and keeping a1 instead of a0
    does not fit: with no link worth using, a1 is re-made from a0, then a2 from a1, before u (a chain)."""
    us = 1e-6
    tensors = [Tensor("a0", 100, TensorKind.INPUT), Tensor("a1", 200), Tensor("a2", 100), Tensor("h1", 300),
               Tensor("h2", 300), Tensor("out", 100, TensorKind.OUTPUT)]
    ops = [Op("f1", "F", ("a0",), ("a1",), duration_s=us), Op("f2", "F", ("a1",), ("a2",), duration_s=us),
           Op("m1", "M", ("a2",), ("h1",), duration_s=us), Op("m2", "M", ("h1",), ("h2",), duration_s=us),
           Op("u", "U", ("a1", "a2", "h2"), ("out",), duration_s=us)]
    return Graph.build("chain2", tensors, ops)


def test_reruns_chain_when_an_input_is_itself_dropped():
    g = chain_graph()
    hw = simple_hardware(hbm=700, bw=SLOW)
    plan, tl = checked(g, hw, offload=False)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    redo = [s.target for s in plan.steps if s.kind is StepKind.RECOMPUTE]
    assert redo == ["f1", "f2"]
    assert tl.metrics.makespan_ns == 7_000


def test_a_plan_with_recompute_steps_is_a_feasible_hint_that_decodes_back():
    g = fwd_bwd()
    hw = at_fraction(g, 0.8, SLOW)
    plan, tl = checked(g, hw, offload=False)
    run = Run.start(g, hw, 10.0)
    run.offload = False
    p, asg = prepare(run, plan, tl)
    assert any(asg.off.get(gap.index) == RECOMPUTE for gap in p.gaps)
    assert check(p, asg) == []
    again = plan_from_assignment(p, asg)
    re_tl = simulate(g, hw, again)
    assert re_tl.valid and re_tl.metrics.makespan_ns <= tl.metrics.makespan_ns
    assert assignment_from_plan(p, again, tick_times(p, again))[1] == []


def test_a_store_beside_a_re_run_gap_is_left_out_of_the_program():
    # The model lets a version's Store be present while its gap is re-run (it costs only link time). Emitted, that
    # Store would follow the Detach the re-run gap puts right after the last use, and find its tensor gone.
    g = fwd_bwd()
    hw = at_fraction(g, 0.8, SLOW)
    plan, tl = checked(g, hw, offload=False)
    run = Run.start(g, hw, 10.0)
    p, asg = prepare(run, plan, tl)
    redo = [gap for gap in p.gaps if asg.off.get(gap.index) == RECOMPUTE and gap.slot is not None]
    assert redo
    tier = next(iter(p.tiers))
    for gap in redo:
        asg.store[gap.slot] = tier
        asg.store_start[gap.slot] = asg.prefetch[gap.index]  # late: after the Detach
    again = plan_from_assignment(p, asg)
    re_tl = simulate(g, hw, again)
    assert re_tl.valid, [v.describe() for v in re_tl.violations[:3]]
    assert again.count(StepKind.STORE) == plan.count(StepKind.STORE)


@pytest.mark.parametrize("offload", [False, True])
def test_the_window_search_keeps_recompute_plans_valid(offload):
    g = fwd_bwd(n=16)
    hw = at_fraction(g, 0.85, SLOW)
    plan, tl = checked(g, hw, offload=offload, whole_max_ops=5, window_ops=10)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    assert plan.stats["cpsat"]["model"] == "lns"
    start = plan.stats["cpsat"]["start_makespan_us"] * 1000
    assert tl.metrics.makespan_ns <= start
    assert tl.metrics.makespan_ns >= bounds.makespan_bound(g, hw).value


def test_remat_only_re_runs_a_checkmate_source_and_proves_it_optimal():
    g = checkmate_source_graph()
    hw = simple_hardware(hbm=1150, bw=1e3)
    plan, tl = checked(g, hw, offload=False)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    assert [s.target for s in plan.steps if s.kind == StepKind.RECOMPUTE] == ["src"]
    assert tl.metrics.makespan_ns == 252_000 and plan.stats["cpsat"]["optimal"]
