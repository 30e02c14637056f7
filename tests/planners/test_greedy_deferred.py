"""The deferred orders with their re-runs (planner/planners/greedy_deferred.py): the phases, the rewrite, the plan
mapped back onto the original graph, and greedy taking them where they pay."""

import pytest
from conftest import simple_hardware

from planner import api
from planner.errors import InputError
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.orders import deferred_phases, first_release, named_order
from planner.plan import StepKind
from planner.planners.greedy import Settings, answers_of, plan_greedy, planned_with_context
from planner.planners.greedy_deferred import COPY, deferral, plan_back
from planner.planners.greedy_select import Context
from planner.planners.greedy_sweep import plan_greedy_sweep


def accumulation_graph(layers: int = 3, micro_batches: int = 4, top_state: int = 20000, state: int = 3000,
                       act: int = 3000) -> Graph:
    """Gradient accumulation over ``micro_batches``: per layer a forward of two ops (a large activation h, then the
    layer's output a), a backward that reads h and adds to the layer's gradient, then one optimizer step per layer
    on host-pinned states, the top layer's the largest (graph order: micro-batch by micro-batch, the steps last)."""
    t = [Tensor("x", 10, TensorKind.INPUT)]
    for i in range(layers):
        t += [Tensor(f"w{i}", 10, TensorKind.WEIGHT), Tensor(f"g{i}", 10, TensorKind.GRADIENT),
              Tensor(f"s{i}", top_state if i == layers - 1 else state, TensorKind.OPTIMIZER_STATE, home="host")]
    ops = []
    for m in range(micro_batches):
        for i in range(layers):
            t += [Tensor(f"h{m}_{i}", act), Tensor(f"a{m}_{i}", 10)]
            ops.append(Op(f"F{m}_{i}h", "F", ("x" if i == 0 else f"a{m}_{i - 1}", f"w{i}"), (f"h{m}_{i}",),
                          duration_s=1e-6))
            ops.append(Op(f"F{m}_{i}a", "F", (f"h{m}_{i}",), (f"a{m}_{i}",), duration_s=1e-6))
        for i in reversed(range(layers)):
            t.append(Tensor(f"d{m}_{i}", 10))
            up = (f"d{m}_{i + 1}",) if i + 1 < layers else (f"a{m}_{i}",)
            ops.append(Op(f"B{m}_{i}", "B", (f"h{m}_{i}", f"w{i}") + up, (f"d{m}_{i}",), (f"g{i}",),
                          duration_s=2e-6))
    for i in range(layers):
        ops.append(Op(f"opt{i}", "Adam", (f"g{i}",), (), (f"w{i}", f"s{i}"), duration_s=0.1e-6))
    return Graph.build("accumulation", t, ops)


# 70% of the graph's no-offload peak (35,090 B): the top layer's 20,000 B of states and the activations compete.
BUDGET = 24563


def test_the_first_release_is_the_update_of_the_bulk_of_the_stored_back_bytes():
    g = accumulation_graph()
    assert first_release(g) == ["opt2"]
    # Equal states: the first two of three hold half the bytes.
    assert first_release(accumulation_graph(top_state=3000)) == ["opt2", "opt1"]


def test_the_deferred_order_releases_the_top_layers_step_before_the_lower_layers_backward():
    g = accumulation_graph()
    for k in range(8):
        order = named_order(g, f"deferred-{k}")
        assert sorted(order) == sorted(op.name for op in g.ops)
        pos = {name: i for i, name in enumerate(order)}
        assert all(pos[u] < pos[v] for u, v in g.dag.edges)
    phases, _ties = deferred_phases(g, 0)
    order = named_order(g, "deferred-0")
    # Every micro-batch's forward and top-layer backward, then the top layer's step, then the lower layers.
    assert phases["opt2"] == 1 and phases["B3_2"] == 1 and phases["B0_1"] == 3
    assert order.index("opt2") < min(order.index(f"B{m}_{i}") for m in range(4) for i in (0, 1))
    # K eighths run first in full: with 4 micro-batches, deferred-4 runs the first two as the graph lists them.
    phases, _ties = deferred_phases(g, 4)
    assert all(phases[f"B{m}_0"] == 0 for m in (0, 1)) and phases["B2_0"] == 3


def test_without_stored_back_updates_there_is_nothing_to_defer():
    g = accumulation_graph()
    ops = [op for op in g.ops if not op.name.startswith("opt")]
    inference = Graph.build("inference", list(g.tensors.values()), ops)
    assert deferred_phases(inference, 0) is None and deferral(inference, 0) is None
    assert named_order(inference, "deferred-3") == named_order(inference, "auto")


def test_the_rewrite_re_runs_what_the_deferred_ops_read_from_what_is_on_hbm_anyway():
    g = accumulation_graph()
    d = deferral(g, 0)
    phases, _ties = deferred_phases(g, 0)
    assert d is not None and d.copy_of
    for copy, original in d.copy_of.items():
        op = d.graph.op(copy)
        assert g.op(original).recomputable and phases[original] <= 1
        # A copy reads weights, other copies, or what a deferred op reads itself (held anyway).
        deferred_reads = {t for o in g.ops if phases[o.name] >= 2 for t in o.reads}
        assert all(t not in g.producer or t.endswith(COPY) or t in deferred_reads for t in op.inputs)
    # The deferred backward reads the copies of the large activations, never the originals.
    for m in range(4):
        assert f"h{m}_0{COPY}" in d.graph.op(f"B{m}_0").reads
    order = [op.name for op in d.graph.ops]
    for copy in d.copy_of:
        # Each copy runs after every read of its original.
        for t in g.op(d.copy_of[copy]).outputs:
            assert all(order.index(r) < order.index(copy) for r in d.graph.users[t])


def test_the_plan_mapped_back_runs_as_the_rewritten_graphs_plan():
    g = accumulation_graph()
    hw = simple_hardware(hbm=BUDGET)
    d = deferral(g, 0)
    planned = planned_with_context(Context(d.graph, hw, "graph", answers_of(True, True)), Settings())
    assert planned.timeline.valid
    plan = plan_back(g, d, planned)
    timeline = simulate(g, hw, plan)
    assert timeline.valid, timeline.violations[:3]
    # The same program under other names: the same times, each copy's run a recompute step of its original.
    assert timeline.metrics.makespan_ns == planned.timeline.metrics.makespan_ns
    assert plan.count(StepKind.RECOMPUTE) >= len(d.copy_of)
    assert all(s.target in g.tensors or s.target in g.op_index for s in plan.steps)
    assert plan.offsets and timeline.metrics.allocator == "static"


def test_greedy_takes_the_deferred_order_where_it_pays():
    g = accumulation_graph()
    hw = simple_hardware(hbm=BUDGET)
    best = api.plan(g, hw, planner="greedy")
    assert best.timeline.valid
    assert best.plan.options["order"].startswith("deferred-")
    assert best.plan.count(StepKind.RECOMPUTE) > 0
    others = [api.plan(g, hw, planner="greedy", order=o).timeline for o in
              ("lowest-peak", "store-release", "sources-first", "graph")]
    assert all(tl.valid for tl in others)
    assert best.timeline.metrics.makespan_ns < min(tl.metrics.makespan_ns for tl in others)
    # Named, it gives the same plan again; the sweep is never slower than greedy's defaults.
    again = api.plan(g, hw, planner="greedy", order=best.plan.options["order"])
    assert again.plan.steps == best.plan.steps
    swept = plan_greedy_sweep(g, hw)
    sweep = simulate(g, hw, swept)
    assert sweep.valid and sweep.metrics.makespan_ns <= best.timeline.metrics.makespan_ns
    # Recorded as the sweep's (a schedule file checks a plan's options against its planner's).
    assert swept.planner == "greedy-sweep" and swept.options["sweep"] is True


@pytest.mark.parametrize("value, ok", [("deferred-0", True), ("deferred-7", True), ("deferred-8", False),
                                       ("deferred-x", False)])
def test_the_order_option_takes_deferred_k_from_0_to_7(value, ok):
    if ok:
        assert api.check_options(plan_greedy, "greedy", {"order": value}) == {"order": value}
    else:
        with pytest.raises(InputError, match="deferred-K \\(K from 0 to 7\\)"):
            api.check_options(plan_greedy, "greedy", {"order": value})


def test_what_outlives_the_step_is_never_made_again_by_a_rerun():
    # op0 makes an output that op6, after the deferral, reads. Re-running op0 made a second copy of a tensor that is
    # kept to the end anyway, and the plan mapped back dropped the original after op0 before storing it: the
    # executor rejected it (store and detach of a tensor not on HBM; found by fuzzing greedy's options).
    W, A = TensorKind.WEIGHT, TensorKind.ACTIVATION
    tensors = [Tensor("w", 1, W, home="host"), Tensor("x", 1, TensorKind.INPUT), Tensor("unread", 1, TensorKind.INPUT),
               Tensor("v", 1, W), Tensor("out", 1, TensorKind.OUTPUT)] + [Tensor(f"a{i}", 1, A) for i in (1, 3, 4, 5)]
    ops = ([Op("op0", "F", ("x",), ("out",), duration_s=1e-6), Op("op1", "F", ("w",), ("a1",), duration_s=1e-6),
            Op("op2", "F", ("x",), (), updates=("w",), duration_s=1e-6)]
           + [Op(f"op{i}", "F", ("w",), (f"a{i}",), duration_s=1e-6) for i in (3, 4, 5)]
           + [Op("op6", "F", ("x", "out"), (), updates=("w",), duration_s=1e-6)])
    g = Graph.build("persistent_rerun", tensors, ops)
    d = deferral(g, 4)
    assert d is None or "op0" not in d.copy_of.values()
    hw = simple_hardware(hbm=6)
    plan = plan_greedy(g, hw, order="deferred-4", recompute=False, offsets=False)
    tl = simulate(g, hw, plan)
    assert tl.valid and plan.status == "feasible", ([v.describe() for v in tl.violations], plan.notes)
