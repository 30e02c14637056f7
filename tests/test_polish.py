"""Stores issued earlier in their link's queue (planner/polish.py): only where the executor finds the plan valid
and faster, never before the version they copy exists, the same plan giving the same result."""

from dataclasses import replace
from pathlib import Path

from conftest import simple_hardware

from planner import api, polish
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.plan import ProgramBuilder, StepKind
from planner.planners.greedy import plan_greedy
from planner.polish import _candidates, stores_earlier, with_stores_earlier

US = 1e-6


def two_weights() -> Graph:
    """Two 100 B weights on HBM that must leave it in turn (W before op0, V before op1) in a 250 B budget."""
    w = TensorKind.WEIGHT
    return Graph.build("two_weights", [
        Tensor("V", 100, w), Tensor("W", 100, w), Tensor("x", 10, TensorKind.INPUT), Tensor("a", 100),
        Tensor("b", 100), Tensor("y", 10, TensorKind.OUTPUT)], [
        Op("op0", "F", ("x",), ("a",), duration_s=US), Op("op1", "F", ("a",), ("b",), duration_s=US),
        Op("op2", "F", ("b",), ("y",), duration_s=US)])


def queued_program(graph: Graph):
    """V's Store queued before W's, though op0 waits only for W's Detach."""
    pb = ProgramBuilder()
    sv = pb.store("V", "d2h")
    sw = pb.store("W", "d2h")
    pb.detach("W", waits=[sw])
    pb.compute("op0")
    pb.detach("V", waits=[sv])
    pb.compute("op1")
    last = pb.compute("op2")
    pb.prefetch("V", "h2d", waits=[last])
    pb.prefetch("W", "h2d", waits=[last])
    return pb.build(graph.name, "test")


def test_a_store_queued_behind_one_the_compute_does_not_wait_for_moves_first():
    g, hw = two_weights(), simple_hardware(hbm=250)
    plan = queued_program(g)
    tl = simulate(g, hw, plan)
    assert tl.valid
    polished, ptl, moved = stores_earlier(g, hw, plan, tl)
    assert moved == 1 and ptl.valid
    assert ptl.metrics.makespan_ns == tl.metrics.makespan_ns - 100  # W's Store (100 B at 1 B/ns) no longer waits
    assert [s.target for s in polished.steps if s.kind is StepKind.STORE] == ["W", "V"]
    assert simulate(g, hw, polished).metrics.makespan_ns == ptl.metrics.makespan_ns
    # Nothing more to gain: the plan comes back as it is.
    again, atl, more = stores_earlier(g, hw, polished, ptl)
    assert more == 0 and again is polished and atl is ptl


def test_an_invalid_plan_comes_back_untouched():
    # 210 B start on HBM (V, W, x) in 200 B: no plan of this program is valid, and none is searched.
    g, hw = two_weights(), simple_hardware(hbm=200)
    plan = queued_program(g)
    tl = simulate(g, hw, plan)
    assert not tl.valid
    polished, ptl, moved = stores_earlier(g, hw, plan, tl)
    assert (polished, ptl, moved) == (plan, tl, 0)


def test_a_store_never_moves_before_the_update_whose_version_it_copies():
    st = TensorKind.OPTIMIZER_STATE
    g = Graph.build("update", [Tensor("m", 100, st), Tensor("g", 10, TensorKind.INPUT)], [
        Op("adam", "Adam", ("g",), (), ("m",), duration_s=US), Op("other", "F", ("g",), (), duration_s=US)])
    pb = ProgramBuilder()
    pb.compute("adam")
    pb.compute("other")
    pb.store("m", "d2h")
    plan = pb.build(g.name, "test")
    (i, to, after), = _candidates(g, plan.steps, set())
    assert (i, to, after) == (2, 1, 0)  # right after the update, waiting for it


def test_the_same_plan_gives_the_same_result_with_the_moves_in_its_stats():
    g, hw = two_weights(), simple_hardware(hbm=250)
    plan = queued_program(g)
    a, atl = with_stores_earlier(g, hw, plan)
    b, _ = with_stores_earlier(g, hw, plan)
    assert a.steps == b.steps and a.stats["stores_earlier"] == 1 and atl.valid
    assert any("issued earlier" in n for n in a.notes)


def test_a_plan_with_static_offsets_is_screened_without_them_and_keeps_the_moves_the_full_runs_keep(monkeypatch):
    # Greedy's plan of transformer_block at 60% has static offsets, and the pass moves one Store (86.10 -> 82.60
    # ms). Each move is first run without the offsets, which has the full run's times: only the moves that run
    # finds faster are run in full, and the pass keeps the same moves as when every move is run in full.
    g = api.load_graph(Path(__file__).parent.parent / "graphs" / "transformer_block.json")
    peak = api.no_offload_reference(g, api.hardware()).metrics.peak_bytes["hbm"]
    hw = api.hardware(hbm=str(int(peak * 0.6)))
    plan = plan_greedy(g, hw)
    tl = simulate(g, hw, plan)
    assert plan.offsets and tl.valid
    runs: list[bool] = []  # per executor run: whether it was a full one (with the offsets)

    def counted(graph, hardware, p, **kw):
        runs.append(bool(p.offsets))
        return simulate(graph, hardware, p, **kw)

    monkeypatch.setattr(polish, "simulate", counted)
    screened, stl, moved = stores_earlier(g, hw, plan, tl, max_runs=16)
    full, screens = runs.count(True), runs.count(False)

    def every_move_in_full(graph, hardware, p, **kw):
        return simulate(graph, hardware, replace(p, offsets=plan.offsets))

    monkeypatch.setattr(polish, "simulate", every_move_in_full)
    plain, ptl, plain_moved = stores_earlier(g, hw, plan, tl, max_runs=16)
    assert moved == plain_moved >= 1 and screened.steps == plain.steps and screened.offsets == plan.offsets
    assert stl.valid and stl.metrics == ptl.metrics and stl.metrics.makespan_ns < tl.metrics.makespan_ns
    assert full == moved < screens
