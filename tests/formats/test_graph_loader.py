"""Each class of bad graph input is rejected with one line naming the file and the item, and exit status 2."""

import copy
import json

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.errors import InputError
from planner.formats import load_graph
from planner.formats.hograph import graph_from_dict, graph_sha256, graph_to_dict

GOOD = {
    "format": "ho-graph/1",
    "name": "tiny",
    "tensors": [
        {"name": "x", "shape": [4, 4], "dtype": "float32", "kind": "input"},
        {"name": "w", "bytes": 64, "kind": "weight", "home": "host"},
        {"name": "h", "shape": [4, 4], "dtype": "bf16"},
        {"name": "y", "bytes": 32, "kind": "output"},
    ],
    "nodes": [
        {"name": "mm", "op_type": "MatMul", "inputs": ["x", "w"], "outputs": ["h"], "flops": 128},
        {"name": "relu", "op_type": "Relu", "inputs": ["h"], "outputs": ["y"], "duration_us": 2.5},
    ],
}


def mutate(fn):
    doc = copy.deepcopy(GOOD)
    fn(doc)
    return doc


def test_good_graph_loads():
    g = graph_from_dict(GOOD, "tiny.json")
    assert [op.name for op in g.ops] == ["mm", "relu"]
    assert g.tensors["x"].bytes == 64 and g.tensors["h"].bytes == 32
    assert g.tensors["w"].home == "host"
    assert g.op("relu").duration_s == pytest.approx(2.5e-6)


def test_round_trip_is_stable():
    g = graph_from_dict(GOOD, "tiny.json")
    again = graph_from_dict(graph_to_dict(g), "again.json")
    assert graph_sha256(again) == graph_sha256(g)


BAD = {
    "unknown top field": (lambda d: d.update(extra=1), "unknown field"),
    "unknown node field": (lambda d: d["nodes"][0].update(colour="red"), "node 'mm' (nodes[0])"),
    "missing field": (lambda d: d["nodes"][0].pop("op_type"), "missing field"),
    "missing tensors": (lambda d: d.pop("tensors"), "missing field"),
    "dangling tensor": (lambda d: d["nodes"][1]["inputs"].append("ghost"), "'ghost' is not a declared tensor"),
    "produced twice": (lambda d: d["nodes"][1]["outputs"].append("h"), "produced twice"),
    "cycle": (lambda d: d["nodes"][0]["inputs"].append("y"), "cycle"),
    "zero size": (lambda d: d["tensors"][1].update(bytes=0), "less than the minimum of 1"),
    "negative size": (lambda d: d["tensors"][1].update(bytes=-5), "less than the minimum of 1"),
    "non-integer size": (lambda d: d["tensors"][1].update(bytes=1.5), "is not of type 'integer'"),
    "zero dim": (lambda d: d["tensors"][0].update(shape=[4, 0]), "less than the minimum of 1"),
    "unknown dtype": (lambda d: d["tensors"][0].update(dtype="float13"), "unknown dtype 'float13'"),
    "empty graph": (lambda d: d.update(nodes=[]), "should be non-empty"),
    "wrong format": (lambda d: d.update(format="ho-graph/9"), "unknown format"),
    "unknown kind": (lambda d: d["tensors"][0].update(kind="scratch"), "is not one of"),
    "negative flops": (lambda d: d["nodes"][0].update(flops=-1), "less than the minimum of 0"),
    "neither bytes nor shape": (lambda d: d["tensors"][0].pop("shape"), "give either bytes, or shape and dtype"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_exit_2(tmp_path, case):
    fn, expected = BAD[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutate(fn)))
    with pytest.raises(InputError) as err:
        load_graph(path)
    assert expected in str(err.value)
    assert str(err.value).startswith(str(path))
    result = CliRunner().invoke(main, [str(path), "--hbm", "1GB", "--no-output"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: " + str(path)), result.output
    assert "Traceback" not in result.output


def test_invalid_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "ho-graph/1", "name": ')
    with pytest.raises(InputError, match="invalid JSON"):
        load_graph(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_graph(tmp_path / "nope.json")


def test_not_a_graph(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a known graph format"):
        load_graph(path)


def test_ops_given_out_of_order_are_sorted():
    doc = mutate(lambda d: d["nodes"].reverse())
    g = graph_from_dict(doc, "rev.json")
    assert [op.name for op in g.ops] == ["mm", "relu"]


def test_in_place_update_orders_readers_first():
    doc = {
        "format": "ho-graph/1", "name": "upd",
        "tensors": [{"name": "w", "bytes": 8, "kind": "weight"}, {"name": "a", "bytes": 8},
                    {"name": "g", "bytes": 8, "kind": "gradient"}],
        "nodes": [
            {"name": "use", "op_type": "MatMul", "inputs": ["w"], "outputs": ["a"]},
            {"name": "grad", "op_type": "Grad", "inputs": ["a"], "outputs": ["g"]},
            {"name": "step", "op_type": "SGD", "inputs": ["g"], "updates": ["w"]},
        ],
    }
    g = graph_from_dict(doc, "upd.json")
    assert g.dag.has_edge("use", "step")
    assert g.users["w"] == ("use", "step")
