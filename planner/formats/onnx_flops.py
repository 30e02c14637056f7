"""FLOPs of one ONNX node from its attributes and the static shapes of its inputs and outputs.

Conventions (one multiply-add is 2 FLOPs; ``prod(Y)`` is the element count of the first output):

- MatMul, MatMulInteger, QLinearMatMul, FusedMatMul: ``2 * prod(Y) * K``, K the contracted dim of A.
- Gemm: ``2 * M * N * K`` with K = A[0] when transA else A[1]; ``+ M * N`` when C is given.
- Conv, ConvInteger, QLinearConv: ``2 * prod(Y) * prod(W[1:])`` (W is [M, C/group, k...]); ``+ prod(Y)`` with a bias.
- ConvTranspose: ``2 * prod(X) * prod(W[1:])`` (every input element is scattered through M/group * k... weights);
  ``+ prod(Y)`` with a bias.
- Attention (ai.onnx, opset 23): ``2 * Skv * (prod(Q) + prod(Y))``, Skv the key length including a past KV
  cache: ``4 * B * Hq * Sq * Skv * D`` when the value head size equals the query's. Causal masking is not
  subtracted (the kernel still touches the full score matrix in most implementations). The same formula serves
  com.microsoft MultiHeadAttention and GroupQueryAttention (Skv from ``present_key`` when given).
- Einsum: ``2 * (n - 1) * prod(size of every index)`` for n >= 2 operands, ``prod(X)`` for one.
- Softmax, LogSoftmax, Hardmax: ``5 * prod(X)`` (max, subtract, exp, sum, divide).
- LayerNormalization, InstanceNormalization, GroupNormalization, MeanVarianceNormalization: ``8 * prod(X)``;
  RMSNormalization and com.microsoft SimplifiedLayerNormalization: ``4 * prod(X)``; SkipLayerNormalization
  ``9 * prod(X)``, SkipSimplifiedLayerNormalization ``5 * prod(X)``; BatchNormalization ``2 * prod(X)``
  (a fused scale and shift; ``8 * prod(X)`` with ``training_mode``); LpNormalization ``3 * prod(X)``;
  LRN ``2 * size * prod(X)``.
- Reductions (Reduce*, ArgMax, ArgMin, CumSum, TopK): ``prod(X)``; ReduceSumSquare, ReduceL2, ReduceLogSumExp
  ``2 * prod(X)``.
- MaxPool, AveragePool, LpPool: ``prod(Y) * prod(kernel_shape)``; Global*Pool: ``prod(X)``.
- Element-wise ops (arithmetic, activations, comparisons, logic, Where, Clip, (De)QuantizeLinear, Resize):
  ``prod(Y)`` per output element, ``(n - 1) * prod(Y)`` for the variadic Sum/Max/Min/Mean;
  RotaryEmbedding ``3 * prod(Y)``.
- Data movement (Reshape, Transpose, Concat, Gather, Slice, Cast, Expand, Pad, Shape, ...): 0.
- Any other op: ``None`` (unknown); the importer counts it as 0 FLOPs and lists its type in the graph's metadata.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Shape = tuple[int, ...]

ELEMENTWISE = frozenset("""
Add Sub Mul Div Pow Mod Neg Abs Reciprocal Sqrt Exp Log Erf Tanh Sigmoid HardSigmoid HardSwish Relu LeakyRelu
PRelu Elu Selu Celu Gelu FastGelu QuickGelu BiasGelu Softplus Softsign Mish Swish Sin Cos Tan Asin Acos Atan
Sinh Cosh Asinh Acosh Atanh Ceil Floor Round Sign Clip Where Equal Less Greater LessOrEqual GreaterOrEqual And Or
Xor Not IsNaN IsInf BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot ThresholdedRelu Shrink QuantizeLinear
DequantizeLinear DynamicQuantizeLinear Resize Upsample BiasAdd BiasSplitGelu
""".split())

VARIADIC = frozenset({"Sum", "Max", "Min", "Mean"})

MOVEMENT = frozenset("""
Reshape Transpose Concat Split Slice Gather GatherElements GatherND Scatter ScatterElements ScatterND Squeeze
Unsqueeze Flatten Expand Tile Pad Shape Size Identity Cast CastLike ConstantOfShape Range DepthToSpace
SpaceToDepth NonZero OneHot EyeLike Compress ReverseSequence Trilu Dropout Constant SequenceConstruct
SplitToSequence SequenceAt ConcatFromSequence Optional OptionalGetElement OptionalHasElement
""".split())

REDUCTIONS = frozenset("""
ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceLogSum ArgMax ArgMin CumSum TopK
""".split())
REDUCTIONS_2 = frozenset({"ReduceSumSquare", "ReduceL2", "ReduceLogSumExp"})

NORM_FLOPS_PER_ELEMENT = {
    "LayerNormalization": 8, "InstanceNormalization": 8, "GroupNormalization": 8, "MeanVarianceNormalization": 8,
    "RMSNormalization": 4, "SimplifiedLayerNormalization": 4, "SkipLayerNormalization": 9,
    "SkipSimplifiedLayerNormalization": 5, "LpNormalization": 3,
}


def prod(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _get(shapes: Sequence[Shape | None], i: int) -> Shape | None:
    return shapes[i] if i < len(shapes) else None


def node_flops(
    op_type: str,
    attrs: dict,
    in_shapes: Sequence[Shape | None],
    out_shapes: Sequence[Shape | None],
    domain: str = "",
) -> float | None:
    """Return the FLOPs of one node, 0 for data movement, or None for an op type without a formula.

    ``in_shapes``/``out_shapes`` are positional (an absent optional input is None). Shapes must be static.
    """
    y = _get(out_shapes, 0)
    x = _get(in_shapes, 0)
    if op_type in ("MatMul", "MatMulInteger", "FusedMatMul", "QLinearMatMul"):
        a = x
        if a is None or y is None:
            return None
        if op_type == "FusedMatMul" and attrs.get("transA", 0) and len(a) >= 2:
            k = a[-2]
        else:
            k = a[-1]
        return 2.0 * prod(y) * k
    if op_type == "Gemm":
        a = x
        if a is None or y is None or len(a) != 2 or len(y) != 2:
            return None
        k = a[0] if attrs.get("transA", 0) else a[1]
        m, n = y
        flops = 2.0 * m * n * k
        if _get(in_shapes, 2) is not None:
            flops += m * n
        return flops
    if op_type in ("Conv", "ConvInteger", "QLinearConv", "FusedConv", "NhwcConv"):
        w = _get(in_shapes, 3 if op_type == "QLinearConv" else 1)
        if w is None or y is None:
            return None
        flops = 2.0 * prod(y) * prod(w[1:])
        if op_type in ("Conv", "FusedConv", "NhwcConv") and _get(in_shapes, 2) is not None:
            flops += prod(y)
        return flops
    if op_type == "ConvTranspose":
        w = _get(in_shapes, 1)
        if x is None or w is None or y is None:
            return None
        flops = 2.0 * prod(x) * prod(w[1:])
        if _get(in_shapes, 2) is not None:
            flops += prod(y)
        return flops
    if op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention") and (
        domain in ("", "ai.onnx") or op_type != "Attention"
    ):
        return _attention_flops(op_type, attrs, in_shapes, out_shapes)
    if op_type == "Einsum":
        return _einsum_flops(attrs.get("equation", ""), in_shapes)
    if op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        return None if x is None else 5.0 * prod(x)
    if op_type in NORM_FLOPS_PER_ELEMENT:
        return None if x is None else float(NORM_FLOPS_PER_ELEMENT[op_type] * prod(x))
    if op_type == "BatchNormalization":
        return None if x is None else (8.0 if attrs.get("training_mode", 0) else 2.0) * prod(x)
    if op_type == "LRN":
        return None if x is None else 2.0 * int(attrs.get("size", 1)) * prod(x)
    if op_type in REDUCTIONS:
        return None if x is None else float(prod(x))
    if op_type in REDUCTIONS_2:
        return None if x is None else 2.0 * prod(x)
    if op_type in ("MaxPool", "AveragePool", "LpPool"):
        k = attrs.get("kernel_shape")
        if y is None or not k:
            return None
        return float(prod(y) * prod(k))
    if op_type in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        return None if x is None else float(prod(x))
    if op_type == "RotaryEmbedding":
        return None if y is None else 3.0 * prod(y)
    if op_type in VARIADIC:
        n = sum(1 for s in in_shapes if s is not None)
        return None if y is None else float(max(1, n - 1) * prod(y))
    if op_type in ELEMENTWISE:
        return None if y is None else float(prod(y))
    if op_type in MOVEMENT:
        return 0.0
    return None


def _attention_flops(op_type: str, attrs: dict, in_shapes, out_shapes) -> float | None:
    q, k, y = _get(in_shapes, 0), _get(in_shapes, 1), _get(out_shapes, 0)
    if q is None or y is None:
        return None
    skv: int | None = None
    present = _get(out_shapes, 1)
    if op_type == "GroupQueryAttention":
        if present is not None and len(present) == 4:
            skv = present[2]
    elif op_type == "MultiHeadAttention":
        if present is not None and len(present) == 4:
            skv = present[2]
        elif k is not None:
            skv = k[2] if len(k) == 4 else k[1]
    else:  # ai.onnx Attention (opset 23): K is [B, Hkv, Skv, D] or [B, Skv, Hkv * D]; past_key is input 4
        if k is not None:
            skv = k[2] if len(k) == 4 else k[1]
            past = _get(in_shapes, 4)
            if past is not None and len(past) == 4:
                skv += past[2]
    if skv is None:
        return None
    if op_type == "GroupQueryAttention":
        # Q may be packed with K and V; the output has the query heads: QK^T and PV cost the same.
        return 4.0 * skv * prod(y)
    return 2.0 * skv * (prod(q) + prod(y))


def _einsum_flops(equation: str, in_shapes: Sequence[Shape | None]) -> float | None:
    eq = equation.replace(" ", "")
    lhs = eq.split("->")[0]
    terms = lhs.split(",")
    if len(terms) != len(in_shapes) or any(s is None for s in in_shapes):
        return None
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, in_shapes):
        assert shape is not None
        if "..." in term:
            head, tail = term.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            if n_ell < 0:
                return None
            # ellipsis dims are aligned from the right across operands (broadcasting)
            labels = list(head) + [f"...{n_ell - i}" for i in range(n_ell)] + list(tail)
        else:
            labels = list(term)
        if len(labels) != len(shape):
            return None
        for lab, d in zip(labels, shape):
            sizes[lab] = max(sizes.get(lab, 1), int(d))
    total = prod(sizes.values())
    return float(total) if len(terms) == 1 else 2.0 * total * (len(terms) - 1)
