"""The computation graph: tensors and the ops that read, write and update them.

A Graph is plain, validated data. It knows nothing of hardware, plans or time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import networkx as nx

from planner.errors import InputError
from planner.hardware import HBM

# Bytes per element, by the dtype names ONNX uses (TensorProto) and their short aliases.
DTYPE_BYTES: dict[str, float] = {
    "float64": 8, "double": 8, "fp64": 8,
    "float32": 4, "float": 4, "fp32": 4,
    "float16": 2, "half": 2, "fp16": 2,
    "bfloat16": 2, "bf16": 2,
    "float8e4m3fn": 1, "float8e4m3fnuz": 1, "float8e5m2": 1, "float8e5m2fnuz": 1, "fp8": 1,
    "float4e2m1": 0.5, "fp4": 0.5,
    "int64": 8, "uint64": 8, "int32": 4, "uint32": 4, "int16": 2, "uint16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "int4": 0.5, "uint4": 0.5,
    "complex64": 8, "complex128": 16,
}


class TensorKind(str, Enum):
    WEIGHT = "weight"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    KV_CACHE = "kv_cache"
    INPUT = "input"
    OUTPUT = "output"


# Kinds whose contents outlive one step: after the step they must still exist on some tier.
PERSISTENT_KINDS = frozenset({TensorKind.WEIGHT, TensorKind.OPTIMIZER_STATE, TensorKind.KV_CACHE, TensorKind.OUTPUT})

# A ``home`` that leaves the starting tier to the planner (planner/placement.py). Any other home pins the tensor.
AUTO = "auto"


@dataclass(frozen=True)
class Tensor:
    """A tensor. ``home`` is the tier it lives on before the step starts (only for tensors no op produces): a tier
    name pins it there; ``"auto"`` (for tensors that outlive the step) lets the planner choose, and the plan's
    ``placement`` then says where it starts (and, steps repeating, where it must be again when the step ends).
    """

    name: str
    bytes: int
    kind: TensorKind = TensorKind.ACTIVATION
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    home: str = HBM

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT_KINDS

    @property
    def pinned(self) -> bool:
        """Whether the graph fixes the starting tier (``home`` is not ``"auto"``)."""
        return self.home != AUTO


@dataclass(frozen=True)
class Op:
    """A compute op. ``updates`` are tensors it reads and writes in place (an optimizer step, a KV append).

    ``duration_s`` overrides the cost model; ``flops`` and ``bytes_accessed`` feed it.
    """

    name: str
    op_type: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    updates: tuple[str, ...] = ()
    flops: float = 0.0
    bytes_accessed: float = 0.0
    duration_s: float | None = None
    workspace_bytes: int = 0
    # The graph file's ``"recompute"``. False: a plan may not re-run the op (random draws, side effects). True: it
    # may, even with no inputs (a source that reads data the graph does not hold, as the input batch of Checkmate's
    # format). None (absent): the default rule of ``recomputable``.
    recompute: bool | None = None

    @property
    def recomputable(self) -> bool:
        """Whether a plan may re-run the op to make its outputs again: it makes outputs, writes nothing in place
        (a second run would write again), and the graph does not forbid it. An op with no inputs (a receive, a
        load) makes its outputs from outside the graph and is recomputable only where the graph says so
        (``recompute=True``)."""
        return (self.recompute is not False and bool(self.outputs) and not self.updates
                and (bool(self.inputs) or self.recompute is True))

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """Tensors that must be resident on HBM while the op runs, besides its outputs. Kept once made: every
        planner and the executor ask per op, and ops read dozens of tensors (1.3M reads on a 38.8k-op graph)."""
        return tuple(dict.fromkeys(self.inputs + self.updates))


@dataclass(frozen=True)
class Graph:
    """Ops in a given (topological) order and the tensors they use. Built with ``Graph.build``."""

    name: str
    tensors: dict[str, Tensor]
    ops: tuple[Op, ...]
    metadata: dict = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        name: str,
        tensors: Iterable[Tensor],
        ops: Iterable[Op],
        source: str = "<graph>",
        metadata: dict | None = None,
    ) -> Graph:
        """Return a validated Graph; raise InputError naming the first bad item.

        Ops are reordered topologically when given out of order (stable: the given order breaks ties).
        """
        tensor_map: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in tensor_map:
                raise InputError(source, f"tensor {t.name!r}", "declared twice")
            if not isinstance(t.bytes, int) or isinstance(t.bytes, bool) or t.bytes <= 0:
                raise InputError(source, f"tensor {t.name!r}", f"size must be a positive integer, got {t.bytes!r}")
            tensor_map[t.name] = t
        op_list = list(ops)
        if not op_list:
            raise InputError(source, "nodes", "the graph has no ops")
        producer: dict[str, str] = {}
        seen_ops: set[str] = set()
        for op in op_list:
            if op.name in seen_ops:
                raise InputError(source, f"node {op.name!r}", "name used twice")
            seen_ops.add(op.name)
            for role, names in (("input", op.inputs), ("output", op.outputs), ("update", op.updates)):
                for tn in names:
                    if tn not in tensor_map:
                        raise InputError(source, f"node {op.name!r}", f"{role} {tn!r} is not a declared tensor")
            for tn in op.outputs:
                if tn in producer:
                    raise InputError(
                        source, f"tensor {tn!r}", f"produced twice (by {producer[tn]!r} and {op.name!r})"
                    )
                producer[tn] = op.name
            for tn in op.updates:
                if tn in op.outputs:
                    raise InputError(source, f"node {op.name!r}", f"{tn!r} is both an output and an update")
            if op.workspace_bytes < 0 or op.flops < 0 or op.bytes_accessed < 0:
                raise InputError(source, f"node {op.name!r}", "flops, bytes and workspace must not be negative")
            if op.duration_s is not None and (op.duration_s < 0 or not math.isfinite(op.duration_s)):
                raise InputError(source, f"node {op.name!r}", "duration must be a non-negative number")
        for t in tensor_map.values():
            if t.home == AUTO and not t.persistent and t.name not in producer:
                raise InputError(source, f"tensor {t.name!r}", f"home {AUTO!r} is only for tensors that outlive the "
                                 f"step (weight, optimizer_state, kv_cache), not {t.kind.value}")
        for op in op_list:
            for tn in op.inputs + op.updates:
                if tn in producer and producer[tn] == op.name:
                    raise InputError(source, f"node {op.name!r}", f"reads its own output {tn!r}")
        dag = _dependency_dag(op_list, producer)
        if not nx.is_directed_acyclic_graph(dag):
            cycle = nx.find_cycle(dag)
            names = " -> ".join(u for u, _ in cycle) + f" -> {cycle[0][0]}"
            raise InputError(source, "nodes", f"the graph has a cycle: {names}")
        index = {op.name: i for i, op in enumerate(op_list)}
        order = list(nx.lexicographical_topological_sort(dag, key=index.__getitem__))
        by_name = {op.name: op for op in op_list}
        return cls(name=name, tensors=tensor_map, ops=tuple(by_name[n] for n in order), metadata=dict(metadata or {}))

    # Derived views, computed once.
    @cached_property
    def op_index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @cached_property
    def producer(self) -> dict[str, str]:
        """Tensor name -> name of the op that produces it (absent for tensors that exist before the step)."""
        return {t: op.name for op in self.ops for t in op.outputs}

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        """Tensor name -> names of the ops that read or update it, in graph order."""
        out: dict[str, list[str]] = {name: [] for name in self.tensors}
        for op in self.ops:
            for t in op.reads:
                out[t].append(op.name)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def free_tensors(self) -> tuple[str, ...]:
        """Tensors whose starting tier the planner chooses: no op produces them and their home is ``"auto"``."""
        return tuple(n for n, t in self.tensors.items() if t.home == AUTO and n not in self.producer)

    @cached_property
    def home_free(self) -> dict:
        """Values other modules derive from the graph that do not depend on tensor homes (the no-offload order:
        planner/orders.py), kept here so that each is computed once per graph; graphs that differ
        from this one only in homes share it (planner/placement.py)."""
        return {}

    @cached_property
    def dag(self) -> nx.DiGraph:
        """Op dependency DAG (read-after-write, and write-after-read for in-place updates)."""
        return _dependency_dag(list(self.ops), self.producer)

    def op(self, name: str) -> Op:
        return self.ops[self.op_index[name]]

    def working_set(self, op: Op) -> int:
        """Bytes that must be on HBM while ``op`` runs: what it reads, what it writes, its workspace."""
        names = set(op.inputs) | set(op.updates) | set(op.outputs)
        return sum(self.tensors[t].bytes for t in names) + op.workspace_bytes

    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors.values())


def _dependency_dag(ops: Sequence[Op], producer: dict[str, str]) -> nx.DiGraph:
    """Edges producer -> reader, and, for an in-place update, every earlier reader -> the updater.

    The given op order decides which readers of an updated tensor come before the update.
    """
    # Edges listed first, duplicates dropped, then added at once: the 38.8k-op inference graph's ops read 1.3M
    # tensors (KV-cache blocks) over 76k distinct edges, and an add_edge per read cost 2.7 s. Each node's
    # successors keep the order of first listing, as with add_edge.
    edges: list[tuple[str, str]] = []
    add = edges.append
    writer = dict(producer)  # the last op that wrote each tensor: its producer, then its updaters
    # Readers are tracked only for tensors some op updates (a few thousand reads among 1.3M there).
    updated = {t for op in ops for t in op.updates}
    readers_since_write: dict[str, list[str]] = {t: [] for t in updated}
    for op in ops:
        name = op.name
        for t in op.inputs + op.updates:
            src = writer.get(t)
            if src is not None and src != name:
                add((src, name))
        for t in op.updates:
            for r in readers_since_write[t]:
                if r != name:
                    add((r, name))
            writer[t] = name
            readers_since_write[t] = []
        for t in op.inputs:
            if t in updated:
                readers_since_write[t].append(name)
    dag = nx.DiGraph()
    dag.add_nodes_from(op.name for op in ops)
    dag.add_edges_from(dict.fromkeys(edges))
    return dag


def tensor_bytes(shape: Sequence[int], dtype: str) -> int:
    """Return the byte size of a tensor of ``shape`` and ``dtype`` (rounded up to whole bytes)."""
    n = 1
    for d in shape:
        n *= int(d)
    return int(math.ceil(n * DTYPE_BYTES[dtype]))
