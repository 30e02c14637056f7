"""Which tensors move, and why: a per-tensor view of an executed plan.

Totals (bytes moved, compute stall) say how much a plan moves; this module says what. For every tensor that
moves (the plan has a Prefetch, Store or Detach of it, a recomputation makes it again, or it starts the step off
HBM) it lists each interval the tensor spends off HBM: the op after which it leaves, the op before which it
returns, the tier that holds it meanwhile (none when it is dropped and recomputed), the HBM bytes x time the
interval frees, the compute stall its transfers cause and the compute time spent recomputing it. It also lists what
is on HBM at the HBM peak, as torch's memory snapshot viewer does, and totals per tensor kind and per layer.

Everything is derived from the Timeline (residencies and step timings) and the Plan's steps: the executor's
numbers, not a second model of them. Nothing here prints; planner/summary.py and planner/report/writer.py format.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from planner.graph import Graph
from planner.hardware import HBM
from planner.placement import start_tiers
from planner.plan import COMPUTE, Plan, StepKind
from planner.timeline import Residency, Timeline, peak_of_intervals

# A layer id in a generated tensor or op name: "p0.L3.q_a_proj", "L31.wo", "mb0.d.L31.h2". "L" must be a whole
# dot-separated part so that names such as "MLP12" or "w_L2norm" do not count as layers.
_LAYER_RE = re.compile(r"(?:^|[./:_-])(L\d+)(?=[./_-]|$)")
NO_LAYER = "-"


def layer_of(name: str) -> str:
    """Return the layer id (``"L3"``) in a tensor or op name, or ``"-"`` when the name has none."""
    m = _LAYER_RE.search(name)
    return m.group(1) if m else NO_LAYER


def _layer_key(layer: str) -> tuple[int, int]:
    # Layers sort by number (L2 before L10); names without a layer last.
    return (1, 0) if layer == NO_LAYER else (0, int(layer[1:]))


@dataclass(frozen=True)
class OffloadInterval:
    """One stretch of time a tensor has no copy on HBM.

    ``leave_ns`` is when its HBM copy is dropped (None: it starts the step off HBM); ``return_ns`` when its HBM
    copy is allocated again, at the start of the Prefetch that brings it back (None: not within the step).
    ``wraps``: the tensor leaves after its last use and returns for its first use of the next step (steps repeat,
    so this is one interval, across the step boundary; ``return_ns`` is then a time in the next step).
    ``duration_ns`` is the length off HBM; ``stall_ns`` the compute stall caused by the transfers that end it (the
    Prefetch) or start it (the Store a Detach waits for). ``next_step``: ``returns_before`` is an op of the next
    step (the interval wraps, or the tensor comes back after its last use to be on HBM when the step ends).
    ``recomputed_by``: the op whose recomputation ends the interval (the tensor was dropped with no copy and made
    again; ``tier`` is then None).
    """

    leave_ns: int | None
    return_ns: int | None
    duration_ns: int
    leaves_after: str | None  # the last op before leave_ns that reads, updates or produces the tensor
    returns_before: str | None  # the first op from return_ns on that reads or updates it
    tier: str | None  # the remote tier holding its copy meanwhile (None: no copy, e.g. never needed again)
    wraps: bool = False
    stall_ns: int = 0
    next_step: bool = False
    recomputed_by: str | None = None

    def freed_byte_ns(self, nbytes: int) -> int:
        """HBM bytes x nanoseconds this interval frees for a tensor of ``nbytes``."""
        return nbytes * self.duration_ns

    def to_dict(self) -> dict:
        return {
            "leave_us": None if self.leave_ns is None else self.leave_ns / 1000,
            "return_us": None if self.return_ns is None else self.return_ns / 1000,
            "off_hbm_us": self.duration_ns / 1000,
            "leaves_after": self.leaves_after,
            "returns_before": self.returns_before,
            "tier": self.tier,
            "wraps": self.wraps,
            "returns_next_step": self.next_step,
            "stall_us": self.stall_ns / 1000,
            "recomputed_by": self.recomputed_by,
        }


@dataclass(frozen=True)
class TensorMove:
    """A tensor that moves: its off-HBM intervals in time order, its transfers, and the stall they cause.

    ``moved_bytes`` is link name -> bytes its Prefetch and Store steps carry. ``stall_ns`` is all compute stall
    attributed to its transfers, including any that no interval claims (a Store of a tensor that stays on HBM).
    ``recomputes`` counts the recompute steps that make it again, ``recompute_ns`` their compute time (a step that
    makes several tensors again is split evenly among them, so the tensors add up to ``Metrics.recompute_ns``).
    """

    name: str
    kind: str
    bytes: int
    layer: str
    start_tier: str | None  # where it starts the step (None: an op produces it)
    intervals: tuple[OffloadInterval, ...]
    moved_bytes: dict[str, int] = field(default_factory=dict)
    prefetches: int = 0
    stores: int = 0
    detaches: int = 0
    stall_ns: int = 0
    recomputes: int = 0
    recompute_ns: int = 0

    @property
    def off_hbm_ns(self) -> int:
        """Total time off HBM, over all intervals."""
        return sum(iv.duration_ns for iv in self.intervals)

    @property
    def freed_byte_ns(self) -> int:
        """HBM bytes x nanoseconds freed over all intervals: what keeping it on HBM instead would cost."""
        return self.bytes * self.off_hbm_ns

    @property
    def largest(self) -> OffloadInterval | None:
        """The longest interval (the first of equals), or None when the tensor never leaves HBM."""
        return max(self.intervals, key=lambda iv: iv.duration_ns, default=None)

    @property
    def tiers(self) -> tuple[str, ...]:
        """The remote tiers its intervals use, in order of first use."""
        return tuple(dict.fromkeys(iv.tier for iv in self.intervals if iv.tier))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "bytes": self.bytes,
            "layer": self.layer,
            "start_tier": self.start_tier,
            "tiers": list(self.tiers),
            "off_hbm_us": self.off_hbm_ns / 1000,
            # Bytes x seconds: a tensor of 1 GB off HBM for 10 ms frees 0.01 GB·s.
            "freed_byte_s": self.freed_byte_ns / 1e9,
            "stall_us": self.stall_ns / 1000,
            "moved_bytes": dict(sorted(self.moved_bytes.items())),
            "prefetches": self.prefetches,
            "stores": self.stores,
            "detaches": self.detaches,
            "recomputes": self.recomputes,
            "recompute_us": self.recompute_ns / 1000,
            "intervals": [iv.to_dict() for iv in self.intervals],
        }


@dataclass(frozen=True)
class PeakResident:
    """An allocation on HBM at the HBM peak: a tensor, or an op's workspace (``workspace:OP``)."""

    name: str
    kind: str
    bytes: int
    layer: str
    since_ns: int  # when this allocation was made
    share: float  # of the peak

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "bytes": self.bytes, "layer": self.layer,
                "since_us": self.since_ns / 1000, "share_of_peak": round(self.share, 6)}


@dataclass(frozen=True)
class HbmPeak:
    """The HBM peak: when it is first reached, its bytes, and what is resident then (largest first).

    ``residents`` may be cut to the largest few; ``count`` is how many allocations there are in all.
    """

    time_ns: int
    bytes: int
    residents: tuple[PeakResident, ...]
    count: int

    def to_dict(self) -> dict:
        return {"time_us": self.time_ns / 1000, "bytes": self.bytes, "count": self.count,
                "residents": [r.to_dict() for r in self.residents]}


@dataclass(frozen=True)
class MoveTotals:
    """Moving tensors of one group (a kind or a layer) added up."""

    key: str
    tensors: int
    bytes: int
    intervals: int
    moved_bytes: int  # over all links
    freed_byte_ns: int
    stall_ns: int
    recompute_ns: int = 0

    def to_dict(self) -> dict:
        return {"key": self.key, "tensors": self.tensors, "bytes": self.bytes, "intervals": self.intervals,
                "moved_bytes": self.moved_bytes, "freed_byte_s": self.freed_byte_ns / 1e9,
                "stall_us": self.stall_ns / 1000, "recompute_us": self.recompute_ns / 1000}


@dataclass(frozen=True)
class TensorView:
    """Everything this module derives for one plan: moves (all, most HBM freed first), the HBM peak, totals."""

    moves: tuple[TensorMove, ...]
    peak: HbmPeak
    by_kind: tuple[MoveTotals, ...]
    by_layer: tuple[MoveTotals, ...]
    makespan_ns: int

    @property
    def recomputes(self) -> bool:
        """Whether the plan makes some tensor again by recomputation (the tables then show a recompute column)."""
        return any(m.recomputes for m in self.moves)

    def to_dict(self) -> dict:
        return {
            "moving_tensors": len(self.moves),
            "freed_byte_s": sum(m.freed_byte_ns for m in self.moves) / 1e9,
            "moves": [m.to_dict() for m in self.moves],
            "peak": self.peak.to_dict(),
            "by_kind": [t.to_dict() for t in self.by_kind],
            "by_layer": [t.to_dict() for t in self.by_layer],
        }


# -- moves ------------------------------------------------------------------------------------------------------


def _counted(r: Residency) -> bool:
    # The executor counts an allocation on a tier only when it lasts (or is held to the end); a Prefetch and a
    # Detach at the same instant hold nothing.
    return r.end_ns > r.start_ns or r.until_end


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def _remote_tier(spans: list[tuple[int, int]], copies: list[Residency]) -> str | None:
    """The remote tier whose copies overlap ``spans`` the longest (the first listed on a tie)."""
    best, best_len = None, 0
    for r in copies:
        length = sum(_overlap(a, b, r.start_ns, r.end_ns) for a, b in spans)
        if length > best_len:
            best, best_len = r.tier, length
    return best


def _compute_stalls(plan: Plan, timeline: Timeline) -> list[tuple[int, int]]:
    """(step index of a transfer or Detach, stall ns it caused), for every compute-stream step that waited on it.

    A step on the compute stream stalls when it starts after both the previous compute-stream step and the
    compute-stream steps it waits for: the wait is on another stream (a transfer, or a Detach on a link). This is
    the executor's own accounting (Metrics.stall_ns), read back from the step times; the stall goes to the wait
    that ended last, split evenly among waits that ended together.
    """
    steps, times = plan.steps, timeline.steps
    out: list[tuple[int, int]] = []
    prev_end = 0
    for i, step in enumerate(steps):
        if step.stream != COMPUTE:
            continue
        own = prev_end
        other_end, others = -1, []
        for w in step.waits:
            end = times[w].end_ns
            if steps[w].stream == COMPUTE:
                own = max(own, end)
            elif end > other_end:
                other_end, others = end, [w]
            elif end == other_end:
                others.append(w)
        if other_end > own:
            stall = other_end - own
            share, extra = divmod(stall, len(others))
            out += [(w, share + (extra if j == 0 else 0)) for j, w in enumerate(others)]
        prev_end = max(prev_end, times[i].end_ns)
    return out


def tensor_moves(graph: Graph, plan: Plan, timeline: Timeline) -> list[TensorMove]:
    """Return every tensor that moves, most HBM bytes x time freed first (then larger, then by name).

    A tensor moves when the plan has a Prefetch, Store or Detach of it, a recompute step makes it again, or it
    starts the step off HBM. Its intervals off HBM are the gaps between its HBM residencies; one that starts the
    step off HBM is off from time 0 to its first residency, and one that outlives the step and leaves HBM after
    its last use is off until the step ends; both together are one interval across the step boundary (``wraps``).
    Tensors that do not outlive the step are not "off HBM" after their last use: they are freed, as with no
    offload. Empty when the timeline has no step times (the plan did not run).

    A recompute step targets an op, not a tensor: it counts for the outputs it allocates again (those not on HBM
    at its start, see ``recomputed_outputs``), and an interval that ends at its start is ``recomputed_by`` that op. A
    recomputation is also a use of the tensors it reads and makes: ``leaves_after`` and ``returns_before`` then
    name it ``recompute OP``.
    """
    if len(timeline.steps) != len(plan.steps):
        return []
    makespan = timeline.metrics.makespan_ns
    start = start_tiers(graph, plan.placement)
    steps, times = plan.steps, timeline.steps

    names: dict[str, None] = {n: None for n, tier in start.items() if tier != HBM}
    per_tensor_steps: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        if not s.kind.runs_op:
            names.setdefault(s.target, None)
            per_tensor_steps.setdefault(s.target, []).append(i)
    remade = _remade(graph, plan, timeline)
    for name in remade:
        names.setdefault(name, None)
    names = {n: None for n in names if n in graph.tensors}

    on_hbm: dict[str, list[Residency]] = {n: [] for n in names}
    copies: dict[str, list[Residency]] = {n: [] for n in names}
    for r in timeline.residencies:
        if r.name in on_hbm and _counted(r):
            (on_hbm if r.tier == HBM else copies)[r.name].append(r)

    op_time = {s.target: (t.start_ns, t.end_ns) for s, t in zip(steps, times) if s.kind is StepKind.COMPUTE}
    producer = graph.producer
    # Recomputations read their op's inputs and make its outputs again: uses of those tensors, as (start, end,
    # label) per tensor. Labelled apart from the op's first run, which the same op name already stands for.
    redo_uses: dict[str, list[tuple[int, int, str]]] = {}
    redo_reads: dict[str, list[tuple[int, int, str]]] = {}
    for s, t in zip(steps, times):
        if s.kind is StepKind.RECOMPUTE and s.target in graph.op_index:
            op = graph.op(s.target)
            use = (t.start_ns, t.end_ns, f"recompute {s.target}")
            for x in op.reads:
                redo_reads.setdefault(x, []).append(use)
            for x in dict.fromkeys(op.reads + op.outputs):
                redo_uses.setdefault(x, []).append(use)

    stall_of_step: dict[int, int] = {}
    for w, ns in _compute_stalls(plan, timeline):
        stall_of_step[w] = stall_of_step.get(w, 0) + ns

    moves: list[TensorMove] = []
    for name in names:
        t = graph.tensors[name]
        segs = sorted(on_hbm[name], key=lambda r: (r.start_ns, r.seq))
        # Ops that touch it, by end (for "leaves after") and readers by start (for "returns before").
        touch = [op for op in ((producer[name],) if name in producer else ()) + graph.users[name] if op in op_time]
        by_end = sorted([(op_time[op][1], op) for op in touch] + [(e, lbl) for _s, e, lbl in redo_uses.get(name, ())])
        readers = sorted([(op_time[op][0], op) for op in graph.users[name] if op in op_time]
                         + [(st, lbl) for st, _e, lbl in redo_reads.get(name, ())])
        remade_at = {times[i].start_ns: steps[i].target for i, _ns in remade.get(name, ())}

        # (leave, return, wraps) with None for "before the step" / "not within the step".
        raw: list[tuple[int | None, int | None, bool]] = []
        starts_off = start.get(name, HBM) != HBM
        if not segs:
            if starts_off:
                raw.append((None, None, False))
        else:
            lead = segs[0].start_ns if starts_off else None
            trail = segs[-1].end_ns if t.persistent and not segs[-1].until_end else None
            if lead is not None and trail is not None:
                raw.append((trail, lead, True))
            elif lead is not None:
                raw.append((None, lead, False))
            raw += [(a.end_ns, b.start_ns, False) for a, b in zip(segs, segs[1:]) if b.start_ns > a.end_ns]
            if trail is not None and lead is None:
                raw.append((trail, None, False))

        intervals: list[OffloadInterval] = []
        for leave, ret, wraps in raw:
            if wraps:
                spans = [(leave, makespan), (0, ret)]
            else:
                spans = [(0 if leave is None else leave, makespan if ret is None else ret)]
            duration = sum(b - a for a, b in spans)
            if duration <= 0:
                continue
            tier = _remote_tier(spans, copies[name])
            if tier is None and (leave is None or wraps):
                tier = start.get(name)
            before = None if ret is None else _first_from(readers, ret)
            # Back on HBM with no use left in the step: restored for the next step, whose first use it is for.
            next_step = wraps or (ret is not None and before is None and bool(readers))
            if next_step and before is None:
                before = readers[0][1]
            intervals.append(OffloadInterval(
                leave_ns=leave, return_ns=ret, duration_ns=duration,
                leaves_after=None if leave is None else _last_before(by_end, leave),
                returns_before=before, tier=tier, wraps=wraps, next_step=next_step,
                recomputed_by=None if ret is None else remade_at.get(ret),
            ))
        # In the order they leave: one that starts the step off HBM first, one across the step boundary last.
        intervals.sort(key=lambda iv: -1 if iv.leave_ns is None else iv.leave_ns)

        moved: dict[str, int] = {}
        counts = {StepKind.PREFETCH: 0, StepKind.STORE: 0, StepKind.DETACH: 0}
        interval_stall = [0] * len(intervals)
        stall = 0
        for i in per_tensor_steps.get(name, ()):
            s = steps[i]
            counts[s.kind] += 1
            if s.kind is not StepKind.DETACH:
                moved[s.stream] = moved.get(s.stream, 0) + t.bytes
            ns = stall_of_step.get(i, 0)
            if not ns:
                continue
            stall += ns
            j = _interval_of(intervals, s.kind, times[i].start_ns, times[i].end_ns)
            if j is not None:
                interval_stall[j] += ns
        intervals = [replace(iv, stall_ns=st) if st else iv for iv, st in zip(intervals, interval_stall)]
        redo = remade.get(name, ())
        moves.append(TensorMove(
            name=name, kind=t.kind.value, bytes=t.bytes, layer=layer_of(name),
            start_tier=start.get(name), intervals=tuple(intervals), moved_bytes=moved,
            prefetches=counts[StepKind.PREFETCH], stores=counts[StepKind.STORE],
            detaches=counts[StepKind.DETACH], stall_ns=stall,
            recomputes=len(redo), recompute_ns=sum(ns for _i, ns in redo),
        ))
    moves.sort(key=lambda m: (-m.freed_byte_ns, -m.bytes, m.name))
    return moves


def recomputed_outputs(graph: Graph, plan: Plan, timeline: Timeline) -> dict[int, tuple[str, ...]]:
    """Recompute step index -> the outputs of its op that it makes again, in the op's order (empty: none).

    The executor allocates at a recompute's start those outputs of the op that are not on HBM then; this reads it
    back from the HBM residencies: an output counts when one of its HBM copies starts at the recompute's start
    and no earlier step that allocates it (its first computation, a Prefetch) starts at that instant too (at equal
    times the executor allocates in program order). Empty when the timeline has no step times.
    """
    steps, times = plan.steps, timeline.steps
    redo = [i for i, s in enumerate(steps) if s.kind is StepKind.RECOMPUTE and s.target in graph.op_index]
    if not redo or len(times) != len(steps):
        return {}
    hbm_starts = {(r.name, r.start_ns) for r in timeline.residencies if r.tier == HBM}
    # (tensor, start ns) -> the first step in program order that may allocate it then.
    first_alloc: dict[tuple[str, int], int] = {}
    for i, s in enumerate(steps):
        if s.kind is StepKind.PREFETCH:
            made: tuple[str, ...] = (s.target,)
        elif s.kind.runs_op and s.target in graph.op_index:
            made = graph.op(s.target).outputs
        else:
            continue
        for t in made:
            first_alloc.setdefault((t, times[i].start_ns), i)
    out: dict[int, tuple[str, ...]] = {}
    for i in redo:
        at = times[i].start_ns
        out[i] = tuple(t for t in graph.op(steps[i].target).outputs
                       if (t, at) in hbm_starts and first_alloc.get((t, at)) == i)
    return out


def _remade(graph: Graph, plan: Plan, timeline: Timeline) -> dict[str, list[tuple[int, int]]]:
    """Tensor -> (recompute step, its share of the step's compute ns) for every recompute step that makes it again.

    The step's compute time is split evenly among the tensors it makes again (the remainder to the first), so they
    add up to ``Metrics.recompute_ns``; a recomputation that makes nothing again is counted by none.
    """
    out: dict[str, list[tuple[int, int]]] = {}
    for i, made in recomputed_outputs(graph, plan, timeline).items():
        if not made:
            continue
        t_i = timeline.steps[i]
        share, extra = divmod(t_i.end_ns - t_i.start_ns, len(made))
        for j, t in enumerate(made):
            out.setdefault(t, []).append((i, share + (extra if j == 0 else 0)))
    return out


def _last_before(by_end: list[tuple[int, str]], ns: int) -> str | None:
    """The op of the last (end, op) with end <= ``ns``, in a sorted list."""
    j = bisect.bisect_right(by_end, ns, key=lambda e: e[0])
    return by_end[j - 1][1] if j else None


def _first_from(by_start: list[tuple[int, str]], ns: int) -> str | None:
    """The op of the first (start, op) with start >= ``ns``, in a sorted list."""
    j = bisect.bisect_left(by_start, ns, key=lambda e: e[0])
    return by_start[j][1] if j < len(by_start) else None


def _interval_of(intervals: list[OffloadInterval], kind: StepKind, start_ns: int, end_ns: int) -> int | None:
    """The interval a transfer belongs to: the one a Prefetch ends (its HBM copy is allocated at the Prefetch's
    start), or the first one that begins at or after a Store or Detach ends (the Detach that waits for it)."""
    if kind is StepKind.PREFETCH:
        return next((j for j, iv in enumerate(intervals) if iv.return_ns == start_ns), None)
    leaving = [(iv.leave_ns, j) for j, iv in enumerate(intervals) if iv.leave_ns is not None and iv.leave_ns >= end_ns]
    return min(leaving)[1] if leaving else None


# -- the HBM peak -----------------------------------------------------------------------------------------------


def hbm_peak(timeline: Timeline, top: int | None = None) -> HbmPeak:
    """Return the HBM peak: the first time HBM holds its most bytes, and the allocations resident then, largest
    first (the ``top`` largest when given).

    Frees at a time count before allocations at that time, as in the executor, so the residents' bytes add up to
    the peak (Metrics.peak_bytes["hbm"] on a timeline the executor made).
    """
    hbm = [r for r in timeline.residencies if r.tier == HBM and _counted(r)]
    _best, when = peak_of_intervals((r.start_ns, None if r.until_end else r.end_ns, r.bytes) for r in hbm)
    resident = [r for r in hbm if r.start_ns <= when and (r.until_end or r.end_ns > when)]
    resident.sort(key=lambda r: (-r.bytes, r.name))
    total = sum(r.bytes for r in resident)
    chosen = resident if top is None else resident[:top]
    return HbmPeak(
        time_ns=when, bytes=total, count=len(resident),
        residents=tuple(PeakResident(r.name, r.kind, r.bytes, layer_of(r.name), r.start_ns,
                                     r.bytes / total if total else 0.0) for r in chosen),
    )


def peak_residents(timeline: Timeline, top: int | None = None) -> list[PeakResident]:
    """Return the allocations on HBM at the HBM peak, largest first (the ``top`` largest when given)."""
    return list(hbm_peak(timeline, top).residents)


# -- totals -----------------------------------------------------------------------------------------------------


def _totals(moves: Iterable[TensorMove], key) -> dict[str, MoveTotals]:
    acc: dict[str, list[int]] = {}
    for m in moves:
        a = acc.setdefault(key(m), [0] * 7)
        for j, v in enumerate((1, m.bytes, len(m.intervals), sum(m.moved_bytes.values()), m.freed_byte_ns,
                               m.stall_ns, m.recompute_ns)):
            a[j] += v
    return {k: MoveTotals(k, *v) for k, v in acc.items()}


def totals_by_kind(moves: Iterable[TensorMove]) -> list[MoveTotals]:
    """Return the moving tensors added up per tensor kind, most HBM bytes x time freed first."""
    return sorted(_totals(moves, lambda m: m.kind).values(), key=lambda t: (-t.freed_byte_ns, t.key))


def totals_by_layer(moves: Iterable[TensorMove]) -> list[MoveTotals]:
    """Return the moving tensors added up per layer id of their names (``L3``), in layer order, ``-`` (names
    without a layer) last."""
    return sorted(_totals(moves, lambda m: m.layer).values(), key=lambda t: _layer_key(t.key))


def tensor_view(graph: Graph, plan: Plan, timeline: Timeline, peak_top: int | None = None) -> TensorView:
    """Return the moves, the HBM peak (its ``peak_top`` largest residents when given) and the totals of a plan."""
    moves = tensor_moves(graph, plan, timeline)
    return TensorView(
        moves=tuple(moves), peak=hbm_peak(timeline, peak_top), by_kind=tuple(totals_by_kind(moves)),
        by_layer=tuple(totals_by_layer(moves)), makespan_ns=timeline.metrics.makespan_ns,
    )


__all__ = ["OffloadInterval", "TensorMove", "PeakResident", "HbmPeak", "MoveTotals", "TensorView", "layer_of",
           "recomputed_outputs", "tensor_moves", "hbm_peak", "peak_residents", "totals_by_kind", "totals_by_layer",
           "tensor_view"]
