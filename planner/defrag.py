"""Evictions that spare a plan the caching allocator's compactions.

A plan whose static offsets do not fit the HBM budget runs under the caching allocator model
(``planner/allocator.py``), which compacts HBM whenever an allocation finds the free bytes scattered: each
compaction stops the device while every live block moves. Those blocks are often tensors that sit idle on HBM
between two distant uses (on ``deepseek-v3-nsa-128k-L3-1layer`` at 60%, the prefill chunks' embeddings, made at
the step's start and read only when their chunk runs), scattered by best fit between shorter-lived blocks.

``spare_compactions`` takes such a tensor off HBM for its idle stretch: a Store after its last use before the
compaction (none when the remote tier holds its current version already, as for a weight that starts there), a
Detach, and a Prefetch that ends as its next use starts. Each eviction is kept only when the executor's run of the
whole plan, with the allocator model, is valid and faster; so the pass never returns a slower plan, and it pays
link time for an eviction only where that time is hidden or cheaper than the compactions it spares.

The search is a first-improvement hill climb over the tensors held across each compaction, longest idle and
largest first, with a fixed number of executor runs (``MAX_RUNS``, fewer on long programs), so that the same plan
gives the same result.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.cost import transfer_duration_ns
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.plan import Plan, Step, StepKind
from planner.timeline import Residencies, StepTiming, Timeline

# Executor runs (with the allocator model) per pass. One run of the 5,000-step plan of deepseek-v3-nsa-128k at 60%
# takes 0.03 s; 60 runs found the 16 ms that single evictions gain there (all of them within 47 runs).
MAX_RUNS = 60
# Runs are capped so that a pass replays at most this many steps in all (a 640k-step plan of the full 38.8k-op
# graph takes seconds a run: one pass there would cost minutes).
MAX_STEPS_REPLAYED = 1_000_000
# Fewer runs than this are not worth a pass (a plan of over MAX_STEPS_REPLAYED / MIN_RUNS steps is left as it is).
MIN_RUNS = 10
# Tensors tried per compaction, in order of idle time x bytes.
CANDIDATES_PER_COMPACTION = 10

_RUNS_OP = (StepKind.COMPUTE, StepKind.RECOMPUTE)


def spare_compactions(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline, max_runs: int = MAX_RUNS,
                      deadline: float | None = None) -> tuple[Plan, Timeline, int]:
    """Return (a plan at least as fast as ``plan``, its executor timeline with the caching allocator, the number
    of evictions added). ``plan`` has no static offsets and ``timeline`` is ``simulate(graph, hw, plan)``.
    ``deadline`` (``time.monotonic()``) stops the search early, as a safety net only: ``max_runs`` bounds the work.
    """
    if plan.offsets or not timeline.compactions or not hw.remote_tiers:
        return plan, timeline, 0
    runs = _Runs(min(max_runs, MAX_STEPS_REPLAYED // max(1, len(plan.steps))), deadline)
    if runs.left < min(MIN_RUNS, max_runs):
        return plan, timeline, 0
    added = 0
    tried: set[tuple[str, str, str]] = set()
    while timeline.compactions:
        found = _first_faster(graph, hw, plan, timeline, tried, runs)
        if found is None:
            break
        plan, timeline = found
        added += 1
        tried.clear()  # what did not pay before may pay now
    return plan, timeline, added


@dataclass
class _Runs:
    """The executor runs a pass may still make."""

    left: int
    deadline: float | None

    def take(self) -> bool:
        if self.left <= 0 or (self.deadline is not None and time.monotonic() > self.deadline):
            return False
        self.left -= 1
        return True


def _first_faster(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline, tried: set[tuple[str, str, str]],
                  runs: _Runs) -> tuple[Plan, Timeline] | None:
    """The first eviction not in ``tried`` (which it extends) whose run is valid and faster than ``timeline``, with
    that run; None when there is none, or no run left."""
    uses = _uses(graph, plan, timeline)
    for step in timeline.compactions:
        for tensor, prev, nxt in _candidates(timeline, uses, timeline.steps[step].start_ns):
            key = (tensor, plan.steps[prev].target, plan.steps[nxt].target)
            if key in tried:
                continue
            tried.add(key)
            for variant in _variants(graph, hw, plan, tensor, prev, nxt, timeline):
                if not runs.take():
                    return None
                tl = simulate(graph, hw, variant)
                if tl.valid:
                    if tl.metrics.makespan_ns < timeline.metrics.makespan_ns:
                        return variant, tl
                    break  # the valid variant decides; an invalid one (a Detach without a copy) gives way
    return None


def _uses(graph: Graph, plan: Plan, timeline: Timeline) -> dict[str, list[tuple[int, int, int]]]:
    """Tensor -> (start ns, end ns, step) of every compute or recompute step that reads, makes or updates it, in
    time order."""
    uses: dict[str, list[tuple[int, int, int]]] = {}
    ops, index, times = graph.ops, graph.op_index, timeline.steps
    for i, s in enumerate(plan.steps):
        if s.kind in _RUNS_OP:
            op = ops[index[s.target]]
            t = times[i]
            for name in {*op.reads, *op.outputs, *op.updates}:
                uses.setdefault(name, []).append((t.start_ns, t.end_ns, i))
    for v in uses.values():
        v.sort()
    return uses


def _candidates(timeline: Timeline, uses: dict[str, list[tuple[int, int, int]]], at_ns: int
                ) -> list[tuple[str, int, int]]:
    """(tensor, step of its last use before ``at_ns``, step of its next use) for the tensors on HBM at ``at_ns``
    that no step uses then, longest idle x largest first; at most ``CANDIDATES_PER_COMPACTION``."""
    found = []
    res = timeline.residencies
    live = res.live_at(HBM, at_ns) if isinstance(res, Residencies) else \
        [r for r in res if r.tier == HBM and r.start_ns <= at_ns < r.end_ns]
    for r in live:
        u = uses.get(r.name)
        if not u:
            continue
        k = bisect.bisect_right(u, (at_ns, -1, -1))
        if k == 0 or k == len(u) or u[k - 1][1] > at_ns:
            continue
        idle = u[k][0] - u[k - 1][1]
        found.append((-idle * r.bytes, r.name, u[k - 1][2], u[k][2]))
    found.sort()
    return [(name, prev, nxt) for _key, name, prev, nxt in found[:CANDIDATES_PER_COMPACTION]]


def _variants(graph: Graph, hw: Hardware, plan: Plan, tensor: str, prev: int, nxt: int, timeline: Timeline
              ) -> list[Plan]:
    """The eviction of ``tensor`` between steps ``prev`` and ``nxt``: without a Store first where a remote tier
    may hold its current version (a tensor no op makes, starting there), then with one."""
    start_tier = plan.placement.get(tensor, graph.tensors[tensor].home)
    remote = {t.name for t in hw.remote_tiers}
    out = []
    if tensor not in graph.producer and start_tier in remote:
        out.append(_evicted(hw, plan, timeline, tensor, prev, nxt, start_tier, store=False))
    out.append(_evicted(hw, plan, timeline, tensor, prev, nxt, hw.fastest_remote_tier(), store=True))
    return [p for p in out if p is not None]


def _bytes_of(res: Sequence, tensor: str) -> int:
    """The bytes of ``tensor``'s first residency in ``res``; 0 when it has none."""
    if isinstance(res, Residencies):
        names = res.names
        return res.sizes[names.index(tensor)] if tensor in names else 0
    return next((r.bytes for r in res if r.name == tensor), 0)


def _busy(steps: Sequence[Step], times: Sequence[StepTiming], link: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """The (start, end) of the steps ``lo..hi-1`` on ``link``, by start."""
    return sorted((times[j].start_ns, times[j].end_ns) for j in range(lo, hi) if steps[j].stream == link)


def _first_gap(busy: list[tuple[int, int]], after_ns: int, length_ns: int) -> int:
    """The earliest time from ``after_ns`` at which a link busy over ``busy`` (``_busy``) is idle for ``length_ns``
    (after the last of them if no stretch between them holds it)."""
    t = after_ns
    for s, e in busy:
        if s >= t + length_ns:
            break
        t = max(t, e)
    return t


def _last_gap(busy: list[tuple[int, int]], after_ns: int, before_ns: int, length_ns: int) -> int | None:
    """The latest start in [``after_ns``, ``before_ns`` - ``length_ns``] of a stretch of ``length_ns`` in which a
    link busy over ``busy`` (``_busy``) is idle, or None."""
    end = before_ns
    for s, e in reversed(busy):
        if e <= end - length_ns:
            break
        end = min(end, s)
    start = end - length_ns
    return start if start >= after_ns else None


def _evicted(hw: Hardware, plan: Plan, timeline: Timeline, tensor: str, prev: int, nxt: int, tier: str,
             store: bool) -> Plan | None:
    """``plan`` with ``tensor`` off HBM from the end of step ``prev`` to the start of step ``nxt``, or None.

    Each stream runs its steps in program order, so the new steps go where the current timeline has their link
    idle, and delay no transfer already there: the Store (or the Detach alone) in the first idle stretch of the
    store link after ``prev`` ends that holds it, the Prefetch in the last one of the fetch link that holds it and
    ends by the start of ``nxt`` (None when there is none). The Prefetch waits for the Detach and for the last
    compute step that ends by its start, so that it does not hold HBM from the moment the tensor leaves."""
    steps, times = plan.steps, timeline.steps
    out_link, in_link = hw.store_link(tier), hw.fetch_link(tier)
    tensor_bytes = _bytes_of(timeline.residencies, tensor)
    out_ns = transfer_duration_ns(tensor_bytes, out_link) if store else 0
    in_ns = transfer_duration_ns(tensor_bytes, in_link)
    ready = times[prev].end_ns
    out_start = _first_gap(_busy(steps, times, out_link.name, prev + 1, nxt), ready, out_ns)
    off_at = next((j for j in range(prev + 1, nxt)
                   if steps[j].stream == out_link.name and times[j].start_ns >= out_start), nxt)
    in_start = _last_gap(_busy(steps, times, in_link.name, prev + 1, nxt), out_start + out_ns, times[nxt].start_ns,
                         in_ns)
    if in_start is None:
        return None
    trigger = max((j for j in range(prev + 1, nxt) if steps[j].kind in _RUNS_OP and times[j].end_ns <= in_start),
                  default=None)
    first = off_at if trigger is None else max(off_at, trigger + 1)
    in_at = next((j for j in range(first, nxt)
                  if steps[j].stream == in_link.name and times[j].start_ns >= in_start), nxt)
    new: list[Step] = []
    where: dict[int, int] = {}
    detach = fetch = -1
    for i, s in enumerate(steps):
        if i == off_at:
            waits = (where[prev],)
            if store:
                new.append(Step(StepKind.STORE, tensor, out_link.name, waits))
                waits = (len(new) - 1,)
            new.append(Step(StepKind.DETACH, tensor, out_link.name, waits))
            detach = len(new) - 1
        if i == in_at:
            waits = {detach} if trigger is None else {detach, where[trigger]}
            new.append(Step(StepKind.PREFETCH, tensor, in_link.name, tuple(sorted(waits))))
            fetch = len(new) - 1
        waits = tuple(where[w] for w in s.waits)
        if i == nxt:
            waits = tuple(sorted({*waits, fetch}))
        where[i] = len(new)
        new.append(Step(s.kind, s.target, s.stream, waits))
    return replace(plan, steps=tuple(new))


__all__ = ["spare_compactions"]
