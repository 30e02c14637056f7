"""Greedy's recompute chains (``greedy_remat``): a remat-only plan where the depth-1 selection finds none.

On the forward/backward chain at 280 B, every activation but one pair has to go and each backward op needs one
made again from the input through the forward ops: a chain. The selection recomputes at depth 1 and stays over the
budget; the chains fit, and the executor validates the plan, its peak and its time (compute plus re-runs).
"""

from __future__ import annotations

import pytest
from conftest import SHARED, simple_hardware
from test_greedy_recompute import compute_ns, fwd_bwd

from planner import api, bench
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.plan import StepKind
from planner.planners.greedy import DEFAULTS, plan_greedy
from planner.planners.greedy_remat import chains_apply, plan_remat_chains
from planner.planners.greedy_select import Answers, Context, select_gaps

TIGHT = 280  # fwd_bwd(6): x, two activations of a chain, the gradients in flight


def remat_context(g: Graph, budget: int, order: str = "graph") -> Context:
    return Context(g, simple_hardware(hbm=budget), order, Answers(offload=False))


def test_chains_fit_where_the_depth_one_selection_cannot():
    g = fwd_bwd(n=6)
    ctx = remat_context(g, TIGHT)
    d = DEFAULTS
    _gaps, _count, over = select_gaps(ctx, TIGHT, d["select_distance"], d["select_num"], d["prefetch_distance"],
                                      d["release_distance"])
    assert over is not None  # the selection alone stays over the budget
    plan = plan_remat_chains(ctx, TIGHT)
    assert plan is not None
    tl = simulate(g, simple_hardware(hbm=TIGHT), plan)
    assert tl.valid, tl.violations[:3]
    assert tl.metrics.peak_bytes[HBM] <= TIGHT
    redo = [s for s in plan.steps if s.kind is StepKind.RECOMPUTE]
    redo_ns = sum(round(g.op(s.target).duration_s * 1e9) for s in redo)
    assert tl.metrics.recompute_ns == redo_ns
    assert tl.metrics.makespan_ns == compute_ns(g) + redo_ns  # nothing moves: the compute stream never waits
    # A chain: some re-run reads what an earlier re-run of the same slot made again.
    made_by_redo = set()
    chained = False
    for s in plan.steps:
        if s.kind is StepKind.RECOMPUTE:
            op = g.op(s.target)
            chained = chained or any(t in made_by_redo for t in op.inputs)
            made_by_redo.update(op.outputs)
        elif s.kind is StepKind.COMPUTE:
            made_by_redo.clear()
    assert chained


def test_greedy_remat_only_returns_the_chains_plan():
    g = fwd_bwd(n=6)
    hw = simple_hardware(hbm=TIGHT)
    plan = plan_greedy(g, hw, offload=False)
    tl = simulate(g, hw, plan)
    assert tl.valid and tl.metrics.peak_bytes[HBM] <= TIGHT
    assert plan.options["offload"] is False and plan.options["recompute"] is True
    assert plan.count(StepKind.PREFETCH) == plan.count(StepKind.STORE) == 0
    assert any("recompute chains" in n for n in plan.notes)


def test_chains_are_deterministic():
    g = fwd_bwd(n=6)
    a = plan_remat_chains(remat_context(g, TIGHT), TIGHT)
    b = plan_remat_chains(remat_context(g, TIGHT), TIGHT)
    assert a is not None and a.steps == b.steps


def test_below_what_any_chain_needs_there_is_no_plan():
    g = fwd_bwd(n=6)
    assert plan_remat_chains(remat_context(g, 200), 200) is None
    assert not simulate(g, simple_hardware(hbm=200), plan_greedy(g, simple_hardware(hbm=200), offload=False)).valid


def test_a_context_runs_the_chains_once_per_budget_and_not_below_a_budget_where_they_failed(monkeypatch):
    """The search depends on the Context's fixed fields only: a budget asked again gets the same plan without a run,
    and one at or below a budget where it found nothing is not searched (greedy's replanning for static offsets
    asks at budget after lower budget; each failure cost 6-9 s on Checkmate's random n1000)."""
    import planner.planners.greedy_remat as remat

    g = fwd_bwd(n=6)
    ctx = remat_context(g, TIGHT)
    runs: list[int] = []
    run = remat._run

    def counted(ctx, facts, budget, policy, addresses):
        runs.append(budget)
        return run(ctx, facts, budget, policy, addresses)

    monkeypatch.setattr(remat, "_run", counted)
    first = plan_remat_chains(ctx, TIGHT)
    assert first is not None and runs
    searched = len(runs)
    again = plan_remat_chains(ctx, TIGHT)
    assert again is first and len(runs) == searched
    assert plan_remat_chains(ctx, 200) is None and len(runs) > searched  # searched: nothing fits 200 B
    searched = len(runs)
    assert plan_remat_chains(ctx, 190) is None and len(runs) == searched  # below a failure: not searched
    assert plan_remat_chains(ctx, 200, addresses=True) is None and len(runs) > searched  # its own record
    assert simulate(g, simple_hardware(hbm=TIGHT), first).valid


def test_chains_do_not_apply_where_a_tensor_must_move():
    t = [Tensor("x", 10, TensorKind.INPUT), Tensor("w", 10, TensorKind.WEIGHT, home="host"), Tensor("y", 10),
         Tensor("z", 10, TensorKind.OUTPUT)]
    ops = [Op("p", "F", ("x", "w"), ("y",), duration_s=1e-6), Op("q", "F", ("y",), ("z",), duration_s=1e-6)]
    g = Graph.build("fetch", t, ops)
    ctx = remat_context(g, 1000)
    assert not chains_apply(ctx)
    assert plan_remat_chains(ctx, 1000) is None


def test_forbidden_recompute_is_never_used():
    g = fwd_bwd(n=6, forbid=True)
    assert plan_remat_chains(remat_context(g, TIGHT), TIGHT) is None
    roomy = 2000
    plan = plan_remat_chains(remat_context(g, roomy), roomy)
    assert plan is not None and plan.count(StepKind.RECOMPUTE) == 0
    assert simulate(g, simple_hardware(hbm=roomy), plan).valid


RANDOM_N100 = SHARED / "graphs" / "checkmate" / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json"


@pytest.mark.skipif(not RANDOM_N100.is_file(), reason="../shared/graphs/checkmate is not here")
def test_checkmate_random_graph_gets_a_remat_only_plan_at_80_percent():
    # Issue 13: before the chains, neither greedy nor cpsat found a remat-only plan here.
    g = api.load_graph(RANDOM_N100, size_unit_bytes=1e6)
    peak = bench.no_offload_reference(g, "ascend-910c", {}, order="graph").metrics.peak_bytes[HBM]
    hw = api.hardware("ascend-910c", hbm=str(int(peak * 0.8)))
    plan = plan_greedy(g, hw, offload=False)
    tl = simulate(g, hw, plan)
    assert tl.valid, tl.violations[:3]
    assert tl.metrics.peak_bytes[HBM] <= hw.hbm_bytes
    assert sum(tl.metrics.bytes_moved.values()) == 0


def test_chains_with_addresses_carry_static_offsets_that_fit():
    g = fwd_bwd(n=6)
    budget = 320
    hw = simple_hardware(hbm=budget)
    plan = plan_remat_chains(remat_context(g, budget), budget, addresses=True)
    assert plan is not None and plan.offsets
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    assert tl.metrics.allocator == "static" and tl.metrics.offset_height_bytes <= budget
    # Without addresses the same run keeps offsets to the caller.
    assert not plan_remat_chains(remat_context(g, budget), budget).offsets


def test_addresses_make_the_run_drop_for_holes_not_bytes():
    # Placing by address can only be as tight as counting bytes: below what the count needs there is no plan either.
    g = fwd_bwd(n=6)
    assert plan_remat_chains(remat_context(g, 260), 260, addresses=True) is None
    placed = plan_remat_chains(remat_context(g, TIGHT), TIGHT, addresses=True)
    if placed is not None:
        assert simulate(g, simple_hardware(hbm=TIGHT), placed).valid


def training_like(n: int = 4) -> Graph:
    """``fwd_bwd``'s shape as a training step: each forward op reads a weight ``w_i`` that an optimizer op updates
    in place after the backward, and makes a second, small output ``s_i`` (as FlashAttention makes its
    log-sum-exp) that the backward reads too. Weights 5 B, activations 100 B, side outputs 4 B, gradients 10 B."""
    NS = 1e-9
    t = [Tensor("x", 50, TensorKind.INPUT), Tensor("loss", 1, TensorKind.OUTPUT)]
    ops = []
    prev = "x"
    for i in range(n):
        t += [Tensor(f"w{i}", 5, TensorKind.WEIGHT), Tensor(f"a{i}", 100), Tensor(f"s{i}", 4)]
        ops.append(Op(f"f{i}", "F", (prev, f"w{i}"), (f"a{i}", f"s{i}"), duration_s=1000 * NS))
        prev = f"a{i}"
    t.append(Tensor(f"g{n}", 10))
    ops.append(Op("head", "L", (prev,), (f"g{n}", "loss"), duration_s=1000 * NS))
    for i in reversed(range(n)):
        t.append(Tensor(f"g{i}", 10, TensorKind.OUTPUT if i == 0 else TensorKind.ACTIVATION))
        ins = (f"a{i - 1}" if i else "x", f"s{i}", f"g{i + 1}", f"w{i}")
        ops.append(Op(f"b{i}", "B", ins, (f"g{i}",), duration_s=2000 * NS))
    for i in range(n):
        ops.append(Op(f"opt{i}", "AdamW", (), (), (f"w{i}",), duration_s=100 * NS))
    return Graph.build("training_like", t, ops)


def test_chains_rerun_ops_with_two_outputs_and_inputs_updated_after_the_backward():
    g = training_like()
    big = simple_hardware(hbm=10**6)
    peak = simulate(g, big, api.get_planner("none")(g, big)).metrics.peak_bytes[HBM]
    budget = peak - 150  # more than one activation has to go: a chain through the forward ops
    ctx = remat_context(g, budget)
    plan = plan_remat_chains(ctx, budget)
    assert plan is not None
    hw = simple_hardware(hbm=budget)
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    assert tl.metrics.peak_bytes[HBM] <= budget
    steps = plan.steps
    redo = [k for k, s in enumerate(steps) if s.kind is StepKind.RECOMPUTE]
    first_opt = next(k for k, s in enumerate(steps) if s.kind is StepKind.COMPUTE and s.target.startswith("opt"))
    assert redo and max(redo) < first_opt  # every re-run reads the weights before the optimizer writes them
    assert tl.metrics.makespan_ns == round(sum(op.duration_s for op in g.ops) * 1e9) + tl.metrics.recompute_ns
