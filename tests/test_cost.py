"""The cost model (planner/cost.py): op durations by roofline, kept per graph and compute model."""

from __future__ import annotations

from dataclasses import replace

from conftest import simple_hardware

from planner.cost import op_durations_ns
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.placement import with_placement


def _roofline_graph() -> Graph:
    tensors = [Tensor("x", 1000, TensorKind.INPUT), Tensor("w", 500, TensorKind.WEIGHT), Tensor("y", 1000)]
    return Graph.build("roofline", tensors, [Op("mm", "MatMul", ("x", "w"), ("y",), flops=4000, bytes_accessed=2500)])


def test_durations_follow_the_compute_model_they_are_asked_for_on_the_same_graph():
    g = _roofline_graph()
    hw = simple_hardware()  # 1 flop per ns: compute-bound, 4000 ns
    assert op_durations_ns(g, hw) == {"mm": 4000}
    assert op_durations_ns(g, replace(hw, peak_flops=4e9)) == {"mm": 1000}
    assert op_durations_ns(g, replace(hw, peak_flops=1e12, hbm_bandwidth_Bps=1e9)) == {"mm": 2500}
    assert op_durations_ns(g, replace(hw, launch_overhead_s=1e-6)) == {"mm": 5000}
    assert op_durations_ns(g, hw) == {"mm": 4000}


def test_a_caller_that_changes_the_durations_it_got_changes_no_later_answer():
    g = _roofline_graph()
    hw = simple_hardware()
    got = op_durations_ns(g, hw)
    got["mm"] = 1
    assert op_durations_ns(g, hw) == {"mm": 4000}
    assert op_durations_ns(with_placement(g, {}), hw) == {"mm": 4000}
