"""Static HBM offsets by CP-SAT: an address for every allocation of a timeline, within a capacity, when one exists.

Best fit (``planner/offsets.py``) is fast but can need 5-30% more address space than the peak on the timelines the
planners make, which fill HBM to the budget (``graphs/transformer_block.json`` at 1 GB: a 990 MB peak, 1.29 GB of
best-fit addresses). A plan whose offsets do not fit is then re-planned for a lower budget (slower) or left to the
caching allocator, whose compactions cost time. With the allocation times fixed, the address assignment is a
packing problem (dynamic storage allocation): no two allocations live at the same time may overlap in address.
OLLA (Steiner et al., 2022) solves it inside its ILP with one Boolean per such pair ("i below j, or j below i");
here the same model is solved after planning, on the times the executor gave. It is exact: "fits" means the
offsets fit, "none" within its effort means only that none was found.

Measured with ortools 9.15 (2 cores): this pairwise model answers the transformer block (56-93 allocations) and
Checkmate's ``random_layered_n100`` at 80% (110) in 0.3-0.4 s, where CP-SAT's ``NoOverlap2D`` on the same
instances took 5-11 s; neither answers timelines of 1,000+ allocations within a minute, so those keep the
heuristics: best fit and the lowest-floor descents of ``planner/offsets_search.py``, whose search also runs before
this model (on transformer_block's timelines it fits 2 of 9 that best fit and the descents miss, in 0.01-0.06 s,
one of them where this model found nothing in 2.2 s).
The search is bounded by CP-SAT's deterministic time with one worker, so that the same timeline gives the same
offsets; the wall-clock limit is only a safety net.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sized

from ortools.sat.python import cp_model

from planner.hardware import HBM
from planner.offsets import (
    Allocations,
    allocations,
    allocations_height,
    offsets_by_name,
    place_allocations,
    tries_for,
)
from planner.offsets_search import search_offsets
from planner.timeline import Residency

EXACT_MAX_BLOCKS = 400  # larger timelines keep the heuristic (measured: no gain within seconds at 1,000+ allocations)
# Pairs of allocations live at the same time (one Boolean each). transformer_block's timelines have about 900 and
# solve in 0.1-0.4 s; a LLaMA-3 training timeline of 174 allocations and 12,821 pairs took 7 s per call, over
# every deadline of greedy's retries and sweep, and found nothing: such models keep best fit.
EXACT_MAX_PAIRS = 5_000
EFFORT = 0.3  # CP-SAT deterministic time: a few seconds at most on these models, and the same answer every run


def fit_offsets(
    residencies: Iterable[Residency], capacity: int, tier: str = HBM,
    effort: float = EFFORT, time_limit_s: float = 10.0,
) -> dict[str, int | list[int]] | None:
    """Return offsets (in ``assign_offsets``'s form) with every ``tier`` allocation inside ``[0, capacity)`` and no
    two allocations live at the same time overlapping, or None when CP-SAT finds none within its effort (or the
    timeline has more than ``EXACT_MAX_BLOCKS`` allocations)."""
    allocs = allocations(residencies, tier)
    found = _fit(allocs, capacity, effort, time_limit_s)
    return None if found is None else offsets_by_name(allocs, found)


def _fit(allocs: Allocations, capacity: int, effort: float, time_limit_s: float) -> list[int] | None:
    """``fit_offsets`` on a timeline's ``Allocations``: one offset per allocation (by index), or None."""
    found = [0] * len(allocs.names)
    inst = [i for i, (s, e) in enumerate(zip(allocs.start, allocs.end)) if e > s]
    if not inst:
        return found
    if len(inst) > EXACT_MAX_BLOCKS or any(allocs.size[i] > capacity for i in inst):
        return None
    times = sorted({allocs.start[i] for i in inst} | {allocs.end[i] for i in inst})
    rank = {t: i for i, t in enumerate(times)}
    spans = [(rank[allocs.start[i]], rank[allocs.end[i]]) for i in inst]
    pairs = _overlapping_pairs(spans)
    if len(pairs) > EXACT_MAX_PAIRS:
        return None
    unit = math.gcd(capacity, *(allocs.size[i] for i in inst)) or 1
    cap = capacity // unit
    sizes = [allocs.size[i] // unit for i in inst]
    model = cp_model.CpModel()
    ys = [model.new_int_var(0, cap - size, f"y{i}") for i, size in enumerate(sizes)]
    for i, j in pairs:
        below = model.new_bool_var(f"b{i}_{j}")
        model.add(ys[i] + sizes[i] <= ys[j]).only_enforce_if(below)
        model.add(ys[j] + sizes[j] <= ys[i]).only_enforce_if(~below)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.cp_model_probing_level = 0  # measured: probing was most of the time on these small models
    solver.parameters.max_deterministic_time = float(effort)
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    for i, y in zip(inst, ys):
        found[i] = solver.value(y) * unit
    return found


def _overlapping_pairs(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Index pairs (i < j) of half-open spans that overlap, by a sweep over the starts."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    pairs: list[tuple[int, int]] = []
    active: list[int] = []
    for i in order:
        start = spans[i][0]
        active = [j for j in active if spans[j][1] > start]
        pairs.extend((min(i, j), max(i, j)) for j in active)
        active.append(i)
    return pairs


__all__ = ["EXACT_MAX_BLOCKS", "fit_offsets", "offsets_within"]


def offsets_within(
    residencies: Iterable[Residency], capacity: int, tier: str = HBM, time_limit_s: float = 10.0,
    effort: float = EFFORT,
) -> tuple[dict[str, int | list[int]], int]:
    """Return (offsets, their height) within ``capacity`` when one of these finds them, tried in turn, cheapest
    first: the (order, fit) pairs of ``assign_offsets`` (``tries_for``: all eight on timelines of up to
    ``EVERY_TRY_MAX`` allocations, fewer above); ``offsets_search``'s lowest-floor descents and its search
    (timelines of up to ``SEARCH_MAX_BLOCKS`` allocations); CP-SAT's exact assignment within ``effort``
    (deterministic seconds; timelines of up to a few hundred allocations). Otherwise the lowest offsets found,
    whose height is then above ``capacity``."""
    if not isinstance(residencies, Sized):
        residencies = list(residencies)
    allocs = allocations(residencies, tier)
    best: tuple[list[int], int] | None = None
    for order, fit in tries_for(len(residencies)):
        offs = place_allocations(allocs, order, fit)
        height = allocations_height(allocs, offs)
        if height <= capacity:
            return offsets_by_name(allocs, offs), height
        if best is None or height < best[1]:
            best = (offs, height)
    assert best is not None
    deadline = time.monotonic() + time_limit_s
    searched = search_offsets(allocs, capacity, time_limit_s=time_limit_s)
    if searched is not None:
        offs, fits = searched
        height = allocations_height(allocs, offs)
        if fits:
            return offsets_by_name(allocs, offs), height
        if height < best[1]:
            best = (offs, height)
    fitted = _fit(allocs, capacity, effort, max(0.0, deadline - time.monotonic())) if effort > 0 else None
    if fitted is not None:
        return offsets_by_name(allocs, fitted), allocations_height(allocs, fitted)
    return offsets_by_name(allocs, best[0]), best[1]
