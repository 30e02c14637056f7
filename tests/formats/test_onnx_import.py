"""ONNX import: real weightless exports, hand-built models for each FLOP formula, symbolic dims, the JSON form,
bad inputs, and a real export planned end to end from the CLI."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT
from google.protobuf import json_format
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

from planner import api
from planner.bounds import largest_working_set
from planner.cli import main
from planner.errors import InputError
from planner.executor import simulate
from planner.formats import load_graph
from planner.formats.hograph import graph_sha256
from planner.formats.onnx_import import _eval_dim, graph_from_model, load_onnx
from planner.graph import TensorKind

FIXTURES = ROOT / "tests" / "fixtures" / "onnx"
FIXTURE_FILES = sorted(FIXTURES.glob("*.onnx"))
DIMS = {"batch": 2, "sequence": 16}
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_FILES = sorted(LIGHT.glob("light_*.onnx")) if LIGHT.is_dir() else []

# The tiny Llama of make_onnx_fixtures.py: hidden 64, MLP 128, 2 layers, 4 query heads, 2 KV heads, vocab 256.
LLAMA_LINEAR_PARAMS = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 64 * 256
LLAMA_PARAMS = LLAMA_LINEAR_PARAMS + 256 * 64 + 2 * 2 * 64 + 64


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# --- real exports --------------------------------------------------------------------------------------------

def test_fixtures_are_there_and_weightless():
    names = {f.name for f in FIXTURE_FILES}
    assert {"llama2l_dynamo_opset23.onnx", "llama2l_dynamo_opset18.onnx", "llama2l_legacy.onnx"} <= names
    for f in FIXTURE_FILES:
        assert f.stat().st_size < 200_000, f
        m = onnx.load(str(f), load_external_data=False)
        external = [t for t in m.graph.initializer if t.data_location == TP.EXTERNAL]
        assert external, f"{f.name} should keep its big weights in an external data file"
        for t in external:
            location = {e.key: e.value for e in t.external_data}["location"]
            assert not (f.parent / location).exists(), "the data file is deleted: import must not need it"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_fixture_imports_from_shapes_alone(path):
    g = load_onnx(path, dims=DIMS)
    assert g.metadata["source_format"] == "onnx" and g.metadata["dims"] == DIMS
    assert not g.metadata.get("ops_without_flops"), g.metadata
    kinds = {t.kind for t in g.tensors.values()}
    assert {TensorKind.WEIGHT, TensorKind.INPUT, TensorKind.OUTPUT, TensorKind.ACTIVATION} <= kinds
    assert g.tensors["input_ids"].kind == TensorKind.INPUT and g.tensors["input_ids"].shape == (2, 16)
    assert g.tensors["input_ids"].bytes == 2 * 16 * 8  # int64
    out = [t for t in g.tensors.values() if t.kind == TensorKind.OUTPUT]
    assert len(out) == 1
    for op in g.ops:
        assert op.bytes_accessed == sum(g.tensors[t].bytes for t in dict.fromkeys(op.inputs + op.outputs))
    if path.name.startswith("llama"):
        assert out[0].shape == (2, 16, 256) and out[0].dtype == "float32"
        weights = sum(t.bytes for t in g.tensors.values() if t.kind == TensorKind.WEIGHT)
        assert weights == pytest.approx(4 * LLAMA_PARAMS, rel=0.01)
        matmul = sum(op.flops for op in g.ops if op.op_type in ("MatMul", "Gemm"))
        tokens = 2 * 16
        attention = 2 * 2 * (2 * 2 * 4 * 16 * 16 * 16)  # two layers, QK^T and PV: 2 * B*Hq*Sq*Skv*D each
        if "opset23" in path.name:
            assert matmul == 2 * tokens * LLAMA_LINEAR_PARAMS
            att = [op for op in g.ops if op.op_type == "Attention"]
            assert len(att) == 2 and all(op.flops == 4 * 2 * 4 * 16 * 16 * 16 for op in att)
            assert {op.op_type for op in g.ops} >= {"RMSNormalization", "RotaryEmbedding"}
        else:
            assert matmul == 2 * tokens * LLAMA_LINEAR_PARAMS + attention


def test_opset23_llama_op_details():
    g = load_onnx(FIXTURES / "llama2l_dynamo_opset23.onnx", dims={"batch": 1, "sequence": 100})
    rms = [op for op in g.ops if op.op_type == "RMSNormalization"]
    assert len(rms) == 5 and all(op.flops == 4 * 100 * 64 for op in rms)
    att = [op for op in g.ops if op.op_type == "Attention"]
    assert all(op.flops == 4 * 1 * 4 * 100 * 100 * 16 for op in att)


def test_legacy_export_needs_symbolic_inference():
    path = FIXTURES / "llama2l_legacy.onnx"
    g = load_onnx(path, dims=DIMS)
    assert len(g.ops) > 100
    with pytest.raises(InputError) as e:
        load_onnx(path, dims=DIMS, symbolic=False)
    assert "no static shape" in str(e.value) and "turned off" in str(e.value)


def test_missing_onnxruntime_gives_the_extra_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", None)
    with pytest.raises(InputError) as e:
        load_onnx(FIXTURES / "llama2l_legacy.onnx", dims=DIMS)
    msg = str(e.value)
    assert "\n" not in msg and "onnx-symbolic" in msg and "no static shape" in msg
    # a dynamo export does not need it
    assert load_onnx(FIXTURES / "llama2l_dynamo_opset18.onnx", dims=DIMS).ops


def test_unresolved_symbolic_dims_are_listed_exit_2():
    r = run(FIXTURES / "llama2l_dynamo_opset23.onnx", "--hbm", "16GB", "--no-output")
    assert r.exit_code == 2
    line = one_error_line(r)
    assert "unresolved symbolic dims: batch, sequence" in line and "--dim" in line
    r = run(FIXTURES / "llama2l_dynamo_opset23.onnx", "--hbm", "16GB", "--dim", "batch=1", "--no-output")
    assert r.exit_code == 2 and "unresolved symbolic dims: sequence" in one_error_line(r)
    r = run(FIXTURES / "llama2l_dynamo_opset23.onnx", "--dim", "batch=1", "--dim", "seq=4", "--no-output")
    assert r.exit_code == 2 and "no symbolic dim named seq" in one_error_line(r)
    r = run(FIXTURES / "llama2l_dynamo_opset23.onnx", "--dim", "batch=0", "--dim", "sequence=4", "--no-output")
    assert r.exit_code == 2 and "--dim batch" in one_error_line(r)


def test_dim_expressions():
    assert _eval_dim("sequence + 1", {"sequence": 7}) == 8
    assert _eval_dim("2*s0 - 1", {"s0": 3}) == 5
    assert _eval_dim("Max(1, s0)", {"s0": 3}) == 3
    assert _eval_dim("floor(s0/2)", {"s0": 7}) == 3
    assert _eval_dim("s1 + 1", {"s0": 7}) is None
    assert _eval_dim("unk__0", {}) is None


def test_json_form_imports_to_the_same_graph(tmp_path):
    src = FIXTURES / "llama2l_dynamo_opset23.onnx"
    m = onnx.load(str(src), load_external_data=False)
    js = tmp_path / "llama2l_dynamo_opset23.onnx.json"
    js.write_text(json_format.MessageToJson(m))
    a = load_graph(src, dims=DIMS)
    b = load_graph(js, dims=DIMS)
    assert graph_sha256(a) == graph_sha256(b)


def test_real_export_plans_end_to_end_from_the_cli(tmp_path):
    src = FIXTURES / "llama2l_dynamo_opset18.onnx"
    dims = ["--dim", "batch=1", "--dim", "sequence=2048"]
    g = load_graph(src, dims={"batch": 1, "sequence": 2048})
    hw = api.hardware("ascend-910c")
    peak = api.no_offload_reference(g, hw).metrics.peak_bytes["hbm"]
    budget = max(int(0.8 * peak), largest_working_set(g)[0])
    assert budget < peak
    out = tmp_path / "llama.schedule.json"
    r = run(src, *dims, "--hbm", budget, "--planner", "reactive", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["valid"] and d["peak_hbm_bytes"] <= budget
    v = run("validate", out, src, *dims)
    assert v.exit_code == 0, v.output
    # the issue's own command: a generous budget, the default planner, no offload needed
    r = run(src, *dims, "--hbm", "16GB", "-o", tmp_path / "b.json")
    assert r.exit_code == 0, r.output


@pytest.mark.skipif(not LIGHT_FILES, reason="the onnx wheel ships no light_*.onnx models here")
@pytest.mark.parametrize("path", LIGHT_FILES, ids=lambda p: p.name)
def test_light_cnns_import_and_plan(path):
    g = load_graph(path)
    assert not g.metadata.get("ops_without_flops")
    hw = api.hardware("ascend-910c")
    ref = api.no_offload_reference(g, hw)
    peak = ref.metrics.peak_bytes["hbm"]
    r = api.plan(g, api.hardware("ascend-910c", hbm=peak), planner="none")
    assert r.timeline.valid
    budget = max(int(0.8 * peak), largest_working_set(g)[0])
    r = api.plan(g, api.hardware("ascend-910c", hbm=budget), planner="reactive")
    assert r.timeline.valid and r.timeline.metrics.peak_bytes["hbm"] <= budget
    assert simulate(g, api.hardware("ascend-910c", hbm=budget), r.plan).valid


def test_light_resnet50_flops():
    path = LIGHT / "light_resnet50.onnx"
    if not path.exists():
        pytest.skip("no light_resnet50.onnx in the onnx wheel")
    g = load_graph(path)
    # ResNet-50 at 224x224 is about 4.1 G multiply-adds per image
    assert sum(op.flops for op in g.ops) == pytest.approx(8.2e9, rel=0.02)


# --- hand-built models: one op per formula -------------------------------------------------------------------

def _vi(name, shape, dtype=TP.FLOAT):
    return oh.make_tensor_value_info(name, dtype, shape)


def _init(name, shape, dtype=TP.FLOAT, values=None):
    if values is not None:
        return numpy_helper.from_array(np.array(values, dtype="int64"), name)
    return oh.make_tensor(name, dtype, shape, [0] * math.prod(shape))


def _model(nodes, inputs, outputs, inits=(), opset=23):
    g = oh.make_graph(nodes, "hand", inputs, outputs, list(inits))
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def test_flop_formulas_by_hand():
    nodes = [
        oh.make_node("MatMul", ["A", "B"], ["mm"], name="matmul"),
        oh.make_node("Gemm", ["GA", "GB", "GC"], ["gemm"], name="gemm", transA=1, transB=1),
        oh.make_node("Conv", ["X", "W", "WB"], ["conv"], name="conv", group=2, pads=[1, 1, 1, 1]),
        oh.make_node("ConvTranspose", ["TX", "TW"], ["convt"], name="convt"),
        oh.make_node("Attention", ["Q", "K", "V"], ["att"], name="attention"),
        oh.make_node("Einsum", ["E1", "E2"], ["ein"], name="einsum", equation="bij,bjk->bik"),
        oh.make_node("Softmax", ["S"], ["soft"], name="softmax"),
        oh.make_node("ReduceMean", ["S", "axes"], ["red"], name="reduce"),
        oh.make_node("LayerNormalization", ["S", "ln_s", "ln_b"], ["ln"], name="layernorm"),
        oh.make_node("RMSNormalization", ["S", "ln_s"], ["rms"], name="rmsnorm"),
        oh.make_node("BatchNormalization", ["X", "bn", "bn", "bn", "bn"], ["bnorm"], name="batchnorm"),
        oh.make_node("Add", ["S", "ln_b"], ["add"], name="add"),
        oh.make_node("MaxPool", ["X"], ["pool"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Transpose", ["S"], ["tr"], name="transpose", perm=[2, 1, 0]),
    ]
    inputs = [
        _vi("A", [2, 3, 4], TP.FLOAT16), _vi("GA", [4, 3]), _vi("X", [1, 4, 8, 8]), _vi("TX", [1, 4, 5, 5]),
        _vi("Q", [2, 4, 8, 16]), _vi("K", [2, 2, 12, 16]), _vi("V", [2, 2, 12, 16]), _vi("E1", [2, 3, 4]),
        _vi("E2", [2, 4, 5]), _vi("S", [2, 3, 4]),
    ]
    inits = [
        _init("B", [4, 5], TP.FLOAT16), _init("GB", [5, 4]), _init("GC", [5]), _init("W", [6, 2, 3, 3]),
        _init("WB", [6]), _init("TW", [4, 3, 3, 3]), _init("axes", None, values=[-1]), _init("ln_s", [4]),
        _init("ln_b", [4]), _init("bn", [4]),
    ]
    outs = ["mm", "gemm", "conv", "convt", "att", "ein", "soft", "red", "ln", "rms", "bnorm", "add", "pool", "tr"]
    out_vis = [_vi(o, None, TP.FLOAT16 if o == "mm" else TP.FLOAT) for o in outs]
    g = graph_from_model(_model(nodes, inputs, out_vis, inits), "hand.onnx")
    f = {op.name: op.flops for op in g.ops}
    assert f["matmul"] == 2 * (2 * 3 * 5) * 4
    assert f["gemm"] == 2 * 3 * 5 * 4 + 3 * 5  # A^T is 3x4, B^T is 4x5, plus C
    assert f["conv"] == 2 * (1 * 6 * 8 * 8) * (2 * 3 * 3) + 6 * 8 * 8
    assert f["convt"] == 2 * (1 * 4 * 5 * 5) * (3 * 3 * 3)
    assert g.tensors["convt"].shape == (1, 3, 7, 7)
    assert f["attention"] == 4 * 2 * 4 * 8 * 12 * 16
    assert f["einsum"] == 2 * 2 * 3 * 4 * 5
    assert f["softmax"] == 5 * 24
    assert f["reduce"] == 24
    assert f["layernorm"] == 8 * 24
    assert f["rmsnorm"] == 4 * 24
    assert f["batchnorm"] == 2 * 256
    assert f["add"] == 24
    assert f["maxpool"] == (4 * 4 * 4) * 4
    assert f["transpose"] == 0
    # bytes from dtype and shape; bytes accessed = distinct inputs + outputs
    assert g.tensors["A"].bytes == 24 * 2 and g.tensors["B"].bytes == 20 * 2 and g.tensors["mm"].bytes == 30 * 2
    assert g.op("matmul").bytes_accessed == 48 + 40 + 60
    assert g.tensors["B"].kind == TensorKind.WEIGHT and g.tensors["A"].kind == TensorKind.INPUT
    assert g.tensors["mm"].kind == TensorKind.OUTPUT
    assert g.op("batchnorm").inputs == ("X", "bn")  # a tensor read twice is one input


def test_constants_optional_inputs_names_views_and_subgraphs():
    then_g = oh.make_graph([oh.make_node("Mul", ["h", "outer"], ["t_out"])], "then", [], [_vi("t_out", [4])])
    else_g = oh.make_graph([oh.make_node("Neg", ["h"], ["e_out"])], "else", [], [_vi("e_out", [4])])
    c = oh.make_tensor("cval", TP.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    nodes = [
        oh.make_node("Constant", [], ["k"], value=c),
        oh.make_node("Add", ["x", "k"], ["h"]),                         # no name
        oh.make_node("Clip", ["h", "", "hi"], ["clipped"], name="dup"),  # empty optional input
        oh.make_node("Reshape", ["clipped", "shape"], ["r"], name="dup"),  # duplicate name, a view
        oh.make_node("Mul", ["r", "r"], ["outer"], name="sq"),
        oh.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    inputs = [_vi("x", [4]), _vi("cond", [], TP.BOOL)]
    inits = [_init("hi", []), _init("shape", None, values=[4])]
    model = _model(nodes, inputs, [_vi("y", [4])], inits, opset=18)
    g = graph_from_model(model, "sub.onnx")
    names = [op.name for op in g.ops]
    assert names == ["Add_1", "dup", "sq", "branch"]
    assert g.tensors["k"].kind == TensorKind.WEIGHT and "k" not in g.producer
    assert g.op("dup").inputs == ("h", "hi")
    assert g.op("sq").inputs == ("clipped",)  # the Reshape output is a view of its input
    assert set(g.op("branch").inputs) == {"cond", "h", "outer"}  # outer values the branches read
    assert g.op("branch").flops == 0 and g.metadata["opaque_ops"] == ["If"]
    g2 = graph_from_model(model, "sub.onnx", fold_views=False)
    assert [op.name for op in g2.ops] == ["Add_1", "dup", "dup__2", "sq", "branch"]
    assert graph_sha256(graph_from_model(model, "sub.onnx")) == graph_sha256(g)  # stable


def test_dangling_input_is_an_error():
    model = _model([oh.make_node("Relu", ["nope"], ["y"])], [_vi("x", [4])], [_vi("y", [4])])
    with pytest.raises(InputError, match="'nope' is not a graph input"):
        graph_from_model(model, "bad.onnx")


# --- bad files -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage\xff\xfe" * 50, b"hello, not a model\n"],
                         ids=["empty", "garbage", "text"])
def test_corrupt_onnx_file_exit_2(tmp_path, content):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    r = run(p, "--hbm", "1GB", "--no-output")
    assert r.exit_code == 2
    assert "bad.onnx" in one_error_line(r)


def test_truncated_real_model_exit_2(tmp_path):
    data = (FIXTURES / "llama2l_dynamo_opset23.onnx").read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    r = run(p, "--dim", "batch=1", "--dim", "sequence=8", "--hbm", "1GB", "--no-output")
    assert r.exit_code == 2
    one_error_line(r)


def test_bad_onnx_json_exit_2(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"irVersion": "8", "graph": {"node": [{"opType": 5}]}}))
    r = run(p, "--hbm", "1GB", "--no-output")
    assert r.exit_code == 2 and "ONNX ModelProto" in one_error_line(r)


def test_missing_onnx_file_exit_2(tmp_path):
    r = run(tmp_path / "nope.onnx", "--hbm", "1GB")
    assert r.exit_code == 2 and "no such file" in one_error_line(r)


def test_options_for_other_formats_are_ignored(tmp_path):
    # --time-unit is a Checkmate option; --dim is ONNX's: each format ignores the other's
    r = run(ROOT / "graphs" / "transformer_block.json", "--hbm", "2GB", "--dim", "batch=1", "--time-unit", "1us",
            "--planner", "greedy", "-o", tmp_path / "s.json")
    assert r.exit_code == 0, r.output
    with pytest.raises(TypeError):
        load_graph(FIXTURES / "llama2l_dynamo_opset23.onnx", dimz={})


@pytest.mark.skipif(os.environ.get("HO_PLAN_SLOW") is None, reason="set HO_PLAN_SLOW=1 to time the import")
def test_import_time():  # pragma: no cover - informational
    import time

    t = time.perf_counter()
    load_onnx(FIXTURES / "llama2l_dynamo_opset23.onnx", dims=DIMS)
    assert time.perf_counter() - t < 1.0
