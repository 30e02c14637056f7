"""Checkmate / Moccasin node-link graphs: every graph in ../shared/graphs/checkmate imports and plans; units,
kinds and errors on small documents made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner import api
from planner.bounds import largest_working_set
from planner.cli import main
from planner.errors import InputError
from planner.executor import simulate
from planner.formats import load_graph
from planner.formats.checkmate import DEFAULT_TIME_UNIT_S, graph_from_node_link
from planner.graph import TensorKind

SHARED = Path(__file__).resolve().parents[3] / "shared"
CHECKMATE = SHARED / "graphs" / "checkmate"
FILES = sorted(CHECKMATE.glob("*.json")) if CHECKMATE.is_dir() else []
needs_shared = pytest.mark.skipif(not FILES, reason="../shared/graphs/checkmate is not here")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@needs_shared
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split("_nx")[0][:40])
def test_every_checkmate_graph_imports_and_plans(path):
    doc = json.loads(path.read_text())
    g = load_graph(path)
    assert len(g.ops) == len(doc["nodes"])
    sinks = [t for t in g.tensors.values() if t.kind == TensorKind.OUTPUT]
    assert sinks and all(g.users[t.name] == () for t in sinks)
    if "train" in path.name:
        assert any(t.kind == TensorKind.GRADIENT for t in g.tensors.values())
    hw = api.hardware("ascend-910c")
    peak = api.no_offload_reference(g, hw).metrics.peak_bytes["hbm"]
    r = api.plan(g, api.hardware("ascend-910c", hbm=peak), planner="none")
    assert r.timeline.valid
    # Moccasin's budgets are 0.8 and 0.9 of the no-offload peak; a chain's peak is one op's working set
    budget = max(int(0.8 * peak), largest_working_set(g)[0])
    hw_b = api.hardware("ascend-910c", hbm=budget)
    r = api.plan(g, hw_b, planner="reactive")
    assert r.timeline.valid, r.timeline.violations[:3]
    assert r.timeline.metrics.peak_bytes["hbm"] <= budget
    again = simulate(g, hw_b, r.plan)
    assert again.valid and again.metrics.makespan_ns == r.timeline.metrics.makespan_ns


@needs_shared
def test_checkmate_units():
    vgg = CHECKMATE / "VGG16_256_224_224_3_train_nx.json"
    g = load_graph(vgg)
    op = g.op("block1_conv1")
    assert op.duration_s == pytest.approx(385 * DEFAULT_TIME_UNIT_S)
    # cost_ram is fp32 bytes of the output at batch 256
    assert g.tensors["block1_conv1:out"].bytes == 256 * 224 * 224 * 64 * 4
    assert load_graph(vgg, time_unit_s=1e-6).op("block1_conv1").duration_s == pytest.approx(385e-6)
    # fcn_8 holds multiply-accumulate counts: read as MACs unless a time unit is given
    fcn = CHECKMATE / "fcn_8_vgg_32_416_608_3_train_nx.json"
    g = load_graph(fcn)
    assert g.metadata["cost"] == "macs"
    c1 = g.op("block1_conv1")
    assert c1.duration_s is None and c1.flops == 2 * 32 * 416 * 608 * 64 * 27
    assert load_graph(fcn, time_unit_s=1e-9).op("block1_conv1").duration_s == pytest.approx(13985906688e-9)


@needs_shared
def test_random_layered_units_and_order():
    path = CHECKMATE / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json"
    doc = json.loads(path.read_text())
    g = load_graph(path)
    assert g.metadata["source_format"] == "moccasin-random-layered"
    assert [t.name for t in g.tensors.values() if t.kind == TensorKind.OUTPUT] == ["1:out"]  # the target node
    n2 = next(n for n in doc["nodes"] if n["name"] == 2)
    assert g.tensors["2:out"].bytes == n2["out_cost"]
    assert g.op("2").duration_s == pytest.approx(n2["duration"] * DEFAULT_TIME_UNIT_S)
    g_mb = load_graph(path, size_unit_bytes=1e6)
    assert g_mb.tensors["2:out"].bytes == n2["out_cost"] * 10**6
    assert len(g.dag.edges) == len(doc["links"])


@needs_shared
def test_cli_plans_a_checkmate_graph(tmp_path):
    path = CHECKMATE / "ResNet50_256_224_224_3_train_nx.json"
    out = tmp_path / "r.json"
    r = run(path, "--hbm", "30GB", "--time-unit", "10us", "--planner", "reactive", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["valid"]
    assert run("validate", out, path, "--time-unit", "10us").exit_code == 0
    r = run(CHECKMATE / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json", "--hbm", "100GB",
            "--size-unit", "1MB", "--time-unit", "1ms", "--planner", "reactive", "--no-output", "--json")
    assert r.exit_code == 0, r.output


# --- small documents -----------------------------------------------------------------------------------------

def doc_of(nodes, links, **graph):
    return {"directed": True, "multigraph": False, "graph": graph, "nodes": nodes, "links": links}


def test_kinds_params_and_names():
    nodes = [
        {"id": 0, "name": "conv", "cost_cpu": 100, "cost_ram": 1000, "backward": False},
        {"id": 1, "name": "relu", "cost_cpu": 10, "cost_ram": 1000, "backward": False},
        {"id": 2, "name": "relu", "cost_cpu": 20, "cost_ram": 500, "backward": True},
    ]
    links = [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}]
    g = graph_from_node_link(doc_of(nodes, links), "t.json")
    assert [op.name for op in g.ops] == ["conv", "relu#1", "relu#2"]
    assert g.op("relu#2").inputs == ("relu#1:out", "conv:out")
    assert g.tensors["relu#2:out"].kind == TensorKind.OUTPUT
    assert g.tensors["relu#1:out"].kind == TensorKind.ACTIVATION
    assert g.op("conv").duration_s == pytest.approx(100 * DEFAULT_TIME_UNIT_S)
    assert g.op("relu#2").op_type == "backward"
    # The source reads the input batch the format leaves out: recomputable, as in Checkmate's and Moccasin's models.
    assert [op.recomputable for op in g.ops] == [True, True, True]
    nodes = [
        {"name": 0, "duration": 5, "out_cost": 30, "param_cost": 0},
        {"name": 1, "duration": 7, "out_cost": 40, "param_cost": 12},
        {"name": 2, "duration": 1, "out_cost": 20, "param_cost": 0},
    ]
    links = [{"0": 0, "1": 1}, {"0": 1, "1": 2}]
    g = graph_from_node_link(doc_of(nodes, links, order=[0, 1, 2]), "r.json", time_unit_s=1e-3)
    assert g.tensors["1:param"].kind == TensorKind.WEIGHT and g.tensors["1:param"].bytes == 12
    assert g.op("1").inputs == ("0:out", "1:param")
    assert g.op("1").duration_s == pytest.approx(7e-3)
    # a gradient for backward nodes that feed others
    nodes = [{"id": i, "name": f"n{i}", "cost_cpu": 1, "cost_ram": 8, "backward": i > 0} for i in range(3)]
    g = graph_from_node_link(doc_of(nodes, [{"source": 0, "target": 1}, {"source": 1, "target": 2}]), "b.json")
    assert g.tensors["n1:out"].kind == TensorKind.GRADIENT


@pytest.mark.parametrize("doc, needle", [
    ({"nodes": [], "links": []}, "non-empty list"),
    ({"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": -5}], "links": []}, "non-negative"),
    ({"nodes": [{"id": 0, "cost_cpu": 1}], "links": []}, "cost_ram"),
    ({"nodes": [{"id": 0, "foo": 1}], "links": []}, "needs cost_cpu"),
    ({"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 5}], "links": [{"source": 0, "target": 9}]}, "not a node"),
    ({"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 5}], "links": [{"from": 0}]}, "source"),
    ({"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 5}, {"id": 0, "cost_cpu": 1, "cost_ram": 5}], "links": []},
     "twice"),
    ({"nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 5}, {"id": 1, "cost_cpu": 1, "cost_ram": 5}],
      "links": [{"source": 0, "target": 1}, {"source": 1, "target": 0}]}, "cycle"),
    ({"nodes": "x", "links": []}, "non-empty list"),
])
def test_malformed_node_link_one_line_exit_2(tmp_path, doc, needle):
    with pytest.raises(InputError, match=needle):
        graph_from_node_link(doc, "x.json")
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    r = run(p, "--hbm", "1GB", "--no-output")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_bad_units():
    doc = doc_of([{"id": 0, "cost_cpu": 1, "cost_ram": 5}], [])
    with pytest.raises(InputError, match="--time-unit"):
        graph_from_node_link(doc, "x.json", time_unit_s=0)
    with pytest.raises(InputError, match="--size-unit"):
        graph_from_node_link(doc, "x.json", size_unit_bytes=-1)
    assert graph_from_node_link(doc, "x.json", macs=True).op("0").flops == 2
