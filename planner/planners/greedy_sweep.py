"""``greedy-sweep``: the greedy planner at its best over a grid of its four settings.

Each point of the grid is planned (sharing one prepared Context) and timed by the executor; a point that gives
the same program as an earlier one is not run again. The best valid plan wins: lowest makespan, then lowest HBM
peak, then the earliest point of the grid. The best two and the defaults are planned again with static offsets
(which may replan against a lower budget) and the best of those is returned; its settings are recorded in
``Plan.options`` (with the sweep's counts in ``Plan.stats``), so reports compare against greedy at its best
rather than at an arbitrary default. Each order's best two points are also planned with Belady's eviction rule
(``greedy_select.select_gaps``) and ranked beside the grid. With ``order=auto`` the grid is run on every order
greedy's ``auto`` plans (``greedy.auto_contexts``, and the deferred orders with their re-runs,
``greedy_deferred.py``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import partial

from planner.bounds import hbm_floor
from planner.executor import simulate
from planner.gc_pause import gc_paused
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.orders import DEFERRED
from planner.plan import Plan, PlanStatus
from planner.planned import Planned
from planner.planners.greedy import (
    DEFAULTS,
    Settings,
    _flag,
    answers_of,
    auto_contexts,
    build_plan,
    deferred_candidates,
    plan_with_context,
    planned_with_context,
    rank_planned,
    with_early_weight_stores,
)
from planner.planners.greedy_deferred import plan_deferred
from planner.planners.greedy_select import Context
from planner.polish import with_stores_earlier

FINALISTS = 2
# Each order's best points of the grid planned again with Belady's eviction rule. With two, NSA-64k at 60% of its
# peak: 532.74 -> 504.02 ms (the rule at every point of the grid finds no better plan there).
BELADY_POINTS = 2

# 13 points with the defaults (select_distance does not matter when select_num is 0); a point whose program is
# the same as an earlier point's is not run again.
DEFAULT_GRID: dict[str, tuple[int, ...]] = {
    "select_distance": (4, 16),
    "select_num": (0, 256),
    "prefetch_distance": (1, 4),
    "release_distance": (1, 4),
}


def grid_points(grid: dict[str, tuple[int, ...]] | None = None) -> list[Settings]:
    """The distinct Settings of ``grid`` (missing keys take the default), the defaults first."""
    grid = dict(DEFAULT_GRID if grid is None else grid)
    keys = ("select_distance", "select_num", "prefetch_distance", "release_distance")
    values = [tuple(grid.get(k, (DEFAULTS[k],))) for k in keys]
    out: list[Settings] = [Settings()]
    seen = {(Settings().select_distance if Settings().select_num else 0,) + tuple(Settings().as_dict().values())[1:]}
    for combo in itertools.product(*values):
        s = Settings(*(int(v) for v in combo))
        key = (s.select_distance if s.select_num else 0, s.select_num, s.prefetch_distance, s.release_distance)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def plan_greedy_sweep(
    graph: Graph, hw: Hardware, grid: dict | None = None, order: str = "auto", offsets: bool = True,
    finalists: int = FINALISTS, recompute: bool = True, offload: bool = True,
) -> Plan:
    """Return the best valid greedy plan over ``grid`` (see the module doc); the defaults' plan when none is.

    The points are ranked by their makespan without static offsets; the best ``finalists`` of them and the
    defaults are then planned in full (static offsets may lower the planning budget, see ``greedy.py``) and the
    best of those wins, so the sweep is never worse than ``greedy`` with its defaults. ``recompute`` and ``offload``
    as for ``greedy``: they hold at every point. The winner's Stores are then issued earlier in their links'
    queues where the executor finds that faster (``planner.polish.stores_earlier``).
    """
    plan = _best_point(graph, hw, grid, order, offsets, finalists, recompute, offload)
    return with_stores_earlier(graph, hw, plan)[0]


def _best_point(graph: Graph, hw: Hardware, grid: dict | None, order: str, offsets: bool, finalists: int,
                recompute: bool, offload: bool) -> Plan:
    # As greedy's own ``auto``: every order it plans is swept; of the deferred ones, the best at greedy's defaults.
    answers = answers_of(recompute, offload)
    swept = partial(swept_planned, grid=grid, offsets=offsets, finalists=finalists)
    deferred = DEFERRED.fullmatch(order)
    if deferred:
        out = plan_deferred(graph, hw, int(deferred.group(1)), answers, swept)
        if out is not None:
            return out.plan
    contexts = auto_contexts(graph, hw, answers) if order == "auto" else [Context(graph, hw, order, answers)]
    plan = sweep_contexts(contexts, grid, offsets, finalists)
    if order != "auto":
        return plan
    outs = [Planned(plan, simulate(graph, hw, plan))]
    others = deferred_candidates(graph, hw, answers,
                                 lambda ctx: planned_with_context(ctx, Settings(), offsets, name="greedy-sweep"))
    if others:
        best = min(others, key=rank_planned)
        again = plan_deferred(graph, hw, int(DEFERRED.fullmatch(best.plan.options["order"]).group(1)), answers,
                                 swept)
        outs += [best] + ([again] if again is not None else [])
    out = min(outs, key=rank_planned).plan
    return out if out.options.get("sweep") else replace(out, options=dict(out.options, sweep=True))


def sweep_contexts(contexts: list[Context], grid: dict | None = None, offsets: bool = True,
                   finalists: int = FINALISTS, defaults: bool = True) -> Plan:
    """``plan_greedy_sweep`` over prepared Contexts of one graph and hardware (a caller that ran greedy on them
    already: what they keep, such as the recompute chains' plans, is reused).

    ``defaults=False``: the defaults are not planned in full unless no other point is valid (a caller that holds
    greedy's plan at its defaults already, and keeps the better of the two), so the returned plan may be slower
    than the defaults'. Each full plan costs about a greedy run (15 s on deepseek-v3-nsa-128k-L3-1layer at 60%)."""
    return sweep_finalists(contexts, grid, offsets, finalists, defaults)[0].plan


def sweep_finalists(contexts: list[Context], grid: dict | None = None, offsets: bool = True,
                    finalists: int = FINALISTS, defaults: bool = True) -> list[Planned]:
    """``sweep_contexts``'s plans of every point it planned in full, with their executor timelines, fastest first
    (its own plan first): for a caller that passes more than the fastest through a later step that can reorder
    them (``planner/polish.py``)."""
    with gc_paused():  # as greedy (planner/gc_pause.py)
        return _sweep(contexts, grid, offsets, finalists, defaults)


def swept_planned(ctx: Context, grid: dict | None = None, offsets: bool = True, finalists: int = FINALISTS,
                  defaults: bool = True) -> Planned:
    """``sweep_contexts`` on the one Context ``ctx``, with the executor's timeline of the plan (what
    ``greedy_deferred.plan_deferred`` takes to plan a rewritten graph)."""
    plan = sweep_contexts([ctx], grid, offsets, finalists, defaults)
    return Planned(plan, simulate(ctx.graph, ctx.hw, plan))


def _sweep(contexts: list[Context], grid: dict | None, offsets: bool, finalists: int, defaults: bool = True
           ) -> list[Planned]:
    graph, hw = contexts[0].graph, contexts[0].hw
    points = grid_points(grid)
    if hw.hbm_bytes < hbm_floor(graph)[0]:
        plan = plan_with_context(contexts[0], points[0], offsets=False, name="greedy-sweep")  # infeasible: says why
        plan = replace(plan, options=dict(plan.options, sweep=True))
        return [Planned(plan, simulate(graph, hw, plan))]
    ranked: list[tuple] = []
    seen: set = set()

    def rank_point(c: int, k: int) -> None:
        plan = build_plan(contexts[c], points[k], hw.hbm_bytes, "greedy-sweep")
        if plan.steps in seen:
            return
        seen.add(plan.steps)
        tl = simulate(graph, hw, plan, allocator=False)
        if plan.status == PlanStatus.FEASIBLE and tl.valid:
            ranked.append((tl.metrics.makespan_ns, tl.metrics.peak_bytes[HBM], c, k))

    for c in range(len(contexts)):
        for k in range(len(points)):
            rank_point(c, k)
    # Each order's best points again with Belady's eviction rule (``greedy_select.select_gaps``), which wins on
    # some graphs and loses on others, so that it is ranked beside them without doubling the grid.
    grid_size = len(points)
    for c in range(len(contexts)):
        best = sorted(r for r in ranked if r[2] == c)[:BELADY_POINTS]
        for *_, k in best:
            points.append(replace(points[k], evict="belady"))
            rank_point(c, len(points) - 1)
    ranked.sort()
    offsets = _flag(offsets)
    if not offsets:
        chosen = [(c, k) for *_, c, k in ranked[:1]]
    else:
        # The best points of each order and its defaults, so that the sweep is never worse than the sweep or greedy's
        # defaults on either order alone (static offsets can reorder points ranked without them). The defaults even
        # when no point of the order was valid here: the full plan may still find one (the recompute chains).
        chosen = []
        for c in range(len(contexts)):
            mine = [(c, k) for *_, c2, k in ranked if c2 == c and (defaults or k)][: max(1, int(finalists))]
            chosen += mine + [(c, 0)] * (defaults and (c, 0) not in mine)
    planned: dict[tuple[int, int], Planned] = {}

    def best_so_far() -> int | None:
        """The makespan to beat (``beat_ns``): the fastest valid plan placed so far."""
        return min((p.timeline.metrics.makespan_ns for p in planned.values() if p.timeline.valid), default=None)

    # The best ranked first, so that the later ones know the makespan to beat.
    rank = {(c, k): i for i, (*_, c, k) in enumerate(ranked)}
    for c, k in sorted(chosen or [(0, 0)], key=lambda ck: rank.get(ck, len(rank))):
        planned[c, k] = planned_with_context(contexts[c], points[k], offsets=offsets, name="greedy-sweep",
                                             beat_ns=best_so_far())

    def key(ck: tuple[int, int]) -> tuple:
        tl = planned[ck].timeline
        return (not tl.valid, tl.metrics.makespan_ns, tl.metrics.peak_bytes.get(HBM, 0), *ck)

    # The early Stores of inference weights for the best point and for the best defaults (greedy's own plan gets
    # them), so that the sweep stays no worse than greedy.
    if defaults:
        firsts = [min(planned, key=key)]
        at_defaults = [ck for ck in planned if ck[1] == 0]  # point 0: greedy's defaults
        if at_defaults:
            firsts.append(min(at_defaults, key=key))
        for ck in dict.fromkeys(firsts):
            planned[ck] = with_early_weight_stores(contexts[ck[0]], points[ck[1]], planned[ck], offsets,
                                                   "greedy-sweep", beat_ns=best_so_far())
    counts = dict(sweep_points=grid_size, sweep_belady_points=len(points) - grid_size,
                  sweep_distinct_plans=len(seen), sweep_valid=len(ranked), sweep_finalists=len(chosen),
                  sweep_grid={k: list(v) for k, v in (DEFAULT_GRID if grid is None else grid).items()})
    return [Planned(replace(planned[ck].plan, options=dict(planned[ck].plan.options, sweep=True),
                            stats=dict(planned[ck].plan.stats, **counts)), planned[ck].timeline)
            for ck in sorted(planned, key=key)]


__all__ = ["BELADY_POINTS", "DEFAULT_GRID", "grid_points", "plan_greedy_sweep", "sweep_contexts", "sweep_finalists",
           "swept_planned"]
