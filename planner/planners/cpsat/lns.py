"""Large-neighbourhood search over windows of the schedule, for graphs too large for one model.

The incumbent is a valid plan, its executed timeline and its assignment in ticks (the plan timed in ticks,
which the decoder's waits make feasible in the scaled model). A window is a stretch of consecutive ops of the
incumbent's compute order; its region is [start of its first op, start of the first op after it]. In the
window model (``model.Frame``) the window's ops are free to move and reorder inside the region, and so are the
offload decisions, Detaches, Prefetches and Stores that can change without leaving the region; everything else
keeps its incumbent value, and enters the cumulatives clipped to the region. The window's objective is the end
of its last op (then bytes moved): finishing the window earlier lets everything after it run earlier.

A window's solution is decoded into a whole plan and run in the executor; it is accepted only when the
executor-validated makespan improves (or stays equal with fewer bytes moved) and, while the incumbent's static
HBM offsets fit the budget, when its offsets fit too (a plan that needs the caching allocator loses its gain to
compactions). The first incumbent is the starting plan decoded from the model, or the starting plan itself when
that is faster, or placed statically where the decoded copy's offsets do not fit. Windows are chosen where the
incumbent's compute stream stalls most; the search stops at the time limit, when no window with a stall is left
untried, or when the makespan reaches the compute bound (``stats["stop"]`` says which). Ctrl-C (KeyboardInterrupt,
in a solve or between them) stops it too: the incumbent, a valid plan, is what it returns.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection
from dataclasses import dataclass

from planner.executor import occupancy, simulate
from planner.hardware import HBM
from planner.offsets_cpsat import offsets_within
from planner.plan import Plan
from planner.planners.cpsat import worker
from planner.planners.cpsat.data import RECOMPUTE, Assignment, Problem, op_end
from planner.planners.cpsat.decode import plan_from_assignment
from planner.planners.cpsat.hint import assignment_from_plan, check, tick_times
from planner.planners.cpsat.model import Frame, Model
from planner.planners.cpsat.run import Run
from planner.timeline import Timeline

# Largest tensors whose gap spans a window (not offloaded there yet) that the window may newly offload.
SPANNING_GAPS = 48
# Wall seconds per window solve: at least MIN, else this share of the time limit.
WINDOW_MIN_S = 1.0
WINDOW_SHARE = 0.05
# Seconds the exact offsets model may spend on an accepted window's plan, after the (order, fit) pairs and descents.
FIT_CHECK_S = 0.05
# Tests and debugging collect the windows whose decoded plan the executor rejects here (a list), when set.
DEBUG: list | None = None
# How many window lengths of ops after the window its transfers and memory are modelled over.
LOOKAHEAD = 1
# Window sizes (ops): the first is the planner's window_ops option; it grows when every stall has been tried.
MIN_WINDOW = 20
MAX_WINDOW = 400
# Deterministic mode: deterministic seconds per wall second of the limit, overall and per window (calibrated on an
# idle 2-core machine; on a busy one the wall clock may end the search first, and the plan's notes say so). A
# window's wall-clock limit is a safety net WINDOW_WALL_SLACK times its nominal length, so that the deterministic
# budget, not the clock, ends it.
DET_PER_WALL_LNS = 0.2
DET_PER_WALL_WINDOW = 0.2
WINDOW_WALL_SLACK = 3.0


@dataclass
class Incumbent:
    plan: Plan
    timeline: Timeline
    asg: Assignment
    version: int = 0
    fits: bool = True  # its static HBM offsets fit the budget (``fits``)

    @property
    def makespan(self) -> int:
        return self.timeline.metrics.makespan_ns


def incumbent_from_plan(p: Problem, plan: Plan, tl: Timeline | None = None, fit: bool | None = None) -> Incumbent:
    """``fit``: whether its offsets fit (``fits``), when the caller knows."""
    tl = tl if tl is not None else simulate(p.graph, p.hw, plan, allocator=False)
    asg, _notes = assignment_from_plan(p, plan, tick_times(p, plan))
    return Incumbent(plan, tl, asg, fits=fits(p, tl) if fit is None else fit)


def fits(p: Problem, tl: Timeline) -> bool:
    """Whether static HBM offsets for the allocator-free run ``tl`` fit the budget, by the cheap tries of
    ``offsets_within`` (the final placement may still find some where these do not)."""
    return offsets_within(tl.residencies, p.hw.hbm_bytes, time_limit_s=FIT_CHECK_S)[1] <= p.hw.hbm_bytes


def improve(run: Run, p: Problem, asg: Assignment, base: Plan, base_tl: Timeline, objective: str, limit_ticks,
            window_ops: int, log: bool) -> list[tuple[Plan, Timeline]] | None:
    """Improve the starting plan window by window. Return the best (plan, timeline) candidates found, fastest
    first (up to 8, for the caller's HBM placement: the fastest may not fit static offsets), or None when nothing
    beats the starting plan."""
    # The incumbent: the starting plan's assignment decoded, so that its timing in ticks is model-feasible.
    start_plan = plan_from_assignment(p, asg)
    start_tl = run.timed(start_plan)
    # A static-offset (or allocator-free) run has the same times as a run without the allocator model.
    base_free = base_tl if base_tl.metrics.allocator in ("static", "none") else run.timed(base)
    # When the plan to beat has static offsets, so must the incumbent: the search accepts only plans whose offsets
    # fit while its incumbent's do, and a plan left to the caching allocator loses to the start what the windows
    # gained (NSA-64k at 60%: the decoded start, 0.25 ms faster than greedy's placed plan, did not fit; five windows
    # took it from 503.8 to 487.7 ms, whose compactions came to 523.5 ms, and cpsat returned the start).
    placed = base_tl.metrics.allocator == "static"
    faster = start_tl.valid and (start_tl.metrics.makespan_ns <= base_free.metrics.makespan_ns or not base_free.valid)
    start_fits = faster and fits(p, start_tl)
    if faster and (start_fits or not placed):
        inc = incumbent_from_plan(p, start_plan, start_tl, start_fits)
    else:
        inc = incumbent_from_plan(p, base, base_free, True if placed else None)
    problems = check(p, inc.asg)
    run.record.model = "lns"
    run.record.incumbent_feasible = not problems
    if problems:
        run.notes.append(f"the starting incumbent is not feasible in the scaled model ({problems[0]})")
    compute = sum(o.dur_ns for o in p.ops)
    n = len(p.ops)
    w = max(MIN_WINDOW, min(window_ops, n))
    stats = {"windows": 0, "accepted": 0, "improved_in_model": 0, "infeasible": 0, "no_solution": 0,
             "window_ops": [w]}
    run.report(phase="lns", incumbent_us=inc.makespan / 1000, bound_us=compute / 1000, windows=0, accepted=0)
    history = [(inc.plan, inc.timeline)]
    limit_ns = p.scale.ns(limit_ticks) if limit_ticks is not None else None
    det_budget = run.search_s() * DET_PER_WALL_LNS if run.deterministic else None
    try:
        inc = _search(run, p, inc, objective, limit_ns, w, compute, det_budget, stats, history, log)
    except KeyboardInterrupt:
        # Ctrl-C between solves (a window's model, decoding, the executor): the incumbent stands.
        run.interrupt()
    if stats.get("wall_stopped"):
        run.notes.append(f"the wall-clock limit stopped {stats['wall_stopped']} window solve(s) before their "
                         "deterministic budget: this run may not be reproducible")
    run.record.lns = stats
    run.record.windows_accepted = stats["accepted"]
    run.record.status = "LNS"
    history.sort(key=lambda c: c[1].metrics.speed_key)
    if base_free is base_tl and not _accept(history[0][1], Incumbent(base, base_tl, inc.asg), objective, limit_ns):
        # Nothing beats the starting plan, whose HBM placement is made (its run is the full one): keep it as is.
        run.notes.append(f"cpsat found nothing better than its starting plan ({base.planner}); it returns that")
        return None
    return history[:8]


def _search(run: Run, p: Problem, inc: Incumbent, objective: str, limit_ns: int | None, w: int, compute: int,
            det_budget: float | None, stats: dict, history: list, log: bool) -> Incumbent:
    """The window loop: returns the last incumbent; appends every accepted plan to ``history`` and records why it
    stopped in ``run.record.stop``."""
    n = len(p.ops)
    tried: set[tuple[int, int, int]] = set()
    # Windows whose solve ran out of time before CP-SAT reported any solution, not even the hint. On the largest
    # window models its presolve's probing takes the whole window time (2.5 of 3 s on NSA-128k's turn to decode,
    # 9,200 variables, where the hint alone is checked feasible in 0.1 s); at a later version, accepted elsewhere,
    # the same window's model is about as large and starves again, so it is not tried again.
    starved: set[tuple[int, int]] = set()
    while True:
        if inc.makespan <= compute and inc.timeline.valid:
            run.notes.append("the makespan reached the compute bound: optimal")
            run.record.stop = "compute_bound"
            break
        # Keep time for deciding HBM placement after the search, and for decoding and running this window.
        left = run.left() - run.final_reserve() - 1.5 * run.sim_s
        if left < 0.5:
            run.record.stop = "time_limit"
            if det_budget is not None:
                run.notes.append("the wall-clock limit ended the search before its deterministic budget: this run "
                                 "may not be reproducible")
            break
        if det_budget is not None and run.det_used >= det_budget:
            run.record.stop = "deterministic_budget"
            break
        pick = next_window if objective != "peak" else peak_window
        window = pick(p, inc, w, tried, starved)
        if window is None:
            if w >= min(n, MAX_WINDOW):
                run.record.stop = "no_improvement"  # every window tried, at every size
                break
            w = min(n, MAX_WINDOW, int(w * 1.6))  # every stall tried at this size: try larger windows
            stats["window_ops"].append(w)
            continue
        i, j = window
        tried.add((i, j, inc.version))
        stats["windows"] += 1
        frame = window_frame(p, inc, i, j)
        m = Model(p, frame, objective=objective, makespan_limit=None)
        m.add_hints()
        nominal = max(WINDOW_MIN_S, WINDOW_SHARE * run.time_limit)
        det = None
        if det_budget is not None:
            det = min(nominal * DET_PER_WALL_WINDOW, det_budget - run.det_used)
            nominal *= WINDOW_WALL_SLACK  # the wall-clock limit is only a safety net here
        wall = min(left, nominal)
        params = run.params(wall, det_s=det, log=log)
        params["keep_all_feasible_solutions_in_presolve"] = True
        run.log(f"# cpsat: LNS window {stats['windows']}: ops {i}..{j - 1} of the incumbent's order")
        res = worker.solve(m.cp, params, wall, on_log=run.log_sink if log else None)
        run.det_used += res.deterministic_time
        run.notes.extend(x for x in res.notes if x not in run.notes)
        if res.interrupted:
            # Ctrl-C during the window's solve: its partial solution is not worth the decoding time.
            run.interrupt()
            break
        if det is not None and res.status in ("FEASIBLE", "UNKNOWN", "TIMEOUT") and res.deterministic_time < 0.99 * det:
            stats["wall_stopped"] = stats.get("wall_stopped", 0) + 1
        if not res.has_solution:
            stats["infeasible" if res.status == "INFEASIBLE" else "no_solution"] += 1
            if res.status != "INFEASIBLE":
                starved.add((i, j))
            continue
        if res.objective >= _objective_of_hint(m):
            continue
        stats["improved_in_model"] += 1
        sol = m.read(res.values)
        plan = plan_from_assignment(p, sol)
        tl = run.timed(plan)
        if not tl.valid:
            stats["invalid"] = stats.get("invalid", 0) + 1
            if DEBUG is not None:
                DEBUG.append((frame, m, res, sol, plan, tl))
            continue
        # A faster plan whose offsets do not fit is worth nothing once placed (the caching allocator's compactions
        # cost more than the windows gain): while the incumbent fits, the search stays on plans that fit.
        fit = True if inc.fits else None
        if _accept(tl, inc, objective, limit_ns) and (not inc.fits or fits(p, tl)):
            version = inc.version + 1
            inc = incumbent_from_plan(p, plan, tl, fit)
            inc.version = version
            history.append((plan, tl))
            stats["accepted"] += 1
            run.report(phase="lns", incumbent_us=inc.makespan / 1000, bound_us=compute / 1000,
                       windows=stats["windows"], accepted=stats["accepted"])
    return inc


def _accept(tl: Timeline, inc: Incumbent, objective: str, limit_ns: int | None) -> bool:
    """Makespan: faster, or as fast with fewer bytes moved. Peak: a lower peak within the makespan limit."""
    m = tl.metrics
    if objective == "peak":
        ok = limit_ns is None or m.makespan_ns <= max(limit_ns, inc.makespan)
        return ok and (m.peak_bytes[HBM], m.makespan_ns) < (inc.timeline.metrics.peak_bytes[HBM], inc.makespan)
    return m.speed_key < inc.timeline.metrics.speed_key


def peak_window(p: Problem, inc: Incumbent, w: int, tried: Collection[tuple[int, int, int]],
                starved: Collection[tuple[int, int]] = frozenset()) -> tuple[int, int] | None:
    """For the peak objective: the untried window of ``w`` ops around the incumbent's HBM peak, then around the
    next highest points of its occupancy (never one in ``starved``, whatever the version)."""
    occ = occupancy(inc.timeline.residencies, HBM)
    if not occ:
        return None
    n = len(p.ops)
    starts_ns = [inc.timeline.steps[i].start_ns for i, s in enumerate(inc.plan.steps) if s.kind.value == "compute"]
    starts_ns.sort()
    for _level, t in sorted(((-b, t) for t, b in occ))[:50]:
        k = max(0, bisect.bisect_right(starts_ns, t) - 1)
        i = max(0, min(n - w, k - w // 2))
        j = min(n, i + w)
        if (i, j, inc.version) not in tried and (i, j) not in starved:
            return i, j
    return None


def _objective_of_hint(m: Model) -> float:
    """The window objective of the incumbent (to tell whether the solver improved on it)."""
    vals = {v.index: val for v, val in m.hints}
    obj = m.cp.proto.objective
    total = obj.offset
    for var, coef in zip(obj.vars, obj.coeffs):
        total += coef * vals.get(var, 0)
    return total * (obj.scaling_factor or 1)


def next_window(p: Problem, inc: Incumbent, w: int, tried: Collection[tuple[int, int, int]],
                starved: Collection[tuple[int, int]] = frozenset()) -> tuple[int, int] | None:
    """The untried window of ``w`` ops that ends just after the largest compute stall of the incumbent (never one
    in ``starved``, whatever the version).

    A stall is fixed by what comes before it (a Prefetch started earlier, room made for it), so the window takes
    most of its ops before the stalled op. The final window also covers transfers that end after the last op.
    """
    a = inc.asg
    n = len(p.ops)
    order = sorted(range(n), key=lambda o: a.start[o])
    stalls = []
    prev_end = 0
    for k, o in enumerate(order):
        idle = a.start[o] - prev_end
        if idle > 0:
            stalls.append((-idle, k))
        prev_end = op_end(p, a, o)
    if a.makespan > prev_end:
        stalls.append((-(a.makespan - prev_end), n))
    stalls.sort()
    for _idle, k in stalls:
        j = min(n, k + max(1, w // 5))
        i = max(0, j - w)
        j = min(n, i + w)
        if (i, j, inc.version) not in tried and (i, j) not in starved:
            return i, j
    return None


def window_frame(p: Problem, inc: Incumbent, i: int, j: int) -> Frame:
    """The frame of the window of ops at positions [i, j) of the incumbent's compute order: which decisions may
    change (those whose every transfer and residency stays inside the region), the rest fixed."""
    a = inc.asg
    w = _Window.of(p, a, i, j)
    f = Frame(lo=w.lo, hi=w.hi, inc=a, ops=w.ops, whole=False, final=j >= len(p.ops), ops_hi=w.ops_hi)
    cand, touched = _candidate_gaps(p, a, w)
    for g in sorted(cand):
        _free_gap(p, a, w, f, g)
    _settle_slots(p, a, w, f)
    _free_tensors(p, a, w, f, touched)
    return f


@dataclass(frozen=True)
class _Window:
    """Ops at positions [i, j) of the incumbent's compute order, and the region [lo, hi] around them."""

    i: int
    j: int
    posn: list[int]  # op -> its position in the incumbent's compute order
    ops: set[int]
    lo: int
    hi: int
    ops_hi: int

    @classmethod
    def of(cls, p: Problem, a: Assignment, i: int, j: int) -> _Window:
        n = len(p.ops)
        order = sorted(range(n), key=lambda o: a.start[o])
        posn = [0] * n
        for k, o in enumerate(order):
            posn[o] = k
        # Transfers and memory are modelled past the window's ops, over the next ``lookahead`` ops, so that the
        # window can offload a tensor whose Prefetch comes after it.
        k = min(n, j + (j - i) * LOOKAHEAD)
        return cls(i, j, posn, set(order[i:j]), a.start[order[i]], a.start[order[k]] if k < n else p.horizon,
                   a.start[order[j]] if j < n else p.horizon)

    def in_window(self, o: int) -> bool:
        return self.i <= self.posn[o] < self.j

    def before_end(self, o: int) -> bool:
        """In the prefix or the window."""
        return self.posn[o] < self.j

    def after_start(self, o: int) -> bool:
        """In the window or the suffix."""
        return self.posn[o] >= self.i

    def inside(self, t0: int, t1: int) -> bool:
        return self.lo <= t0 and t1 <= self.hi


def _candidate_gaps(p: Problem, a: Assignment, w: _Window) -> tuple[set[int], set[int]]:
    """(the gaps whose decision the window may change, the tensors its ops touch): the gaps of those tensors,
    offloaded gaps whose transfers fall in the region, and the largest tensors kept on HBM across it."""
    cand: set[int] = set()
    touched: set[int] = set()
    for o in w.ops:
        touched.update(p.ops[o].reads)
        touched.update(p.ops[o].outputs)
    for t in touched:
        cand.update(p.tensors[t].gaps)
    for g in a.off:
        gap = p.gaps[g]
        if gap.has_fetch and w.lo <= a.prefetch[g] < w.hi:
            cand.add(g)
        if gap.kind != "init" and w.lo <= a.detach[g] < w.hi:
            cand.add(g)
    for s in a.store:
        if w.lo <= a.store_start[s] < w.hi:
            cand.update(p.slots[s].gaps)
    spanning = []
    for gap in p.gaps:
        if gap.index in cand or gap.index in a.off or gap.kind == "init":
            continue
        t = p.tensors[gap.tensor]
        bef = list(gap.before) or ([t.producer] if t.producer is not None else [])
        if all(w.posn[u] < w.i for u in bef) and gap.after and all(w.posn[u] >= w.j for u in gap.after):
            spanning.append((-t.nbytes, gap.index))
    spanning.sort()
    cand.update(g for _b, g in spanning[:SPANNING_GAPS])
    return cand, touched


def _free_gap(p: Problem, a: Assignment, w: _Window, f: Frame, g: int) -> None:
    """Free in ``f`` what of candidate gap ``g`` can change inside the region: its offload decision when every
    transfer it adds or removes and every residency it adds fits there, else only the times that can move."""
    gap = p.gaps[g]
    t = p.tensors[gap.tensor]
    users = t.users
    bset = list(users[:gap.n_before]) + ([t.producer] if t.producer is not None else [])
    aset = users[gap.n_before:]
    if not all(w.before_end(u) for u in bset) or not all(w.after_start(u) for u in aset):
        return
    on = g in a.off
    tier = a.off.get(g)
    # A re-run moves among the window's ops only, a transfer anywhere in the region.
    top = w.ops_hi if tier == RECOMPUTE else w.hi
    fetch_ok = not gap.has_fetch or (on and w.lo <= a.prefetch[g] and a.prefetch[g] + gap.fetch[tier] <= top)
    slot_ok = gap.slot is None or _slot_movable(p, a, gap.slot, w.lo, w.hi, w.before_end)
    if gap.kind == "init":
        if fetch_ok and w.inside(a.prefetch[g], a.prefetch[g] + gap.fetch[tier]):
            f.free_prefetch.add(g)
        return
    # Keeping a tensor an offloaded end gap dropped holds it to the end of the step, hence f.final. A required
    # gap (the Store back to a pinned home) stays offloaded; only its times may move.
    if not gap.mandatory and ((not on and slot_ok) or (on and fetch_ok and slot_ok and (gap.has_fetch or f.final))):
        f.free_offload.add(g)
        f.free_detach.add(g)
        f.free_prefetch.add(g)
        if gap.slot is not None:
            f.free_store_tier.add(gap.slot)
            f.free_store_start.add(gap.slot)
        return
    if on and fetch_ok and gap.has_fetch:
        f.free_prefetch.add(g)
    if any(w.in_window(u) for u in gap.before):
        f.free_detach.add(g)
        if not on:
            f.free_prefetch.add(g)  # Detach = Prefetch = the end of a window op
    if gap.slot is not None and on and _slot_movable(p, a, gap.slot, w.lo, w.hi, w.before_end) \
            and gap.slot in a.store:
        f.free_store_start.add(gap.slot)
        f.free_detach.add(g)


def _settle_slots(p: Problem, a: Assignment, w: _Window, f: Frame) -> None:
    """A slot's Store presence is free only if no fixed offloaded gap needs it; a Store that moves frees the
    Detaches that wait for it, or stays put when one of those cannot move."""
    for s in list(f.free_store_tier):
        for g in p.slots[s].gaps:
            if g in a.off and g not in f.free_offload:
                f.free_store_tier.discard(s)
    for s in sorted(f.free_store_start):
        for g in p.slots[s].gaps:
            if g in a.off and g not in f.free_detach:
                if w.lo <= a.detach[g] <= w.hi or g in f.free_offload:
                    f.free_detach.add(g)
                else:
                    f.free_store_start.discard(s)
                    f.free_store_tier.discard(s)
                    break


def _free_tensors(p: Problem, a: Assignment, w: _Window, f: Frame, touched: set[int]) -> None:
    """Per tensor: the end of a tensor freed after its last use is free when a user is in the window and none
    after it; the tier choice is free for tensors with several tiers and no fixed offload."""
    for t in touched:
        ti = p.tensors[t]
        if not ti.modelled or ti.until_end:
            continue
        us = list(ti.users) + ([ti.producer] if ti.producer is not None else [])
        if any(w.in_window(u) for u in us) and all(w.before_end(u) for u in us):
            f.free_end.add(t)
    for t in touched | {p.gaps[g].tensor for g in f.free_offload}:
        ti = p.tensors[t]
        if len(ti.tiers) > 1 and all(g in f.free_offload or g not in a.off for g in ti.gaps):
            f.free_tier.add(t)


def _slot_movable(p: Problem, a: Assignment, s: int, lo: int, hi: int, before_end) -> bool:
    """A slot's Store can be added, removed or moved inside the region."""
    sl = p.slots[s]
    if sl.writer is not None and not before_end(sl.writer):
        return False
    if s in a.store:
        return lo <= a.store_start[s] and a.store_start[s] + sl.store[a.store[s]] <= hi
    return True


__all__ = ["improve", "window_frame", "Incumbent"]
