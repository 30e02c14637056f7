"""``planner.inspect`` and ``ho-plan inspect``: the figures agree with the bounds and the executor they come from."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import GRAPHS, chain_graph, simple_hardware

import planner.inspect as inspect_mod
from planner import api, bounds
from planner.cli import main
from planner.graph import AUTO, Graph
from planner.hardware import HBM
from planner.inspect import BUDGET_SHARES, inspect_graph
from planner.orders import graph_order, live_bytes

TB = GRAPHS / "transformer_block.json"


def run(*args):
    return CliRunner().invoke(main, ["inspect", *(str(a) for a in args)])


def test_transformer_block_agrees_with_the_bounds_and_the_executor():
    g, hw = api.load_graph(TB), api.hardware("ascend-910c")
    info = inspect_graph(g, hw)
    ref = api.no_offload_reference(g, hw).metrics
    # 32 ops: small enough for the executor's figures by default.
    assert info.no_offload_source == "executor"
    assert info.no_offload_peak_bytes == ref.peak_bytes[HBM]
    assert info.no_offload_makespan_us == ref.makespan_ns / 1000
    assert (info.hbm_floor_bytes, info.hbm_floor_reason) == bounds.hbm_floor(g)
    assert (info.largest_working_set_bytes, info.largest_working_set_op) == bounds.largest_working_set(g)
    compute = bounds.compute_bound(g, hw)
    assert (info.compute_bound_us, info.compute_bound_reason) == (compute.value / 1000, compute.reason)
    assert (info.ops, info.tensors, info.total_bytes) == (len(g.ops), len(g.tensors), g.total_bytes())
    assert sum(info.bytes_by_kind.values()) == g.total_bytes()
    # Every tensor is counted once: where it starts the step, or as made by an op.
    started = sum(b for per in info.start_bytes.values() for b in per.values())
    assert started + sum(info.made_bytes.values()) == g.total_bytes()
    assert info.start_bytes["optimizer_state"] == {"host": info.bytes_by_kind["optimizer_state"]}
    assert [b.share for b in info.budgets] == list(BUDGET_SHARES)
    for b in info.budgets:
        assert b.hbm_bytes == int(info.no_offload_peak_bytes * b.share)
        assert b.feasible == (b.hbm_bytes >= info.hbm_floor_bytes)
    assert info.makespan_bound_us is None and info.makespan_bound_reason is None
    json.dumps(info.to_dict())


def test_makespan_bound_at_the_budget():
    g, hw = api.load_graph(TB), api.hardware("ascend-910c", hbm="1GB")
    info = inspect_graph(g, hw, at_budget=True)
    bound = bounds.makespan_bound(g, hw)
    assert info.hbm_bytes == 10**9
    assert (info.makespan_bound_us, info.makespan_bound_reason) == (bound.value / 1000, bound.reason)


def test_sizes_figure_bounds_the_executor_figure():
    # Forced to sizes: the peak of the graph's order with every tensor pinned off HBM resident from the start,
    # at least what the no-offload plan reaches (it fetches those as it goes); no makespan.
    g, hw = api.load_graph(TB), api.hardware("ascend-910c")
    info = inspect_graph(g, hw, simulate=False)
    assert info.no_offload_source == "sizes" and info.no_offload_makespan_us is None
    assert info.no_offload_peak_bytes == max(live_bytes(g, graph_order(g)))
    assert info.no_offload_peak_bytes >= api.no_offload_reference(g, hw).metrics.peak_bytes[HBM]


def test_large_graphs_take_the_peak_from_sizes_by_default(monkeypatch):
    monkeypatch.setattr(inspect_mod, "SIMULATE_MAX_OPS", 2)
    g = chain_graph()
    assert inspect_graph(g, simple_hardware()).no_offload_source == "sizes"
    assert inspect_graph(g, simple_hardware(), simulate=True).no_offload_source == "executor"


def test_tiny_graph_by_hand():
    # x (50 B, HBM) -> op0 -> a0 -> op1 -> a1 -> op2 -> a2 (100 B each), each op reading a 10 B weight on the
    # host; 1 us per op, 1 B/ns links.
    g, hw = chain_graph(weight_home="host"), simple_hardware()
    info = inspect_graph(g, hw)
    # op1 and op2 both hold 210 B (100 in, 10 weight, 100 out); the first one is named.
    assert (info.largest_working_set_bytes, info.largest_working_set_op) == (210, "op1")
    assert (info.hbm_floor_bytes, info.hbm_floor_reason) == bounds.hbm_floor(g) == (
        210, "largest single-op working set (op 'op1')")
    # Peak at op2: 30 B of weights, a1, a2.
    assert info.no_offload_source == "executor" and info.no_offload_peak_bytes == 230
    # The first weight's fetch (10 ns), then three 1 us ops.
    assert info.no_offload_makespan_us == pytest.approx(3.01)
    assert info.compute_bound_us == bounds.compute_bound(g, hw).value / 1000 == 3.0
    assert info.start_bytes == {"input": {"hbm": 50}, "weight": {"host": 30}}
    assert info.made_bytes == {"activation": 200, "output": 100}
    assert info.bytes_by_kind == {"activation": 200, "output": 100, "input": 50, "weight": 30}
    # 90% of 230 B is 207 B, below the 210 B floor: no suggested budget fits.
    assert [b.hbm_bytes for b in info.budgets] == [207, 184, 161, 138]
    assert not any(b.feasible for b in info.budgets)


def test_floor_from_the_bytes_pinned_on_hbm():
    # Small activations: the 80 B that start on HBM (x and the weights) exceed any op's working set (61 B).
    g = chain_graph(sizes=(1, 1, 1))
    info = inspect_graph(g, simple_hardware())
    assert (info.hbm_floor_bytes, info.hbm_floor_reason) == bounds.hbm_floor(g) == (
        80, "bytes pinned to start on HBM and still needed")
    assert info.largest_working_set_bytes == 61


def test_tensors_left_to_the_planner_start_on_auto():
    g = chain_graph()
    g = Graph.build(g.name, [replace(t, home=AUTO) if t.name.startswith("w") else t for t in g.tensors.values()],
                    g.ops)
    info = inspect_graph(g, simple_hardware())
    assert info.start_bytes["weight"] == {AUTO: 30} and info.free_tensors == 3
    assert (info.hbm_floor_bytes, info.hbm_floor_reason) == bounds.hbm_floor(g)


@pytest.mark.parametrize("graph_file,preset", [("remote_weights_chain.json", "cloudmatrix384"),
                                               ("deepseek-v3-nsa-64k-L3-1layer.json", "ascend-910c")])
def test_floor_agrees_with_bounds_on_the_repository_graphs(graph_file, preset):
    g = api.load_graph(GRAPHS / graph_file)
    info = inspect_graph(g, api.hardware(preset), simulate=False)
    assert (info.hbm_floor_bytes, info.hbm_floor_reason) == bounds.hbm_floor(g)


def test_cli_table():
    r = run(TB, "--hbm", "1GB")
    assert r.exit_code == 0, r.output
    for text in ("no-offload peak", "HBM floor", "largest working set", "compute bound", "makespan bound at the budget",
                 "optimizer_state", "start host", "90%", "60%"):
        assert text in r.output, text


def test_cli_json():
    r = run(TB, "--json", "--home", "weight=auto")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("ops", "tensors", "bytes_by_kind", "start_bytes", "made_bytes", "no_offload_source",
                "no_offload_peak_bytes", "no_offload_makespan_us", "hbm_floor_bytes", "hbm_floor_reason",
                "largest_working_set_bytes", "largest_working_set_op", "compute_bound_us", "budgets",
                "makespan_bound_us"):
        assert key in d, key
    assert d["start_bytes"]["weight"] == {AUTO: d["bytes_by_kind"]["weight"]}
    assert d["makespan_bound_us"] is None
    assert [b["share"] for b in d["budgets"]] == list(BUDGET_SHARES)
    with_budget = json.loads(run(TB, "--json", "--hbm", "1GB", "--no-simulate").output)
    assert with_budget["makespan_bound_us"] > 0 and with_budget["no_offload_source"] == "sizes"


@pytest.mark.parametrize("args,expected", [
    (["missing.json"], "no such file"),
    ([TB, "--hbm", "lots"], "--hbm"),
    ([TB, "--home", "weight"], "--home"),
    ([TB, "--colour", "blue"], "No such option"),
    ([GRAPHS / "remote_weights_chain.json", "--hardware", "h100-pcie"], "home tier 'pool'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and expected in lines[0], r.output


def test_malformed_graph_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "ho-graph/1", "name": "x", "tensors": [], "nodes": []}')
    r = run(bad)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and str(bad) in lines[0], r.output
