"""Evictions that spare the caching allocator its compactions (planner/defrag.py)."""

from __future__ import annotations

from dataclasses import replace

from conftest import simple_hardware

from planner.defrag import spare_compactions
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.plan import ProgramBuilder, StepKind

US = 1e-6


def scattering_graph() -> Graph:
    """x is made early and read last; in between, best fit leaves it splitting HBM's free bytes in two, so that b
    (600 B of 1,000) finds no block large enough and the caching allocator compacts."""
    tensors = [Tensor("a1", 400), Tensor("x", 200), Tensor("a2", 400), Tensor("c", 100), Tensor("b", 600),
               Tensor("y", 100, TensorKind.OUTPUT)]
    ops = [Op("make_a1", "F", (), ("a1",), duration_s=US), Op("make_x", "F", (), ("x",), duration_s=US),
           Op("make_a2", "F", ("a1",), ("a2",), duration_s=US), Op("make_c", "F", ("a2",), ("c",), duration_s=US),
           Op("make_b", "F", ("c",), ("b",), duration_s=US), Op("use", "F", ("x", "b"), ("y",), duration_s=US)]
    return Graph.build("scattering", tensors, ops)


def in_graph_order(g: Graph):
    pb = ProgramBuilder()
    for op in g.ops:
        pb.compute(op.name, waits=[len(pb.steps) - 1] if pb.steps else [])
    return pb.build(g.name, "hand")


def test_an_idle_tensor_is_evicted_and_the_compaction_spared():
    g = scattering_graph()
    hw = replace(simple_hardware(hbm=1000), hbm_bandwidth_Bps=1e9)  # moving x (200 B) down costs 400 ns
    plan = in_graph_order(g)
    tl = simulate(g, hw, plan)
    assert tl.valid and tl.metrics.defrag_events == 1 and tl.metrics.makespan_ns == 6400
    assert [plan.steps[i].target for i in tl.compactions] == ["make_b"]
    out, out_tl, added = spare_compactions(g, hw, plan, tl)
    assert added == 1 and out_tl.valid and out_tl == simulate(g, hw, out)
    assert out_tl.metrics.defrag_events == 0 and out_tl.metrics.makespan_ns == 6000
    moves = [(s.kind, s.target) for s in out.steps if s.kind is not StepKind.COMPUTE]
    assert moves == [(StepKind.STORE, "x"), (StepKind.DETACH, "x"), (StepKind.PREFETCH, "x")]
    assert out.compute_order() == plan.compute_order()


def test_an_eviction_that_does_not_pay_is_not_kept():
    g = scattering_graph()
    # Links so slow that x's round trip costs more than the compaction it spares.
    hw = replace(simple_hardware(hbm=1000, bw=1e7), hbm_bandwidth_Bps=1e9)
    plan = in_graph_order(g)
    tl = simulate(g, hw, plan)
    assert tl.metrics.defrag_events == 1
    out, out_tl, added = spare_compactions(g, hw, plan, tl)
    assert added == 0 and out is plan and out_tl is tl


def test_nothing_to_do_without_compactions_or_runs():
    g = scattering_graph()
    hw = replace(simple_hardware(hbm=2000), hbm_bandwidth_Bps=1e9)
    plan = in_graph_order(g)
    tl = simulate(g, hw, plan)
    assert tl.compactions == () and spare_compactions(g, hw, plan, tl) == (plan, tl, 0)
    tight = replace(hw, tiers=(replace(hw.tiers[0], capacity_bytes=1000),) + hw.tiers[1:])
    tl = simulate(g, tight, plan)
    assert tl.compactions and spare_compactions(g, tight, plan, tl, max_runs=0) == (plan, tl, 0)


def test_a_weight_that_starts_remote_leaves_with_a_detach_alone():
    # x, on host, is fetched for its first reader and read again last; the remote copy is current, so no Store.
    tensors = [Tensor("x", 200, TensorKind.WEIGHT, home="host"), Tensor("a1", 390), Tensor("r", 10, TensorKind.OUTPUT),
               Tensor("a2", 390), Tensor("c", 100), Tensor("b", 600), Tensor("y", 100, TensorKind.OUTPUT)]
    ops = [Op("make_a1", "F", (), ("a1",), duration_s=US), Op("read_x", "F", ("x",), ("r",), duration_s=US),
           Op("make_a2", "F", ("a1",), ("a2",), duration_s=US), Op("make_c", "F", ("a2",), ("c",), duration_s=US),
           Op("make_b", "F", ("c",), ("b",), duration_s=US), Op("use", "F", ("x", "b"), ("y",), duration_s=US)]
    g = Graph.build("weight", tensors, ops)
    hw = replace(simple_hardware(hbm=1000), hbm_bandwidth_Bps=1e9)
    pb = ProgramBuilder()
    first = pb.compute("make_a1")
    fetch = pb.prefetch("x", "h2d")
    step = pb.compute("read_x", waits=[first, fetch])
    for op in ("make_a2", "make_c", "make_b", "use"):
        step = pb.compute(op, waits=[step])
    plan = pb.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid and tl.metrics.defrag_events == 1
    out, out_tl, added = spare_compactions(g, hw, plan, tl)
    assert added == 1 and out_tl.valid and out_tl == simulate(g, hw, out)
    assert out_tl.metrics.makespan_ns < tl.metrics.makespan_ns
    moves = [(s.kind, s.target) for s in out.steps if s.kind is not StepKind.COMPUTE]
    assert moves == [(StepKind.PREFETCH, "x"), (StepKind.DETACH, "x"), (StepKind.PREFETCH, "x")]
