"""Greedy with a large tensor brought back before a crowded op and held through it.

Greedy evicts, where HBM is short, the tensor whose next use is furthest (Belady's rule, or its stall estimate),
and fetches it back a few ops before that use. That is right one op at a time and can be wrong over a stretch: on
``deepseek-v3-nsa-64k-L3-1layer`` at 60% of its peak, the embedding table (1.85 GB) and the LM head (1.85 GB) are
both off HBM while the last prefill chunk's attention runs, and after it they come back one after the other over
the one fetch link, the table only once the LM head is in: 87 ms of stall before the first decode step, where the
table alone beside the attention's working set fits the budget (the experts, the chunk's input and a few weights
leave instead, and come back while the LM head's fetch runs). Greedy's sweep: 499.13 ms; with the table brought
back before that attention and held through it: 490.31 ms.

Built as a graph rewrite, as ``greedy_deferred.py``: a copy of the graph, its ops in the plan's compute order, with
one more op, a read of the tensor right after the crowded op (no compute; a 1-byte output nothing reads). Greedy
plans that graph in its order, so the tensor is on HBM at that point, and its plan is mapped back: the read's step
and its output's cache steps are dropped (a wait on one of them becomes a wait on what it waited for). The executor
judges the result on the original graph, and it is kept only when valid and faster.

Which reads are tried (``hold_candidates``): the compute stream's longest stalls, the largest tensor each stalled op
waited for a Prefetch of, and the ops between that tensor's previous use and the stalled op with the largest
working sets that leave room for it. cpsat makes the pass on its best greedy start (``cpsat/solve.py``,
``_held_start``); greedy-sweep does not (28 s on NSA-128k at 60%, more than cpsat can spend within its limit, and
cpsat must not end slower than greedy-sweep).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import Hardware
from planner.offsets_cpsat import offsets_within
from planner.orders import DEFERRED, named_order
from planner.plan import Plan, PlanStatus, Step, StepKind
from planner.planned import Planned
from planner.planners.greedy import (
    DEFAULTS,
    Settings,
    answers_of,
    build_plan,
    planned_with_context,
    with_early_weight_stores,
)
from planner.planners.greedy_select import EVICT_RULES, Answers, Context
from planner.timeline import Timeline

# The name of the added read and of its output.
HOLD_OP = "#hold"
HOLD_OUT = "#hold.out"
# Stalls of the compute stream examined, longest first, and the crowded ops tried per tensor.
STALLS = 3
CROWDED = 2
# Prefetch distances each hold is ranked at (the plan's other settings kept), and how many of the best are then
# planned in full (one per hold and timing): those whose static offsets fit (``_fits``) rank first, and only those
# are planned when any of the best do. Static offsets decide: on NSA-64k at 60%, ranked by makespan alone, the two
# best (the LM head held, 477.07 ms without offsets; the table at prefetch distance 1, 480.15 ms) needed the
# caching allocator in full (497.19 and 506.28 ms, 5-7 s each), the third (the table at distance 2, 490.31 ms)
# placed static offsets at 490.31 ms in 0.8 s.
PREFETCH_DISTANCES = (1, 2, 4)
FINALISTS = 3
# Seconds of offsets search per ranked plan (``_fits``), as the window search's check (``cpsat/lns.py``).
FIT_CHECK_S = 0.05
# Graphs up to this size (each try is a greedy run on a copy of the graph).
HELD_MAX_OPS = 5000
# Stalls shorter than this share of the makespan are not worth a try.
MIN_STALL_SHARE = 0.01


@dataclass(frozen=True)
class Hold:
    """Bring ``tensor`` to HBM before ``after`` ends (an op of the plan's compute order) and hold it there."""

    tensor: str
    after: str

    def describe(self) -> str:
        return f"{self.tensor} held through {self.after}"


def hold_candidates(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> list[Hold]:
    """The holds worth a try on ``plan`` (``timeline`` is its executor run), most promising first: for each of the
    ``STALLS`` longest stalls of the compute stream, the largest tensor whose Prefetch the stalled op waited for,
    and the ``CROWDED`` ops with the largest working sets between that tensor's previous use and the stalled op
    that leave room for it on HBM."""
    steps, timing = plan.steps, timeline.steps
    runs = [i for i, s in enumerate(steps) if s.kind.runs_op]
    stalls: list[tuple[int, int]] = []  # (stall ns, step)
    busy = 0
    for i in runs:
        stall = timing[i].start_ns - busy
        if stall > MIN_STALL_SHARE * timeline.metrics.makespan_ns:
            stalls.append((stall, i))
        busy = max(busy, timing[i].end_ns)
    out: list[Hold] = []
    for _stall, i in sorted(stalls, key=lambda s: (-s[0], s[1]))[:STALLS]:
        op = graph.op(steps[i].target)
        idle_from = max((timing[j].end_ns for j in runs if j < i), default=0)
        waited = [t for t in dict.fromkeys(op.reads) if _fetched_late(steps, timing, t, i, idle_from)]
        if not waited:
            continue
        tensor = max(waited, key=lambda t: (graph.tensors[t].bytes, t))
        size = graph.tensors[tensor].bytes
        previous = max((j for j in runs if j < i and tensor in _touched(graph, steps[j])), default=-1)
        between = [graph.op(steps[j].target) for j in runs if previous < j < i and steps[j].kind is StepKind.COMPUTE]
        roomy = [o for o in between if graph.working_set(o) + size <= hw.hbm_bytes and tensor not in o.reads]
        # Largest working set first; of equals, the later one (nearer the use).
        ranked = sorted(enumerate(roomy), key=lambda e: (-graph.working_set(e[1]), -e[0]))
        for _k, o in ranked[:CROWDED]:
            hold = Hold(tensor, o.name)
            if hold not in out:
                out.append(hold)
    return out


def _touched(graph: Graph, step: Step) -> set[str]:
    op = graph.op(step.target)
    return set(op.reads) | set(op.outputs) | set(op.updates)


def _fetched_late(steps, timing, tensor: str, i: int, idle_from: int) -> bool:
    """Whether step ``i`` waited for a Prefetch of ``tensor``: its last one before ``i`` ended after the compute
    stream went idle."""
    last = max((j for j in range(i) if steps[j].kind is StepKind.PREFETCH and steps[j].target == tensor),
               default=None)
    return last is not None and timing[last].end_ns > idle_from


def held_graph(graph: Graph, order: list[str], hold: Hold) -> Graph:
    """``graph`` with its ops in ``order`` and the read of ``hold`` right after ``hold.after``."""
    ops: list[Op] = []
    for name in order:
        ops.append(graph.op(name))
        if name == hold.after:
            ops.append(Op(HOLD_OP, "Hold", (hold.tensor,), (HOLD_OUT,), duration_s=0.0))
    tensors = [*graph.tensors.values(), Tensor(HOLD_OUT, 1, TensorKind.ACTIVATION)]
    return Graph.build(graph.name, tensors, ops, metadata=graph.metadata)


def plan_back(graph: Graph, plan: Plan) -> Plan:
    """A plan of the held graph as a plan of ``graph``: the read's step and its output's steps dropped, a wait on
    one of them replaced by what it waited for, and the output's offsets and placement left out."""
    kept: dict[int, int] = {}
    steps: list[Step] = []
    for i, s in enumerate(plan.steps):
        if s.target in (HOLD_OP, HOLD_OUT):
            continue
        waits: set[int] = set()
        todo = list(s.waits)
        while todo:
            w = todo.pop()
            if w in kept:
                waits.add(kept[w])
            else:
                todo.extend(plan.steps[w].waits)
        kept[i] = len(steps)
        steps.append(Step(s.kind, s.target, s.stream, tuple(sorted(waits))))
    return replace(plan, graph_name=graph.name, steps=tuple(steps),
                   offsets={k: v for k, v in plan.offsets.items() if k != HOLD_OUT},
                   placement={k: v for k, v in plan.placement.items() if k != HOLD_OUT})


def settings_of(plan: Plan) -> Settings:
    """The greedy settings ``plan`` records (the defaults for those it does not)."""
    o = plan.options
    evict = o.get("evict", EVICT_RULES[0])
    return Settings(*(int(o.get(k, DEFAULTS[k])) for k in DEFAULTS), evict=evict if evict in EVICT_RULES
                    else EVICT_RULES[0])


def with_held(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline | None = None, offsets: bool = True,
              deadline: float | None = None, holds: list[Hold] | None = None) -> tuple[Plan, Timeline, Hold | None]:
    """Return (a plan at least as fast as greedy's ``plan``, its executor timeline, the hold it makes or None): greedy
    in ``plan``'s order with each candidate hold (``hold_candidates``), at ``plan``'s settings and each prefetch
    distance of ``PREFETCH_DISTANCES``, ranked without the allocator model (those whose static offsets fit first);
    of the best ``FINALISTS`` those that fit, else the best, planned in full (``held_planned``; ``offsets``: with
    static offsets, as greedy places them); the fastest is kept when the executor finds it valid and faster than
    ``plan``. Its options record the hold and the settings, which reproduce it. ``plan`` itself when no hold pays,
    on graphs above ``HELD_MAX_OPS`` ops, in the deferred orders (their graph is rewritten already), or when it is
    not valid. ``deadline`` (``time.monotonic()``): no try starts after it. ``holds``: ``holds_to_try``'s, when the
    caller has them."""
    timeline = timeline if timeline is not None else simulate(graph, hw, plan)
    holds = holds if holds is not None else holds_to_try(graph, hw, plan, timeline)
    if not holds:
        return plan, timeline, None
    order_name = str(plan.options.get("order", "auto"))
    order = named_order(graph, order_name)
    answers = answers_of(plan.options.get("recompute", True), plan.options.get("offload", True))
    base = settings_of(plan)
    ranked: list[tuple[bool, tuple[int, int], int, Hold, Settings]] = []
    seen: set = set()
    for h, hold in enumerate(holds):
        ctx = Context(held_graph(graph, order, hold), hw, "graph", answers)
        for distance in dict.fromkeys(PREFETCH_DISTANCES):
            settings = replace(base, prefetch_distance=distance)
            # Ranked at the faster of the two ways greedy issues inference weights' Stores, as the full plan takes
            # the faster (``with_early_weight_stores``): on NSA-64k at 60% the hold that won ranked third without.
            timings = []
            for early in (False, True):
                if _late(deadline):
                    break
                ctx.early_weight_stores = early
                back = plan_back(graph, build_plan(ctx, settings, hw.hbm_bytes, plan.planner))
                if back.status is PlanStatus.FEASIBLE:
                    tl = simulate(graph, hw, back, allocator=False)
                    if tl.valid:
                        timings.append((not _fits(tl, hw, offsets), tl.metrics.speed_key))
            ctx.early_weight_stores = False
            # Distances that give a hold the same timing are one finalist (their programs differ in waits only).
            if timings and (hold, min(timings)) not in seen:
                seen.add((hold, min(timings)))
                ranked.append((*min(timings), h * len(PREFETCH_DISTANCES) + distance, hold, settings))
    best: Planned | None = None
    ordered = sorted(ranked, key=lambda r: r[:3])
    # A plan whose static offsets do not fit replans for a lower budget or takes the caching allocator's
    # compactions, and costs a greedy run several times over (5-7 s against 0.8 s on NSA-64k at 60%): of the best
    # ``FINALISTS``, those that fit, else the best alone.
    for *_key, hold, settings in [r for r in ordered[:FINALISTS] if not r[0]] or ordered[:1]:
        if _late(deadline):
            break
        to_beat = (best.timeline if best else timeline).metrics
        out = held_planned(graph, hw, order_name, hold, settings, answers, offsets, plan.planner, to_beat.makespan_ns,
                           deadline)
        if out.timeline.valid and out.timeline.metrics.speed_key < to_beat.speed_key:
            best = out
    if best is None:
        return plan, timeline, None
    held = replace(best.plan, options={**plan.options, **best.plan.options}, stats={**plan.stats, **best.plan.stats})
    return held, best.timeline, parse_hold(held.options["hold"])


def holds_to_try(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> list[Hold]:
    """The holds ``with_held`` tries on ``plan`` (``timeline``: its executor run): ``hold_candidates``, or none on
    graphs above ``HELD_MAX_OPS`` ops, in the deferred orders, for a plan that holds a tensor already, or for one
    that is not valid."""
    if (not timeline.valid or plan.status is not PlanStatus.FEASIBLE or len(graph.ops) > HELD_MAX_OPS
            or DEFERRED.fullmatch(str(plan.options.get("order", "auto"))) or plan.options.get("hold")):
        return []
    return hold_candidates(graph, hw, plan, timeline)


def held_planned(graph: Graph, hw: Hardware, order: str, hold: Hold, settings: Settings, answers: Answers,
                 offsets: bool = True, name: str = "greedy", beat_ns: int | None = None,
                 deadline: float | None = None) -> Planned:
    """Greedy's plan in the order named ``order`` with ``hold`` (``held_graph``), at ``settings`` (with the early
    Stores of inference weights where faster, as greedy's own), mapped back onto ``graph`` (``plan_back``) and run
    by the executor there. ``beat_ns`` and ``deadline``: as ``planned_with_context``'s. Its options record the hold
    as ``TENSOR@OP``."""
    ctx = Context(held_graph(graph, named_order(graph, order), hold), hw, "graph", answers)
    full = planned_with_context(ctx, settings, offsets=offsets, name=name, deadline=deadline, beat_ns=beat_ns)
    full = with_early_weight_stores(ctx, settings, full, offsets, name, deadline=deadline, beat_ns=beat_ns)
    back = plan_back(graph, full.plan)
    note = f"{hold.describe()}: brought back before it ends and kept on HBM (planner/planners/greedy_held.py)"
    back = replace(back, options={**back.options, **settings.as_dict(), "order": order,
                                  "hold": f"{hold.tensor}@{hold.after}"},
                   notes=(*back.notes, note))
    return Planned(back, simulate(graph, hw, back))


def parse_hold(text: str) -> Hold:
    """``TENSOR@OP`` as a Hold."""
    tensor, _, after = str(text).rpartition("@")
    return Hold(tensor, after)


def _fits(tl: Timeline, hw: Hardware, offsets: bool) -> bool:
    """Whether static offsets for the allocator-free run ``tl`` fit the budget by the quick tries (``FIT_CHECK_S``):
    where they do not, greedy's full plan replans for a lower budget or leaves HBM to the caching allocator, and
    runs slower than its ranking said."""
    return not offsets or offsets_within(tl.residencies, hw.hbm_bytes, time_limit_s=FIT_CHECK_S)[1] <= hw.hbm_bytes


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


__all__ = ["Hold", "held_graph", "held_planned", "hold_candidates", "holds_to_try", "parse_hold", "plan_back",
           "settings_of", "with_held"]
