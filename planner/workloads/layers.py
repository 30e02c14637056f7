"""Shared builders for the workload generators.

- ``GraphBuilder`` collects tensors (shape, dtype, kind, home) and ops (flops, bytes_accessed) and returns a
  validated ``planner.graph.Graph``.
- ``Tape`` records one micro-batch's forward ops under logical tensor names, with what each op's backward reads
  (``saved``) and which inputs get gradients.
- ``emit_training`` turns a Tape into one device's training step: the forward and backward of every micro-batch in
  the 1F1B pipeline order, the saved activations (or the per-layer recompute), the weight gradients (accumulated
  in place over micro-batches), the data-parallel gradient reduction and an AdamW step with fp32 master weights
  and two fp32 moments, written as in-place ``updates``.

Naming: weights ``L3.wq``; activations of micro-batch 0 ``mb0.L3.q``; their gradients ``mb0.d.L3.q``;
recomputed copies ``mb0.re.L3.q``; weight gradients ``grad.L3.wq``; optimizer states ``L3.wq.master``,
``L3.wq.adam_m``, ``L3.wq.adam_v``. Ops: ``mb0.F.*`` forward, ``mb0.R.*`` recompute, ``mb0.B.*`` backward,
``opt.*`` optimizer.

Communication (TP all-reduce, pipeline send/recv, DP gradient reduction) appears as ops so the graph shows when
buffers live; their bytes_accessed is the bytes they read and write on HBM, so the roofline cost model times them
as memory-bound copies, not as network transfers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.errors import InputError
from planner.graph import DTYPE_BYTES, Graph, Op, Tensor, TensorKind, tensor_bytes
from planner.hardware import HBM

# Short dtype names accepted by the generators, mapped to the ONNX names the graph stores.
DTYPE_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
    "fp8": "float8e4m3fn", "fp64": "float64", "double": "float64",
}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
                "float8e5m2fnuz", "float4e2m1")

# AdamW cost per parameter: moments (4 mul/add each), bias corrections, sqrt, division, weight decay, update.
ADAMW_FLOPS_PER_PARAM = 12


def canonical_dtype(dtype: str, item: str, source: str) -> str:
    """Return the ONNX name of a floating-point ``dtype``; raise InputError for anything else."""
    if not isinstance(dtype, str):
        raise InputError(source, item, f"{dtype!r} is not a dtype name")
    d = dtype.lower()
    d = DTYPE_ALIASES.get(d, d)
    if d not in DTYPE_BYTES or d not in FLOAT_DTYPES:
        raise InputError(source, item, f"unknown floating-point dtype {dtype!r} (e.g. bfloat16, float16, float32, fp8)")
    return d


def check_int(value, item: str, source: str, minimum: int = 1) -> int:
    """Return ``value`` as an int >= ``minimum``; raise InputError (one line) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(source, item, f"{value!r} is not a whole number")
    if value < minimum:
        raise InputError(source, item, f"must be at least {minimum}, got {value}")
    return value


def check_divides(n: int, d: int, what: str, item: str, source: str) -> None:
    if n % d:
        raise InputError(source, item, f"{d} does not divide {what} ({n})")


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


class GraphBuilder:
    """Collects tensors and ops in execution order and builds a validated Graph."""

    def __init__(self, name: str, source: str = "<workload>") -> None:
        self.name = name
        self.source = source
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []

    def tensor(self, name: str, shape: Sequence[int], dtype: str, kind: str = "activation", home: str = HBM) -> str:
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} declared twice")
        shape = tuple(int(d) for d in shape)
        self.tensors[name] = Tensor(name=name, bytes=tensor_bytes(shape, dtype), kind=TensorKind(kind), shape=shape,
                                    dtype=dtype, home=home)
        return name

    def nbytes(self, name: str) -> int:
        return self.tensors[name].bytes

    def op(self, name: str, op_type: str, inputs: Iterable[str] = (), outputs: Iterable[str] = (),
           updates: Iterable[str] = (), flops: float = 0.0, bytes_accessed: float | None = None,
           workspace: int = 0) -> str:
        """Add an op. ``bytes_accessed`` defaults to the bytes it reads and writes: inputs, outputs, and twice
        each in-place update."""
        inputs, outputs, updates = tuple(inputs), tuple(outputs), tuple(updates)
        if bytes_accessed is None:
            t = self.tensors
            bytes_accessed = (sum(t[n].bytes for n in dict.fromkeys(inputs + outputs))
                              + 2 * sum(t[n].bytes for n in dict.fromkeys(updates)))
        self.ops.append(Op(name=name, op_type=op_type, inputs=inputs, outputs=outputs, updates=updates,
                           flops=float(flops), bytes_accessed=float(bytes_accessed), workspace_bytes=int(workspace)))
        return name

    def build(self, metadata: dict | None = None) -> Graph:
        return Graph.build(self.name, self.tensors.values(), self.ops, source=self.source, metadata=metadata)


# ---------------------------------------------------------------------------------------------------------------
# The training tape


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: str
    kind: str = "activation"
    trainable: bool = True

    @property
    def differentiable(self) -> bool:
        return self.dtype in FLOAT_DTYPES and self.kind == "activation"


@dataclass(frozen=True)
class TapeOp:
    """A forward op in logical names, with what its backward needs.

    ``saved``: the forward tensors its backward reads. ``grad_inputs``: the inputs that receive a gradient.
    ``passthrough``: an addition, whose gradient flows unchanged to every input (no backward op; the gradient
    tensor is shared, or accumulated in place when the input already has one). ``loss``: the backward starts here
    with no incoming gradient. ``grad_allreduce``: the gradient of its outputs is all-reduced over TP before its
    backward (the input side of a column-parallel linear). Ops with ``updates`` and no outputs (a forward
    all-reduce) have no backward.
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    updates: tuple[str, ...]
    flops: float
    saved: tuple[str, ...]
    grad_inputs: tuple[str, ...]
    bwd_flops: float
    bwd_op_type: str
    passthrough: bool = False
    loss: bool = False
    layer: int | None = None
    grad_allreduce: bool = False
    workspace: int = 0


class Tape:
    """One micro-batch's forward in logical names: weights (shared by all micro-batches), activations, ops."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.weights: dict[str, Spec] = {}
        self.acts: dict[str, Spec] = {}
        self.ops: list[TapeOp] = []
        self.stage_input: str | None = None  # received from the previous pipeline stage
        self.stage_output: str | None = None  # sent to the next pipeline stage

    def weight(self, name: str, shape: Sequence[int], dtype: str | None = None, trainable: bool = True) -> str:
        if name not in self.weights:
            self.weights[name] = Spec(tuple(int(d) for d in shape), dtype or self.dtype, "weight", trainable)
        return name

    def act(self, name: str, shape: Sequence[int], dtype: str | None = None, kind: str = "activation") -> str:
        if name in self.acts:
            raise ValueError(f"activation {name!r} declared twice")
        self.acts[name] = Spec(tuple(int(d) for d in shape), dtype or self.dtype, kind)
        return name

    def spec(self, name: str) -> Spec:
        return self.weights.get(name) or self.acts[name]

    def add(self, name: str, op_type: str, inputs: Sequence[str] = (), outputs: Sequence[str] = (), *,
            flops: float = 0.0, updates: Sequence[str] = (), saved: Sequence[str] | None = None,
            grad_inputs: Sequence[str] | None = None, bwd_flops: float | None = None, bwd_op_type: str | None = None,
            passthrough: bool = False, loss: bool = False, layer: int | None = None, grad_allreduce: bool = False,
            workspace: int = 0) -> None:
        inputs, outputs = tuple(inputs), tuple(outputs)
        if grad_inputs is None:
            grad_inputs = tuple(
                t for t in inputs
                if (t in self.weights and self.weights[t].trainable) or (t in self.acts and self.acts[t].differentiable)
            )
        self.ops.append(TapeOp(
            name=name, op_type=op_type, inputs=inputs, outputs=outputs, updates=tuple(updates), flops=float(flops),
            saved=tuple(inputs if saved is None else saved), grad_inputs=tuple(grad_inputs),
            bwd_flops=float(2 * flops if bwd_flops is None else bwd_flops), bwd_op_type=bwd_op_type or f"{op_type}Grad",
            passthrough=passthrough, loss=loss, layer=layer, grad_allreduce=grad_allreduce, workspace=workspace,
        ))

    # Building blocks shared by the models.
    def linear(self, name: str, x: str, w: str, out: str, *, layer: int | None, op_type: str = "MatMul") -> None:
        """out = x @ w: 2*m*k*n forward, twice that backward (input and weight gradients).

        For a grouped (expert) weight of shape (experts, k, n), each of the m rows goes through one expert.
        """
        k, n = self.weights[w].shape[-2:]
        m = numel(self.acts[x].shape) // k
        self.add(name, op_type, (x, w), (out,), flops=2 * m * k * n, layer=layer)

    def rmsnorm(self, name: str, x: str, w: str, out: str, *, layer: int | None, grad_allreduce: bool = False) -> None:
        self.add(name, "RMSNorm", (x, w), (out,), flops=4 * numel(self.acts[x].shape), layer=layer,
                 grad_allreduce=grad_allreduce)

    def residual(self, name: str, inputs: Sequence[str], out: str, *, layer: int | None) -> None:
        self.add(name, "Add", inputs, (out,), flops=(len(inputs) - 1) * numel(self.acts[out].shape), saved=(),
                 passthrough=True, layer=layer)

    def swiglu(self, name: str, gate: str, up: str, out: str, *, layer: int | None) -> None:
        self.add(name, "SwiGLU", (gate, up), (out,), flops=5 * numel(self.acts[out].shape), layer=layer)

    def allreduce(self, name: str, t: str, group: int, *, layer: int | None) -> None:
        """In-place all-reduce over ``group`` ranks (forward only; its backward is the identity)."""
        self.add(name, "AllReduce", (), (), updates=(t,), flops=numel(self.acts[t].shape) * (group - 1) / group,
                 saved=(), grad_inputs=(), layer=layer)


def one_f_one_b(micro_batches: int, pp: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B order of one pipeline stage: warm-up forwards, then one forward one backward, then the rest."""
    warm = min(pp - 1 - stage, micro_batches)
    seq = [("F", i) for i in range(warm)]
    for i in range(micro_batches - warm):
        seq += [("F", warm + i), ("B", i)]
    seq += [("B", i) for i in range(micro_batches - warm, micro_batches)]
    return seq


@dataclass
class TrainingStats:
    forward_flops: float = 0.0
    recompute_flops: float = 0.0
    backward_flops: float = 0.0
    optimizer_flops: float = 0.0
    comm_ops: int = 0


def emit_training(b: GraphBuilder, tape: Tape, *, micro_batches: int, pp: int = 1, stage: int = 0,
                  recompute: bool = False, dp: int = 1, tp: int = 1, zero: int = 0, weight_home: str = "auto",
                  state_home: str = "host") -> TrainingStats:
    """Emit one training step of ``tape`` into ``b``; return FLOP totals by phase."""
    stats = TrainingStats()
    for w, spec in tape.weights.items():
        b.tensor(w, spec.shape, spec.dtype, "weight", weight_home)
    layer_ops: dict[int, list[TapeOp]] = {}
    for f in tape.ops:
        if f.layer is not None:
            layer_ops.setdefault(f.layer, []).append(f)
    recompute_sets = {layer: _recompute_ops(ops) for layer, ops in layer_ops.items()} if recompute else {}
    for phase, i in one_f_one_b(micro_batches, pp, stage):
        if phase == "F":
            _forward(b, tape, i, stats)
        else:
            _backward(b, tape, i, tp, recompute_sets, stats)
    _optimizer(b, tape, dp, zero, state_home, stats)
    return stats


def _declare(b: GraphBuilder, tape: Tape, logical: str, actual: str, kind: str | None = None) -> str:
    spec = tape.acts[logical]
    return b.tensor(actual, spec.shape, spec.dtype, kind or spec.kind)


def _forward(b: GraphBuilder, tape: Tape, i: int, stats: TrainingStats) -> None:
    p = f"mb{i}."

    def name(t: str) -> str:
        return t if t in tape.weights else p + t

    for t, spec in tape.acts.items():
        if spec.kind == "input":
            _declare(b, tape, t, p + t)
    if tape.stage_input:
        b.op(p + "F.recv", "Recv", outputs=(_declare(b, tape, tape.stage_input, p + tape.stage_input),))
        stats.comm_ops += 1
    for f in tape.ops:
        outs = [_declare(b, tape, o, p + o) for o in f.outputs]
        b.op(p + "F." + f.name, f.op_type, [name(t) for t in f.inputs], outs, [name(t) for t in f.updates],
             flops=f.flops, workspace=f.workspace)
        stats.forward_flops += f.flops
    if tape.stage_output:
        b.op(p + "F.send", "Send", inputs=(p + tape.stage_output,))
        stats.comm_ops += 1


def _recompute_ops(ops: list[TapeOp]) -> list[TapeOp]:
    """The forward ops one layer's backward re-runs first: the whole layer, as activation checkpointing does
    (its output is made again and dropped; the backward reads the other copies)."""
    return list(ops)


def _backward(b: GraphBuilder, tape: Tape, i: int, tp: int, recompute_sets: dict[int, list[TapeOp]],
              stats: TrainingStats) -> None:
    p = f"mb{i}."
    grad: dict[str, str] = {}
    remap: dict[str, str] = {}
    done: set[int] = set()

    def fwd(t: str) -> str:
        if t in tape.weights:
            return t
        return remap.get(t, p + t)

    if tape.stage_output:
        g = _declare(b, tape, tape.stage_output, p + "d." + tape.stage_output)
        b.op(p + "B.recv", "Recv", outputs=(g,))
        stats.comm_ops += 1
        grad[tape.stage_output] = g
    for f in reversed(tape.ops):
        out_grads = [grad[o] for o in f.outputs if o in grad]
        if not out_grads and not f.loss:
            continue
        if f.layer in recompute_sets and f.layer not in done:
            done.add(f.layer)
            for r in recompute_sets[f.layer]:
                ins = [fwd(t) for t in r.inputs]
                ups = [fwd(t) for t in r.updates]
                outs = []
                for o in r.outputs:
                    remap[o] = _declare(b, tape, o, p + "re." + o)
                    outs.append(remap[o])
                b.op(p + "R." + r.name, r.op_type, ins, outs, ups, flops=r.flops, workspace=r.workspace)
                stats.recompute_flops += r.flops
        if f.grad_allreduce and tp > 1:
            for k, g in enumerate(out_grads):
                n = numel(b.tensors[g].shape)
                b.op(f"{p}B.{f.name}.allreduce{k or ''}", "AllReduce", updates=(g,), flops=n * (tp - 1) / tp)
                stats.comm_ops += 1
        if f.passthrough:
            g = out_grads[0]
            for t in f.grad_inputs:
                if t in grad:
                    b.op(f"{p}B.{f.name}.acc.{t}", "Add", inputs=(g,), updates=(grad[t],),
                         flops=numel(tape.acts[t].shape))
                else:
                    grad[t] = g
            continue
        inputs = list(dict.fromkeys(out_grads + [fwd(t) for t in f.saved]))
        outs: list[str] = []
        ups: list[str] = []
        for t in f.grad_inputs:
            if t in tape.weights:
                gname = "grad." + t
                if gname in b.tensors:
                    ups.append(gname)
                else:
                    spec = tape.weights[t]
                    outs.append(b.tensor(gname, spec.shape, spec.dtype, "gradient"))
            elif t in grad:
                ups.append(grad[t])
            else:
                grad[t] = _declare(b, tape, t, p + "d." + t)
                outs.append(grad[t])
        b.op(p + "B." + f.name, f.bwd_op_type, inputs, outs, ups, flops=f.bwd_flops, workspace=f.workspace)
        stats.backward_flops += f.bwd_flops
    if tape.stage_input:
        b.op(p + "B.send", "Send", inputs=(grad[tape.stage_input],))
        stats.comm_ops += 1


def _optimizer(b: GraphBuilder, tape: Tape, dp: int, zero: int, state_home: str, stats: TrainingStats) -> None:
    """AdamW with fp32 master weights and moments (home ``state_home``), last layers first.

    Without ZeRO each device holds the full states and all-reduces the gradients (when dp > 1). With ``zero=1``
    and dp > 1 the states are sharded over DP (ZeRO-1): reduce-scatter the gradient, step the shard, all-gather
    the updated weight.
    """
    for w in reversed(list(tape.weights)):
        spec = tape.weights[w]
        g = "grad." + w
        if not spec.trainable or g not in b.tensors:
            continue
        n = numel(spec.shape)
        sharded = zero and dp > 1
        shape = (math.ceil(n / dp),) if sharded else spec.shape
        states = [b.tensor(f"{w}.{s}", shape, "float32", "optimizer_state", state_home)
                  for s in ("master", "adam_m", "adam_v")]
        if sharded:
            shard = math.ceil(n / dp)
            gs = b.tensor(g + ".shard", (shard,), spec.dtype, "gradient")
            b.op(f"opt.{w}.reduce_scatter", "ReduceScatter", inputs=(g,), outputs=(gs,), flops=n * (dp - 1) / dp)
            new = b.tensor(w + ".new_shard", (shard,), spec.dtype)
            b.op(f"opt.{w}.adamw", "AdamW", inputs=(gs,), outputs=(new,), updates=states,
                 flops=ADAMW_FLOPS_PER_PARAM * shard)
            b.op(f"opt.{w}.all_gather", "AllGather", inputs=(new,), updates=(w,))
            stats.optimizer_flops += ADAMW_FLOPS_PER_PARAM * shard + n * (dp - 1) / dp
            stats.comm_ops += 2
        else:
            if dp > 1:
                b.op(f"opt.{w}.allreduce", "AllReduce", updates=(g,), flops=n * (dp - 1) / dp)
                stats.optimizer_flops += n * (dp - 1) / dp
                stats.comm_ops += 1
            b.op(f"opt.{w}.adamw", "AdamW", inputs=(g,), updates=(w, *states), flops=ADAMW_FLOPS_PER_PARAM * n)
            stats.optimizer_flops += ADAMW_FLOPS_PER_PARAM * n


def bytes_by_kind(graph: Graph) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in graph.tensors.values():
        out[t.kind.value] = out.get(t.kind.value, 0) + t.bytes
    return out


def weight_elements(graph: Graph) -> int:
    """Elements of the weight tensors (parameters on this device)."""
    return sum(numel(t.shape) for t in graph.tensors.values() if t.kind is TensorKind.WEIGHT and t.shape)
