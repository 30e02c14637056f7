"""Where tensors start the step (planner/placement.py): homes, overrides, every planner's choice, steady state."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import GRAPHS, ROOT, chain_graph, simple_hardware

from planner import api
from planner.errors import InputError, InputErrors
from planner.executor import simulate
from planner.formats.hograph import graph_sha256, graph_to_dict
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.placement import apply_homes, bytes_by_kind, parse_homes, start_tiers, with_placement
from planner.planners.cpsat import plan_cpsat
from planner.schedule import plan_from_dict, schedule_to_dict, validate_schedule

TB = GRAPHS / "transformer_block.json"
ONNX_FIXTURES = ROOT / "tests" / "fixtures" / "onnx"


def options(name: str) -> dict:
    return {"time_limit": 10, "workers": 1} if name == "cpsat" else {}


def test_parse_homes_and_its_errors():
    assert parse_homes(["weight=auto", " optimizer_state = host "]) == {"weight": "auto", "optimizer_state": "host"}
    with pytest.raises(InputError, match="unknown tensor kind 'weights'"):
        parse_homes(["weights=auto"])
    with pytest.raises(InputError, match="KIND=TIER"):
        parse_homes(["weight"])


def test_apply_homes_sets_homes_by_kind_and_records_them():
    g = api.load_graph(TB)
    hw = api.hardware("ascend-910c")
    free = apply_homes(g, {"weight": AUTO}, hw)
    weights = [n for n, t in g.tensors.items() if t.kind is TensorKind.WEIGHT]
    assert sorted(free.free_tensors) == sorted(weights)
    assert free.metadata["homes"] == {"weight": "auto"} and graph_sha256(free) != graph_sha256(g)
    assert apply_homes(g, {}, hw) is g
    with pytest.raises(InputError, match="has no tier 'pool'"):
        apply_homes(g, {"weight": "pool"}, hw)
    with pytest.raises(InputError, match="do not outlive the step"):
        apply_homes(g, {"input": AUTO}, hw)


def test_start_tiers_and_with_placement():
    g = chain_graph(weight_home=AUTO)
    assert set(g.free_tensors) == {"w0", "w1", "w2"}
    tiers = start_tiers(g, {"w1": "host"})
    assert tiers == {"x": HBM, "w0": HBM, "w1": "host", "w2": HBM}
    placed = with_placement(g, {"w1": "host"})
    assert placed.tensors["w1"].home == "host" and placed.tensors["w0"].home == HBM and not placed.free_tensors
    assert bytes_by_kind(g, {"w1": "host"}) == {"input": {HBM: 50}, "weight": {HBM: 20, "host": 10}}


ALL_FREE = {"weight": AUTO, "optimizer_state": AUTO}


@pytest.mark.parametrize("name, homes", [
    (name, ALL_FREE) for name in ("none", "reactive", "greedy", "greedy-sweep", "cpsat")
] + [
    # Optimizer states pinned to the host: the planners that plan ahead hide their fetch and store back as the
    # no-offload plan does (reactive fetches on demand, by design, and is left out).
    (name, {"weight": AUTO}) for name in ("none", "greedy", "greedy-sweep", "cpsat")
])
def test_steady_state_costs_nothing_when_everything_fits(name, homes):
    # When the no-offload plan fits (its peak, and its caching allocator's high-water mark: fragmentation is
    # another matter) every planner keeps the no-offload makespan, free tensors on HBM included.
    g = apply_homes(api.load_graph(TB), homes)
    ref = api.no_offload_reference(g, api.hardware("ascend-910c"))
    fits = max(ref.metrics.peak_bytes[HBM], ref.metrics.offset_height_bytes or 0)
    hw = api.hardware("ascend-910c", hbm=str(fits + 10**6))
    r = api.plan(g, hw, planner=name, **options(name))
    assert r.timeline.valid, [v.describe() for v in r.timeline.violations[:3]]
    # (Planning ahead may even beat the no-offload plan, whose fetches of pinned-remote tensors all go first.)
    assert r.timeline.metrics.makespan_ns <= ref.metrics.makespan_ns
    assert set(g.free_tensors) <= set(r.plan.placement)


def weight_chain(n: int, home: str):
    """x -> op0 -> a0 -> ... each op reading its own 100-byte weight (homed ``home``); activations of 10 B."""
    tensors = [Tensor("x", 10, TensorKind.INPUT)]
    ops = []
    prev = "x"
    for i in range(n):
        tensors += [Tensor(f"w{i}", 100, TensorKind.WEIGHT, home=home), Tensor(f"a{i}", 10)]
        ops.append(Op(f"op{i}", "MatMul", (prev, f"w{i}"), (f"a{i}",), duration_s=5e-6))
        prev = f"a{i}"
    return Graph.build("weights", tensors, ops)


@pytest.mark.parametrize("name", ["reactive", "greedy", "greedy-sweep", "cpsat"])
def test_free_weights_let_a_budget_below_the_weights_plan(name):
    # Pinned to HBM, the weights are the floor (600 B); free, the planner starts some of them remote.
    hw = simple_hardware(hbm=300)
    with pytest.raises(api.InfeasibleBudget, match="pinned to start on HBM"):
        api.plan(weight_chain(6, HBM), hw, planner=name, **options(name))
    g = weight_chain(6, AUTO)
    r = api.plan(g, hw, planner=name, **options(name))
    assert r.timeline.valid, [v.describe() for v in r.timeline.violations[:3]]
    assert r.timeline.metrics.peak_bytes[HBM] <= 300
    assert sum(1 for n in g.free_tensors if r.plan.placement[n] != HBM) >= 3


def test_schedule_records_the_placement_and_validate_rechecks_it(tmp_path):
    g = apply_homes(api.load_graph(TB), {"weight": AUTO}, api.hardware("ascend-910c"))
    hw = api.hardware("ascend-910c", hbm="1GB")
    r = api.plan(g, hw, planner="greedy")
    doc = schedule_to_dict(g, hw, r.plan, r.timeline)
    assert doc["graph"]["homes"] == {"weight": "auto"}
    assert {e["tensor"]: e["tier"] for e in doc["placement"]} == r.plan.placement
    assert plan_from_dict(doc, "s.json").placement == r.plan.placement
    # Validation applies the recorded homes to the graph file's graph.
    report = validate_schedule(doc, api.load_graph(TB), "s.json")
    assert report.ok, (report.mismatches, [v.describe() for v in report.timeline.violations[:3]])
    # A placement that moves a pinned tensor is refused.
    pinned = next(e for e in doc["placement"] if e["tensor"] == "w_qkv_m")
    pinned["tier"] = HBM
    # A file that contradicts the graph is bad input (one line, exit 2 on the command line), not a plan to run.
    with pytest.raises(InputErrors, match="'w_qkv_m' is pinned to 'host' by the graph, not 'hbm'"):
        validate_schedule(doc, api.load_graph(TB), "s.json")


def run(*args):
    return CliRunner().invoke(main_cli(), [str(a) for a in args])


def main_cli():
    from planner.cli import main

    return main


def test_cli_home_option_plans_and_validates(tmp_path):
    out = tmp_path / "tb.json"
    r = run(TB, "--hbm", "800MB", "--planner", "greedy", "--home", "weight=auto", "--home", "optimizer_state=auto",
            "-o", out)
    assert r.exit_code == 0, r.output
    assert "start of step" in r.output
    doc = json.loads(out.read_text())
    assert doc["valid"] and doc["graph"]["homes"] == {"optimizer_state": "auto", "weight": "auto"}
    v = run("validate", out, TB)
    assert v.exit_code == 0, v.output


@pytest.mark.parametrize("args, message", [
    (["--home", "weight=pool"], "has no tier 'pool'"),
    (["--home", "weights=auto"], "unknown tensor kind"),
    (["--home", "input=auto"], "do not outlive the step"),
    (["--home", "weight"], "KIND=TIER"),
])
def test_cli_home_errors_are_one_line_and_exit_2(args, message):
    r = run(TB, "--hbm", "1GB", *args)
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_pinned_bytes_over_the_budget_are_infeasible_with_the_bound(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps(graph_to_dict(weight_chain(6, HBM))))
    r = run(path, "--hbm", "300", "--planner", "greedy", "--no-output")
    assert r.exit_code == 1 and "pinned to start on HBM" in r.output, r.output
    r = run(path, "--hbm", "300", "--planner", "greedy", "--no-output", "--home", "weight=auto")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("fixture", sorted(p.name for p in ONNX_FIXTURES.glob("*.onnx")))
def test_imported_onnx_weights_are_free_and_plan_at_60_percent(fixture):
    g = api.load_graph(ONNX_FIXTURES / fixture, dims={"batch": 2, "sequence": 16})
    weights = [n for n, t in g.tensors.items() if t.kind is TensorKind.WEIGHT and n not in g.producer]
    assert weights and set(weights) <= set(g.free_tensors)
    hw0 = api.hardware("ascend-910c")
    peak = api.no_offload_reference(g, hw0).metrics.peak_bytes[HBM]
    budget = int(peak * 0.6)
    ws, _op = api.largest_working_set(g)
    if ws > budget:
        pytest.skip(f"the largest single-op working set ({ws} B) is above 60% of the peak ({budget} B)")
    hw = api.hardware("ascend-910c", hbm=str(budget))
    for name in ("greedy", "reactive"):
        r = api.plan(g, hw, planner=name)
        assert r.timeline.valid, (name, [v.describe() for v in r.timeline.violations[:3]])
        assert simulate(g, hw, r.plan).metrics.peak_bytes[HBM] <= budget


def test_cpsat_decides_the_placement_in_its_model():
    # Four free 100-byte weights read one after another: all on HBM they peak at 430 B. Started from the
    # no-offload plan (every weight on HBM, over the 250 B budget: an infeasible hint), the model itself must
    # start weights remote to find a plan.
    g = weight_chain(4, AUTO)
    hw = simple_hardware(hbm=250)
    plan = plan_cpsat(g, hw, time_limit=10, workers=1, start="none")
    tl = simulate(g, hw, plan)
    assert tl.valid, ([v.describe() for v in tl.violations[:3]], plan.notes)
    assert plan.stats["cpsat"]["start_planner"] == "none" and plan.stats["cpsat"]["hint_feasible"] is False
    assert sum(1 for n in g.free_tensors if plan.placement[n] != HBM) >= 2
