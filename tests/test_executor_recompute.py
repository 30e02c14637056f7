"""The executor's recompute steps: a dropped activation made again, and each way a recomputation can be wrong."""

from conftest import simple_hardware
from test_executor import kinds, skip_graph

from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.plan import ProgramBuilder, StepKind
from planner.schedule import plan_from_dict, schedule_to_dict, validate_schedule


def remat_plan(recompute: bool = True, read_x_after: bool = False) -> ProgramBuilder:
    """skip_graph with a0 dropped after op0 (no copy anywhere) and made again by re-running op0 before op3."""
    pb = ProgramBuilder()
    pb.compute("op0")
    pb.detach("a0")
    pb.compute("op1")
    pb.compute("op2")
    if recompute:
        pb.recompute("op0")
    pb.compute("op3")
    return pb


def test_recompute_makes_a_dropped_activation_again():
    g = skip_graph()
    hw = simple_hardware(hbm=1000)
    tl = simulate(g, hw, remat_plan().build("skip", "hand"))
    assert tl.valid, [v.describe() for v in tl.violations]
    # Five 1 us steps on the compute stream, the recomputation among them, and nothing moved.
    assert tl.metrics.makespan_ns == 5000
    assert tl.metrics.recompute_ns == 1000 and tl.metrics.compute_ns == 5000
    assert sum(tl.metrics.bytes_moved.values()) == 0
    a0 = [(r.start_ns, r.end_ns) for r in tl.residencies if r.name == "a0"]
    assert a0 == [(0, 1000), (3000, 5000)]
    # x (50) is kept for the recomputation: it dies at the recompute's end, not at op1's.
    x = [(r.start_ns, r.end_ns) for r in tl.residencies if r.name == "x"]
    assert x == [(0, 4000)]
    # Without the drop the peak is x + a0 + a1 + a2 = 350 (op2); with it a0 is gone there: 250.
    assert tl.metrics.peak_bytes["hbm"] == 300  # op3: a0, a2 and a3 (x freed at 4000)


def test_drop_without_recompute_loses_data():
    g = skip_graph()
    tl = simulate(g, simple_hardware(hbm=1000), remat_plan(recompute=False).build("skip", "hand"))
    assert "data_loss" in kinds(tl) and "not_resident" in kinds(tl)


def test_recompute_in_a_schedule_file_round_trips():
    g = skip_graph()
    hw = simple_hardware(hbm=1000)
    plan = remat_plan().build("skip", "none")
    doc = schedule_to_dict(g, hw, plan, simulate(g, hw, plan))
    entry = next(e for e in doc["program"] if e["kind"] == "recompute")
    assert entry["node"] == "op0" and "tensor" not in entry
    back = plan_from_dict(doc, "s.json")
    assert back.steps == plan.steps
    assert back.count(StepKind.RECOMPUTE) == 1
    report = validate_schedule(doc, g, "s.json")
    assert report.ok and report.timeline.metrics.recompute_ns == 1000


def test_recompute_before_the_op_runs_is_malformed():
    pb = ProgramBuilder()
    pb.recompute("op0")
    for op in ("op0", "op1", "op2", "op3"):
        pb.compute(op)
    tl = simulate(skip_graph(), simple_hardware(hbm=1000), pb.build("skip", "hand"))
    assert kinds(tl) == ["program"]
    assert "has not run yet" in tl.violations[0].message


def test_recompute_needs_its_inputs_resident():
    # a1 is dropped after op2 (its last use) and op2 re-run before op3: a1 is gone.
    g = skip_graph()
    pb = ProgramBuilder()
    for op in ("op0", "op1", "op2"):
        pb.compute(op)
    pb.detach("a2")
    pb.detach("a1")
    pb.recompute("op2")
    pb.compute("op3")
    tl = simulate(g, simple_hardware(hbm=1000), pb.build("skip", "hand"))
    at_recompute = [v for v in tl.violations if v.step == 5]
    assert [v.kind for v in at_recompute] == ["not_resident"]
    assert "recompute reads 'a1'" in at_recompute[0].message
    # Dropping a1 is itself flagged: the recomputation still needs it.
    assert any(v.kind == "data_loss" and v.tensor == "a1" for v in tl.violations)


def inplace_graph() -> Graph:
    """p: w -> y; u: updates w; c: reads y (w changes between y's production and its use)."""
    us = 1e-6
    tensors = [Tensor("w", 10, TensorKind.WEIGHT), Tensor("y", 100), Tensor("z", 10, TensorKind.OUTPUT)]
    ops = [Op("p", "F", ("w",), ("y",), duration_s=us), Op("u", "U", (), (), ("w",), duration_s=us),
           Op("c", "F", ("y",), ("z",), duration_s=us)]
    return Graph.build("inplace", tensors, ops)


def stale_program():
    """``inplace_graph``'s y dropped, w updated, then p re-run to make y again: it would read the new w."""
    pb = ProgramBuilder()
    pb.compute("p")
    pb.detach("y")
    pb.compute("u")
    pb.recompute("p")
    pb.compute("c")
    return pb.build("inplace", "hand")


def test_recompute_after_an_inplace_update_of_its_input_is_stale():
    tl = simulate(inplace_graph(), simple_hardware(hbm=1000), stale_program())
    assert kinds(tl) == ["stale_recompute"]


def test_recompute_of_an_inplace_op_is_malformed():
    pb = ProgramBuilder()
    for op in ("p", "u"):
        pb.compute(op)
    pb.recompute("u")
    pb.compute("c")
    tl = simulate(inplace_graph(), simple_hardware(hbm=1000), pb.build("inplace", "hand"))
    assert kinds(tl) == ["program"] and "in place" in tl.violations[0].message


def test_recompute_of_an_op_the_graph_forbids_is_malformed():
    g = skip_graph()
    ops = tuple(Op(o.name, o.op_type, o.inputs, o.outputs, duration_s=o.duration_s, recompute=o.name != "op0")
                for o in g.ops)
    g = Graph.build("skip", g.tensors.values(), ops)
    tl = simulate(g, simple_hardware(hbm=1000), remat_plan().build("skip", "hand"))
    assert kinds(tl) == ["program"] and "not recomputable" in tl.violations[0].message


def source_graph(recompute: bool | None) -> Graph:
    """src (no inputs) -> a0; op1: a0 -> a1; op2: a0, a1 -> a2: a0 idle across op1's output only."""
    us = 1e-6
    tensors = [Tensor("a0", 100), Tensor("a1", 100), Tensor("a2", 100, TensorKind.OUTPUT)]
    ops = [Op("src", "Conv", (), ("a0",), duration_s=us, recompute=recompute),
           Op("op1", "F", ("a0",), ("a1",), duration_s=us), Op("op2", "F", ("a0", "a1"), ("a2",), duration_s=us)]
    return Graph.build("source", tensors, ops)


def source_remat_plan() -> ProgramBuilder:
    pb = ProgramBuilder()
    pb.compute("src")
    pb.compute("op1")
    pb.detach("a0")
    pb.recompute("src")
    pb.compute("op2")
    return pb


def test_a_source_the_graph_marks_recomputable_is_made_again_from_nothing():
    tl = simulate(source_graph(True), simple_hardware(hbm=1000), source_remat_plan().build("source", "hand"))
    assert tl.valid, [v.describe() for v in tl.violations]
    assert tl.metrics.recompute_ns == 1000 and tl.metrics.makespan_ns == 4000


def test_a_source_the_graph_does_not_mark_is_not_recomputable():
    tl = simulate(source_graph(None), simple_hardware(hbm=1000), source_remat_plan().build("source", "hand"))
    assert "program" in kinds(tl) and "not recomputable" in tl.violations[0].message
