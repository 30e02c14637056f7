"""The none and reactive baselines: their plans validate, and reactive fits budgets none cannot."""

import pytest
from conftest import GRAPHS, chain_graph, simple_hardware

from planner import api
from planner.executor import simulate
from planner.formats import load_graph
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.orders import live_bytes, memory_aware_order
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive


def fan_graph() -> Graph:
    """Three big producers then their consumers: a graph order that peaks high, a memory-aware one lower."""
    t = [Tensor("x", 1, TensorKind.INPUT)]
    ops = []
    for i in range(3):
        t += [Tensor(f"big{i}", 100), Tensor(f"small{i}", 1)]
        ops.append(Op(f"make{i}", "F", ("x",), (f"big{i}",), duration_s=1e-6))
    for i in range(3):
        ops.append(Op(f"use{i}", "F", (f"big{i}",), (f"small{i}",), duration_s=1e-6))
    t.append(Tensor("y", 1, TensorKind.OUTPUT))
    ops.append(Op("join", "F", tuple(f"small{i}" for i in range(3)), ("y",), duration_s=1e-6))
    return Graph.build("fan", t, ops)


def test_memory_aware_order_lowers_the_peak():
    g = fan_graph()
    given = [op.name for op in g.ops]
    aware = memory_aware_order(g)
    assert max(live_bytes(g, aware)) < max(live_bytes(g, given))
    tl = simulate(g, simple_hardware(hbm=10**6), plan_none(g, simple_hardware(hbm=10**6)))
    assert tl.valid and tl.metrics.peak_bytes["hbm"] == max(live_bytes(g, aware))


def test_live_bytes_matches_executor_peak():
    g = fan_graph()
    hw = simple_hardware(hbm=10**6)
    plan = plan_none(g, hw)
    tl = simulate(g, hw, plan)
    assert tl.valid
    assert tl.metrics.peak_bytes["hbm"] == max(live_bytes(g, plan.compute_order()))


def test_live_bytes_bounds_the_peak_when_tensors_start_remote():
    # Remote-home tensors arrive over time in the executor; live_bytes counts them from the start.
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c")
    plan = plan_none(g, hw)
    tl = simulate(g, hw, plan)
    assert tl.valid
    assert tl.metrics.peak_bytes["hbm"] <= max(live_bytes(g, plan.compute_order()))


@pytest.mark.parametrize("graph_file,preset", [("transformer_block.json", "ascend-910c"),
                                               ("remote_weights_chain.json", "cloudmatrix384")])
@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.9, 1.0])
def test_reactive_fits_budgets_below_the_no_offload_peak(graph_file, preset, fraction):
    g = load_graph(GRAPHS / graph_file)
    hw0 = api.hardware(preset)
    ref = api.no_offload_reference(g, hw0)
    minimum, _ = api.largest_working_set(g)
    budget = max(int(ref.metrics.peak_bytes["hbm"] * fraction), minimum)
    hw = api.hardware(preset, hbm=str(budget))
    result = api.plan(g, hw, planner="reactive")
    assert result.timeline.valid, [v.describe() for v in result.timeline.violations[:5]]
    assert result.timeline.metrics.peak_bytes["hbm"] <= budget
    if fraction < 1.0:
        assert sum(result.timeline.metrics.bytes_moved.values()) > 0


def test_reactive_stalls_and_lookahead_helps():
    g = chain_graph(sizes=(10,) * 6, durations_us=(1.0,) * 6, weight_home="host")
    hw = simple_hardware(hbm=70, bw=0.01e9)  # 10 bytes of weight take 1 us; the no-offload program needs 80 B
    assert not simulate(g, hw, plan_none(g, hw)).valid
    base = simulate(g, hw, plan_reactive(g, hw))
    ahead = simulate(g, hw, plan_reactive(g, hw, lookahead=2))
    assert base.valid and ahead.valid
    assert base.metrics.stall_ns == 6000  # every weight fetched synchronously
    assert ahead.metrics.makespan_ns < base.metrics.makespan_ns


@pytest.mark.parametrize("budget", ["2.4GB", "3GB"])
def test_reactive_keeps_the_no_offload_makespan_when_everything_fits(budget):
    # transformer_block's weights and optimizer states are pinned to the host: fetched on demand they stall the
    # step by tens of ms, while the no-offload program streams them in from the start.
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm=budget)
    none = simulate(g, hw, plan_none(g, hw))
    reactive = simulate(g, hw, plan_reactive(g, hw, lookahead=1))
    assert none.valid and reactive.valid
    assert reactive.metrics.makespan_ns == none.metrics.makespan_ns


def test_reactive_runs_short_below_the_no_offload_peak():
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="2.3GB")  # the no-offload program peaks at 2.37 GB
    assert not simulate(g, hw, plan_none(g, hw)).valid
    tl = simulate(g, hw, plan_reactive(g, hw))
    assert tl.valid and tl.metrics.stall_ns > 0


def test_reactive_stores_only_what_has_no_valid_copy():
    g = chain_graph(sizes=(100,) * 3, weight_home="host")
    hw = simple_hardware(hbm=260)
    plan = plan_reactive(g, hw)
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations]
    stored = {s.target for s in plan.steps if s.kind.value == "store"}
    assert not stored & {"w0", "w1", "w2"}  # weights have their home copy: evicted by Detach alone


def test_budget_below_working_set_is_infeasible():
    g = chain_graph()
    with pytest.raises(api.InfeasibleBudget) as err:
        api.plan(g, simple_hardware(hbm=100), planner="reactive")
    assert err.value.minimum == 100 + 10 + 100 and "op 'op1'" in err.value.reason


def test_reactive_fetches_wait_for_the_drops_of_the_start():
    """The room of tensors dropped at time 0 is what the first fetch counts on: it waits for their Detaches."""
    g = Graph("dropped", {"x": Tensor("x", 3, TensorKind.INPUT, home="host"),
                          "small": Tensor("small", 1, TensorKind.INPUT),
                          "unread": Tensor("unread", 4, TensorKind.INPUT), "w": Tensor("w", 1, TensorKind.WEIGHT)},
              (Op("op0", "F", ("x",), (), updates=("w",), duration_s=1e-6),))
    hw = simple_hardware(hbm=4)
    plan = plan_reactive(g, hw)
    drop = next(i for i, s in enumerate(plan.steps) if s.kind.value == "detach" and s.target == "unread")
    fetch = next(s for s in plan.steps if s.kind.value == "prefetch")
    assert drop in fetch.waits
    tl = simulate(g, hw, plan)
    assert plan.status == "feasible" and tl.valid, [v.describe() for v in tl.violations]


def test_reactive_fetches_at_the_end_wait_for_the_evictions_they_count_on():
    # Three 1 B weights on HBM, a 2 B output, a 3 B budget: two weights leave so that the op fits, and come back at
    # the end. Bringing back the first evicts the output, which makes room for both; the second's fetch once ran
    # beside that eviction (4 B held; found by fuzzing reactive).
    from test_properties import budgeted, with_pool

    W = TensorKind.WEIGHT
    g = Graph.build("end_fetches", [Tensor("p0", 1, W), Tensor("p1", 1, W), Tensor("p2", 1, W),
                                    Tensor("out", 2, TensorKind.OUTPUT)], [Op("op0", "F", ("p0",), ("out",),
                                                                              duration_s=1e-6)])
    hw = budgeted(with_pool(simple_hardware()), 3)
    plan = plan_reactive(g, hw)
    tl = simulate(g, hw, plan)
    assert plan.status == "feasible" and tl.valid, [v.describe() for v in tl.violations]


def test_reactive_uses_the_tier_of_the_quicker_round_trip_when_bandwidths_tie():
    # Reactive ranked tiers by bandwidth, then by name, unlike greedy and cpsat (Hardware.round_trip_key): between
    # two tiers of one bandwidth it chose by name, not by latency, both where tensors start and where it evicts to.
    from conftest import fwd_bwd

    from planner.hardware import HBM, Hardware, Link, Tier

    lat = {"aaa": 1e-6, "zzz": 0.0}
    links = tuple(ln for t in lat for ln in (Link(f"d2{t}", HBM, t, 1e9, lat[t]), Link(f"{t}2d", t, HBM, 1e9, lat[t])))
    chain = chain_graph(sizes=(100,) * 6, durations_us=(1.0,) * 6, weight_home="host")
    starts_remote = Graph.build(chain.name, [Tensor(t.name, t.bytes, t.kind, home="auto" if t.home == "host"
                                                    else t.home) for t in chain.tensors.values()], list(chain.ops))
    for g, hbm, used in ((starts_remote, 230, {"zzz2d"}), (fwd_bwd(), 300, {"zzz2d", "d2zzz"})):
        hw = Hardware(name="tie", tiers=(Tier(HBM, hbm), Tier("aaa", 10**9), Tier("zzz", 10**9)), links=links,
                      peak_flops=1e9, hbm_bandwidth_Bps=1e12, launch_overhead_s=0.0)
        plan = plan_reactive(g, hw)
        assert simulate(g, hw, plan).valid
        assert {s.stream for s in plan.steps if s.stream != "compute"} == used
