"""The timeline executor: runs a Plan on a model of the hardware and checks every rule of residency.

``simulate(graph, hardware, plan)`` is the one entry point. It is a discrete-event simulation of one compute
stream and one stream per link channel, with integer nanosecond times:

1. timing: each step starts when its stream (for a link, the channel that frees first) is free and every step
   it waits for has ended; the program order is the issue order on each stream;
2. residency: the steps' starts and ends are replayed in time order to track every tensor's HBM copy, its
   remote copies and their versions, and to list each violation with its step, op, tensor and time.

Semantics (also in README.md): an op's outputs and workspace are allocated at its start; its inputs and
in-place updates must be resident and usable on HBM for its whole duration; a Prefetch allocates its HBM copy at
its start and the copy is usable at its end; a Store needs the tensor resident for the whole transfer and leaves a
valid remote copy at its end, valid until the next in-place write; a Detach frees the HBM copy at once; a
tensor that does not outlive the step is freed (HBM and remote copies) at the end of its last use.
At equal times, ends come before frees and frees before starts.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from planner.allocator import ALLOC, FREE, AllocatorReport, AllocRecord, check_offsets, replay_caching
from planner.cost import op_durations_ns, transfer_duration_ns
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import check_placement, start_tiers
from planner.plan import COMPUTE, Plan, Step, StepKind
from planner.timeline import Metrics, Residency, StepTiming, Timeline, Violation

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


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a block that allocates many small objects and makes no cycles.

    The replay creates a few objects per step (allocation records, residencies); each collection they trigger
    rescans every live object of the graph as well, which doubled the executor's time on 30k-op graphs. The
    collector's previous state is restored on exit.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _simulate(graph: Graph, hw: Hardware, plan: Plan, durations_ns: dict[str, int] | None, allocator: bool
              ) -> Timeline:
    problems = check_program(graph, hw, plan)
    if problems:
        empty = Metrics(0, 0, 0, {t.name: 0 for t in hw.tiers}, {ln.name: 0 for ln in hw.links}, 0, 0)
        return Timeline(steps=(), residencies=(), metrics=empty, violations=tuple(problems))
    durations = durations_ns if durations_ns is not None else op_durations_ns(graph, hw)
    timings, stall_ns = _time_steps(graph, hw, plan.steps, durations)
    start = start_tiers(graph, plan.placement)
    replay = _Replay(graph, hw, plan.steps, timings, start)
    residencies, violations = replay.run()
    extra: dict = {"allocator": "none"}
    if plan.offsets:
        off_violations, height = check_offsets(residencies, plan.offsets, hw.hbm_bytes, HBM)
        violations += off_violations
        extra = {"allocator": "static", "offset_height_bytes": height}
    elif allocator:
        report = replay_caching(replay.hbm_log, hw.hbm_bytes, hw.hbm_bandwidth_Bps)
        if report.defrags:
            # One re-run of the timing with the compaction delays; the allocator's counts are those of the replay
            # before the delays (the delays are assumed not to reorder allocations). See README.md.
            delays = _defrag_delays(report, plan.steps, timings)
            timings, stall_ns = _time_steps(graph, hw, plan.steps, durations, delays)
            replay = _Replay(graph, hw, plan.steps, timings, start)
            residencies, violations = replay.run()
        extra = {
            "allocator": "caching", "defrag_events": len(report.defrags), "defrag_ns": report.defrag_ns,
            "fragmentation_failures": report.fragmentation_failures, "offset_height_bytes": report.high_water_bytes,
        }
    sweeps = _sweeps(residencies)
    violations += _capacity_violations(hw, residencies, sweeps)
    metrics = replace(_metrics(graph, hw, plan.steps, timings, residencies, stall_ns, sweeps), **extra)
    violations.sort(key=_violation_order)
    return Timeline(tuple(timings), tuple(residencies), metrics, tuple(violations))


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


def _defrag_delays(report: AllocatorReport, steps: tuple[Step, ...], timings: list[StepTiming]) -> dict[int, int]:
    """Step index -> delay added to its start: a compaction stops the device while it moves blocks.

    The step whose allocation triggered the compaction starts ``cost`` later; when that step is a transfer, so
    does the first compute step that starts at or after the event (the compute stream is stopped too).
    """
    compute = [(timings[i].start_ns, i) for i, s in enumerate(steps) if s.stream == COMPUTE]
    delays: dict[int, int] = {}
    for d in report.defrags:
        if d.step is None or d.cost_ns <= 0:
            continue
        delays[d.step] = delays.get(d.step, 0) + d.cost_ns
        if steps[d.step].stream != COMPUTE:
            j = bisect.bisect_left(compute, (d.time_ns, -1))
            if j < len(compute):
                c = compute[j][1]
                delays[c] = delays.get(c, 0) + d.cost_ns
    return delays


def check_program(graph: Graph, hw: Hardware, plan: Plan) -> list[Violation]:
    """Return the structural problems of the program (empty when it can be run)."""
    out: list[Violation] = []
    links = {ln.name: ln for ln in hw.links}
    seen: dict[str, int] = {}

    def bad(i: int, msg: str, op: str | None = None, tensor: str | None = None) -> None:
        out.append(Violation("program", 0, msg, step=i, op=op, tensor=tensor))

    for i, s in enumerate(plan.steps):
        if s.waits and (min(s.waits) < 0 or max(s.waits) >= i):
            bad(i, f"waits for step(s) {[w for w in s.waits if w < 0 or w >= i]} that do not come before it")
        if s.kind is StepKind.COMPUTE:
            if s.target not in graph.op_index:
                bad(i, f"unknown op {s.target!r}", op=s.target)
            elif s.target in seen:
                bad(i, f"op runs twice (also step {seen[s.target]})", op=s.target)
            else:
                seen[s.target] = i
            if s.stream != COMPUTE:
                bad(i, f"compute step on stream {s.stream!r}", op=s.target)
            continue
        if s.target not in graph.tensors:
            bad(i, f"unknown tensor {s.target!r}", tensor=s.target)
        if s.kind is StepKind.DETACH:
            if s.stream != COMPUTE and s.stream not in links:
                bad(i, f"unknown stream {s.stream!r}", tensor=s.target)
            continue
        link = links.get(s.stream)
        if link is None:
            bad(i, f"{s.kind.value} on unknown link {s.stream!r}", tensor=s.target)
        elif s.kind is StepKind.PREFETCH and link.dst != HBM:
            bad(i, f"prefetch on link {link.name!r}, which does not lead to HBM", tensor=s.target)
        elif s.kind is StepKind.STORE and link.src != HBM:
            bad(i, f"store on link {link.name!r}, which does not leave HBM", tensor=s.target)
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
        for u, v in graph.dag.edges:
            if seen[u] > seen[v]:
                out.append(
                    Violation("program", 0, f"runs before {u!r}, which it depends on", step=seen[v], op=v)
                )
    return out


def _time_steps(
    graph: Graph, hw: Hardware, steps: tuple[Step, ...], durations: dict[str, int],
    delays: dict[int, int] | None = None,
) -> tuple[list[StepTiming], int]:
    """Return each step's start, end and channel, and the compute stream's stall time.

    ``delays`` (step index -> ns) pushes a step's start later (a defragmentation); it is not counted as stall.
    """
    delays = delays or {}
    links = {ln.name: ln for ln in hw.links}
    channel_free = {ln.name: [0] * ln.channels for ln in hw.links}
    tensors = graph.tensors
    transfer_ns: dict[tuple[int, str], int] = {}  # (bytes, link) -> ns: sizes repeat a lot
    compute_kind, detach_kind = StepKind.COMPUTE, StepKind.DETACH
    compute_free = 0
    stall = 0
    starts: list[int] = []
    ends: list[int] = []
    chans: list[int] = []
    on_compute = [s.stream == COMPUTE for s in steps]
    for i, s in enumerate(steps):
        waits = s.waits
        ready = max(map(ends.__getitem__, waits)) if waits else 0
        if on_compute[i]:
            start = compute_free if compute_free >= ready else ready
            if start > compute_free:
                # Waiting on another compute step is ordinary; waiting on a transfer is a stall.
                own = max(compute_free, max((ends[w] for w in waits if on_compute[w]), default=0))
                stall += start - own
            if delays:
                start += delays.get(i, 0)
            end = start + (durations[s.target] if s.kind is compute_kind else 0)
            compute_free = end
            starts.append(start)
            ends.append(end)
            chans.append(0)
            continue
        free = channel_free[s.stream]
        ch = 0 if len(free) == 1 else min(range(len(free)), key=lambda c: (free[c], c))
        start = max(free[ch], ready) + (delays.get(i, 0) if delays else 0)
        if s.kind is detach_kind:
            end = start
        else:
            key = (tensors[s.target].bytes, s.stream)
            ns = transfer_ns.get(key)
            if ns is None:
                ns = transfer_ns[key] = transfer_duration_ns(key[0], links[s.stream])
            end = start + ns
        free[ch] = end
        starts.append(start)
        ends.append(end)
        chans.append(ch)
    return list(map(StepTiming, starts, ends, chans)), stall


# Replay handler codes (indices into ``_Replay._replay_events``'s handlers).
_H_OP_START, _H_OP_END, _H_PREFETCH_START, _H_STORE_START, _H_STORE_END, _H_DETACH, _H_DIES = range(7)


class _OpInfo:
    """What the replay needs of an op, computed once (``Op.reads`` builds a new tuple on every access)."""

    __slots__ = ("name", "reads", "outputs", "updates", "workspace_bytes", "workspace_name", "touched")

    def __init__(self, op) -> None:
        self.name = op.name
        self.reads = op.reads
        self.outputs = op.outputs
        self.updates = op.updates
        self.workspace_bytes = op.workspace_bytes
        self.workspace_name = "workspace:" + op.name
        self.touched = self.reads + self.outputs


@dataclass
class _TensorState:
    resident: bool = False
    usable_ns: int = 0
    pins: int = 0
    version: int = 0
    dead: bool = False


class _Replay:
    """Replays step starts and ends in time order, tracking copies, versions and allocations."""

    def __init__(self, graph: Graph, hw: Hardware, steps: tuple[Step, ...], timings: list[StepTiming],
                 start: dict[str, str]) -> None:
        self.g, self.hw, self.steps, self.t = graph, hw, steps, timings
        self.start = start  # tensor no op produces -> the tier it starts on (and must be on when the step ends)
        self.links = {ln.name: ln for ln in hw.links}
        self.state = {name: _TensorState() for name in graph.tensors}
        # remote[tensor][tier] = version of the completed copy there
        self.remote: dict[str, dict[str, int]] = {name: {} for name in graph.tensors}
        self.open: dict[tuple[str, str], tuple[int, int, str, int]] = {}
        self.open_seq: list[str] = []
        self.open_tiers: dict[str, dict[str, None]] = {}  # name -> tiers it is open on, in allocation order
        self.residencies: list[Residency] = []
        self.violations: list[Violation] = []
        self.store_version: dict[int, int] = {}
        # HBM allocations and frees in replay order, for the allocator models.
        self.hbm_log: list[AllocRecord] = []
        # Start times of the compute steps that read or update each tensor, to tell if a copy is still needed.
        self.use_starts: dict[str, list[int]] = {name: [] for name in graph.tensors}
        self._index_steps()
        for i, op in enumerate(self.step_op):
            if op is not None:
                for tn in op.reads:
                    self.use_starts[tn].append(timings[i].start_ns)
        for v in self.use_starts.values():
            v.sort()

    def _index_steps(self) -> None:
        """Look every op and tensor up once: per event, ``graph.op()`` and ``Op.reads`` (a new tuple each call)
        were most of the replay's time on large graphs."""
        infos: dict[str, _OpInfo] = {}
        self.step_op: list[_OpInfo | None] = []
        for s in self.steps:
            if s.kind is StepKind.COMPUTE:
                info = infos.get(s.target)
                if info is None:
                    info = infos[s.target] = _OpInfo(self.g.op(s.target))
                self.step_op.append(info)
            else:
                self.step_op.append(None)
        # name -> (kind value, bytes)
        self.tinfo = {name: (t.kind.value, t.bytes) for name, t in self.g.tensors.items()}

    # -- allocation bookkeeping
    def _alloc(self, tier: str, name: str, kind: str, nbytes: int, now: int, step: int | None = None) -> None:
        self.open[(tier, name)] = (now, nbytes, kind, len(self.open_seq))
        tiers = self.open_tiers.get(name)
        if tiers is None:
            tiers = self.open_tiers[name] = {}
        tiers[tier] = None
        self.open_seq.append(name)
        if tier == HBM:
            self.hbm_log.append(AllocRecord(now, ALLOC, name, nbytes, step))

    def _free(self, tier: str, name: str, now: int, until_end: bool = False) -> None:
        start, nbytes, kind, seq = self.open.pop((tier, name))
        del self.open_tiers[name][tier]
        self.residencies.append(Residency(tier, name, kind, nbytes, start, now, until_end, seq))
        if tier == HBM and not until_end:
            self.hbm_log.append(AllocRecord(now, FREE, name, nbytes))

    def _violate(self, kind: str, now: int, msg: str, step: int | None, op=None, tensor=None) -> None:
        self.violations.append(Violation(kind, now, msg, step=step, op=op, tensor=tensor))

    def _events(self) -> list[tuple[int, int, int]]:
        """(time, handler code, step index or n + tensor index), in time order: ends, then frees, then starts
        at equal times, then by step. (A Prefetch's end changes nothing and is not an event.)"""
        steps, t = self.steps, self.t
        times: list[int] = []
        prios: list[int] = []
        codes: list[int] = []
        idx: list[int] = []
        last_use: dict[str, int] = {}
        for i, s in enumerate(steps):
            st, en = t[i].start_ns, t[i].end_ns
            kind = s.kind
            if kind is StepKind.COMPUTE:
                times += (st, en)
                prios += (_START, _OP_END)
                codes += (_H_OP_START, _H_OP_END)
                idx += (i, i)
                for tn in self.step_op[i].touched:
                    if last_use.get(tn, 0) < en:
                        last_use[tn] = en
            elif kind is StepKind.PREFETCH:
                times.append(st)
                prios.append(_START)
                codes.append(_H_PREFETCH_START)
                idx.append(i)
            elif kind is StepKind.STORE:
                times += (st, en)
                prios += (_START, _STORE_END)
                codes += (_H_STORE_START, _H_STORE_END)
                idx += (i, i)
                if last_use.get(s.target, 0) < en:
                    last_use[s.target] = en
            else:
                times.append(st)
                prios.append(_FREE)
                codes.append(_H_DETACH)
                idx.append(i)
        n = len(steps)
        for k, (name, tensor) in enumerate(self.g.tensors.items()):
            if not tensor.persistent and name in last_use:
                times.append(last_use[name])
                prios.append(_FREE)
                codes.append(_H_DIES)
                idx.append(n + k)
        times_a, idx_a, codes_a = np.array(times, dtype=np.int64), np.array(idx, dtype=np.int64), np.array(codes)
        order = np.lexsort((idx_a, np.array(prios), times_a))
        return list(zip(times_a[order].tolist(), codes_a[order].tolist(), idx_a[order].tolist()))

    def _replay_events(self) -> None:
        handlers = (self._op_start, self._op_end, self._prefetch_start, self._store_start, self._store_end,
                    self._detach)
        names = list(self.g.tensors)
        n = len(self.steps)
        for now, code, i in self._events():
            if code == _H_DIES:
                self._dies(names[i - n], now)
            else:
                handlers[code](i, now)

    def run(self) -> tuple[list[Residency], list[Violation]]:
        for name, tier in self.start.items():
            tensor = self.g.tensors[name]
            if tier == HBM:
                self.state[name].resident = True
            else:
                self.remote[name][tier] = 0
            self._alloc(tier, name, tensor.kind.value, tensor.bytes, 0)
        self._replay_events()
        end = max((tm.end_ns for tm in self.t), default=0)
        self._check_restored(end)
        for tier, name in sorted(self.open):
            self._free(tier, name, end, until_end=True)
        self.residencies.sort(key=attrgetter("start_ns", "seq"))
        return self.residencies, self.violations

    def _check_restored(self, end: int) -> None:
        """Steady state: each tensor that outlives the step is back on its starting tier, latest version."""
        for name, tier in self.start.items():
            if not self.g.tensors[name].persistent:
                continue
            st = self.state[name]
            if tier == HBM:
                if not st.resident:
                    self._violate("placement_not_restored", end, "started the step on hbm but is not resident when "
                                  "it ends (the next step would find it missing)", None, tensor=name)
            elif self.remote[name].get(tier) != st.version:
                what = "holds no copy" if tier not in self.remote[name] else "holds a stale copy (updated since)"
                self._violate("placement_not_restored", end, f"started the step on {tier} but {tier} {what} when "
                              "the step ends: store it back after its last update", None, tensor=name)

    # -- event handlers
    def _op_start(self, i: int, now: int) -> None:
        op = self.step_op[i]
        state = self.state
        for tn in op.reads:
            st = state[tn]
            if not st.resident:
                self._violate("not_resident", now, f"reads {tn!r}, which is not on HBM", i, op.name, tn)
            elif st.usable_ns > now:
                self._violate(
                    "not_resident", now, f"reads {tn!r} before its prefetch ends at {st.usable_ns / 1000:.3f}us",
                    i, op.name, tn,
                )
            st.pins += 1
        end = self.t[i].end_ns
        for tn in op.outputs:
            st = state[tn]
            st.resident, st.usable_ns = True, end
            kind, nbytes = self.tinfo[tn]
            self._alloc(HBM, tn, kind, nbytes, now, i)
        if op.workspace_bytes:
            self._alloc(HBM, op.workspace_name, "workspace", op.workspace_bytes, now, i)

    def _op_end(self, i: int, now: int) -> None:
        op = self.step_op[i]
        state = self.state
        for tn in op.reads:
            state[tn].pins -= 1
        for tn in op.updates:
            state[tn].version += 1
        if op.workspace_bytes:
            self._free(HBM, op.workspace_name, now)

    def _prefetch_start(self, i: int, now: int) -> None:
        tn = self.steps[i].target
        src = self.links[self.steps[i].stream].src
        st = self.state[tn]
        copy = self.remote[tn].get(src)
        if copy is None:
            self._violate("no_remote_copy", now, f"prefetch from {src!r}, which holds no copy", i, tensor=tn)
        elif copy != st.version:
            self._violate("no_remote_copy", now, f"prefetch from {src!r}, whose copy is stale", i, tensor=tn)
        if st.resident:
            self._violate("already_resident", now, "prefetch of a tensor already on HBM", i, tensor=tn)
            return
        st.resident, st.usable_ns = True, self.t[i].end_ns  # usable at the (known) end: no end event needed
        kind, nbytes = self.tinfo[tn]
        self._alloc(HBM, tn, kind, nbytes, now, i)

    def _store_start(self, i: int, now: int) -> None:
        tn = self.steps[i].target
        dst = self.links[self.steps[i].stream].dst
        st = self.state[tn]
        if not st.resident or st.usable_ns > now:
            self._violate("store_not_resident", now, f"store to {dst!r} of a tensor not on HBM", i, tensor=tn)
            self.store_version[i] = -1
        else:
            st.pins += 1
            self.store_version[i] = st.version
        if (dst, tn) not in self.open and not st.dead:
            kind, nbytes = self.tinfo[tn]
            self._alloc(dst, tn, kind, nbytes, now)

    def _store_end(self, i: int, now: int) -> None:
        tn = self.steps[i].target
        dst = self.links[self.steps[i].stream].dst
        version = self.store_version[i]
        if version < 0:
            return
        self.state[tn].pins -= 1
        self.remote[tn][dst] = version

    def _detach(self, i: int, now: int) -> None:
        tn = self.steps[i].target
        st = self.state[tn]
        if not st.resident:
            self._violate("detach_not_resident", now, "detach of a tensor not on HBM", i, tensor=tn)
            return
        if st.pins > 0:
            self._violate("not_resident", now, "detach while an op or a store still uses the HBM copy", i, tensor=tn)
        needed = self.g.tensors[tn].persistent or bisect.bisect_left(self.use_starts[tn], now) < len(
            self.use_starts[tn]
        )
        if needed and not any(v == st.version for v in self.remote[tn].values()):
            stale = " (remote copies are stale)" if self.remote[tn] else ""
            self._violate("data_loss", now, f"detach drops the only valid copy of a tensor still needed{stale}", i,
                          tensor=tn)
        st.resident = False
        self._free(HBM, tn, now)

    def _dies(self, tn: str, now: int) -> None:
        st = self.state[tn]
        st.dead = True
        for tier in list(self.open_tiers.get(tn, ())):
            self._free(tier, tn, now)
        st.resident = False


def _capacity_violations(
    hw: Hardware, residencies: list[Residency], sweeps: dict[str, list[tuple[int, int, str]]] | None = None
) -> list[Violation]:
    """One violation each time a tier goes over its capacity (frees at a time count before allocations)."""
    out: list[Violation] = []
    for tier in hw.tiers:
        cur, over = 0, False
        sweep = sweeps.get(tier.name, []) if sweeps is not None else _sweep(residencies, tier.name)
        for time, delta, name in sweep:
            cur += delta
            if cur > tier.capacity_bytes and not over:
                out.append(Violation(
                    "capacity", time,
                    f"{tier.name} holds {cur} B, over its capacity of {tier.capacity_bytes} B",
                    tensor=None if name.startswith("workspace:") else name,
                    op=name[len("workspace:"):] if name.startswith("workspace:") else None,
                ))
                over = True
            elif cur <= tier.capacity_bytes:
                over = False
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


def _sweeps(residencies: list[Residency]) -> dict[str, list[tuple[int, int, str]]]:
    """``_sweep`` for every tier at once (one pass over the residencies instead of one per tier and use)."""
    ev: dict[str, list] = {}
    for r in residencies:
        if r.end_ns > r.start_ns or r.until_end:
            tier_ev = ev.get(r.tier)
            if tier_ev is None:
                tier_ev = ev[r.tier] = []
            tier_ev.append((r.start_ns, 1, r.seq, r.bytes, r.name))
            if not r.until_end:
                tier_ev.append((r.end_ns, 0, r.seq, -r.bytes, r.name))
    out = {}
    for tier, tier_ev in ev.items():
        tier_ev.sort()
        out[tier] = [(t, d, n) for t, _o, _s, d, n in tier_ev]
    return out


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


def _metrics(
    graph: Graph, hw: Hardware, steps: tuple[Step, ...], timings: list[StepTiming],
    residencies: list[Residency], stall_ns: int, sweeps: dict[str, list[tuple[int, int, str]]] | None = None,
) -> Metrics:
    makespan = max((tm.end_ns for tm in timings), default=0)
    compute = [(timings[i].start_ns, timings[i].end_ns) for i, s in enumerate(steps) if s.kind is StepKind.COMPUTE]
    compute_ns = sum(e - s for s, e in compute)
    peak = {}
    for tier in hw.tiers:
        cur = best = 0
        sweep = sweeps.get(tier.name, []) if sweeps is not None else _sweep(residencies, tier.name)
        for _t, delta, _n in sweep:
            cur += delta
            best = max(best, cur)
        peak[tier.name] = best
    moved = {ln.name: 0 for ln in hw.links}
    transfer_ns = hidden = 0
    starts = [s for s, _ in compute]
    prefix = [0]
    for s, e in compute:
        prefix.append(prefix[-1] + e - s)
    for i, s in enumerate(steps):
        if s.kind in (StepKind.PREFETCH, StepKind.STORE):
            moved[s.stream] += graph.tensors[s.target].bytes
            a, b = timings[i].start_ns, timings[i].end_ns
            transfer_ns += b - a
            hidden += _overlap(compute, starts, prefix, a, b)
    return Metrics(makespan, compute_ns, stall_ns, peak, moved, transfer_ns, hidden)


def _overlap(intervals: list[tuple[int, int]], starts: list[int], prefix: list[int], a: int, b: int) -> int:
    """Length of [a, b) covered by sorted disjoint ``intervals``."""
    if b <= a or not intervals:
        return 0
    lo = max(0, bisect.bisect_right(starts, a) - 1)
    hi = bisect.bisect_left(starts, b)
    if hi <= lo:
        return 0
    total = prefix[hi] - prefix[lo]
    s0, e0 = intervals[lo]
    total -= max(0, min(e0, a) - s0)
    s1, e1 = intervals[hi - 1]
    total -= max(0, e1 - max(s1, b))
    return max(0, total)


__all__ = ["simulate", "with_static_offsets", "check_program", "occupancy"]
