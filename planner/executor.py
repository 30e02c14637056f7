"""The timeline executor: runs a Plan on a model of the hardware and checks every rule of residency.

``simulate(graph, hardware, plan)`` is the one entry point. It is a discrete-event simulation of one compute
stream and one stream per link channel, with integer nanosecond times:

1. timing: each step starts when its stream (for a link, the channel that frees first) is free and every step
   it waits for has ended; the program order is the issue order on each stream;
2. residency: the steps' starts and ends are replayed in time order to track every tensor's HBM copy, its
   remote copies and their versions, and to list each violation with its step, op, tensor and time.

Semantics (also in docs/executor.md): an op's outputs and workspace are allocated at its start; its inputs and
in-place updates must be resident and usable on HBM for its whole duration; a Prefetch allocates its HBM copy at
its start and the copy is usable at its end; a Store needs the tensor resident for the whole transfer and leaves a
valid remote copy at its end, valid until the next in-place write; a Detach frees the HBM copy at once; a
Recompute re-runs an op that ran before (one with no in-place updates) and, like the op, needs its inputs resident
for its whole duration, as the versions the op first read; it allocates those of the op's outputs that are not on
HBM at its start, usable at its end, as the version the op first made; a tensor that does not outlive the step is
freed (HBM and remote copies) at the end of its last use (a recomputation reading or making it is a use). A tensor
starts the step on the tier the plan places it on; a free one that no op updates, placed on HBM, also has its master
copy on a remote tier (planner/placement.py: ``master_copies``).
At equal times, ends come before frees and frees before starts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from itertools import chain
from typing import NamedTuple

import numpy as np

from planner import executor_kernel
from planner.allocator import ALLOC, FREE, AllocatorReport, check_offsets, replay_caching_columns
from planner.cost import op_durations_ns, transfer_duration_ns
from planner.gc_pause import gc_paused
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import check_placement, master_copies, start_tiers
from planner.plan import COMPUTE, Plan, Step, StepKind
from planner.timeline import Metrics, Residencies, Residency, StepTimes, Timeline, Violation

# Event priorities at equal times.
_OP_END, _STORE_END, _PREFETCH_END, _FREE, _START = 0, 1, 2, 3, 4


def simulate(
    graph: Graph, hw: Hardware, plan: Plan, durations_ns: dict[str, int] | None = None, *, allocator: bool = True
) -> Timeline:
    """Run ``plan`` and return its Timeline: step times, residencies, metrics and every violation found.

    A plan is valid when ``timeline.violations`` is empty. A malformed program (unknown names, a wait on a later
    step, an op missing or run twice, an order against the data dependencies) is reported without running it.

    HBM addresses: a plan with ``offsets`` is checked against them (``offset_overlap``, ``offset_missing``, and
    ``capacity`` for an offset past the HBM size); a plan without is replayed through the caching allocator
    (planner/allocator.py), whose defragmentation events delay the compute stream (see ``_defrag_delays``).
    ``allocator=False`` skips the allocator model (planners use it to time a plan before assigning offsets).
    """
    with gc_paused():
        return _simulate(graph, hw, plan, durations_ns, allocator)


def _simulate(graph: Graph, hw: Hardware, plan: Plan, durations_ns: dict[str, int] | None, allocator: bool
              ) -> Timeline:
    problems = check_program(graph, hw, plan)
    if problems:
        empty = Metrics(0, 0, 0, {t.name: 0 for t in hw.tiers}, {ln.name: 0 for ln in hw.links}, 0, 0)
        return Timeline(steps=(), residencies=(), metrics=empty, violations=tuple(problems))
    durations = durations_ns if durations_ns is not None else op_durations_ns(graph, hw)
    start = start_tiers(graph, plan.placement)
    masters = master_copies(graph, hw, plan.placement)
    prog = _Program(graph, hw, plan.steps, durations, start)
    caching = allocator and not plan.offsets
    times = _time_steps(prog)
    replayed = _replay(prog, times, start, masters)
    residencies = None
    extra: dict = {"allocator": "none"}
    compactions: tuple[int, ...] = ()
    if plan.offsets:
        residencies = replayed.residencies()
        off_violations, height = check_offsets(residencies, plan.offsets, hw.hbm_bytes, HBM)
        replayed.violations.extend(off_violations)
        extra = {"allocator": "static", "offset_height_bytes": height}
    elif caching:
        log_times, ops, aids, steps = replayed.hbm_log_columns()
        report = replay_caching_columns(log_times, ops, aids, np.asarray(prog.alloc_bytes, dtype=np.int64)[aids], steps,
                                        prog.alloc_names, hw.hbm_bytes, hw.hbm_bandwidth_Bps)
        if report.defrags:
            # One re-run of the timing with the compaction delays; the allocator's counts are those of the replay
            # before the delays (the delays are assumed not to reorder allocations). See docs/planners.md.
            delays = _defrag_delays(report, prog, times.starts)
            times = _time_steps(prog, delays)
            replayed = _replay(prog, times, start, masters)
            compactions = tuple(d.step for d in report.defrags if d.step is not None)
        extra = {
            "allocator": "caching", "defrag_events": len(report.defrags), "defrag_ns": report.defrag_ns,
            "fragmentation_failures": report.fragmentation_failures, "offset_height_bytes": report.high_water_bytes,
        }
    if residencies is None:
        residencies = replayed.residencies()
    violations = replayed.violations
    sweeps = _sweeps(prog, replayed)
    violations += _capacity_violations(hw, prog, sweeps)
    metrics = replace(_metrics(hw, prog, times, sweeps), **extra)
    violations.sort(key=_violation_order)
    return Timeline(StepTimes(times.starts, times.ends, times.channels), residencies, metrics, tuple(violations),
                    compactions)


def with_static_offsets(graph: Graph, hw: Hardware, plan: Plan, timed: Timeline) -> Timeline:
    """``simulate(graph, hw, plan)`` for ``plan`` with static offsets, given ``timed``: the same program and
    placement run with ``allocator=False``.

    Static offsets add no delay, so the timing and residencies are ``timed``'s and only the offset checks are new;
    this saves a whole run (seconds on 30k-op graphs). When ``timed`` has violations, or the plan has no offsets, it
    simulates again instead (the order of mixed violations is the executor's).
    """
    if not plan.offsets or timed.violations or timed.metrics.allocator != "none":
        return simulate(graph, hw, plan)
    violations, height = check_offsets(timed.residencies, plan.offsets, hw.hbm_bytes, HBM)
    violations.sort(key=_violation_order)
    metrics = replace(timed.metrics, allocator="static", offset_height_bytes=height)
    return Timeline(timed.steps, timed.residencies, metrics, tuple(violations))


def _violation_order(v: Violation) -> tuple[int, int, str]:
    return (v.time_ns, v.step if v.step is not None else -1, v.kind)


def _defrag_delays(report: AllocatorReport, prog: _Program, starts: list[int]) -> dict[int, int]:
    """Step index -> delay added to its start: a compaction stops the device while it moves blocks.

    The step whose allocation triggered the compaction starts ``cost`` later; when that step is a transfer, so
    does the first compute step that starts at or after the event (the compute stream is stopped too).
    """
    stream = prog.stream
    compute = [(starts[i], i) for i in range(prog.n) if stream[i] < 0]
    delays: dict[int, int] = {}
    for d in report.defrags:
        if d.step is None or d.cost_ns <= 0:
            continue
        delays[d.step] = delays.get(d.step, 0) + d.cost_ns
        if stream[d.step] >= 0:
            j = bisect.bisect_left(compute, (d.time_ns, -1))
            if j < len(compute):
                c = compute[j][1]
                delays[c] = delays.get(c, 0) + d.cost_ns
    return delays


def check_program(graph: Graph, hw: Hardware, plan: Plan) -> list[Violation]:
    """Return the structural problems of the program (empty when it can be run)."""
    out: list[Violation] = []
    links = hw.links_by_name
    seen: dict[str, int] = {}
    op_index, tensors = graph.op_index, graph.tensors
    compute_kind, detach_kind, prefetch_kind = StepKind.COMPUTE, StepKind.DETACH, StepKind.PREFETCH
    recompute_kind = StepKind.RECOMPUTE

    def bad(i: int, msg: str, op: str | None = None, tensor: str | None = None) -> None:
        out.append(Violation("program", 0, msg, step=i, op=op, tensor=tensor))

    for i, s in enumerate(plan.steps):
        waits = s.waits
        if waits and (min(waits) < 0 or max(waits) >= i):
            bad(i, f"waits for step(s) {[w for w in waits if w < 0 or w >= i]} that do not come before it")
        kind, target, stream = s.kind, s.target, s.stream
        if kind is compute_kind:
            if target not in op_index:
                bad(i, f"unknown op {target!r}", op=target)
            elif target in seen:
                bad(i, f"op runs twice (also step {seen[target]})", op=target)
            else:
                seen[target] = i
            if stream != COMPUTE:
                bad(i, f"compute step on stream {stream!r}", op=target)
            continue
        if kind is recompute_kind:
            op = graph.ops[op_index[target]] if target in op_index else None
            if op is None:
                bad(i, f"recompute of unknown op {target!r}", op=target)
            elif target not in seen:
                bad(i, "recompute of an op that has not run yet", op=target)
            elif op.updates:
                bad(i, "recompute of an op that updates tensors in place (a second run would write them again)",
                    op=target)
            elif not op.recomputable:
                bad(i, "recompute of an op that is not recomputable (no outputs, no inputs where the graph does "
                    "not mark it recomputable, or the graph forbids it)", op=target)
            if stream != COMPUTE:
                bad(i, f"recompute step on stream {stream!r}", op=target)
            continue
        if target not in tensors:
            bad(i, f"unknown tensor {target!r}", tensor=target)
        if kind is detach_kind:
            if stream != COMPUTE and stream not in links:
                bad(i, f"unknown stream {stream!r}", tensor=target)
            continue
        link = links.get(stream)
        if link is None:
            bad(i, f"{kind.value} on unknown link {stream!r}", tensor=target)
        elif kind is prefetch_kind:
            if link.dst != HBM:
                bad(i, f"prefetch on link {link.name!r}, which does not lead to HBM", tensor=target)
        elif link.src != HBM:
            bad(i, f"store on link {link.name!r}, which does not leave HBM", tensor=target)
    for op in graph.ops:
        if op.name not in seen:
            out.append(Violation("program", 0, "op never runs", op=op.name))
    for name, problem in check_placement(graph, hw, plan.placement):
        out.append(Violation("program", 0, problem, tensor=name))
    for name in graph.free_tensors:
        if name not in plan.placement:
            out.append(Violation("program", 0, "the graph leaves its starting tier to the planner (home 'auto') "
                                 "and the plan's placement does not state it", tensor=name))
    if not out:
        src, dst = _dag_edges(graph)
        at = np.empty(len(graph.ops), dtype=np.int64)
        at[list(map(op_index.__getitem__, seen))] = list(seen.values())
        names = graph.ops
        for e in np.flatnonzero(at[src] > at[dst]).tolist():
            u, v = names[src[e]].name, names[dst[e]].name
            out.append(Violation("program", 0, f"runs before {u!r}, which it depends on", step=seen[v], op=v))
    return out


def _dag_edges(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The dependency DAG's edges as op indices (sources, targets), in ``dag.edges`` order; once per graph (kept in
    ``graph.home_free``): walking the networkx adjacency was half of ``check_program`` on a 20k-op graph."""
    got = graph.home_free.get("dag_edges")
    if got is None:
        index = graph.op_index
        pairs = [(index[u], index[v]) for u, succ in graph.dag.adj.items() for v in succ]
        got = graph.home_free["dag_edges"] = (np.array([u for u, _ in pairs], dtype=np.int64),
                                              np.array([v for _, v in pairs], dtype=np.int64))
    return got


# Step kinds, as small ints for the per-step lists.
_K_COMPUTE, _K_PREFETCH, _K_STORE, _K_DETACH, _K_RECOMPUTE = range(5)


class _Program:
    """A checked program with every name resolved to an index, once per run: the timing and the replay then work
    on lists of ints (per step, per tensor, per op) instead of looking names up per event.

    Allocations (``aid``) are numbered tensors first (the tensor's index), then one workspace per op
    (``n_tensors + op index``).
    """

    __slots__ = (
        "n", "kind", "target", "stream", "waits", "duration", "link_src", "link_dst", "channels",
        "tiers", "hbm", "names", "tindex", "tensor_kind", "nbytes", "persistent", "n_tensors",
        "op_names", "op_reads", "op_outputs", "op_updates", "op_workspace", "alloc_names", "alloc_kinds",
        "alloc_bytes", "kind_a", "target_a", "op_step", "read_flat", "read_op", "output_flat", "output_op",
        "recomputes", "graph_columns",
    )

    def __init__(self, graph: Graph, hw: Hardware, steps: tuple[Step, ...], durations: dict[str, int],
                 start: dict[str, str]) -> None:
        # The hardware's tiers, then any other a pinned tensor starts on (held, but not counted in the metrics).
        self.tiers = list(dict.fromkeys([t.name for t in hw.tiers] + list(start.values())))
        tier_index = {name: k for k, name in enumerate(self.tiers)}
        self.hbm = tier_index[HBM]
        links = hw.links
        self.channels = [ln.channels for ln in links]
        self.link_src = [tier_index[ln.src] for ln in links]
        self.link_dst = [tier_index[ln.dst] for ln in links]
        stream_index = {ln.name: k for k, ln in enumerate(links)}
        stream_index[COMPUTE] = -1

        self.graph_columns = cols = _graph_columns(graph)
        for name in _GRAPH_COLUMNS:
            setattr(self, name, cols[name])
        tindex, nbytes = self.tindex, self.nbytes
        ops = graph.ops

        # Column by column (C-level maps and comprehensions): a loop over the steps was most of this set-up.
        self.n = len(steps)
        self.waits = [s.waits for s in steps]
        kinds, targets, streams = [s.kind for s in steps], [s.target for s in steps], [s.stream for s in steps]
        code = {StepKind.COMPUTE: _K_COMPUTE, StepKind.PREFETCH: _K_PREFETCH, StepKind.STORE: _K_STORE,
                StepKind.DETACH: _K_DETACH, StepKind.RECOMPUTE: _K_RECOMPUTE}
        self.kind = kind = list(map(code.__getitem__, kinds))
        self.stream = stream = list(map(stream_index.__getitem__, streams))
        op_index = graph.op_index
        self.target = target = [op_index[name] if k == _K_COMPUTE or k == _K_RECOMPUTE else tindex[name]
                                for k, name in zip(kind, targets)]
        # Transfer durations by (bytes, link): sizes repeat a lot.
        moves = {(nbytes[t], sid) for k, t, sid in zip(kind, target, stream) if k == _K_PREFETCH or k == _K_STORE}
        transfer_ns = {key: transfer_duration_ns(key[0], links[key[1]]) for key in moves}
        self.duration = [durations[name] if k == _K_COMPUTE or k == _K_RECOMPUTE else 0 if k == _K_DETACH
                         else transfer_ns[nbytes[t], sid] for k, name, t, sid in zip(kind, targets, target, stream)]
        # The same as arrays, and every op's reads and outputs flattened (with their op), for numpy.
        self.kind_a = np.array(kind, dtype=np.int8)
        self.target_a = np.array(target, dtype=np.int64)
        self.op_step = np.zeros(len(ops), dtype=np.int64)  # op -> its compute step (each op runs once)
        computes = np.flatnonzero(self.kind_a == _K_COMPUTE)
        self.op_step[self.target_a[computes]] = computes
        # The recompute steps (usually none).
        self.recomputes = np.flatnonzero(self.kind_a == _K_RECOMPUTE)


# What ``_Program`` takes from the graph alone: the same for every plan of the graph (and for graphs that differ
# from it only in homes), so computed once per graph (``_graph_columns``): 0.5 s of each run on a 38.8k-op graph.
_GRAPH_COLUMNS = ("names", "tindex", "n_tensors", "tensor_kind", "nbytes", "persistent", "op_names", "op_reads",
                  "op_outputs", "op_updates", "op_workspace", "alloc_names", "alloc_kinds", "alloc_bytes", "read_flat",
                  "read_op", "output_flat", "output_op")


def _graph_columns(graph: Graph) -> dict:
    """The executor's per-tensor and per-op lists for ``graph`` (``_GRAPH_COLUMNS``), computed once per graph (kept
    in ``graph.home_free``). Callers must not change them."""
    got = graph.home_free.get("executor_columns")
    if got is not None:
        return got
    tensors = list(graph.tensors.values())
    names = list(graph.tensors)
    tindex = {name: k for k, name in enumerate(names)}
    tensor_kind = [t.kind.value for t in tensors]
    nbytes = [t.bytes for t in tensors]
    ops = graph.ops
    op_reads = [tuple([tindex[t] for t in op.reads]) for op in ops]
    op_outputs = [tuple([tindex[t] for t in op.outputs]) for op in ops]
    op_workspace = [op.workspace_bytes for op in ops]
    read_flat, read_op = _flatten(op_reads)
    output_flat, output_op = _flatten(op_outputs)
    got = {
        "names": names, "tindex": tindex, "n_tensors": len(names), "tensor_kind": tensor_kind, "nbytes": nbytes,
        "persistent": [t.persistent for t in tensors], "op_names": [op.name for op in ops], "op_reads": op_reads,
        "op_outputs": op_outputs, "op_updates": [tuple([tindex[t] for t in op.updates]) for op in ops],
        "op_workspace": op_workspace, "alloc_names": names + ["workspace:" + op.name for op in ops],
        "alloc_kinds": tensor_kind + ["workspace"] * len(ops), "alloc_bytes": nbytes + op_workspace,
        "read_flat": read_flat, "read_op": read_op, "output_flat": output_flat, "output_op": output_op,
    }
    graph.home_free["executor_columns"] = got
    return got


def _flatten(per_op: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(every entry, the op it belongs to) of per-op tuples of tensor indices."""
    counts = np.fromiter(map(len, per_op), dtype=np.int64, count=len(per_op))
    flat = np.fromiter(chain.from_iterable(per_op), dtype=np.int64, count=int(counts.sum()))
    return flat, np.repeat(np.arange(len(per_op), dtype=np.int64), counts)


@dataclass
class _Times:
    """Each step's start, end and channel (``StepTiming``'s fields as lists), and the compute stream's stall."""

    starts: list[int]
    ends: list[int]
    channels: list[int]
    stall_ns: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) as arrays."""
        return np.array(self.starts, dtype=np.int64), np.array(self.ends, dtype=np.int64)


def _time_steps(prog: _Program, delays: dict[int, int] | None = None) -> _Times:
    """Return each step's start, end and channel, and the compute stream's stall time.

    ``delays`` (step index -> ns) pushes a step's start later (a defragmentation); it is not counted as stall.
    """
    delays = delays or {}
    channel_free = [[0] * c for c in prog.channels]
    stream = prog.stream
    compute_free = 0
    stall = 0
    starts: list[int] = []
    ends: list[int] = []
    chans: list[int] = []
    end_of = ends.__getitem__
    for i, (waits, sid, dur) in enumerate(zip(prog.waits, stream, prog.duration)):
        ready = max(map(end_of, waits)) if waits else 0
        if sid < 0:
            start = compute_free if compute_free >= ready else ready
            if start > compute_free:
                # Waiting on another compute step is ordinary; waiting on a transfer is a stall.
                own = max(compute_free, max((ends[w] for w in waits if stream[w] < 0), default=0))
                stall += start - own
            if delays:
                start += delays.get(i, 0)
            compute_free = end = start + dur
            starts.append(start)
            ends.append(end)
            chans.append(0)
            continue
        free = channel_free[sid]
        # The channel that frees first; the lowest on a tie.
        ch = 0 if len(free) == 1 else free.index(min(free))
        start = free[ch] if free[ch] >= ready else ready
        if delays:
            start += delays.get(i, 0)
        free[ch] = end = start + dur
        starts.append(start)
        ends.append(end)
        chans.append(ch)
    return _Times(starts, ends, chans, stall)


# Replay events. Their priority at equal times (``_EVENT_PRIORITY``): ends, then frees, then starts.
# A recompute step ends as an op does (its op writes nothing in place): _E_OP_END.
_E_OP_START, _E_OP_END, _E_PREFETCH_START, _E_STORE_START, _E_STORE_END, _E_DETACH, _E_DIES, _E_REDO_START = range(8)
_EVENT_PRIORITY = np.array([_START, _OP_END, _START, _START, _STORE_END, _FREE, _FREE, _START], dtype=np.int8)
# A step's start event, by step kind.
_START_EVENT = np.array([_E_OP_START, _E_PREFETCH_START, _E_STORE_START, _E_DETACH, _E_REDO_START], dtype=np.int8)


@dataclass
class _Replayed:
    """What the replay found: the residencies in allocation order, as arrays (``residencies()`` makes the
    objects, only for the run the Timeline keeps; ``step``: the step whose start made each, -1 before the step),
    and the violations. ``hbm_log_columns()`` gives the HBM allocation log for the caching allocator."""

    prog: _Program
    tier: np.ndarray
    aid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    until_end: np.ndarray
    seq: np.ndarray
    step: np.ndarray
    violations: list[Violation]

    def residencies(self) -> Residencies:
        prog = self.prog
        return Residencies(prog.tiers, prog.alloc_names, prog.alloc_kinds, prog.alloc_bytes, self.tier, self.aid,
                           self.start, self.end, self.until_end, self.seq)

    def hbm_log_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The HBM allocations and frees in the order the replay made them, as arrays (times, ``ALLOC`` or ``FREE``,
        allocation ids into ``prog.alloc_names``, steps or -1): by time, frees before allocations at a time (the
        order of frees at one time does not change what is free after them), allocations in their sequence, and
        those of the tensors that start on HBM before everything. Made from the arrays after the replay: a record
        per event made in the replay's loop was a third of its time (0.4M on a 38.8k-op plan)."""
        prog = self.prog
        # A tensor that starts on HBM and is dropped at time 0 never holds memory in the replay's count (frees come
        # before starts at a time), nor in static offsets; the allocator must not place it beside the others either.
        hbm = (self.tier == prog.hbm) & ~((self.step < 0) & ~self.until_end & (self.end == self.start))
        seq, start, end, aid, step = self.seq[hbm], self.start[hbm], self.end[hbm], self.aid[hbm], self.step[hbm]
        freed = ~self.until_end[hbm]
        n, m = len(seq), int(freed.sum())
        # Priority at a time: -1 an allocation before the step, 0 a free, 1 an allocation.
        t = np.concatenate((start, end[freed]))
        prio = np.concatenate((np.where(step < 0, -1, 1), np.zeros(m, dtype=np.int64)))
        order = np.lexsort((np.concatenate((seq, seq[freed])), prio, t))
        op = np.concatenate((np.full(n, ALLOC, dtype=np.int64), np.full(m, FREE, dtype=np.int64)))[order]
        return (t[order].astype(np.int64), op, np.concatenate((aid, aid[freed]))[order].astype(np.int64),
                np.concatenate((step, np.full(m, -1, dtype=np.int64)))[order].astype(np.int64))


def _events(prog: _Program, arrays: tuple[np.ndarray, np.ndarray]) -> tuple[list[int], list[int], list[int]]:
    """``_event_arrays`` as lists."""
    t, code, idx = _event_arrays(prog, arrays)
    return t.tolist(), code.tolist(), idx.tolist()


def _event_arrays(prog: _Program, arrays: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, event codes, step index or n + tensor index), in time order: ends, then frees, then starts at
    equal times, then by step (the deaths of tensors after the steps, by tensor). A Prefetch's end changes
    nothing and is not an event.

    A tensor that does not outlive the step dies at the latest end of a compute step that touches it or a Store
    of it (if that end is after time 0).
    """
    n = prog.n
    kind, target = prog.kind_a, prog.target_a
    starts, ends = arrays
    step = np.arange(n, dtype=np.int64)
    has_end = (kind == _K_COMPUTE) | (kind == _K_STORE) | (kind == _K_RECOMPUTE)
    end_event = np.array([_E_OP_END, -1, _E_STORE_END, -1, _E_OP_END], dtype=np.int8)[kind[has_end]]

    last_use = np.zeros(prog.n_tensors, dtype=np.int64)
    op_ends = ends[prog.op_step]
    np.maximum.at(last_use, prog.read_flat, op_ends[prog.read_op])
    np.maximum.at(last_use, prog.output_flat, op_ends[prog.output_op])
    for i in prog.recomputes.tolist():
        o = int(target[i])
        for t in prog.op_reads[o] + prog.op_outputs[o]:
            last_use[t] = max(last_use[t], ends[i])
    is_store = kind == _K_STORE
    np.maximum.at(last_use, target[is_store], ends[is_store])
    dies = np.flatnonzero((last_use > 0) & ~np.array(prog.persistent, dtype=bool))

    t = np.concatenate((starts, ends[has_end], last_use[dies]))
    code = np.concatenate((_START_EVENT[kind], end_event, np.full(len(dies), _E_DIES, dtype=np.int8)))
    idx = np.concatenate((step, step[has_end], n + dies))
    order = np.lexsort((idx, _EVENT_PRIORITY[code], t))
    return t[order], code[order].astype(np.int64), idx[order]


def _last_read_starts(prog: _Program, starts: np.ndarray) -> np.ndarray:
    """Per tensor, the latest start of a compute step that reads it (-1: none): a copy dropped at ``now`` is
    still needed when that is at or after ``now``."""
    out = np.full(prog.n_tensors, -1, dtype=np.int64)
    np.maximum.at(out, prog.read_flat, starts[prog.op_step][prog.read_op])
    for i in prog.recomputes.tolist():
        for t in prog.op_reads[prog.target[i]]:
            out[t] = max(out[t], starts[i])
    return out


def _remade_starts(prog: _Program, starts: np.ndarray) -> dict[int, int]:
    """Tensor -> the latest start of a recompute step that makes it: a copy dropped before then is made again,
    so dropping it loses nothing (a read before the recomputation is still caught as not resident)."""
    out: dict[int, int] = {}
    for i in prog.recomputes.tolist():
        for t in prog.op_outputs[prog.target[i]]:
            out[t] = max(out.get(t, -1), int(starts[i]))
    return out


def _replay(prog: _Program, times: _Times, start: dict[str, str], masters: dict[str, str]) -> _Replayed:
    """Replay the step starts and ends in time order, tracking every tensor's HBM copy (resident, usable from,
    pinned by running ops and stores), its remote copies and their versions, and every allocation. The tensors
    start on their ``start`` tiers, and those of ``masters`` (planner/placement.py) on HBM with a copy on theirs.

    One loop with the handlers inline and the state in per-tensor lists: this is the executor's hot loop (a
    call per event and an object per tensor were most of its time on 30k-op graphs). Long programs go to the
    compiled loop first (``_replay_compiled``), which answers when they break no rule.
    """
    arrays = times.arrays()
    last_read = _last_read_starts(prog, arrays[0])
    if prog.n > COMPILED_MIN_STEPS:
        got = _replay_compiled(prog, times, start, masters, arrays, last_read)
        if got is not None:
            return got
    names, n_tensors = prog.names, prog.n_tensors
    alloc_names = prog.alloc_names
    target, stream, ends = prog.target, prog.stream, times.ends
    link_src, link_dst = prog.link_src, prog.link_dst
    op_names, op_reads, op_outputs, op_updates = prog.op_names, prog.op_reads, prog.op_outputs, prog.op_updates
    op_workspace, persistent = prog.op_workspace, prog.persistent
    hbm, n = prog.hbm, prog.n
    tier_index = {name: k for k, name in enumerate(prog.tiers)}

    resident = [False] * n_tensors
    usable = [0] * n_tensors  # when the HBM copy can be read (a prefetch's or the producing op's end)
    pins = [0] * n_tensors  # running ops and stores that need the HBM copy
    version = [0] * n_tensors  # in-place writes so far
    dead = [False] * n_tensors
    remote: dict[int, dict[int, int]] = {}  # tensor -> {tier: version of the completed copy there}
    store_version: dict[int, int] = {}  # store step -> version it copies (-1: it copies nothing)
    last_read = last_read.tolist()
    remade = _remade_starts(prog, arrays[0])
    # The versions each recomputed op read when it first ran: a recomputation must read the same.
    redone = {prog.target[i] for i in prog.recomputes.tolist()}
    first_read: dict[int, tuple[int, ...]] = {}
    # Allocations, by sequence number: (tier, aid, start) and the end (-1 while open); per tier, aid -> the
    # sequence number of its open allocation (-1: none).
    allocs: list[tuple[int, int, int]] = []
    alloc_end: list[int] = []
    opened = [[-1] * len(alloc_names) for _ in prog.tiers]
    hbm_open = opened[hbm]
    violations: list[Violation] = []
    violate = violations.append

    for name, tier in start.items():
        t, k = prog.tindex[name], tier_index[tier]
        if k == hbm:
            resident[t] = True
        else:
            remote.setdefault(t, {})[k] = 0
        opened[k][t] = len(allocs)
        allocs.append((k, t, 0, -1))
        alloc_end.append(-1)
    for name, tier in masters.items():
        t, k = prog.tindex[name], tier_index[tier]
        remote.setdefault(t, {})[k] = 0
        opened[k][t] = len(allocs)
        allocs.append((k, t, 0, -1))
        alloc_end.append(-1)

    ev_times, ev_codes, ev_idx = _events(prog, arrays)
    for now, code, i in zip(ev_times, ev_codes, ev_idx):
        if code == _E_DETACH:
            t = target[i]
            if not resident[t]:
                violate(Violation("detach_not_resident", now, "detach of a tensor not on HBM", i, None, names[t]))
                continue
            if pins[t] > 0:
                violate(Violation("not_resident", now, "detach while an op or a store still uses the HBM copy", i,
                                  None, names[t]))
            if (persistent[t] or last_read[t] >= now) and remade.get(t, -1) < now:
                copies = remote.get(t)
                if not copies or version[t] not in copies.values():
                    stale = " (remote copies are stale)" if copies else ""
                    violate(Violation("data_loss", now, "detach drops the only valid copy of a tensor still "
                                      f"needed{stale}", i, None, names[t]))
            resident[t] = False
            alloc_end[hbm_open[t]] = now
            hbm_open[t] = -1
        elif code == _E_STORE_START:
            t = target[i]
            dst = link_dst[stream[i]]
            if not resident[t] or usable[t] > now:
                violate(Violation("store_not_resident", now, f"store to {prog.tiers[dst]!r} of a tensor not on HBM",
                                  i, None, names[t]))
                store_version[i] = -1
            else:
                pins[t] += 1
                store_version[i] = version[t]
            dst_open = opened[dst]
            if dst_open[t] < 0 and not dead[t]:
                dst_open[t] = len(allocs)
                allocs.append((dst, t, now, i))
                alloc_end.append(-1)
        elif code == _E_STORE_END:
            v = store_version[i]
            if v >= 0:
                t = target[i]
                pins[t] -= 1
                remote.setdefault(t, {})[link_dst[stream[i]]] = v
        elif code == _E_DIES:
            t = i - n
            dead[t] = True
            for tier_open in opened:
                seq = tier_open[t]
                if seq >= 0:
                    alloc_end[seq] = now
                    tier_open[t] = -1
            resident[t] = False
        elif code == _E_PREFETCH_START:
            t = target[i]
            src = link_src[stream[i]]
            copy = remote[t].get(src) if t in remote else None
            if copy is None:
                violate(Violation("no_remote_copy", now, f"prefetch from {prog.tiers[src]!r}, which holds no copy",
                                  i, None, names[t]))
            elif copy != version[t]:
                violate(Violation("no_remote_copy", now, f"prefetch from {prog.tiers[src]!r}, whose copy is stale",
                                  i, None, names[t]))
            if resident[t]:
                violate(Violation("already_resident", now, "prefetch of a tensor already on HBM", i, None, names[t]))
                continue
            # Usable at its (known) end: the end needs no event.
            resident[t] = True
            usable[t] = ends[i]
            hbm_open[t] = len(allocs)
            allocs.append((hbm, t, now, i))
            alloc_end.append(-1)
        elif code == _E_OP_START:
            o = target[i]
            for t in op_reads[o]:
                if not resident[t]:
                    violate(Violation("not_resident", now, f"reads {names[t]!r}, which is not on HBM", i,
                                      op_names[o], names[t]))
                elif usable[t] > now:
                    violate(Violation("not_resident", now, f"reads {names[t]!r} before its prefetch ends at "
                                      f"{usable[t] / 1000:.3f}us", i, op_names[o], names[t]))
                pins[t] += 1
            if redone and o in redone:
                first_read[o] = tuple([version[t] for t in op_reads[o]])
            end = ends[i]
            for t in op_outputs[o]:
                resident[t] = True
                usable[t] = end
                hbm_open[t] = len(allocs)
                allocs.append((hbm, t, now, i))
                alloc_end.append(-1)
            if op_workspace[o]:
                w = n_tensors + o
                hbm_open[w] = len(allocs)
                allocs.append((hbm, w, now, i))
                alloc_end.append(-1)
        elif code == _E_REDO_START:
            o = target[i]
            for t, v in zip(op_reads[o], first_read[o]):
                if not resident[t]:
                    violate(Violation("not_resident", now, f"recompute reads {names[t]!r}, which is not on HBM", i,
                                      op_names[o], names[t]))
                elif usable[t] > now:
                    violate(Violation("not_resident", now, f"recompute reads {names[t]!r} before its prefetch ends "
                                      f"at {usable[t] / 1000:.3f}us", i, op_names[o], names[t]))
                elif version[t] != v:
                    violate(Violation("stale_recompute", now, f"recompute reads {names[t]!r} after an in-place "
                                      "update the op did not see: it would make different outputs", i, op_names[o],
                                      names[t]))
                pins[t] += 1
            end = ends[i]
            for t in op_outputs[o]:
                if resident[t]:
                    continue
                if version[t]:
                    violate(Violation("stale_recompute", now, f"recompute makes {names[t]!r}, which was updated in "
                                      "place since: the copy would be an old version", i, op_names[o], names[t]))
                resident[t] = True
                usable[t] = end
                hbm_open[t] = len(allocs)
                allocs.append((hbm, t, now, i))
                alloc_end.append(-1)
            if op_workspace[o]:
                w = n_tensors + o
                hbm_open[w] = len(allocs)
                allocs.append((hbm, w, now, i))
                alloc_end.append(-1)
        else:  # _E_OP_END (of an op or a recompute step)
            o = target[i]
            for t in op_reads[o]:
                pins[t] -= 1
            for t in op_updates[o]:
                version[t] += 1
            if op_workspace[o]:
                w = n_tensors + o
                alloc_end[hbm_open[w]] = now
                hbm_open[w] = -1

    makespan = max(ends, default=0)
    violations += _not_restored(prog, start, makespan, resident, version, lambda t: remote.get(t, {}))
    raw = np.fromiter(chain.from_iterable(allocs), dtype=np.int64, count=4 * len(allocs)).reshape(-1, 4)
    return _replayed(prog, raw, np.array(alloc_end, dtype=np.int64), opened, makespan, violations)


def _not_restored(prog: _Program, start: dict[str, str], makespan: int, resident, version, copies_of
                  ) -> list[Violation]:
    """Steady state: each tensor that outlives the step is back on its starting tier, latest version (``copies_of``:
    tensor -> {tier: version of its completed copy there})."""
    out: list[Violation] = []
    tier_index = {name: k for k, name in enumerate(prog.tiers)}
    persistent = prog.persistent
    for name, tier in start.items():
        t = prog.tindex[name]
        if not persistent[t]:
            continue
        if tier == HBM:
            if not resident[t]:
                out.append(Violation("placement_not_restored", makespan, "started the step on hbm but is not "
                                     "resident when it ends (the next step would find it missing)", None, None, name))
            continue
        copies = copies_of(t)
        k = tier_index[tier]
        if copies.get(k) != version[t]:
            what = "holds no copy" if k not in copies else "holds a stale copy (updated since)"
            out.append(Violation("placement_not_restored", makespan, f"started the step on {tier} but {tier} {what} "
                                 "when the step ends: store it back after its last update", None, None, name))
    return out


def _replayed(prog: _Program, raw: np.ndarray, end: np.ndarray, opened, makespan: int,
              violations: list[Violation]) -> _Replayed:
    """The ``_Replayed`` of the allocations made (``raw``: rows of tier, allocation id, start, step; ``end``: -1
    while open; ``opened``: per tier, allocation id -> the open one or -1)."""
    # What is still open is held until the end. An allocation over one still open (a second allocation of a copy
    # a broken plan made twice) replaced it: the replaced one was never freed and is no residency.
    held = np.zeros(len(raw), dtype=bool)
    for tier_open in opened:
        seqs = np.asarray(tier_open, dtype=np.int64)
        held[seqs[seqs >= 0]] = True
    end[held] = makespan
    keep = np.flatnonzero(held | (end >= 0))
    return _Replayed(prog, raw[keep, 0], raw[keep, 1], raw[keep, 2], end[keep], held[keep], keep, raw[keep, 3],
                     violations)


# Programs of more steps than this replay in the compiled loop first (``executor_kernel``: the same state, no
# Violation objects; a program it finds a violation in replays again in Python). Once compiled (once per install)
# the loop costs a load of about 0.1 s per process, and a tenth of the Python loop a run.
COMPILED_MIN_STEPS = 1000


def _kernel_columns(prog: _Program) -> dict:
    """The graph's per-op tensor lists as CSR arrays (pointers, flat entries), and its per-tensor and per-op flags
    as arrays, for the compiled replay; once per graph (kept beside ``_graph_columns``)."""
    cols = prog.graph_columns
    got = cols.get("kernel")
    if got is None:
        def csr(per_op):
            flat, op = _flatten(per_op)
            ptr = np.zeros(len(per_op) + 1, dtype=np.int64)
            np.cumsum(np.bincount(op, minlength=len(per_op)), out=ptr[1:])
            return ptr, flat
        got = cols["kernel"] = {
            "reads": csr(prog.op_reads), "outputs": csr(prog.op_outputs), "updates": csr(prog.op_updates),
            "workspace": np.array(prog.op_workspace, dtype=np.int64),
            "persistent": np.array(prog.persistent, dtype=np.bool_),
        }
    return got


def _replay_compiled(prog: _Program, times: _Times, start: dict[str, str], masters: dict[str, str],
                     arrays: tuple[np.ndarray, np.ndarray], last_read: np.ndarray) -> _Replayed | None:
    """``_replay``'s result from the compiled loop, or None when the program breaks a rule (the Python replay then
    words each violation)."""
    k = _kernel_columns(prog)
    n_tiers, n_ids, n_tensors, hbm = len(prog.tiers), len(prog.alloc_names), prog.n_tensors, prog.hbm
    tier_index = {name: j for j, name in enumerate(prog.tiers)}
    resident = np.zeros(n_tensors, dtype=np.bool_)
    remote_v = np.full((n_tensors, n_tiers), -1, dtype=np.int64)
    opened = np.full((n_tiers, n_ids), -1, dtype=np.int64)
    # At most: the starting copies, every output and workspace of every op, a copy per transfer step.
    cap = len(start) + len(masters) + len(prog.output_flat) + len(prog.op_names) + prog.n
    a_tier, a_aid, a_start, a_step = (np.zeros(cap, dtype=np.int64) for _ in range(4))
    a_end = np.full(cap, -1, dtype=np.int64)
    na = 0
    for name, tier in start.items():
        t, j = prog.tindex[name], tier_index[tier]
        if j == hbm:
            resident[t] = True
        else:
            remote_v[t, j] = 0
        opened[j, t] = na
        a_tier[na], a_aid[na] = j, t
        a_step[na] = -1
        na += 1
    for name, tier in masters.items():
        t, j = prog.tindex[name], tier_index[tier]
        remote_v[t, j] = 0
        opened[j, t] = na
        a_tier[na], a_aid[na] = j, t
        a_step[na] = -1
        na += 1
    version = np.zeros(n_tensors, dtype=np.int64)
    remade = np.full(n_tensors, -1, dtype=np.int64)
    for t, at in _remade_starts(prog, arrays[0]).items():
        remade[t] = at
    redone = np.zeros(len(prog.op_names), dtype=np.bool_)
    redone[prog.target_a[prog.recomputes]] = True
    ev_t, ev_code, ev_idx = _event_arrays(prog, arrays)
    ok, na = executor_kernel.replay(
        ev_t, ev_code, ev_idx, prog.target_a, np.array(prog.stream, dtype=np.int64), arrays[1],
        np.array(prog.link_src, dtype=np.int64), np.array(prog.link_dst, dtype=np.int64), *k["reads"], *k["outputs"],
        *k["updates"], k["workspace"], k["persistent"], last_read, remade, redone, prog.n, n_tensors, hbm,
        resident, remote_v, opened, a_tier, a_aid, a_start, a_step, a_end, na, version)
    if not ok:
        return None
    makespan = int(arrays[1].max()) if prog.n else 0

    def copies_of(t: int) -> dict[int, int]:
        return {j: int(v) for j, v in enumerate(remote_v[t].tolist()) if v >= 0}

    violations = _not_restored(prog, start, makespan, resident, version, copies_of)
    raw = np.stack((a_tier[:na], a_aid[:na], a_start[:na], a_step[:na]), axis=1)
    return _replayed(prog, raw, a_end[:na].copy(), opened, makespan, violations)


class _Sweep(NamedTuple):
    """A tier's allocation deltas in time order, frees before allocations at equal times (then by sequence)."""

    times: np.ndarray
    deltas: np.ndarray
    aids: np.ndarray


def _sweeps(prog: _Program, r: _Replayed) -> dict[int, _Sweep]:
    """``_sweep`` for every tier at once, from the replay's arrays (tier index -> its sweep)."""
    counted = (r.end > r.start) | r.until_end
    nbytes = np.array(prog.alloc_bytes, dtype=np.int64)[r.aid]
    seq = r.seq
    freed = counted & ~r.until_end
    t = np.concatenate((r.start[counted], r.end[freed]))
    o = np.concatenate((np.ones(int(counted.sum()), dtype=np.int8), np.zeros(int(freed.sum()), dtype=np.int8)))
    s = np.concatenate((seq[counted], seq[freed]))
    d = np.concatenate((nbytes[counted], -nbytes[freed]))
    a = np.concatenate((r.aid[counted], r.aid[freed]))
    tier = np.concatenate((r.tier[counted], r.tier[freed]))
    order = np.lexsort((s, o, t, tier))
    t, d, a, tier = t[order], d[order], a[order], tier[order]
    out = {}
    bounds = np.searchsorted(tier, np.arange(len(prog.tiers) + 1))
    for k in range(len(prog.tiers)):
        lo, hi = bounds[k], bounds[k + 1]
        if hi > lo:
            out[k] = _Sweep(t[lo:hi], d[lo:hi], a[lo:hi])
    return out


def _capacity_violations(hw: Hardware, prog: _Program, sweeps: dict[int, _Sweep]) -> list[Violation]:
    """One violation each time a tier goes over its capacity (frees at a time count before allocations)."""
    out: list[Violation] = []
    for k, tier in enumerate(hw.tiers):
        sweep = sweeps.get(k)
        if sweep is None:
            continue
        cur = np.cumsum(sweep.deltas)
        over = cur > tier.capacity_bytes
        # The first delta of each run over the capacity.
        first = np.flatnonzero(over & ~np.concatenate(([False], over[:-1])))
        for j in first.tolist():
            name = prog.alloc_names[int(sweep.aids[j])]
            ws = name.startswith("workspace:")
            out.append(Violation(
                "capacity", int(sweep.times[j]),
                f"{tier.name} holds {int(cur[j])} B, over its capacity of {tier.capacity_bytes} B",
                tensor=None if ws else name, op=name[len("workspace:"):] if ws else None,
            ))
    return out


def _sweep(residencies: list[Residency], tier: str) -> list[tuple[int, int, str]]:
    """Allocation deltas on ``tier`` in time order, frees before allocations at equal times."""
    ev = []
    for r in residencies:
        if r.tier == tier and (r.end_ns > r.start_ns or r.until_end):
            ev.append((r.start_ns, 1, r.seq, r.bytes, r.name))
            if not r.until_end:
                ev.append((r.end_ns, 0, r.seq, -r.bytes, r.name))
    ev.sort()
    return [(t, d, n) for t, _o, _s, d, n in ev]


def occupancy(residencies: list[Residency] | tuple[Residency, ...], tier: str) -> list[tuple[int, int]]:
    """Return (time_ns, bytes on ``tier`` from then on), one point per change."""
    out: list[tuple[int, int]] = []
    cur = 0
    for time, delta, _ in _sweep(list(residencies), tier):
        cur += delta
        if out and out[-1][0] == time:
            out[-1] = (time, cur)
        else:
            out.append((time, cur))
    return out


def _metrics(hw: Hardware, prog: _Program, times: _Times, sweeps: dict[int, _Sweep]) -> Metrics:
    makespan = max(times.ends, default=0)
    kind = prog.kind_a
    starts, ends = times.arrays()
    is_compute = (kind == _K_COMPUTE) | (kind == _K_RECOMPUTE)
    # Compute and recompute steps run one after another on one stream: sorted, disjoint intervals.
    c_starts, c_ends = starts[is_compute], ends[is_compute]
    compute_ns = int((c_ends - c_starts).sum())
    redo = prog.recomputes
    recompute_ns = int((ends[redo] - starts[redo]).sum())
    peak = {}
    for k, tier in enumerate(hw.tiers):
        sweep = sweeps.get(k)
        peak[tier.name] = max(0, int(np.cumsum(sweep.deltas).max())) if sweep is not None else 0
    is_transfer = (kind == _K_PREFETCH) | (kind == _K_STORE)
    a, b = starts[is_transfer], ends[is_transfer]
    link = np.array(prog.stream, dtype=np.int64)[is_transfer]
    nbytes = np.array(prog.nbytes, dtype=np.int64)[prog.target_a[is_transfer]]
    moved_by_link = np.zeros(len(hw.links), dtype=np.int64)
    np.add.at(moved_by_link, link, nbytes)
    moved = {ln.name: int(m) for ln, m in zip(hw.links, moved_by_link.tolist())}
    transfer_ns = int((b - a).sum())
    hidden = int(_overlaps(c_starts, c_ends, a, b).sum())
    return Metrics(makespan, compute_ns, times.stall_ns, peak, moved, transfer_ns, hidden, recompute_ns=recompute_ns)


def _overlaps(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per interval [a, b), the length of it covered by the sorted disjoint intervals [starts, ends)."""
    out = np.zeros(len(a), dtype=np.int64)
    if not len(starts):
        return out
    prefix = np.concatenate(([0], np.cumsum(ends - starts)))
    lo = np.maximum(0, np.searchsorted(starts, a, side="right") - 1)
    hi = np.searchsorted(starts, b, side="left")
    ok = (b > a) & (hi > lo)
    lo, hi, a, b = lo[ok], hi[ok], a[ok], b[ok]
    total = prefix[hi] - prefix[lo]
    # Trim the parts of the first and last intervals outside [a, b).
    total -= np.maximum(0, np.minimum(ends[lo], a) - starts[lo])
    total -= np.maximum(0, ends[hi - 1] - np.maximum(starts[hi - 1], b))
    out[ok] = np.maximum(0, total)
    return out


__all__ = ["simulate", "with_static_offsets", "check_program", "occupancy"]
