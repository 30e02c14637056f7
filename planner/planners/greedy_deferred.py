"""Greedy in a deferred order, with what the deferral holds longer made again by re-runs.

With gradient accumulation and optimizer states stored back to a remote tier, the Stores take longer than the
compute, and they start only once a layer's optimizer step has run: after that layer's backward in every
micro-batch. The order ``deferred-K`` (``planner.orders.deferred_phases``) runs the first K eighths of the
micro-batches in full, then only what the top layers' steps need in the others (their forward passes and the top
layers' backward), then the rest: the Stores start earlier. The price is that the other micro-batches' activations
for the lower layers' backward are held across the top layers' steps, when HBM is fullest. Kept, they push other
tensors off HBM; moved, they take the links the Stores need. Here they are made again instead, right before their
readers, by re-running their producers (their producers' inputs made again too, back to the tensors no re-run may
make: a layer's output whose input a collective wrote in place, a weight): compute, which a link-bound step has to
spare.

Built as a graph rewrite: each re-run is an op of a rewritten graph (a copy of the producer, reading the copies of
its inputs and making copies of its outputs, which the deferred readers read instead). Greedy plans that graph in
its order as any graph, and its plan is mapped back onto the original graph: a copy's run becomes a ``recompute``
step of its producer, the copies' tensors their originals, and each original gets a Detach after its last read
before the re-run (in the rewritten graph it was freed there). The executor checks the plan on the original graph.
DeepSeek-V3 training (8 micro-batches, Adam states on the host) at 60% of its no-offload peak: 2374.48 ms for
greedy's best plan in the other orders, 2207.11 ms in ``deferred-0`` (docs/planners.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import networkx as nx

from planner.executor import simulate
from planner.graph import Graph, Op
from planner.hardware import Hardware
from planner.orders import deferred_phases, phased_order
from planner.plan import Plan, PlanStatus, Step, StepKind
from planner.planned import Planned, place_statically
from planner.planners.greedy_select import Answers, Context
from planner.timeline import Timeline

# The name of a re-run's copy of an op or a tensor: the original's, then this.
COPY = "#redo"
# The deferred orders greedy's ``auto`` tries on graphs that store tensors back (each costs a greedy run on a graph
# with the re-runs as ops): K eighths of the first release's work run first.
DEFERRED_EIGHTHS = (0, 2, 4)
# And only on graphs up to this size (the re-runs add ops).
DEFERRED_MAX_OPS = 5000


@dataclass(frozen=True)
class Deferral:
    """The rewritten graph (ops in their deferred order, re-runs as ops) and what maps it back onto the original."""

    graph: Graph
    copy_of: dict[str, str]  # a re-run's op -> the op it re-runs
    original: dict[str, str]  # a re-run's tensor -> the tensor it makes again


def deferral(graph: Graph, eighths: int) -> Deferral | None:
    """The rewrite of ``graph`` for the order ``deferred-K`` (K = ``eighths``); None when nothing is stored back or
    nothing made before the deferral is read after it."""
    got = deferred_phases(graph, eighths)
    if got is None:
        return None
    phases, ties = got
    wanted = _rerun(graph, phases)
    if not wanted:
        return None
    made = {t for op in wanted for t in op.outputs}
    names = set(graph.tensors) | {op.name for op in graph.ops}
    if any(f"{x}{COPY}" in names for x in made | {op.name for op in wanted}):
        return None  # a name the copies would take is in use: leave such a graph alone

    def copied(t: str) -> str:
        return f"{t}{COPY}" if t in made else t

    copies: dict[str, Op] = {}
    for op in wanted:
        copies[op.name] = replace(op, name=f"{op.name}{COPY}", inputs=tuple(map(copied, op.inputs)),
                                  outputs=tuple(map(copied, op.outputs)))
    # Each copy right after its original in the list: a tensor written in place later is read before the write,
    # as the original read it.
    ops: list[Op] = []
    for op in graph.ops:
        if phases[op.name] >= 2:
            op = replace(op, inputs=tuple(map(copied, op.inputs)))
        ops.append(op)
        if op.name in copies:
            ops.append(copies[op.name])
    tensors = list(graph.tensors.values()) + [replace(graph.tensors[t], name=copied(t)) for t in sorted(made)]
    draft = Graph.build(graph.name, tensors, ops, metadata=graph.metadata)
    # A copy runs after every read of the originals it makes again (the executor's re-run makes only what is not
    # on HBM, and the original is dropped after its last read).
    key: dict[str, tuple] = {name: (phases[name], i, 0) for i, name in enumerate(ties)}
    copy_of = {c.name: name for name, c in copies.items()}
    dag = draft.dag.copy()
    for name, c in copies.items():
        for t in graph.op(name).outputs:
            dag.add_edges_from((r, c.name) for r in draft.users[t])
    if not nx.is_directed_acyclic_graph(dag):
        return None
    # Each copy's first deferred reader, its own or through the copies that read it.
    first: dict[str, tuple] = {}
    for name in sorted(copies, key=lambda n: -key[n][1]):
        readers = {r for t in copies[name].outputs for r in draft.users[t]}
        first[name] = min(key[r] if r in key else first[copy_of[r]] for r in readers)
    for group in _blocks(graph, copies, ties).values():
        start = min(first[c] for c in group)
        for c in group:
            # The block starts before its first reader; within it, what is read first is made first.
            key[copies[c].name] = (start[0], start[1], -1, first[c][1], key[c][1])
    by_name = {op.name: op for op in draft.ops}
    rewritten = Graph.build(graph.name, tensors, [by_name[name] for name in phased_order(dag, key)],
                            metadata=graph.metadata)
    return Deferral(rewritten, copy_of, {copied(t): t for t in made})


def _blocks(graph: Graph, copies: dict[str, Op], ties: list[str]) -> dict[str, list[str]]:
    """The re-runs that run together, in the order their originals ran, right before the first deferred op that
    reads one of them (as a framework recomputes a checkpointed layer before its backward), by first original.

    The segments (re-runs that make one another's inputs) are grouped in the order their originals ran, each group
    up to twice the bytes of the largest segment: a transformer layer's attention and MLP segments together, the
    next layer apart. On DeepSeek-V3 training at 60% of its peak (a prototype's phases, five micro-batches deferred),
    each segment right before its own first reader ran 2443 ms, each layer together 2250 ms, each micro-batch's three
    layers together 2674 ms. ``ties`` orders the originals (``deferred_phases``)."""
    segment = nx.utils.UnionFind(copies)
    producer = graph.producer
    for name in copies:
        for t in graph.op(name).inputs:
            if producer.get(t) in copies:
                segment.union(name, producer[t])
    members: dict[str, list[str]] = {}
    pos = {name: i for i, name in enumerate(ties)}
    for name in sorted(copies, key=pos.__getitem__):
        members.setdefault(segment[name], []).append(name)
    made = {root: sum(graph.tensors[t].bytes for n in ms for t in graph.op(n).outputs) for root, ms in members.items()}
    cap = 2 * max(made.values())
    blocks: dict[str, list[str]] = {}
    head, size = None, 0
    for root, ms in members.items():  # by first original
        if head is None or size + made[root] > cap:
            head, size = ms[0], 0
            blocks[head] = []
        blocks[head] += ms
        size += made[root]
    return blocks


def _rerun(graph: Graph, phases: dict[str, int]) -> list[Op]:
    """The ops to re-run for the deferred phases (2 and 3), in the graph's order: those whose outputs the deferred
    ops read, made before (phases 0 and 1), and those their re-runs need, as long as every re-run reads only what is
    on HBM then anyway. That is: tensors no op makes (weights, inputs), outputs of other re-runs, and tensors the
    deferred ops read themselves (a layer's output whose input a collective wrote in place). A re-run that would
    hold anything else longer is not made, and what it would make is kept instead.

    A re-run may not make what an op writes in place (the copy would miss the write), nor what outlives the step
    (it is kept to the end anyway, and the plan mapped back dropped it after its last read before the re-run:
    found by fuzzing, an output of a 7-op graph), nor read what the first release writes in place after it (it
    would have to run before that, which holds its outputs across the first release)."""
    dag = graph.dag
    writers: dict[str, list[str]] = {}
    for op in graph.ops:
        for t in op.updates:
            writers.setdefault(t, []).append(op.name)

    def may_rerun(op: Op) -> bool:
        return (phases[op.name] <= 1 and op.recomputable and not any(t in writers for t in op.outputs)
                and not any(graph.tensors[t].persistent for t in op.outputs)
                and not any(phases[w] <= 1 and dag.has_edge(op.name, w) for t in op.inputs for w in writers.get(t, ())))

    producer = graph.producer
    deferred_reads = {t for op in graph.ops if phases[op.name] >= 2 for t in op.reads}
    chosen: set[str] = set()
    stack = [producer[t] for t in deferred_reads if t in producer]
    while stack:
        name = stack.pop()
        op = graph.op(name)
        if name in chosen or not may_rerun(op):
            continue
        chosen.add(name)
        stack.extend(producer[t] for t in op.inputs if t in producer)
    changed = True
    while changed:
        changed = False
        for name in sorted(chosen):
            if any(t in producer and producer[t] not in chosen and t not in deferred_reads
                   for t in graph.op(name).inputs):
                chosen.discard(name)
                changed = True
    # Only the re-runs whose outputs a deferred op or a kept re-run reads.
    needed: set[str] = set()
    stack = [producer[t] for t in deferred_reads if t in producer and producer[t] in chosen]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(producer[t] for t in graph.op(name).inputs if t in producer and producer[t] in chosen)
    return [op for op in graph.ops if op.name in needed]


def plan_back(graph: Graph, d: Deferral, planned: Planned) -> Plan:
    """``planned`` (a plan for ``d.graph`` and its timeline) as a plan for ``graph``: the copies' runs as recompute
    steps of their originals, the copies' tensors as the originals, and a Detach of each original after its last
    read before the re-run (or right after it is made, when only the re-run's readers read it). Static offsets
    carry over: an original's residencies, then its copy's, in the order they start."""
    plan = planned.plan
    last: dict[str, int] = {}
    for i, s in enumerate(plan.steps):
        if s.kind.runs_op:
            op = d.graph.op(s.target)
            for t in op.outputs:
                if f"{t}{COPY}" in d.original:
                    last.setdefault(t, i)
            for t in op.reads:
                if f"{t}{COPY}" in d.original:
                    last[t] = i
    drops: dict[int, list[str]] = {}
    for t, i in last.items():
        drops.setdefault(i, []).append(t)
    steps: list[Step] = []
    moved: list[int] = []  # each step's new index
    for i, s in enumerate(plan.steps):
        waits = tuple(moved[w] for w in s.waits)
        if s.kind.runs_op and s.target in d.copy_of:
            steps.append(Step(StepKind.RECOMPUTE, d.copy_of[s.target], s.stream, waits))
        else:
            steps.append(Step(s.kind, d.original.get(s.target, s.target), s.stream, waits))
        moved.append(len(steps) - 1)
        for t in sorted(drops.get(i, ())):
            steps.append(Step(StepKind.DETACH, t, s.stream, (len(steps) - 1,)))
    offsets: dict = {}
    if plan.offsets:
        count: dict[str, int] = {}
        for r in planned.timeline.residencies:
            count[r.name] = count.get(r.name, 0) + 1
        for name, off in plan.offsets.items():
            if name in d.original:
                continue
            copy = f"{name}{COPY}"
            if copy in plan.offsets:
                offsets[name] = _each(off, count.get(name, 0)) + _each(plan.offsets[copy], count.get(copy, 0))
            else:
                offsets[name] = off
    placement = {t: tier for t, tier in plan.placement.items() if t not in d.original}
    return replace(plan, graph_name=graph.name, steps=tuple(steps), offsets=offsets, placement=placement)


def _each(off: int | list[int], count: int) -> list[int]:
    """An offsets entry as one offset per residency (an int stands for every residency of its name)."""
    return list(off) if isinstance(off, list) else [off] * count


def plan_deferred(graph: Graph, hw: Hardware, eighths: int, answers: Answers,
                  plan_rewritten: Callable[[Context], Planned], time_limit_s: float = 10.0) -> Planned | None:
    """Greedy's plan in the order ``deferred-K`` (K = ``eighths``), mapped back onto ``graph`` and run by the
    executor there; None when the order does not apply. ``plan_rewritten(ctx)`` plans a Context of the rewritten
    graph (greedy at its settings, with its offsets or without). When the offsets carried over do not check out,
    they are searched again (``time_limit_s``), and the plan falls back to the caching allocator's model when none
    fit."""
    d = deferral(graph, eighths)
    if d is None:
        return None
    plan = plan_back(graph, d, plan_rewritten(Context(d.graph, hw, "graph", answers)))
    redone = sum(1 for s in plan.steps if s.kind is StepKind.RECOMPUTE)
    plan = replace(plan, options={**plan.options, "order": f"deferred-{eighths}"}, notes=plan.notes + (
        f"order deferred-{eighths}: the lower layers' backward of the last micro-batches after the top layers' "
        f"optimizer steps, {redone} re-runs making again what it holds (planner/planners/greedy_deferred.py)",))
    timeline = simulate(graph, hw, plan)
    if timeline.valid or not plan.offsets:
        return _checked(plan, timeline)
    bare = replace(plan, offsets={})
    timed = simulate(graph, hw, bare, allocator=False)
    if timed.violations:
        return _checked(plan, timeline)
    placed, _height = place_statically(graph, hw, bare, timed, time_limit_s=time_limit_s)
    return placed if placed is not None else _checked(bare, simulate(graph, hw, bare))


def _checked(plan: Plan, timeline: Timeline) -> Planned:
    """``plan`` marked infeasible, with the executor's first violations, when ``timeline`` has any."""
    if timeline.valid or plan.status != PlanStatus.FEASIBLE:
        return Planned(plan, timeline)
    shown = "; ".join(v.describe() for v in timeline.violations[:3])
    return Planned(replace(plan, status=PlanStatus.INFEASIBLE, notes=plan.notes + (
        f"the executor rejects the deferred order's plan on the original graph: {shown}",)), timeline)
