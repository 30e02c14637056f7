"""Import an ONNX model (``.onnx`` protobuf, or the JSON form of a ModelProto) as a Graph.

What it does, in order:

1. Loads the model without its weights (``onnx.load(path, load_external_data=False)``): initializer sizes come
   from their ``dims``, so a model whose external data file is missing or tens of GB imports in a blink.
   Local functions are inlined.
2. Fixes the symbolic dims the exporter left (``dims={"batch": 1, "sequence": 4096}``, CLI ``--dim``) in the
   graph's inputs, outputs and value_info, including dims written as expressions (``sequence + 1``). A
   symbolic dim of a graph input with no value is an error that lists every such dim.
3. Infers shapes with ONNX's own inference (``data_prop=True``). When values are still without a static shape
   (legacy exports, some published models), it runs onnxruntime's symbolic shape inference
   (``onnxruntime.tools.symbolic_shape_infer``) when onnxruntime is importable (the ``onnx-symbolic`` extra)
   and takes the shapes it resolves. Values still unknown are an error that names them (and, without
   onnxruntime, says to install the extra).
4. Builds the Graph: initializers and ``Constant`` nodes become ``weight`` tensors (no op); graph inputs
   ``input``; graph outputs ``output``; every other value ``activation``. Bytes come from dtype and shape (at
   least 1 byte). View ops (Reshape, Squeeze, Unsqueeze, Flatten, Identity) share their input's memory in
   every runtime, so they are folded away (``fold_views=False`` keeps them as copying ops). FLOPs per node
   follow ``planner.formats.onnx_flops``; ``bytes_accessed`` is the bytes of the node's distinct inputs and
   outputs. Nodes with subgraphs (If, Loop, Scan) are opaque ops: their inputs include the outer values their
   bodies read, their FLOPs are 0. Empty optional inputs and outputs (``""``) are skipped; missing or
   duplicate node names get stable generated names (``<op_type>_<index>``, ``<name>__2``).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import onnx
import onnx.inliner
from google.protobuf import json_format
from onnx import numpy_helper  # noqa: F401  (imported for its side effect of loading onnx's mappings)

from planner.errors import InputError
from planner.formats.onnx_flops import node_flops
from planner.graph import AUTO, DTYPE_BYTES, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM

# TensorProto.DataType -> our dtype name (planner.graph.DTYPE_BYTES).
ONNX_DTYPES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
    16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4e2m1",
}
# Types we size but that have no name in DTYPE_BYTES: string (sized as a pointer per element), float8e8m0,
# uint2, int2, float6e2m3, float6e3m2.
OTHER_DTYPE_BYTES: dict[int, float] = {8: 8, 24: 1, 25: 0.25, 26: 0.25, 27: 0.75, 28: 0.75}

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
SUBGRAPH_ATTR_TYPES = (5, 10)  # AttributeProto.GRAPH, AttributeProto.GRAPHS
EXTRA_HINT = ("install the onnx-symbolic extra (pip install 'ho-plan[onnx-symbolic]') for onnxruntime's symbolic "
              "shape inference")

Dim = int | str | None  # a static size, a symbolic name or expression, or unknown


def load_onnx(path: str | Path, dims: dict[str, int] | None = None, symbolic: bool | None = None,
              fold_views: bool = True, name: str | None = None) -> Graph:
    """Return the Graph of the ``.onnx`` model at ``path`` (weights are not read).

    ``dims`` fixes symbolic dims by name. ``symbolic``: None uses onnxruntime's symbolic shape inference when
    ONNX's leaves shapes unknown and onnxruntime is importable; False never; True requires it.
    """
    source = str(path)
    p = Path(path)
    if not p.exists():
        raise InputError(source, "file", "no such file")
    if p.is_dir():
        raise InputError(source, "file", "is a directory")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, or onnx's own checks on the header
        raise InputError(source, "file", f"not a valid ONNX model ({_one_line(exc)})") from None
    return graph_from_model(model, source, dims=dims, symbolic=symbolic, fold_views=fold_views,
                            name=name or p.name.removesuffix(".onnx"))


def load_onnx_json(doc: dict, source: str, dims: dict[str, int] | None = None, symbolic: bool | None = None,
                   fold_views: bool = True, name: str | None = None) -> Graph:
    """Return the Graph of an ONNX ModelProto in protobuf's JSON form (``json_format.MessageToJson``)."""
    model = onnx.ModelProto()
    try:
        json_format.ParseDict(doc, model)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise InputError(source, "document", f"not an ONNX ModelProto in JSON form ({_one_line(exc)})") from None
    stem = Path(source).name.removesuffix(".json").removesuffix(".onnx")
    return graph_from_model(model, source, dims=dims, symbolic=symbolic, fold_views=fold_views, name=name or stem)


def graph_from_model(model, source: str = "<onnx>", dims: dict[str, int] | None = None, symbolic: bool | None = None,
                     fold_views: bool = True, name: str | None = None) -> Graph:
    """Return the Graph of an ``onnx.ModelProto`` (see the module docstring). The model is not modified.

    In four steps: a copy with local functions inlined; symbolic dims checked and substituted; static shapes from
    ONNX's shape inference (onnxruntime's symbolic inference where that leaves some unknown); ops and tensors.
    """
    m = _inlined_copy(model, source)
    g = m.graph
    dims = _check_dims(dims or {}, source)
    initializer_names = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    _substitute_dims(g, dims, initializer_names, source)
    node_names = _node_names(g.node)
    _check_references(g, node_names, initializer_names, source)
    shapes, elem, dropped = _static_shapes(m, dims, initializer_names, symbolic, source)
    graph_inputs = [vi.name for vi in g.input if vi.name not in initializer_names]
    graph_outputs = {vi.name for vi in g.output}
    kinds: dict[str, TensorKind] = dict.fromkeys(initializer_names, TensorKind.WEIGHT)
    kinds.update(dict.fromkeys(graph_inputs, TensorKind.INPUT))
    nodes = _ops_from_nodes(g, node_names, shapes, dropped, graph_outputs, kinds, fold_views)
    kinds.update(dict.fromkeys(graph_outputs, TensorKind.OUTPUT))
    used = {t for op in nodes.ops for t in op.inputs + op.outputs} | {nodes.resolve(n) for n in graph_outputs}
    tensors = {t: _tensor(t, elem[t], shapes[t], kinds.get(t, TensorKind.ACTIVATION), source)
               for t in sorted(used, key=_order_key(g, graph_inputs))}
    ops = [replace(op, bytes_accessed=float(sum(tensors[t].bytes for t in dict.fromkeys(op.inputs + op.outputs))))
           for op in nodes.ops]
    metadata = {
        "source_format": "onnx",
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "dims": dict(sorted(dims.items())),
        "onnx_nodes": len(g.node),
        "folded_views": len(nodes.alias),
    }
    if nodes.no_formula:
        metadata["ops_without_flops"] = sorted(nodes.no_formula)
    if nodes.opaque:
        metadata["opaque_ops"] = sorted(nodes.opaque)
    if dropped:
        metadata["dropped_unsized_unused_outputs"] = len(dropped)
    return Graph.build(name or g.name or "onnx", tensors.values(), ops, source=source, metadata=metadata)


def _inlined_copy(model, source: str):
    """A copy of ``model`` with its local functions inlined (the caller's model is left as it is)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if len(m.graph.node) == 0:
        raise InputError(source, "graph", "the model has no nodes (not an ONNX model, or an empty graph)")
    if len(m.functions):
        try:
            m = onnx.inliner.inline_local_functions(m)
        except Exception as exc:
            raise InputError(source, "functions",
                             f"could not inline the model's local functions ({_one_line(exc)})") from None
    return m


def _substitute_dims(g, dims: dict[str, int], initializer_names: set[str], source: str) -> None:
    """Check the given dims against the symbolic dims the model uses and the graph inputs' unresolved ones, then
    write their values into the graph's value infos (in place, on the caller's copy)."""
    top_infos = list(g.input) + list(g.output) + list(g.value_info)
    known_names: set[str] = set()
    for vi in top_infos:
        for d in _tensor_dims(vi):
            if d.HasField("dim_param"):
                known_names |= _expr_names(d.dim_param)
    unknown_given = sorted(set(dims) - known_names)
    if unknown_given:
        have = ", ".join(sorted(known_names)) or "none"
        raise InputError(source, "dims", f"no symbolic dim named {', '.join(unknown_given)} in the model "
                                         f"(its symbolic dims: {have})")
    unresolved: set[str] = set()
    anonymous: list[str] = []
    for vi in g.input:
        if vi.name in initializer_names:
            continue
        for axis, d in enumerate(_tensor_dims(vi)):
            if d.HasField("dim_param"):
                if _eval_dim(d.dim_param, dims) is None:
                    unresolved |= _expr_names(d.dim_param) - set(dims)
            elif not d.HasField("dim_value"):
                anonymous.append(f"{vi.name!r} axis {axis}")
    if unresolved or anonymous:
        parts = []
        if unresolved:
            parts.append(f"unresolved symbolic dims: {', '.join(sorted(unresolved))} (fix each with --dim NAME=VALUE)")
        if anonymous:
            parts.append(f"graph inputs with an unnamed unknown dim: {', '.join(anonymous)}")
        raise InputError(source, "dims", "; ".join(parts))
    for vi in top_infos:
        for d in _tensor_dims(vi):
            if d.HasField("dim_param"):
                v = _eval_dim(d.dim_param, dims)
                if v is not None:
                    d.dim_value = v


def _check_references(g, node_names: list[str], initializer_names: set[str], source: str) -> None:
    """Every node input is a graph input, an initializer or an earlier node's output."""
    defined = set(initializer_names) | {vi.name for vi in g.input}
    for node, op_name in zip(g.node, node_names):
        for t in list(node.input) + _outer_refs(node):
            if t and t not in defined:
                raise InputError(source, f"node {op_name!r}",
                                 f"input {t!r} is not a graph input, an initializer or an earlier node's output")
        defined.update(node.output)


def _static_shapes(m, dims: dict[str, int], initializer_names: set[str], symbolic: bool | None, source: str
                   ) -> tuple[dict[str, tuple[int, ...]], dict[str, int], set[str]]:
    """Return (shape, ONNX element type, unsized outputs dropped) of every value the graph needs: ONNX's shape
    inference, then onnxruntime's symbolic inference for what it leaves unknown (``symbolic``: None when it is
    importable, True required, False never). Outputs no one reads and the graph does not return (a Dropout mask,
    a norm's saved statistics) may be left unsized by every inference: they are dropped from their op. Any other
    value left unsized is an InputError."""
    g = m.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        inferred = m
    types = _value_types(inferred)
    _fill_known_rules(g, types, dims)
    needed = _needed_values(g)
    missing = [n for n in needed if _static(types.get(n), dims) is None]
    symbolic_note = None
    if symbolic is False:
        symbolic_note = "onnxruntime's symbolic shape inference was turned off (symbolic=False)"
    if missing and symbolic is not False:
        ort_model, symbolic_note = _symbolic_infer(m, required=symbolic is True, source=source)
        if ort_model is not None:
            ort_types = _value_types(ort_model)
            for n in missing:
                if _static(ort_types.get(n), dims) is not None:
                    types[n] = ort_types[n]
            missing = [n for n in needed if _static(types.get(n), dims) is None]
    consumed = {t for node in g.node for t in list(node.input) + _outer_refs(node)} | {vi.name for vi in g.output}
    dropped = {n for n in missing if n not in consumed and n not in initializer_names
               and n not in {vi.name for vi in g.input}}
    missing = [n for n in missing if n not in dropped]
    if missing:
        raise InputError(source, "shapes", _missing_message(missing, types, symbolic_note))
    shapes: dict[str, tuple[int, ...]] = {}
    elem: dict[str, int] = {}
    for n in needed:
        if n not in dropped:
            elem[n], shapes[n] = _static(types[n], dims)
    return shapes, elem, dropped


@dataclass
class _Nodes:
    """The ops of the graph's nodes, and what the import did on the way."""

    ops: list[Op] = field(default_factory=list)
    alias: dict[str, str] = field(default_factory=dict)  # folded view output -> the value it views
    opaque: set[str] = field(default_factory=set)  # op types with subgraphs, counted as zero FLOPs
    no_formula: set[str] = field(default_factory=set)  # op types without a FLOP formula

    def resolve(self, t: str) -> str:
        """The value a (possibly folded view) name stands for."""
        while t in self.alias:
            t = self.alias[t]
        return t


def _ops_from_nodes(g, node_names: list[str], shapes: dict[str, tuple[int, ...]], dropped: set[str],
                    graph_outputs: set[str], kinds: dict[str, TensorKind], fold_views: bool) -> _Nodes:
    """One Op per node, in graph order: Constants become weights (``kinds``), single-output views fold into the
    value they view when ``fold_views``, FLOPs from ``onnx_flops`` (bytes accessed are filled in later)."""
    out = _Nodes()
    for node, op_name in zip(g.node, node_names):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for o in node.output:
                if o:
                    kinds[o] = TensorKind.WEIGHT
            continue
        ins = [t for t in node.input if t]
        outs = [t for t in node.output if t and t not in dropped]
        if (fold_views and node.op_type in VIEW_OPS and node.domain in ("", "ai.onnx") and len(outs) == 1 and ins
                and outs[0] not in graph_outputs and outs[0] == node.output[0]):
            out.alias[outs[0]] = out.resolve(node.input[0])
            continue
        if any(a.type in SUBGRAPH_ATTR_TYPES for a in node.attribute):
            flops: float | None = 0.0
            out.opaque.add(node.op_type)
        else:
            attrs = {a.name: _attr(a) for a in node.attribute}
            try:
                flops = node_flops(node.op_type, attrs, [shapes.get(t) if t else None for t in node.input],
                                   [shapes.get(t) if t else None for t in node.output], node.domain)
            except (ValueError, TypeError, IndexError, KeyError, AttributeError):
                flops = None  # attributes the formula cannot read: count as an op without a formula
            if flops is None:
                out.no_formula.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}")
                flops = 0.0
        inputs = tuple(dict.fromkeys(out.resolve(t) for t in ins + _outer_refs(node)))
        out.ops.append(Op(name=op_name, op_type=node.op_type, inputs=inputs, outputs=tuple(dict.fromkeys(outs)),
                          flops=float(flops)))
    return out


def _tensor(t: str, dtype_id: int, shape: tuple[int, ...], kind: TensorKind, source: str) -> Tensor:
    """The Tensor of value ``t``. An imported model names no tiers: where its weights start is the planner's
    choice (planner/placement.py)."""
    dtype = ONNX_DTYPES.get(dtype_id)
    per = DTYPE_BYTES[dtype] if dtype else OTHER_DTYPE_BYTES.get(dtype_id)
    if per is None:
        raise InputError(source, f"value {t!r}", f"unsupported element type {dtype_id}")
    nbytes = max(1, math.ceil(math.prod(shape) * per))
    return Tensor(name=t, bytes=nbytes, kind=kind, shape=shape, dtype=dtype,
                  home=AUTO if kind is TensorKind.WEIGHT else HBM)


def _attr(a):
    v = onnx.helper.get_attribute_value(a)
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _check_dims(dims: dict, source: str) -> dict[str, int]:
    out = {}
    for k, v in dims.items():
        iv = None
        if isinstance(v, int) and not isinstance(v, bool):
            iv = v
        elif isinstance(v, float) and v.is_integer():
            iv = int(v)
        elif isinstance(v, str) and v.strip().isdigit():
            iv = int(v)
        if iv is None or iv <= 0:
            raise InputError("command line", f"--dim {k}", f"{v!r} must be a positive whole number")
        out[str(k)] = iv
    return out


def _tensor_dims(vi) -> Iterable:
    t = vi.type
    if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
        return t.tensor_type.shape.dim
    return ()


# --- symbolic dim expressions --------------------------------------------------------------------------------

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow, ast.Div: operator.truediv}
_FUNCS = {
    "max": max, "Max": max, "min": min, "Min": min, "abs": abs, "Abs": abs,
    "floor": math.floor, "Floor": math.floor, "ceiling": math.ceil, "ceil": math.ceil, "Ceil": math.ceil,
    "FloorDiv": lambda a, b: a // b, "CeilDiv": lambda a, b: -(-a // b), "Mod": lambda a, b: a % b,
    "CeilToInt": math.ceil, "FloorToInt": math.floor, "TruncToInt": int,
}


def _expr_names(expr: str) -> set[str]:
    """The free names of a dim expression (the whole string when it is not an expression)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return {expr}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def _eval_dim(expr: str, dims: dict[str, int]) -> int | None:
    """The value of a dim expression given ``dims``, or None when a name is unknown or it is not an expression."""
    if expr in dims:
        return dims[expr]
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise KeyError(node.id)
            return Fraction(dims[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return Fraction(_BINOPS[type(node.op)](ev(node.left), ev(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords):
            return Fraction(_FUNCS[node.func.id](*[ev(a) for a in node.args]))
        raise ValueError(ast.dump(node))

    try:
        v = ev(tree)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, OverflowError):
        return None
    if v.denominator != 1 or v < 0:
        return None
    return int(v)


# --- shapes --------------------------------------------------------------------------------------------------

def _value_types(model) -> dict[str, tuple[int, list[Dim] | None]]:
    """Every top-level value's (element type, dims) the model states: initializers, Constant nodes, inputs,
    outputs and value_info. dims is None for an unknown rank."""
    g = model.graph
    out: dict[str, tuple[int, list[Dim] | None]] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type
        if not t.HasField("tensor_type"):
            continue
        tt = t.tensor_type
        dims: list[Dim] | None = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
                    for d in tt.shape.dim]
        prev = out.get(vi.name)
        if prev is None or (prev[1] is None and dims is not None) or prev[0] == 0:
            out[vi.name] = (tt.elem_type or (prev[0] if prev else 0), dims)
    for node in g.node:
        if node.op_type == "Constant" and node.output and node.output[0]:
            c = _constant_type(node)
            if c is not None:
                out[node.output[0]] = c
    for init in g.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    for sp in g.sparse_initializer:
        out[sp.values.name] = (sp.values.data_type, list(sp.dims))
    return out


def _constant_type(node) -> tuple[int, list[Dim]] | None:
    for a in node.attribute:
        if a.name == "value":
            return a.t.data_type, list(a.t.dims)
        if a.name == "sparse_value":
            return a.sparse_tensor.values.data_type, list(a.sparse_tensor.dims)
        if a.name == "value_float":
            return 1, []
        if a.name == "value_int":
            return 7, []
        if a.name == "value_string":
            return 8, []
        if a.name == "value_floats":
            return 1, [len(a.floats)]
        if a.name == "value_ints":
            return 7, [len(a.ints)]
        if a.name == "value_strings":
            return 8, [len(a.strings)]
    return None


def _static(t: tuple[int, list[Dim] | None] | None, dims: dict[str, int]) -> tuple[int, tuple[int, ...]] | None:
    """(element type, static shape), or None when the type or any dim is unknown."""
    if t is None or not t[0] or t[1] is None:
        return None
    shape = []
    for d in t[1]:
        if isinstance(d, int) and not isinstance(d, bool):
            shape.append(d)
        elif isinstance(d, str):
            v = _eval_dim(d, dims)
            if v is None:
                return None
            shape.append(v)
        else:
            return None
    return t[0], tuple(shape)


def _needed_values(g) -> list[str]:
    """Top-level values the graph uses or produces, in a stable order."""
    seen: dict[str, None] = {}
    for vi in g.input:
        seen.setdefault(vi.name, None)
    for node in g.node:
        for t in list(node.input) + _outer_refs(node) + list(node.output):
            if t:
                seen.setdefault(t, None)
    for vi in g.output:
        seen.setdefault(vi.name, None)
    return list(seen)


def _symbolic_infer(m, required: bool, source: str):
    """Return (the model with onnxruntime's symbolic shape inference applied, a note for error messages).
    The model is None when onnxruntime is not importable or its inference fails (with ``required``, those are
    errors)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        if required:
            raise InputError(source, "shapes", f"onnxruntime is not installed: {EXTRA_HINT}") from None
        return None, EXTRA_HINT
    try:
        out = SymbolicShapeInference.infer_shapes(m, auto_merge=True, guess_output_rank=False, verbose=0)
    except Exception as exc:
        if required:
            raise InputError(source, "shapes",
                             f"onnxruntime's symbolic shape inference failed ({_one_line(exc)})") from None
        return None, f"onnxruntime's symbolic shape inference failed ({_one_line(exc)})"
    if out is None:
        return None, "onnxruntime's symbolic shape inference gave no model"
    return out, "onnxruntime's symbolic shape inference could not resolve them either"


def _fill_known_rules(g, types: dict, dims: dict) -> None:
    """Shapes some inferences leave out but that follow from the op: a Dropout mask has its input's shape."""
    for node in g.node:
        if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1] and node.input:
            x = _static(types.get(node.input[0]), dims)
            if x is not None and _static(types.get(node.output[1]), dims) is None:
                types[node.output[1]] = (9, list(x[1]))


def _missing_message(missing: list[str], types: dict, note: str | None) -> str:
    symbolic: set[str] = set()
    for n in missing:
        t = types.get(n)
        if t and t[1]:
            for d in t[1]:
                if isinstance(d, str):
                    symbolic.add(d)

    def describe(n: str) -> str:
        t = types.get(n)
        if t is None or t[1] is None:
            return f"{n!r} (unknown shape)"
        return f"{n!r} [{', '.join('?' if d is None else str(d) for d in t[1])}]"

    shown = ", ".join(describe(n) for n in missing[:8])
    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
    msg = f"{len(missing)} values have no static shape after shape inference: {shown}{more}"
    named = sorted(d for d in symbolic if not re.fullmatch(r"unk__\d+", d))
    if named:
        msg += f"; unresolved dims: {', '.join(named)}"
    if len(named) < len(symbolic):
        msg += f"; {len(symbolic) - len(named)} dims shape inference could not name"
    if note:
        msg += f"; {note}"
    return msg


# --- nodes ---------------------------------------------------------------------------------------------------

def _node_names(nodes) -> list[str]:
    """Stable unique names: the node's own, or ``<op_type>_<index>``; repeats get ``__2``, ``__3``..."""
    given = [n.name for n in nodes]
    taken = set(given)
    out: list[str] = []
    used: set[str] = set()
    for i, n in enumerate(nodes):
        base = n.name or f"{n.op_type}_{i}"
        if not n.name and base in taken:
            base = f"{n.op_type}_{i}_"
        cand, k = base, 1
        while cand in used:
            k += 1
            cand = f"{base}__{k}"
        used.add(cand)
        out.append(cand)
    return out


def _outer_refs(node) -> list[str]:
    """Values of the enclosing scope that the node's subgraphs read (If, Loop, Scan bodies)."""
    refs: dict[str, None] = {}
    for a in node.attribute:
        subs = [a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []
        for sg in subs:
            for r in _graph_free_names(sg):
                refs.setdefault(r, None)
    return list(refs)


def _graph_free_names(sg) -> list[str]:
    local = {vi.name for vi in sg.input} | {t.name for t in sg.initializer}
    local |= {t.values.name for t in sg.sparse_initializer}
    free: dict[str, None] = {}
    for node in sg.node:
        for t in list(node.input) + _outer_refs(node):
            if t and t not in local:
                free.setdefault(t, None)
        local.update(o for o in node.output if o)
    for vi in sg.output:
        if vi.name not in local:
            free.setdefault(vi.name, None)
    return list(free)


def _order_key(g, graph_inputs: list[str]):
    """Tensors in a readable order: graph inputs, initializers, then values in node order."""
    order: dict[str, int] = {}
    for n in graph_inputs:
        order.setdefault(n, len(order))
    for t in g.initializer:
        order.setdefault(t.name, len(order))
    for node in g.node:
        for t in list(node.input) + list(node.output):
            order.setdefault(t, len(order))
    return lambda t: (order.get(t, len(order)), t)
