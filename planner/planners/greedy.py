"""The paper's planner: distance-based cache-op insertion, then a greedy execution-order refinement.

HyperOffload (arXiv 2602.00748) inserts Prefetch / Store / Detach into the graph and then moves each cache op
to the feasible position where the cost model says its transfer completes in time, overlaps compute best and
costs the least peak memory. The production implementation (MindSpore ``utils/hyper_offload``) is reported to
be distance-based with four settings, which are this planner's options:

* ``select_distance`` (default 8): a tensor whose next use is at least this many ops away is a candidate;
* ``select_num`` (default 32): at most this many such candidates are offloaded for their own sake (the longest
  gaps first, then the largest bytes x gap time, and only those whose Store and Prefetch fit in the gap's compute
  time);
* ``prefetch_distance`` (default 2): a Prefetch goes at least this many ops before the use;
* ``release_distance`` (default 1): a Detach goes at least this many ops after the use (it also waits for
  the Store, so a later Detach stalls less and holds more).

On top of the distance rule the planner respects the HBM budget: it offloads more gaps, those whose transfers
stall least first, then the longest, until the sequential HBM count fits (``greedy_select.py``), places every
cache op (``refine.py``), emits the program, checks it with the executor and assigns static HBM offsets
(``planner/offsets.py``: best fit, or the exact assignment on small timelines). When the offsets do not fit
the budget (fragmentation), it plans again against a budget lowered by the excess (extrapolating its growth
from the second retry on; three times at most) and keeps that plan if it is no slower than the first plan under
the caching allocator (defragmentation delays included); otherwise the first plan, with the caching allocator.
On graphs above ``REFINE_MAX_OPS`` ops the first replan's budget is fixed in advance (``FRAG_FIRST``), so that it
is planned beside the first plan, on a second core (``planner/background.py``), with the same result on one core.

A gap has a third answer besides keeping the tensor and offloading it: recomputing it (``recompute=True``, the
default), i.e. dropping the tensor after its use and re-running its producer right before the next use, which
costs the producer's time on the compute stream instead of link time; the budget sweep weighs it against
offloading by estimated stall. ``offload=False`` makes only the transfers no plan can avoid: with recomputation,
the remat-only planner (the Checkmate problem); without, the no-offload program's memory count.

It reports ``status=PlanStatus.INFEASIBLE`` with a note when no plan can fit: the budget is below an op's working set
(the lower bound ``planner.bounds.largest_working_set``), or the remote tiers have no room for what must leave.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from planner.background import Background, can_fork
from planner.bounds import hbm_floor, initial_hbm_bytes, largest_working_set
from planner.defrag import spare_compactions
from planner.executor import simulate
from planner.gc_pause import gc_paused
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.offsets_cpsat import EFFORT, offsets_within
from planner.orders import DEFERRED, live_bytes, named_order
from planner.placement import plan_placement
from planner.plan import COMPUTE, Plan, PlanStatus, ProgramBuilder, Step, StepKind
from planner.planned import Planned, place_statically
from planner.planners.greedy_deferred import DEFERRED_EIGHTHS, DEFERRED_MAX_OPS, plan_deferred
from planner.planners.greedy_remat import chains_apply, plan_remat_chains
from planner.planners.greedy_select import EVICT_RULES, Answers, Context, Gap, cover_all, select_gaps
from planner.planners.none import plan_none
from planner.planners.refine import place, resolve_copies, room_never_binds, store_issued_after
from planner.timeline import Timeline
from planner.units import format_bytes_exact, format_time_us

DEFAULTS = {"select_distance": 8, "select_num": 32, "prefetch_distance": 2, "release_distance": 1}
GREEDY_SETTINGS = tuple(DEFAULTS)  # the four settings, in the paper's order
OFFSET_RETRIES = 3  # replans against a lower budget when static offsets do not fit
# Recompute chains are tried beside a valid selection on graphs up to this size (always where it is not valid).
CHAINS_MAX_OPS = 5000
# On graphs up to this size, the search for a planning budget whose static offsets fit also steps back up (halfway
# to the lowest budget that did not fit) after a budget too low to plan or one that fits: this many more plans.
REFINE_MAX_OPS = 5000
# Greedy's auto orders include the searched one (planner/order_search.py, a few seconds at 5,000 ops) up to this size.
SEARCH_MAX_OPS = 5000
SEARCH_GAIN = 0.01  # and only when it lowers their lowest peak by at least this share (else one more order to plan)
# Greedy's auto orders include sources-first up to this size: each order costs a whole greedy run, and on the paper's
# full-size inference graphs (29k and 38.8k ops, where it differs from auto) greedy must stay under 30 s.
SOURCES_FIRST_MAX_OPS = 5000
REFINE_RETRIES = 3
# The exact offsets' effort (CP-SAT deterministic seconds) for a plan with early fetches, which is kept only when its
# offsets fit: a third of the placement's, so that a plan whose offsets do not fit costs little (up to 2 s each
# on transformer_block's timelines at the full effort, in every point of cpsat's starting sweep).
EARLY_OFFSETS_EFFORT = EFFORT / 3
# How fast best fit's offset height over the plan's peak grows as the planning budget drops, per unit of budget
# share (the 29k-op DeepSeek-V3 NSA inference graph at 53.8 GB: 1.0397, 1.0560, 1.0759 at 53.8, 51.2, 49.4 GB, 0.34
# then 0.57; the 38.8k-op one: 1.0489, 1.0838, 1.1125 at 53.8, 50.8, 47.4 GB, 0.62 then 0.46). Used for the first
# replan on graphs above REFINE_MAX_OPS, before two attempts measure it.
FRAG_GROWTH = 0.45
# The offsets' height over the planning budget at the full budget that the first replan on graphs above
# REFINE_MAX_OPS plans for (measured: 1.0397 and 1.0489 on the 29k- and 38.8k-op graphs above). Planned beside the
# first plan; when its offsets do not fit either, the replans after it extrapolate from both measured ratios.
FRAG_FIRST = 1.035


@dataclass(frozen=True)
class Settings:
    select_distance: int = DEFAULTS["select_distance"]
    select_num: int = DEFAULTS["select_num"]
    prefetch_distance: int = DEFAULTS["prefetch_distance"]
    release_distance: int = DEFAULTS["release_distance"]
    evict: str = EVICT_RULES[0]  # the budget sweep's rule (``greedy_select.select_gaps``)

    def as_dict(self) -> dict:
        return {
            "select_distance": self.select_distance, "select_num": self.select_num,
            "prefetch_distance": self.prefetch_distance, "release_distance": self.release_distance,
            "evict": self.evict,
        }


def plan_greedy(
    graph: Graph,
    hw: Hardware,
    select_distance: int = DEFAULTS["select_distance"],
    select_num: int = DEFAULTS["select_num"],
    prefetch_distance: int = DEFAULTS["prefetch_distance"],
    release_distance: int = DEFAULTS["release_distance"],
    evict: str = EVICT_RULES[0],
    order: str = "auto",
    offsets: bool = True,
    recompute: bool = True,
    offload: bool = True,
) -> Plan:
    """Return the greedy plan for ``hw``'s HBM budget (see the module doc). ``offsets=False`` leaves HBM
    placement to the executor's caching allocator; ``order`` as for ``none`` (``auto`` plans the orders of
    ``auto_contexts`` and returns the fastest plan); ``recompute`` and ``offload`` say which answers a gap may
    get besides staying on HBM (``Answers``)."""
    return plan_greedy_timed(graph, hw, select_distance, select_num, prefetch_distance, release_distance, evict,
                             order, offsets, recompute, offload).plan


def plan_greedy_timed(
    graph: Graph,
    hw: Hardware,
    select_distance: int = DEFAULTS["select_distance"],
    select_num: int = DEFAULTS["select_num"],
    prefetch_distance: int = DEFAULTS["prefetch_distance"],
    release_distance: int = DEFAULTS["release_distance"],
    evict: str = EVICT_RULES[0],
    order: str = "auto",
    offsets: bool = True,
    recompute: bool = True,
    offload: bool = True,
) -> Planned:
    """``plan_greedy`` with the executor's full timeline of the plan (greedy runs the executor on it anyway)."""
    settings = Settings(int(select_distance), int(select_num), int(prefetch_distance), int(release_distance), evict)
    answers = answers_of(recompute, offload)
    with gc_paused():  # millions of short-lived objects and no cycles (planner/gc_pause.py)
        def rewritten(ctx: Context) -> Planned:
            return planned_with_context(ctx, settings, offsets=_flag(offsets))

        deferred = DEFERRED.fullmatch(order)
        if deferred:
            out = plan_deferred(graph, hw, int(deferred.group(1)), answers, rewritten)
            if out is not None:
                return out
        contexts = auto_contexts(graph, hw, answers) if order == "auto" else [Context(graph, hw, order, answers)]
        outs: list[Planned] = []
        for ctx in contexts:
            # The best valid plan so far is what a later order's evictions against compactions must beat: on the
            # 20k-op generated graph at 60% the second order's plan compacted 3,365 times, and the pass spent 13 s
            # of greedy's 26 s on it for nothing.
            outs.append(planned_with_context(ctx, settings, offsets=_flag(offsets), beat_ns=fastest_valid_ns(outs)))
        k = min(range(len(outs)), key=lambda k: rank_planned(outs[k]))
        outs[k] = with_early_weight_stores(contexts[k], settings, outs[k], offsets=_flag(offsets))
        if order == "auto":
            outs += deferred_candidates(graph, hw, answers, rewritten)
        return min(outs, key=rank_planned)


def with_early_weight_stores(ctx: Context, settings: Settings, out: Planned, offsets: bool = True,
                             name: str = "greedy", deadline: float | None = None,
                             beat_ns: int | None = None) -> Planned:
    """``out`` (``ctx``'s plan), or ``ctx``'s plan with the Stores of its inference weights issued at the step's
    start (``refine.store_issued_after``) when that one is faster; ``out`` alone, at no cost, unless the compute
    stream of ``out`` waits for a Store of an inference weight (never on training graphs: every weight is
    updated). One more plan where it does: the rule wins on some inference graphs and loses on others, and greedy's
    estimates do not tell which beforehand. ``beat_ns``: as ``planned_with_context``'s (a sweep's best so far)."""
    if not waits_for_weight_store(ctx, out):
        return out
    # The other plan counts only where it beats ``out``: no evictions' search for one that cannot.
    if not rank_planned(out)[0]:
        own = out.timeline.metrics.makespan_ns
        beat_ns = own if beat_ns is None else min(own, beat_ns)
    ctx.early_weight_stores = True
    try:
        early = planned_with_context(ctx, settings, offsets, name, deadline, beat_ns)
    finally:
        ctx.early_weight_stores = False
    if rank_planned(early) >= rank_planned(out):
        return out
    note = "the inference weights' Stores are issued at the step's start, not after their reads before the gap"
    return replace(early, plan=replace(early.plan, notes=(*early.plan.notes, note)))


def waits_for_weight_store(ctx: Context, out: Planned) -> bool:
    """Whether the compute stream of ``out`` idles before a Detach until the Store of an inference weight it waits
    for ends."""
    steps, times = out.plan.steps, out.timeline.steps
    last_end = 0
    for i, step in enumerate(steps):
        if step.stream != COMPUTE:
            continue
        start = times[i].start_ns
        if step.kind is StepKind.DETACH and start > last_end and any(
                steps[w].kind is StepKind.STORE and steps[w].target in ctx.inference_weights
                and times[w].end_ns == start for w in step.waits):
            return True
        last_end = max(last_end, times[i].end_ns)
    return False


def deferred_candidates(graph: Graph, hw: Hardware, answers: Answers,
                        plan_rewritten: Callable[[Context], Planned]) -> list[Planned]:
    """The plans in the deferred orders ``auto`` tries (``DEFERRED_EIGHTHS``), on graphs that store tensors back, of
    up to ``DEFERRED_MAX_OPS`` ops, where re-runs are allowed."""
    if not answers.recompute or len(graph.ops) > DEFERRED_MAX_OPS:
        return []
    outs = (plan_deferred(graph, hw, k, answers, plan_rewritten) for k in DEFERRED_EIGHTHS)
    return [out for out in outs if out is not None]


def answers_of(recompute: bool | str = True, offload: bool | str = True) -> Answers:
    """The answers the ``recompute`` and ``offload`` options allow (either may come as command-line text)."""
    return Answers(offload=_flag(offload), recompute=_flag(recompute))


def auto_contexts(graph: Graph, hw: Hardware, answers: Answers | None = None, searched: bool = True
                  ) -> list[Context]:
    """The orders greedy's ``auto`` plans, each prepared once: ``auto`` and, when they differ from it, the
    ``lowest-peak``, ``store-release`` and (up to ``SOURCES_FIRST_MAX_OPS`` ops) ``sources-first`` orders (the last:
    a table read by each chunk's embedding leaves HBM after the first reads instead of coming back for every
    chunk). Moving the store-back releases up can cost more offloading under a tight budget than it saves in link
    time (transformer_block at 1 GB: 151.6 against 132.2 ms), and running layer by layer across micro-batches more
    still, for much less link-bound time when the budget allows; running the sources first holds their outputs
    longer. On graphs up to ``SEARCH_MAX_OPS`` ops whose orders all peak over the budget, also the ``searched``
    order (``planner/order_search.py``) when it peaks at least ``SEARCH_GAIN`` lower."""
    out = [Context(graph, hw, "auto", answers)]
    for name in ("lowest-peak", "store-release", "sources-first"):
        if name == "sources-first" and len(graph.ops) > SOURCES_FIRST_MAX_OPS:
            continue
        order = named_order(graph, name)  # once, not once per context it is compared with
        if all(order != c.order for c in out):
            out.append(Context(graph, hw, name, answers))
    # Under memory pressure, the searched order too when it peaks lower: less is left to move or re-run.
    if searched and len(graph.ops) <= SEARCH_MAX_OPS:
        peak = min(max(live_bytes(graph, c.order), default=0) for c in out)
        if peak > hw.hbm_bytes and max(live_bytes(graph, named_order(graph, "searched")), default=0) < (
                1 - SEARCH_GAIN) * peak:
            out.append(Context(graph, hw, "searched", answers))
    return out


def fastest_valid_ns(outs: Iterable[Planned]) -> int | None:
    """The makespan of the fastest valid plan of ``outs`` (None: none is valid): the mark a later plan's evictions
    against compactions must beat (``beat_ns``)."""
    return min((p.timeline.metrics.makespan_ns for p in outs if not rank_planned(p)[0]), default=None)


def rank_planned(planned: Planned) -> tuple:
    """Sort key: valid plans first, then the faster, then the first given (``min`` keeps the first of equals)."""
    tl = planned.timeline
    return (not (tl.valid and planned.plan.status == PlanStatus.FEASIBLE), tl.metrics.makespan_ns)


def _flag(value) -> bool:
    """A boolean option that may come from the command line as text (``-O offsets=false``)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off")
    return bool(value)


def plan_with_context(ctx: Context, settings: Settings, offsets: bool = True, name: str = "greedy") -> Plan:
    """Plan with a prepared Context (the sweep shares one across settings)."""
    return planned_with_context(ctx, settings, offsets, name).plan


def planned_with_context(ctx: Context, settings: Settings, offsets: bool = True, name: str = "greedy",
                         deadline: float | None = None, beat_ns: int | None = None, finer: int = 0) -> Planned:
    """Plan with a prepared Context; the plan and its full timeline.

    When nothing has to leave HBM (the no-offload plan fits the budget) that plan is a candidate too: the
    distance rule may offload for its own sake, and its prefetch timing is an estimate, so the faster of the two
    is returned (the paper's planner would keep its own).

    ``deadline`` (``time.monotonic()``; for callers with a time limit, such as cpsat's starting plan): no replanning
    for a lower budget when static offsets do not fit starts unless it can end by then, as the first plan took.
    ``beat_ns``: a makespan the caller has already (a sweep's best so far); the evictions against compactions
    (``planner/defrag.py``) are not searched for a plan they cannot bring below it. ``finer``: on graphs above
    ``REFINE_MAX_OPS`` too, once a lower budget's offsets fit, plan up to this many budgets halfway back up towards
    the lowest budget whose offsets did not, as on smaller graphs, while ``_cheap`` allows (for a caller with time
    left over: each plan costs 5 to 10 s on 29k ops; a count, not the clock, so that a deterministic caller gets the
    same plan every run).
    """
    with gc_paused():
        return _planned_with_context(ctx, settings, offsets, name, deadline, beat_ns, finer)


def _planned_with_context(ctx: Context, settings: Settings, offsets: bool, name: str, deadline: float | None,
                          beat_ns: int | None = None, finer: int = 0) -> Planned:
    out = _plan_offloading(ctx, settings, offsets, name, deadline, beat_ns, finer)
    plan = out.plan
    # Cheap necessary conditions first (the no-offload program and its run cost seconds on 30k-op graphs): the
    # no-offload order's live bytes without what starts remote, and what that program holds when the step ends.
    if (plan.status != PlanStatus.FEASIBLE or no_offload_end_bytes(ctx.graph) > ctx.hw.hbm_bytes
            or max(live_bytes(ctx.graph, ctx.order, remote_resident=False)) > ctx.hw.hbm_bytes):
        return out
    nothing = plan_none(ctx.graph, ctx.hw, order=ctx.order_name)
    if nothing.status != PlanStatus.FEASIBLE:
        return out
    ours, theirs = out.timeline, simulate(ctx.graph, ctx.hw, nothing)
    if not theirs.valid or (ours.valid and ours.metrics.makespan_ns <= theirs.metrics.makespan_ns):
        return out
    return Planned(replace(nothing, planner=name, options=plan.options, stats=plan.stats, notes=(
        "nothing has to leave HBM at this budget and the no-offload program is faster than the offloading one: "
        "it is returned",)), theirs)


def no_offload_end_bytes(graph: Graph) -> int:
    """The bytes on HBM when the no-offload program (``planners/none.py``) ends its step: every tensor that outlives
    the step, except those pinned to a remote tier and never read (that program fetches every other one it reads
    and never drops a copy), so a lower bound of that program's HBM peak."""
    return sum(t.bytes for name, t in graph.tensors.items() if t.persistent and (
        name in graph.producer or not t.pinned or t.home == HBM or graph.users[name]))


def _plan_offloading(ctx: Context, settings: Settings, offsets: bool, name: str, deadline: float | None = None,
                     beat_ns: int | None = None, finer: int = 0) -> Planned:
    """The plan with its offsets (``_placed``), or on graphs up to ``CHAINS_MAX_OPS`` ops the recompute chains run
    with addresses (static offsets that fit by construction) when that is faster: where fragmentation leaves a plan
    to the caching allocator, or makes it plan for a lower budget."""
    out = _placed(ctx, settings, offsets, name, deadline, beat_ns, finer)
    if not (offsets and ctx.answers.recompute and ctx.n <= CHAINS_MAX_OPS and chains_apply(ctx)):
        return out
    if out.timeline.valid and out.timeline.metrics.allocator == "static" and out.plan.stats.get(
            "offset_attempts") == 1:
        return out  # placed at the full budget: the chains planned with addresses cannot fit better
    plan = _chains_plan(ctx, settings, ctx.hw.hbm_bytes, name, addresses=True)
    if plan is None:
        return out
    timeline = simulate(ctx.graph, ctx.hw, plan)
    if timeline.valid and (not out.timeline.valid or timeline.metrics.makespan_ns < out.timeline.metrics.makespan_ns):
        return Planned(plan, timeline)
    return out


def _placed(ctx: Context, settings: Settings, offsets: bool, name: str, deadline: float | None = None,
            beat_ns: int | None = None, finer: int = 0) -> Planned:
    t0 = time.monotonic()
    budget = ctx.hw.hbm_bytes
    g, hw = ctx.graph, ctx.hw
    floor = hbm_floor(g)[0]
    if budget < floor:
        plan = build_plan(ctx, settings, budget, name)  # infeasible: say why
        return Planned(plan, simulate(g, hw, plan))
    refine = ctx.n <= REFINE_MAX_OPS
    # Large graphs: the first replan's budget does not depend on the first plan, so it is planned beside it, on the
    # second core, from the start (``Background``); it is the same plan either way, only sooner.
    # Not where nothing-offloaded fits with room for the fragmentation: the first plan's offsets will fit.
    first_replan = None if refine else _first_replan_budget(hw.hbm_bytes)
    beside = (offsets and first_replan is not None and first_replan >= floor and can_fork()
              and int(ctx.base.max(initial=0)) * FRAG_FIRST > budget)
    if beside:
        ctx.table  # noqa: B018 - built once here, the child inherits it (1 s on the 38.8k-op graph), not twice
    with Background(_replan, ctx, settings, first_replan, name, ctx.answers, None) if beside else nullcontext(
            ) as spec:
        return _placed_from(ctx, settings, offsets, name, deadline, t0, floor, first_replan, spec, beat_ns, finer)


def _placed_from(ctx: Context, settings: Settings, offsets: bool, name: str, deadline: float | None, t0: float,
                 floor: int, first_replan: int | None, spec: Background | None, beat_ns: int | None,
                 finer: int = 0) -> Planned:
    g, hw = ctx.graph, ctx.hw
    budget = hw.hbm_bytes
    plan, timeline, answers, windows_cut = _plan_checked(ctx, settings, budget, name)
    if not offsets or plan.status != PlanStatus.FEASIBLE or not timeline.valid:
        return Planned(plan, simulate(g, hw, plan))
    first, first_free = plan, timeline
    static: Planned | None = None
    caching: Timeline | None = None  # the first plan under the caching allocator, once needed
    out_of_time = False
    ratios: list[float] = []  # offset height / planning budget, per attempt whose offsets did not fit
    tried: list[int] = []  # and those attempts' planning budgets
    unplannable: int | None = None  # large graphs: a planning budget too low for a valid plan
    attempt = 0
    unplaced = budget  # the lowest planning budget whose plan is valid but whose offsets do not fit
    low: int | None = None  # the highest planning budget whose offsets fit, or else with no valid plan
    refine = ctx.n <= REFINE_MAX_OPS
    # On larger graphs the plans for a lower budget give only the answers that won at the full budget: checking the
    # joint plan against each answer alone costs a plan and an executor run each time (20 s an attempt at 38.8k
    # ops), and a lower budget for fragmentation's sake rarely changes which answer wins. The first replan, planned
    # beside the first plan (``first_replan``), cannot know them: it gives every answer the context allows, jointly.
    only = None if refine else answers
    fresh = True  # the attempt's plan is valid: ``placed`` and ``height`` are its static offsets' outcome
    placed, height = place_statically(g, hw, plan, timeline, found=_offsets(ctx, timeline))
    cut = False  # the deadline, a wall clock, stopped the replanning: another run may plan differently
    between = 0  # budgets planned halfway back up so far (``finer``)
    while True:
        if fresh:
            if placed is not None:
                stats = dict(placed.plan.stats, offset_height_bytes=height, offset_attempts=attempt + 1)
                notes = placed.plan.notes + ((
                    f"static offsets fit after planning for {format_bytes_exact(budget)} (the offsets need more than "
                    "the peak: fragmentation)",) if attempt else ())
                mine = Planned(replace(placed.plan, stats=stats, notes=notes), placed.timeline)
                if static is None or mine.timeline.metrics.makespan_ns < static.timeline.metrics.makespan_ns:
                    static = mine
                low = budget if low is None else max(low, budget)
            else:
                unplaced = min(unplaced, budget)
                ratios.append(height / budget)
                tried.append(budget)
        if static is not None and attempt == 0:
            break  # placed at the full budget
        if low is not None:
            # Between a budget too low (or one that fits) and one that does not fit: halfway, on small graphs or
            # when asked (``finer``) (a plan for a lower budget is usually slower, and the recompute chains run out of
            # room before the gap selection does).
            if not (refine or between < finer) or attempt >= OFFSET_RETRIES + REFINE_RETRIES or (
                    unplaced - low <= hw.hbm_bytes // 100):
                break
            if not _cheap(t0, deadline):
                cut = True
                break
            budget = (low + unplaced) // 2
            between += 1
        else:
            if attempt >= OFFSET_RETRIES:
                break
            # Fragmentation makes the height exceed the planning budget by a few percent: plan for a budget lower
            # by that ratio. The ratio grows as the budget drops (more offloading, more, shorter allocations: 5.0%,
            # 6.7%, 8.5%, 9.4% on the 38.8k-op inference graph), so from the second retry on it is extrapolated
            # from the last two attempts. A margin of 1% (growing by 0.5% an attempt) for the plan changing under
            # the budget.
            ratio = ratios[-1]
            margin = 0.99 - 0.005 * attempt
            if first_replan is not None and attempt == 0:
                target = first_replan
            elif not refine:
                # Large graphs, whose attempts cost 10 to 20 s each, plan for where the ratio will be, not where it
                # was: growing linearly as the budget drops, at the rate the last two attempts measured (or
                # FRAG_GROWTH before there are two).
                slope = -FRAG_GROWTH / hw.hbm_bytes if len(ratios) < 2 else min(
                    0.0, (ratios[-1] - ratios[-2]) / (tried[-1] - tried[-2]))
                target = _fitting_budget(tried[-1], ratio, slope, hw.hbm_bytes * margin)
                if unplannable is not None:
                    # The prediction was too low for a valid plan: step back up, halfway to the last budget whose
                    # offsets did not fit.
                    target = max(target, (unplannable + tried[-1]) // 2)
                    budget = tried[-1]
            else:
                if len(ratios) >= 2:
                    ratio += max(0.0, ratios[-1] - ratios[-2])
                target = int(hw.hbm_bytes / ratio * margin)
            budget = min(budget - hw.hbm_bytes // 1000, target)
            if budget < floor:
                break
        from_child = spec is not None and attempt == 0 and budget == first_replan
        if deadline is not None and not from_child:
            # Another attempt costs about what the first took; the caching allocator's run of the first plan
            # (the fallback) about half of that.
            per_attempt = (time.monotonic() - t0) / (attempt + 1)
            if time.monotonic() + 1.5 * per_attempt > deadline:
                out_of_time = static is None
                cut = True
                break
        attempt += 1
        if from_child:
            # Needed from here on whatever the replans give (the fallback, or the static plan's rival): run it while
            # the second core finishes the replan.
            caching = simulate(g, hw, first)
            if deadline is not None and not spec.ready_by(deadline):
                out_of_time = static is None
                cut = True
                break
            fresh, placed, height = spec.result()
        else:
            # Small graphs replan with both window rules (the faster wins): the rule that won at the full budget can
            # lose at a lower one (Checkmate's random n500 at 0.8, joint: 4316.7 ms keeping the first plan's cut
            # windows, 3918.1 ms with whole windows in the replans).
            args = (ctx.answers, None) if attempt == 1 and first_replan is not None else (
                only, None if refine else windows_cut)
            fresh, placed, height = _replan(ctx, settings, budget, name, *args)
        if not fresh:  # no valid plan at this budget
            if refine and static is None and _cheap(t0, deadline):
                low = budget if low is None else max(low, budget)
            elif not refine and static is None and unplannable is None and tried:
                unplannable = budget  # once: the next attempt steps back up
            else:
                cut = cut or (refine and static is None)
                break
    if cut:
        static = _deadline_cut(static)
        first = replace(first, stats=dict(first.stats, deadline_cut=True))
    if static is not None and static.plan.stats["offset_attempts"] == 1:
        return static
    # The first plan under the caching allocator (its defragmentation delays included) against the static plan
    # made for a lower budget, if any: the faster one wins, static offsets on a tie.
    if caching is None:
        caching = simulate(g, hw, first)
    # Evictions add steps and waits, so no eviction makes the first plan faster than its run without the allocator
    # model: where the static plan, or the caller's best, is no slower than that, the search would be in vain.
    floor_ns = first_free.metrics.makespan_ns
    if caching.compactions and (static is None or static.timeline.metrics.makespan_ns > floor_ns) and (
            beat_ns is None or beat_ns > floor_ns):
        compactions = caching.metrics.defrag_events
        first, caching, added = spare_compactions(g, hw, first, caching, deadline=deadline)
        if added:
            first = replace(first, stats=dict(first.stats, compaction_evictions=added), notes=first.notes + (
                f"{added} eviction(s) of tensors idle on HBM spare the caching allocator "
                f"{compactions - caching.metrics.defrag_events} of its {compactions} compactions",))
    if static is not None:
        if static.timeline.valid and static.timeline.metrics.makespan_ns <= caching.metrics.makespan_ns:
            return static
        planned_for = format_bytes_exact(static.plan.stats["planning_budget_bytes"])
        why = (f"static offsets fit only when planning for {planned_for}, which is slower "
               f"({format_time_us(static.timeline.metrics.makespan_ns / 1000)}) than the caching allocator at the "
               "full budget")
    else:
        why = "static offsets did not fit the HBM budget" + (
            " (no time left to plan for a lower budget)" if out_of_time else "")
    return Planned(replace(first, notes=first.notes + (f"{why}; HBM placement is left to the caching allocator",)),
                   caching)


def _first_replan_budget(hbm: int) -> int:
    """The planning budget of the first replan on graphs above ``REFINE_MAX_OPS`` ops: where the offsets' height
    over the planning budget is expected to reach ``FRAG_FIRST`` at the full budget and to grow by ``FRAG_GROWTH``
    per unit of budget share below it, with the 1% margin of every replan. It does not depend on the first plan, so
    it can be planned beside it."""
    return min(hbm - hbm // 1000, _fitting_budget(hbm, FRAG_FIRST, -FRAG_GROWTH / hbm, hbm * 0.99))


def _replan(ctx: Context, settings: Settings, budget: int, name: str, only: Answers | None,
            windows_cut: bool | None) -> tuple[bool, Planned | None, int]:
    """Plan against ``budget`` (``_plan_checked``) and give the plan static offsets; return (whether the plan is
    valid, the plan with its offsets and its timeline or None when they do not fit the HBM budget, their
    height)."""
    plan, timeline, _, _ = _plan_checked(ctx, settings, budget, name, only, windows_cut)
    if plan.status != PlanStatus.FEASIBLE or not timeline.valid:
        return False, None, 0
    placed, height = place_statically(ctx.graph, ctx.hw, plan, timeline, found=_offsets(ctx, timeline))
    return True, placed, height


def _deadline_cut(planned: Planned | None) -> Planned | None:
    """``planned`` with ``stats["deadline_cut"]``: the caller's deadline (a wall clock) stopped the replanning for
    static offsets, so a run on a less busy machine may return another plan (cpsat's deterministic runs say so)."""
    if planned is None:
        return None
    return Planned(replace(planned.plan, stats=dict(planned.plan.stats, deadline_cut=True)), planned.timeline)


def _cheap(t0: float, deadline: float | None) -> bool:
    """Whether more plans for the offsets' sake are cheap: no deadline (greedy on its own), or what planning took so far
    is under half the time to the deadline (cpsat's starting plan: its search needs the rest). A quarter stopped the
    searched order of Checkmate's random n1000 at 0.8 after 2 of the 6 plans greedy makes alone (8263.7 against
    8122.8 ms), which cpsat's 40 s of windows did not make up (8191.4 ms); with half, cpsat ends at 8050.5 ms."""
    return deadline is None or 2 * (time.monotonic() - t0) < deadline - t0


def _fitting_budget(at: int, ratio: float, slope: float, room: float) -> int:
    """The largest planning budget ``b`` up to ``at`` whose offsets' height, ``b * (ratio + slope * (b - at))`` (the
    height over the budget measured at ``at``, growing by ``-slope`` per byte the budget drops), is within ``room``
    bytes."""
    lo, hi = 0.0, float(at)
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid * (ratio + slope * (mid - at)) <= room:
            lo = mid
        else:
            hi = mid
    return int(lo)


def _plan_checked(ctx: Context, settings: Settings, budget: int, name: str, only: Answers | None = None,
                  windows_cut: bool | None = None) -> tuple[Plan, Timeline, Answers | None, bool]:
    """Plan against ``budget`` and time the plan (no allocator model); an invalid plan becomes infeasible. Return
    the plan, its timeline, the answers it was built with (None: the recompute chains') and whether its link
    windows were cut (``select_gaps``' ``cut_windows``).

    With both answers on (offload and recompute), the joint plan is checked against each answer alone where that
    could differ: the offload-only plan when the joint one recomputes, the remat-only plan when it offloads and a
    recompute candidate exists. The fastest valid one is kept (the joint plan on a tie), so the joint planner is
    never slower than either alone at this budget. The selection ranks a transfer by its estimated stall, which
    can be far off where the budget keeps its prefetch late: on Checkmate's VGG16 at 90% of its peak, offloading
    two activations runs +76% over no offload while recomputing three runs +4.5%. A variant that cannot fit by
    its own count is not run (the executor's run is most of a plan's cost on large graphs).

    Where recomputing may help and nothing has to move, the recompute chains of ``greedy_remat`` are a candidate
    too (when the selection's plan is not valid, or on graphs of up to ``CHAINS_MAX_OPS`` ops): the selection
    recomputes at depth 1 only and finds no remat plan on Checkmate's random graphs.

    On graphs of up to ``REFINE_MAX_OPS`` ops the best of these is also emitted with early Prefetches (each waits
    only for the Detaches of its slot it needs room from, ``emit``): the optimizer phase of a training step fetches
    the next states while the last ones are still being stored (transformer_block at 1 GB: 132.2 -> 114.7 ms,
    deepseek-v3-paper at 80% of its peak 2355.0 -> 2151.2 ms); where the earlier fetches crowd the links or HBM
    they lose, so both are timed, and the early one is kept only when its static offsets fit the budget. Above
    that size the first is kept: on the 38.8k-op inference graph the early one was slower and needed a third plan
    for its offsets to fit.

    On graphs of up to ``REFINE_MAX_OPS`` ops the selection with its link windows uncut is a variant too: the cut
    keeps optimizer states from being offloaded behind the passes that fill HBM (LLaMA-3-8B training at 33.6 GB/s:
    470.1 ms uncut, 352.4 ms cut), but where most ops are over the budget it leaves the distance rule little to
    take (transformer_block at 1 GB: 132.2 ms uncut, 138.6 ms cut).

    ``only``: build with these answers alone, no variant (a replan that keeps the answers a first plan chose).
    ``windows_cut``: build with the windows cut or not, no such variant (a replan on a large graph keeps what the
    first plan chose; on small graphs replans pass None and try both).
    """
    answers = only if only is not None else ctx.answers
    plan = build_plan(ctx, settings, budget, name, answers, cut_windows=windows_cut is not False)
    best = (*_checked(ctx, plan), answers, windows_cut is not False)
    variants = []
    if only is None and answers.offload and answers.recompute:
        used = plan.stats.get("answers", [])
        if "recompute" in used:
            variants.append(Answers(recompute=False))
        if "offload" in used and _remat_may_fit(ctx, budget):
            variants.append(Answers(offload=False))
    for variant in variants:
        alt = build_plan(ctx, settings, budget, name, variant, cut_windows=best[4])
        if alt.status != PlanStatus.FEASIBLE or alt.steps == plan.steps:
            continue
        checked = _checked(ctx, alt)
        if checked[0] < best[0]:
            best = (*checked, variant, best[4])
    if windows_cut is None and ctx.n <= REFINE_MAX_OPS and ctx.tiers:
        uncut = build_plan(ctx, settings, budget, name, best[3], cut_windows=False)
        if uncut.status == PlanStatus.FEASIBLE and uncut.steps != best[1].steps:
            checked = _checked(ctx, uncut)
            if checked[0] < best[0]:
                best = (*checked, best[3], False)
    if not best[0][0] and ctx.n <= REFINE_MAX_OPS and ctx.tiers:
        early = build_plan(ctx, settings, budget, name, best[3], cut_windows=best[4], early_fetches=True)
        if early.steps != best[1].steps:
            checked = _checked(ctx, early)
            # Only where its offsets fit (best fit, or the exact model at a reduced effort): the earlier fetches
            # overlap more allocations, and offsets that need a lower planning budget cost more than they gain.
            if checked[0] < best[0] and _offsets(ctx, checked[2], EARLY_OFFSETS_EFFORT)[1] <= ctx.hw.hbm_bytes:
                best = (*checked, best[3], best[4])
    if answers.recompute and (best[0][0] or ctx.n <= CHAINS_MAX_OPS) and chains_apply(ctx):
        chains = _chains_plan(ctx, settings, budget, name)
        if chains is not None:
            checked = _checked(ctx, chains)
            if checked[0] < best[0]:
                best = (*checked, None, best[4])
    return best[1], best[2], best[3], best[4]


def _offsets(ctx: Context, timeline: Timeline, effort: float = EFFORT) -> tuple[dict[str, int | list[int]], int]:
    """``offsets_within`` for ``timeline``'s allocations at the full budget (its exact model within ``effort``),
    computed once per timeline: the early fetches' plans are checked for offsets before they are kept, and placed
    with them after."""
    key = id(timeline.residencies)
    got = ctx.offsets_found.get(key)
    if got is None or got[0] is not timeline.residencies:  # an id is reused once its object is gone
        while len(ctx.offsets_found) >= 2:  # the last two: a plan's timeline is placed right after it is checked
            del ctx.offsets_found[next(iter(ctx.offsets_found))]
        got = ctx.offsets_found[key] = (timeline.residencies,
                                        offsets_within(timeline.residencies, ctx.hw.hbm_bytes, effort=effort))
    return got[1]


def _chains_plan(ctx: Context, settings: Settings, budget: int, name: str, addresses: bool = False) -> Plan | None:
    """The recompute chains' plan (``greedy_remat``) with greedy's options and stats, or None."""
    chains = plan_remat_chains(ctx, budget, name, addresses)
    if chains is None:
        return None
    options = dict(settings.as_dict(), order=ctx.order_name, **ctx.answers.options())
    stats = dict(chains.stats, planning_budget_bytes=int(budget), answers=["recompute"], gaps_offloaded=0, stores=0,
                 prefetches=0)
    why = ("recompute chains (greedy_remat), placed as they ran: the other plans were slower once placed"
           if addresses else "recompute chains (greedy_remat): the gap selection's plan was slower or did not fit")
    return replace(chains, options=options, stats=stats, notes=(why,))


def _remat_may_fit(ctx: Context, budget: int) -> bool:
    """Whether a remat-only plan could fit ``budget`` at all: with every recompute gap and every mandatory gap taken
    at its widest (more than any selection can take together), no op is over. A necessary condition, in one pass:
    on the paper's inference graphs, whose KV caches and weights must move, it spares building a plan that cannot
    fit."""
    free = np.zeros(ctx.n + 1, dtype=np.int64)
    any_remat = False
    for g in ctx.gaps:
        if (g.recompute is not None or g.mandatory) and g.hi > g.lo:
            any_remat = any_remat or g.recompute is not None
            free[g.lo] += g.bytes
            free[g.hi] -= g.bytes
    if not any_remat:
        return False
    return bool(ctx.n == 0 or (ctx.base - np.cumsum(free[:-1])).max() <= budget)


def _checked(ctx: Context, plan: Plan) -> tuple[tuple, Plan, Timeline]:
    """(rank key, plan, timeline): the plan timed without the allocator model, infeasible when the executor
    rejects it; the key ranks valid plans first, then the faster. A plan over the budget only at the step's end
    gets room there first (``with_room_at_the_end``)."""
    timeline = simulate(ctx.graph, ctx.hw, plan, allocator=False)
    if timeline.violations and plan.status == PlanStatus.FEASIBLE:
        roomy = with_room_at_the_end(ctx, plan, timeline)
        if roomy is not None:
            roomy_timeline = simulate(ctx.graph, ctx.hw, roomy, allocator=False)
            if roomy_timeline.valid:
                plan, timeline = roomy, roomy_timeline
    if timeline.violations and plan.status == PlanStatus.FEASIBLE:
        shown = "; ".join(v.describe() for v in timeline.violations[:3])
        plan = replace(plan, status=PlanStatus.INFEASIBLE,
                       notes=plan.notes + (f"the executor rejects the greedy plan: {shown}",))
    return (not (timeline.valid and plan.status == PlanStatus.FEASIBLE), timeline.metrics.makespan_ns), plan, timeline


def with_room_at_the_end(ctx: Context, plan: Plan, timeline: Timeline) -> Plan | None:
    """``plan`` with room made for what comes back at the step's end, or None where that is not its fault.

    The selection counts HBM during each op, not after the last one, where the tensors that started the step on
    HBM and left it come back (``back`` gaps) beside what the plan still holds: the tensors the step made and
    keeps (its outputs), copies of tensors that live remote (pinned or placed there) and were never written, and
    copies of those and of outputs stored after their last write. Together they may not fit. Then, after the last
    op, those copies are dropped (once their Store ends), and the kept tensors, largest first, stored to the fastest
    remote tier and dropped, until what is held when the step ends fits; the end's Prefetches come after and wait
    for those Detaches. Only for a plan whose every violation is a capacity one after the last op ends."""
    steps = plan.steps
    ops = [i for i, s in enumerate(steps) if s.kind in (StepKind.COMPUTE, StepKind.RECOMPUTE)]
    # A program the executor rejects outright has no timed steps.
    if not ops or not ctx.tiers or any(v.kind != "capacity" for v in timeline.violations):
        return None
    last = ops[-1]
    last_end = timeline.steps[last].end_ns
    if any(v.time_ns < last_end for v in timeline.violations):
        return None
    g = ctx.graph
    held = [r for r in timeline.residencies if r.tier == HBM and r.until_end]
    excess = sum(r.bytes for r in held) - ctx.hw.hbm_bytes
    last_write: dict[str, int] = {}
    for i in ops:
        if steps[i].kind is StepKind.COMPUTE:
            op = g.op(steps[i].target)
            for t in op.updates + op.outputs:
                last_write[t] = i
    stored_back: dict[str, int] = {}  # tensor -> its last Store, when that comes after its last write
    for i, s in enumerate(steps):
        if s.kind is StepKind.STORE and i > last_write.get(s.target, -1):
            stored_back[s.target] = i

    def lives_remote(name: str) -> bool:  # pinned to a remote tier, or placed on one
        return name not in g.producer and plan.placement.get(name, g.tensors[name].home) != HBM

    def home_copy(name: str) -> bool:  # lives remote and never written: its copy there is valid
        return lives_remote(name) and name not in last_write

    def droppable(name: str) -> bool:  # a Detach is enough (what the step made may end remote)
        return home_copy(name) or (name in stored_back and (lives_remote(name) or name in g.producer))

    # Copies with a valid remote copy first (a Detach is enough), then what the step made (a Store first).
    kept = sorted((r for r in held if droppable(r.name) or (r.name in g.producer and r.name not in stored_back)),
                  key=lambda r: (not droppable(r.name), -r.bytes, r.name))
    chosen: list[tuple[str, bool]] = []  # (tensor, needs a Store)
    for r in kept:
        if excess <= 0:
            break
        chosen.append((r.name, not droppable(r.name)))
        excess -= r.bytes
    if excess > 0 or not chosen:
        return None
    # After the last op: the tail's steps but its Prefetches, then a Store where needed and a Detach per tensor,
    # then the tail's Prefetches, which wait for those Detaches. Nothing else in the tail may wait for a Prefetch.
    at = last + 1
    fetches = [i for i in range(at, len(steps)) if steps[i].kind is StepKind.PREFETCH]
    others = [i for i in range(at, len(steps)) if steps[i].kind is not StepKind.PREFETCH]
    if any(w in fetches for i in others for w in steps[i].waits):
        return None
    n_added = sum(1 + store for _, store in chosen)
    where = {old: new for new, old in enumerate(list(range(at)) + others)}
    where.update({old: at + len(others) + n_added + k for k, old in enumerate(fetches)})
    tier = ctx.tiers[0]
    added: list[Step] = []
    detaches = []
    for name, store in chosen:
        waits = (where[stored_back[name]],) if name in stored_back else (last,)
        if store:
            added.append(Step(StepKind.STORE, name, ctx.store_link[tier], (last,)))
            waits = (at + len(others) + len(added) - 1,)
        added.append(Step(StepKind.DETACH, name, COMPUTE, waits))
        detaches.append(at + len(others) + len(added) - 1)

    def moved(i: int, extra: tuple[int, ...] = ()) -> Step:
        s = steps[i]
        return Step(s.kind, s.target, s.stream, tuple(sorted({where[w] for w in s.waits} | set(extra))))

    new = ([moved(i) for i in range(at)] + [moved(i) for i in others] + added
           + [moved(i, tuple(detaches)) for i in fetches])
    return replace(plan, steps=tuple(new),
                   notes=plan.notes + (f"dropped {len(chosen)} tensor(s) after the last op (storing those the step "
                                       "made) to make room for what comes back to HBM before it ends",))


def build_plan(ctx: Context, settings: Settings, budget: int, name: str = "greedy", answers: Answers | None = None,
               cut_windows: bool = True, early_fetches: bool = False) -> Plan:
    """Select, refine and emit (no executor run). ``answers`` narrows ``ctx.answers`` (``select_gaps``); the plan's
    options record ``ctx.answers``, what the caller asked for. ``cut_windows``: ``select_gaps``'.
    ``early_fetches``: each Prefetch waits only for the Detaches of its slot it needs room from (``emit``)."""
    answers = answers if answers is not None else ctx.answers

    def select(answers: Answers) -> tuple[list[Gap], int | None]:
        gaps, _L, over = select_gaps(
            ctx, budget, settings.select_distance, settings.select_num, settings.prefetch_distance,
            settings.release_distance, answers, cut_windows, settings.evict,
        )
        return gaps, over

    gaps, over = select(answers)
    if over is not None and answers.recompute and answers.offload:
        # A re-run holds its producer's inputs on HBM, and so bars their gaps; the sweep takes one for an early op
        # and may then find a later op over the budget with the gap that would have fixed it barred (found by
        # HO_PLAN_FUZZ). Offloading alone never bars a gap: select again without re-runs, and keep that if it fits.
        plain, plain_over = select(replace(answers, recompute=False))
        if plain_over is None:
            gaps, over = plain, None
        else:  # the gaps' flags are the selection's state: selecting again restores the first one (only here)
            gaps, over = select(answers)
    # Resolve the copies, count, place; placing may give gaps up, and a gap given up may have held the remote
    # copy a later gap of its tensor relied on, so resolve and place again until no gap is given up (deciding
    # again only for those tensors when other tensors' copies cannot change theirs: ``room_never_binds``).
    independent = room_never_binds(ctx, gaps)
    redo: set[str] | None = None  # every tensor
    while True:
        notes = resolve_copies(ctx, gaps, redo)
        gaps = [g for g in gaps if g.selected]
        L = ctx.base.copy()
        cover_all(L, np.array([g.lo for g in gaps], dtype=np.int64), np.array([g.hi for g in gaps], dtype=np.int64),
                  np.array([g.bytes for g in gaps], dtype=np.int64))
        worst = int(L.argmax()) if len(L) else 0
        over = len(L) > 0 and L[worst] > budget
        place(ctx, gaps, L, budget, settings.prefetch_distance, settings.release_distance)
        if all(g.selected for g in gaps):
            break
        redo = {g.tensor for g in gaps if not g.selected} if independent else None
        gaps = [g for g in gaps if g.selected]
    status = PlanStatus.FEASIBLE
    initial = initial_hbm_bytes(ctx.graph)
    if initial > budget:
        status = PlanStatus.INFEASIBLE
        notes.append(
            f"{format_bytes_exact(initial)} start on HBM and are still needed, over the budget of "
            f"{format_bytes_exact(budget)}: no plan can fit "
            "(none of it can leave HBM at time 0)"
        )
    elif over:
        status = PlanStatus.INFEASIBLE
        op = ctx.ops[worst]
        ws = ctx.graph.working_set(op)
        if ws <= budget:
            # The op the count peaks at may not be the one that cannot fit (recomputing moves the peak elsewhere):
            # name the op whose working set is over the budget, when there is one.
            most, most_op = largest_working_set(ctx.graph)
            if most > budget:
                op, ws = ctx.graph.op(most_op), most
        if ws > budget:
            notes.append(
                f"op {op.name!r} needs {format_bytes_exact(ws)} on HBM while it runs (its inputs, outputs and "
                f"workspace), over the budget of {format_bytes_exact(budget)}: no plan can fit (largest single-op "
                "working set)"
            )
        elif not answers.offload:
            why = ("with offload=false only recomputing frees HBM, and no more recomputation frees it there (depth 1: "
                   "a recomputation reads only tensors kept on HBM)") if answers.recompute else \
                "with offload and recompute both off nothing can leave HBM"
            notes.append(
                f"op {op.name!r}: at least {format_bytes_exact(int(L[worst]))} stay on HBM, over the budget of "
                f"{format_bytes_exact(budget)}: {why}"
            )
        else:
            # Greedy's own limit, not a proof: the floor (``hbm_floor``) is what no plan can go below.
            why = ("greedy found nothing more to take off HBM there: the remote tiers' room, the gaps of this "
                   "order and the re-runs it chose leave none")
            notes.append(
                f"op {op.name!r}: at least {format_bytes_exact(int(L[worst]))} must stay on HBM, over the budget of "
                f"{format_bytes_exact(budget)}: {why}"
            )
    plan = emit(ctx, gaps, name, L if early_fetches else None, budget)
    plan = replace(plan, placement=plan_placement(ctx.graph, {**ctx.unused_remote, **ctx.wrapped}))
    options = dict(settings.as_dict(), order=ctx.order_name, **ctx.answers.options())
    redone = sum(1 for g in gaps if g.recompute is not None)
    stats = {
        "gaps_offloaded": len(gaps) - redone,
        "stores": sum(1 for g in gaps if g.needs_store),
        "prefetches": sum(1 for g in gaps if ctx.fetches(g)),
        "estimated_peak_hbm_bytes": int(L.max(initial=0)),
        "planning_budget_bytes": int(budget),
    }
    if ctx.answers.recompute:
        stats["recomputes"] = redone
        stats["answers"] = ctx.answers.used(gaps)
    return replace(plan, options=options, status=status, notes=tuple(notes), stats=stats)


def emit(ctx: Context, gaps: list[Gap], name: str = "greedy", counts: np.ndarray | None = None,
         budget: int | None = None) -> Plan:
    """Write the program: per op slot, Detaches, then Prefetches, then recomputations, then the op, then the Stores
    after it.

    A Prefetch waits for every Detach of its slot, unless ``counts`` (the HBM count per op after placing) and
    ``budget`` are given: then only for the Detaches it needs room from, in the order their Stores were issued
    (a Prefetch need not wait for a Store that ends later than the one that frees its room)."""
    n = ctx.n
    detach_at: dict[int, list[Gap]] = {}
    fetch_at: dict[int, list[Gap]] = {}
    store_after: dict[int, list[Gap]] = {}
    redo_at: dict[int, list[Gap]] = {}
    for g in gaps:
        if not g.pre_absent:
            detach_at.setdefault(g.r, []).append(g)
        if ctx.fetches(g):
            fetch_at.setdefault(g.q, []).append(g)
        if g.recompute is not None:
            redo_at.setdefault(g.u, []).append(g)
        if g.needs_store:
            store_after.setdefault(store_issued_after(ctx, g), []).append(g)
    pb = ProgramBuilder()
    store_step: dict[int, int] = {}
    fetched: dict[tuple[str, int], int] = {}
    last_cs: int | None = None  # the last compute-stream step

    def stores(a: int, waits: list[int]) -> None:
        for g in sorted(store_after.get(a, ()), key=lambda g: (g.a, g.u, g.tensor)):
            store_step[id(g)] = pb.store(g.tensor, ctx.store_link[g.store_tier], waits=waits)

    stores(-1, [])
    early = counts is not None and budget is not None
    for i in range(n):
        # Detaches that wait for nothing first, so that what they free is free at once; then (``early``) in the
        # order of their Stores.
        detaches = sorted(detach_at.get(i, ()), key=(lambda g: (g.needs_store, store_step.get(id(g), -1), g.tensor))
                          if early else (lambda g: (g.needs_store, g.tensor)))
        freed, after_step = [0], [last_cs]  # bytes the slot's first k Detaches free; the compute step after them
        for g in detaches:
            waits = [store_step[id(g)]] if g.needs_store else []
            last_cs = pb.detach(g.tensor, COMPUTE, waits=waits)
            freed.append(freed[-1] + g.bytes)
            after_step.append(last_cs)
        fetches = sorted(fetch_at.get(i, ()), key=lambda g: (g.u, g.tensor))
        early_here = early and fetches and len(freed) > 1
        if early_here:
            made = sum(ctx.graph.tensors[t].bytes for t in ctx.ops[i].outputs)
            redo = sum(g.bytes for g in redo_at.get(i, ()))
            # On HBM before the slot's Detaches and Prefetches (the count holds them at op i as off and on).
            held = int(counts[i]) - made - int(ctx.workspace[i]) - redo - sum(g.bytes for g in fetches) + freed[-1]
        for g in fetches:
            link = ctx.fetch_link[g.fetch_tier]
            after = last_cs
            if early_here:
                held += g.bytes
                after = after_step[min(bisect.bisect_left(freed, held - budget), len(freed) - 1)]
            fetched[(g.tensor, g.u)] = pb.prefetch(g.tensor, link, waits=[] if after is None else [after])
        # In the order the producers first ran: one may read what an earlier one makes again for this op.
        for g in sorted(redo_at.get(i, ()), key=lambda g: g.recompute):
            p = ctx.ops[g.recompute]
            last_cs = pb.recompute(p.name, waits=[fetched[(t, i)] for t in p.reads if (t, i) in fetched])
        op = ctx.ops[i]
        waits = [fetched[(t, i)] for t in op.reads if (t, i) in fetched]
        last_cs = pb.compute(op.name, waits=waits)
        stores(i, [last_cs])
    # Tensors that started the step on HBM and left it after their last use come back before the step ends.
    for g in sorted(fetch_at.get(n, ()), key=lambda g: g.tensor):
        pb.prefetch(g.tensor, ctx.fetch_link[g.fetch_tier], waits=[] if last_cs is None else [last_cs])
    return pb.build(ctx.graph.name, name)


__all__ = ["DEFAULTS", "Answers", "Settings", "answers_of", "auto_contexts", "deferred_candidates", "plan_greedy",
           "plan_greedy_timed", "plan_with_context", "planned_with_context", "build_plan", "emit",
           "waits_for_weight_store", "with_early_weight_stores"]
