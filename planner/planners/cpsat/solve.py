"""``plan_cpsat``: the CP-SAT planner's entry point.

1. A starting plan: the greedy planner (at its best sweep setting when the sweep fits in the time budget), or
   the reactive or no-offload plan when they are better or greedy is missing. It is the hint and the fallback:
   cpsat never returns a plan slower than it.
2. The scaled problem (``data.py``) in the starting plan's compute order, and a complete hint from the starting
   plan timed in ticks (``hint.py``).
3. Graphs of up to ``whole_max_ops`` ops: the whole model (``model.py``) solved with the hint. Larger graphs:
   the large-neighbourhood search (``lns.py``): windows of a few hundred ops with everything else fixed.
4. The best solution decoded (``decode.py``) and checked by the executor; static HBM offsets as greedy assigns
   them. Anything that fails falls back to the starting plan with a note saying why.

The wall-clock limit is enforced here (each solve runs in a child process that is killed at its deadline; see
``worker.py``). With ``workers=1`` (the default) the run is deterministic: CP-SAT gets a fixed seed and a
deterministic time limit (``max_deterministic_time``) instead of a wall-clock one, and the LNS budget is counted in
deterministic time, so the same input gives the same schedule, byte for byte, as long as the wall-clock limit is
not hit first (the plan then says so in its notes). ``workers >= 2`` is CP-SAT's parallel portfolio: not
reproducible.

The outcome (``planner.quality.solver_outcome``) is read from ``Plan.stats["cpsat"]``: ``stop`` (why the search
ended: one of ``planner.quality.STOP_REASONS``), ``returned`` (``start``, ``cpsat`` or ``exact``: whose plan is
returned), CP-SAT's ``status``, objective and bound. Ctrl-C (KeyboardInterrupt) during the search stops it; the
best valid plan found so far is returned, with the note ``INTERRUPTED_NOTE`` and ``stop`` = ``interrupted``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

from planner import bounds, polish
from planner.cost import op_durations_ns
from planner.defrag import spare_compactions
from planner.errors import InputError
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.offsets_cpsat import EXACT_MAX_BLOCKS
from planner.orders import DEFERRED, best_no_offload_order, first_release, live_bytes
from planner.placement import with_placement
from planner.plan import Plan, PlanStatus
from planner.planned import Planned, place_statically
from planner.planners import exact
from planner.planners.cpsat import worker
from planner.planners.cpsat.data import RECOMPUTE, Assignment, Problem, build_problem, canonical, choose_scale
from planner.planners.cpsat.decode import plan_from_assignment
from planner.planners.cpsat.hint import assignment_from_plan, check, offload_cycles, tick_times
from planner.planners.cpsat.lns import WINDOW_MIN_S, improve
from planner.planners.cpsat.model import Model, whole_frame
from planner.planners.cpsat.run import DET_PER_WALL, FINAL_RUNS, RESERVE, SIM_S_PER_OP, Progress, Run
from planner.planners.cpsat.variables import is_const
from planner.planners.greedy import (
    REFINE_MAX_OPS,
    Settings,
    answers_of,
    auto_contexts,
    build_plan,
    fastest_valid_ns,
    plan_greedy,
    planned_with_context,
    rank_planned,
    waits_for_weight_store,
    with_early_weight_stores,
)
from planner.planners.greedy_deferred import DEFERRED_EIGHTHS, DEFERRED_MAX_OPS, plan_deferred
from planner.planners.greedy_held import FINALISTS as HELD_FINALISTS
from planner.planners.greedy_held import PREFETCH_DISTANCES, holds_to_try, with_held
from planner.planners.greedy_select import Answers, Context
from planner.planners.greedy_sweep import (
    BELADY_POINTS,
    FINALISTS,
    grid_points,
    plan_greedy_sweep,
    sweep_finalists,
)
from planner.planners.none import no_offload_program, plan_none
from planner.planners.reactive import plan_reactive
from planner.timeline import Timeline

# Wall seconds of one greedy run per op (measured: 0.6 to 0.7 ms per op on the workloads in graphs/).
SWEEP_S_PER_OP = 7e-4
# A point of greedy's sweep costs about this share of one full greedy run (the sweep shares its preparation and
# places offsets only for its finalists; measured 0.17 to 0.4 on the workloads in graphs/); the sweep runs when
# it fits in this share of the time limit. Reports compare against greedy at its best, so it is worth the time.
SWEEP_POINT_SHARE = 0.4
SWEEP_LIMIT_SHARE = 0.45
# The search on a large graph: the model (about 1.5 executor runs on 29k ops), the first incumbent decoded and
# run (2), a window decoded and run (1.5), and FINAL_RUNS.
SEARCH_MIN_RUNS = 5.0 + FINAL_RUNS
# Wall seconds of one exact placement of static offsets (``offsets_cpsat.fit_offsets``: CP-SAT with a deterministic
# effort of 0.3 s, 0.1 to 0.9 s measured on transformer_block's timelines), which each finalist of a sweep on a
# small graph pays when best fit overflows the budget: on small graphs it, not the points, is most of a sweep. Since
# greedy checks its early-fetch plan's offsets too (``greedy.EARLY_OFFSETS_EFFORT``), a finalist pays up to two: 1 s
# (0.5 s before; transformer_block at 1 GB with 10 s: the sweep took 5 s of its 10 and left the search 1.5 s, and on
# a loaded machine none; now 2.1 s and the same plan, 110.87 ms).
EXACT_OFFSETS_S = 1.0
# Reactive is a starting plan on graphs of up to this many ops. Its cost grows with the evictions and fetches it
# makes, not with the ops: 0.06 to 0.8 ms per op on the workloads in graphs/ (up to 1.9k ops), 1.2 ms per op on
# the 29k-op deepseek-v3-nsa-64k with weights on host (627k steps, 35 s), 5.6 ms per op on the 38.8k-op -128k
# (216 s, planning and the executor's run): there cpsat's estimate (27 s) let it take 216 s of a 240 s limit,
# leaving no search and no bound, and the run ended 14% over its limit. Its plans there are 4x slower than greedy's.
REACTIVE_START_MAX_OPS = 10_000
# An optional phase (another starting planner) runs when its estimate is at most this share of the time left.
AFFORDABLE_SHARE = 0.25
# From this limit on, the deferred orders' starting plans (``_deferred_starts``) are planned one by one while each
# fits in this larger share of the time left: where a deferred order wins, greedy's plan in it is the start to beat
# (the paper suite at 60-80%, deepseek-v3-paper and llama3-8b-no2-4layers, all three skipped at a quarter: cpsat
# returned 2374.48, 2178.43 and 798.71 ms where greedy's own, in ``deferred-0``, ran 2207.11, 2146.44 and 746.86).
# Below it they go all or none at a quarter: on transformer_block at 1 GB with 10 s (the README's run) a larger
# share left no time for the search (110.87 -> 114.73 ms).
DEFERRED_SHARE = 0.45
DEFERRED_SHARE_MIN_S = 30.0
# Greedy's sweep gets a larger share: cpsat promises never to end slower than the sweep's best point, and its
# estimate runs high (finalists reuse what greedy's run prepared: on Checkmate's random_n500 at 0.8, 2 workers,
# 12.4 s estimated for 6.4 s spent). At 0.25 the sweep was skipped there and cpsat ended at +72.7% against the
# sweep's +54.6%. At 0.5 the sweep with one finalist (22 s estimated, 43 s left) was skipped on
# deepseek-v3-nsa-128k-L3-1layer at 60% (2 workers, 60 s): 1559.2 ms against the sweep's 1255.6.
SWEEP_AFFORDABLE_SHARE = 0.6
# Where the sweep does not fit on graphs above greedy's REFINE_MAX_OPS, greedy's best order is planned once more with
# Belady's eviction rule when that fits in this share of the time left. On the full deepseek-v3-nsa-64k (29k ops)
# at 49.1 GB: 20,657.83 ms against 22,156.03 ms at greedy's defaults, in 9.7 s (the defaults took 17.6 s), where the
# window search, which the time went to before, gains nothing (2026-12-07).
BELADY_SHARE = 0.75
# Where greedy's fastest plan there was planned for a lower budget so that its static offsets fit, it is planned again
# searching that budget halfway back up, as on small graphs, when this many full plans fit in that share: on the same
# graph, Belady's plan at 47.8 instead of 45.5 GB, 20,155.61 ms in 32.0 s. Each further full plan that fits buys one
# budget more halfway back up, up to FINER_MAX_STEPS: a count fixed by the estimates, so that a deterministic run
# plans the same budgets every run (with the clock alone deciding, the 29k-op graph at 120 s with one worker noted
# that its run may not be reproducible).
FINER_RUNS = 2.0
FINER_MAX_STEPS = 3
# When the search cannot run after the starts anyway, they may take this share of the time left instead of
# BELADY_SHARE: not all of it, since a deterministic run counts from the whole limit, and on the full graphs the CLI's
# loading, no-offload reference and writing take 10-15% of that (38.8k ops at 120 s: 14.3 s; with 1.0 the finer
# start ran there, 104.6 s wall, and the clock cut it).
START_ALL_SHARE = 0.9
# Greedy's plan with a tensor held through a crowded op (``_held_start``) runs when its estimate fits in this share
# of the time left.
HELD_SHARE = 0.45
# Sampled orders (``orders.sampled_order``) as starting orders, on graphs of more ops than the exact search covers
# (it weighs every order itself) and up to SAMPLED_MAX_OPS. Each order is scored by greedy's plan at its defaults,
# built and timed without static offsets (two points of its sweep, with and without early fetches: 10 to 20 ms an
# order on transformer_block); the SAMPLED_FULL best are planned in full (offsets that do not fit can cost a plan
# 20%), and the SAMPLED_KEEP best of those join the orders greedy planned. As many orders as SAMPLED_SHARE of the
# limit allows, up to SAMPLED_MAX: the count depends on the limit and the graph alone, so one-worker runs stay
# reproducible.
SAMPLED_MAX_OPS = 64
SAMPLED_MAX = 256
SAMPLED_SHARE = 0.1
SAMPLED_FULL = 4
SAMPLED_KEEP = 2
# The fastest starting plans, up to POLISHED_STARTS of them within POLISHED_MARGIN of the fastest, get the pass that
# issues Stores earlier (``_polished_starts``) before the best is chosen, since the pass reorders them. On
# deepseek-v3-paper at 70% cpsat's fastest start (deferred-0 at release distance 4, 2122.12 ms) went to 2112.98 ms,
# while greedy-sweep's best point (release distance 1, 2124.76 ms) went to 2109.01 ms, so cpsat, which passed only
# its best start, ended slower than greedy-sweep whenever its windows gained less than 4 ms.
POLISHED_STARTS = 3
POLISHED_MARGIN = 0.02


def plan_cpsat(
    graph: Graph,
    hw: Hardware,
    time_limit: float = 60.0,
    seed: int = 0,
    workers: int = 1,
    objective: str = "makespan",
    makespan_limit_us: float | None = None,
    whole_max_ops: int = 500,
    window_ops: int = 80,
    start: str = "auto",
    log: str | None = None,
    progress: Progress | None = None,
    wall_budget: float | None = None,
    recompute: bool = True,
    offload: bool = True,
    sampled_orders: int | None = None,
) -> Plan:
    """Plan with CP-SAT within ``time_limit`` seconds of wall-clock time (see the module doc).

    ``objective``: ``makespan`` (ties broken by bytes moved) or ``peak`` (lowest HBM peak whose makespan is at
    most ``makespan_limit_us``, default the starting plan's). ``workers=1`` (the default) makes the run
    deterministic; 2 or more run CP-SAT's parallel portfolio, which is not reproducible.
    ``log``: CP-SAT's search log (``log_target``): ``"true"`` sends it line by line to ``progress`` as
    ``{"log": line}`` (the CLI writes those to stderr), or keeps it in ``stats["cpsat"]["log"]`` without
    ``progress``; a path writes it to that file. Never to stdout.
    ``start``: the starting plan (``auto``: the best of greedy, reactive and no offload). ``progress`` receives
    dicts (phase, elapsed_s, incumbent_us, bound_us, ...) while solving; the planner itself prints nothing.
    ``wall_budget``: the seconds actually left for planning when the caller spent some of the limit already (the
    CLI's loading); deadlines use it, deterministic budgets and the recorded options use ``time_limit``.
    ``recompute``: a gap may also be dropped and its tensor made again by re-running its producer (keep, offload
    or recompute, per gap; see ``data.py``); ``offload=False`` offloads nothing by choice (remat only).
    ``sampled_orders``: how many random topological orders greedy plans before the search, its best two joining
    the starting orders (None: as the limit allows, on graphs of 13 to 64 ops; ``sampled_count``).
    """
    return plan_cpsat_timed(graph, hw, time_limit, seed, workers, objective, makespan_limit_us, whole_max_ops,
                            window_ops, start, log, progress, wall_budget, recompute, offload, sampled_orders).plan


def plan_cpsat_timed(
    graph: Graph,
    hw: Hardware,
    time_limit: float = 60.0,
    seed: int = 0,
    workers: int = 1,
    objective: str = "makespan",
    makespan_limit_us: float | None = None,
    whole_max_ops: int = 500,
    window_ops: int = 80,
    start: str = "auto",
    log: str | None = None,
    progress: Progress | None = None,
    wall_budget: float | None = None,
    recompute: bool = True,
    offload: bool = True,
    sampled_orders: int | None = None,
) -> Planned:
    """``plan_cpsat`` with the executor's full timeline of the plan it returns (cpsat compares its candidates by
    their full timelines, so it has it)."""
    if objective not in ("makespan", "peak"):
        raise ValueError(f"objective must be 'makespan' or 'peak', not {objective!r}")
    time_limit = float(time_limit)
    run = Run.start(graph, hw, time_limit, seed, workers, progress)
    run.recompute, run.offload = bool(recompute), bool(offload)
    run.sampled_orders = None if sampled_orders is None else int(sampled_orders)
    if wall_budget is not None:
        run.wall_limit = min(time_limit, float(wall_budget))
    log_file = None
    target, path = log_target(log)
    if target == "file":
        try:
            log_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed after the search, below
        except OSError as exc:
            raise InputError("command line", "-O log", f"cannot write the search log to {path!r}: {exc}") from None

        def to_file(line: str) -> None:
            log_file.write(line.rstrip("\n") + "\n")
            log_file.flush()  # a search stopped by Ctrl-C or a kill still leaves its log so far

        run.log_sink = to_file
    elif target == "stream" and progress is not None:
        def to_progress(line: str) -> None:
            try:
                progress({"log": line.rstrip("\n")})
            except Exception:  # noqa: BLE001 - a display must never break planning
                pass

        run.log_sink = to_progress
    try:
        return _plan(run, target != "off", objective, makespan_limit_us, whole_max_ops, window_ops, start)
    finally:
        if log_file is not None:
            log_file.close()


def log_target(log: object) -> tuple[str, str | None]:
    """What ``log`` asks for: ``("off", None)`` (None, false, no, 0, empty), ``("stream", None)`` (true, yes, 1:
    to ``progress``, else kept in the stats), or ``("file", path)``."""
    if log is None or log is False:
        return "off", None
    if log is True:
        return "stream", None
    text = str(log).strip()
    if text.lower() in ("", "false", "no", "0", "none"):
        return "off", None
    if text.lower() in ("true", "yes", "1"):
        return "stream", None
    return "file", text


def _plan(run: Run, log: bool, objective: str, makespan_limit_us: float | None, whole_max_ops: int,
          window_ops: int, start: str) -> Planned:
    graph, hw, time_limit = run.graph, run.hw, run.time_limit
    options = {"time_limit": time_limit, "seed": run.seed, "workers": run.workers, "objective": objective,
               "whole_max_ops": whole_max_ops, "window_ops": window_ops}
    if makespan_limit_us is not None:
        options["makespan_limit_us"] = makespan_limit_us
    # Always recorded: the bound a report quotes for the plan depends on whether it could recompute.
    options["recompute"], options["offload"] = run.recompute, run.offload
    if run.sampled_orders is not None:
        options["sampled_orders"] = run.sampled_orders
    run.report(phase="start plan")
    (base, base_tl), (seed, seed_tl) = starting_plans(run, start, windows=len(graph.ops) > whole_max_ops)
    worker.python_sigint()  # the starting planners may have run CP-SAT here (static offsets): Ctrl-C is ours again
    run.record.start_planner = base.planner
    run.record.start_makespan_us = base_tl.metrics.makespan_ns / 1000
    best_plan, best_tl = base, base_tl
    compute = sum(op_durations_ns(graph, hw).values())
    # Makespan >= the compute (one compute stream): a plan at it is optimal over every plan.
    run.record.compute_us = compute / 1000
    floor, why = bounds.hbm_floor(graph)
    try:
        if run.interrupted:
            result = None
            run.record.model = run.record.model or "none"
        elif hw.hbm_bytes < floor:
            result = None
            run.notes.append(f"infeasible: the HBM budget of {hw.hbm_bytes} B is below {why} ({floor} B); no plan "
                             "can fit")
            run.record.status = "INFEASIBLE"
            run.record.model = "none"
            run.record.stop = "infeasible"
        elif objective == "makespan" and base_tl.valid and base_tl.metrics.makespan_ns <= compute:
            result = None
            run.notes.append(f"the starting plan ({base.planner}) already runs at the compute bound: optimal")
            run.record.optimal = True
            run.record.model = "none"
            run.record.status = "OPTIMAL"
            run.record.stop = "compute_bound"
        else:
            result = _optimise(run, seed, seed_tl, objective, makespan_limit_us, whole_max_ops, window_ops, log)
    except KeyboardInterrupt:
        # Ctrl-C outside a solve (decoding, the executor, HBM placement): the starting plan is the best valid plan
        # at hand.
        result = None
        run.interrupt()
    except Exception as exc:  # noqa: BLE001 - any failure falls back to the starting plan
        result = None
        run.notes.append(f"cpsat failed ({type(exc).__name__}: {exc}); returning the {base.planner} plan")
        run.record.stop = "failed"
    if result is not None:
        plan, tl = result
        if _better(tl, best_tl, objective):
            best_plan, best_tl = plan, tl
        elif tl.valid:
            run.notes.append(f"cpsat found nothing better than its starting plan ({base.planner}); it returns that")
    run.record.returned = "start" if best_plan is base else "cpsat"
    # The bound holds for every plan, so it is computed before the polish below, which gets what is left (the main
    # job on the 29k-op graph at 64 GB spent 9.7 s on the Stores and then had no time left for the bound's 3 s). It
    # is computed whatever the clock says (about one executor run): every report quotes it, and the CLI computed it
    # after the limit anyway when cpsat skipped it, while the plan's notes said there was no gap vs bound and that
    # the run might not be reproducible (the 38.8k-op graph at 64 GB).
    if objective == "makespan" and not run.interrupted:
        run.makespan_bound()
    if objective == "makespan" and best_tl.valid and not run.interrupted:
        best_plan, best_tl = _stores_earlier(run, best_plan, best_tl, base, base_tl)
    if objective == "makespan" and hw.hbm_bytes >= floor and not run.interrupted:
        best_plan, best_tl = _prove_small(run, best_plan, best_tl)
    run.record.runtime_s = round(run.elapsed, 3)
    run.record.makespan_us = best_tl.metrics.makespan_ns / 1000
    run.record.peak_hbm_bytes = best_tl.metrics.peak_bytes[HBM]
    if not run.interrupted:
        _bounds(run, best_tl, objective)
    run.report(phase="done", incumbent_us=best_tl.metrics.makespan_ns / 1000)
    notes = list(best_plan.notes) if best_plan is not base else list(base.notes)
    notes += run.notes
    status = best_plan.status if best_tl.valid else PlanStatus.INFEASIBLE
    # Only the program, placement and offsets decide the timeline, and they are best_plan's.
    stats = {"cpsat": run.record.to_dict(), **({"start": base.stats} if base.stats else {})}
    plan = replace(best_plan, planner="cpsat", options=options, notes=tuple(dict.fromkeys(notes)), stats=stats,
                   status=status)
    return Planned(plan, best_tl)


def _stores_earlier(run: Run, plan: Plan, tl: Timeline, base: Plan, base_tl: Timeline) -> tuple[Plan, Timeline]:
    """The best plan with its Stores issued earlier where the executor finds that faster (``planner/polish.py``),
    and the starting plan so treated too when the search returns another: greedy-sweep returns its plan after the
    same pass, and cpsat must not end slower than that. Returns the faster; the moves are in the record."""
    # A pass costs up to MAX_RUNS executor runs (0.3 s on NSA-64k, several seconds on 20,000 ops): it runs until
    # half of the share of the limit kept for what follows the search (the bound needs about one run more), and a
    # note says when the clock, not its run count, ended it.
    deadline = run.deadline + RESERVE * run.limit_s / 2
    best = plan, tl
    for cand, cand_tl in [(plan, tl)] + ([(base, base_tl)] if plan is not base and base_tl.valid else []):
        if not polish.runs_allowed(cand):
            continue  # a program too long for the pass (the full-size graphs'): greedy-sweep skips it too
        if time.monotonic() >= deadline:
            run.clock_cut("Stores were not issued earlier: no time was left for that pass")
            break
        moved_plan, moved_tl, moved = polish.stores_earlier(run.graph, run.hw, cand, cand_tl, deadline=deadline)
        if time.monotonic() >= deadline:
            run.clock_cut("the clock ended the pass that issues Stores earlier")
        if moved and _better(moved_tl, best[1], "makespan"):
            best = moved_plan, moved_tl
            run.record.stores_earlier = moved
            run.record.returned = "start" if cand is base else run.record.returned
    if best[0] is not plan:
        run.notes.append(polish.moved_note(run.record.stores_earlier))
    return best


def _prove_small(run: Run, plan: Plan, tl: Timeline) -> tuple[Plan, Timeline]:
    """On graphs small enough for the exact search (``planner/planners/exact.py``: every order), run it in the time
    left: cpsat's own model fixes one order, so only this proves a plan optimal over every plan. Returns the
    faster of ``plan`` and the exact plan; records the proven optimum in ``stats["exact_optimum_us"]``."""
    if len(run.graph.ops) > exact.MAX_OPS:
        return plan, tl
    if run.recompute and any(op.recomputable for op in run.graph.ops):
        # The exact search covers plans without recompute steps: its optimum bounds nothing here.
        return plan, tl
    if run.left() < 0.5:
        run.clock_cut("the exact search over every order did not run: no time was left")
        return plan, tl
    try:
        found = exact.search_exact(run.graph, run.hw, time_limit=max(0.5, 0.8 * run.left()), start=plan)
    except Exception as exc:  # noqa: BLE001 - too many orders, or a failure: cpsat's plan stands
        run.notes.append(f"the exact search did not run ({exc})")
        return plan, tl
    st = found.stats.get("exact", {})
    if not st.get("proven"):
        run.clock_cut("the exact search over every order did not finish in the time left")
        return plan, tl
    run.record.exact_optimum_us = st["optimum_ns"] / 1000
    found_tl = simulate(run.graph, run.hw, found)
    # An invalid plan (a start that does not fit, returned when the search found nothing) may look faster.
    if found_tl.valid and (not tl.valid or found_tl.metrics.makespan_ns < tl.metrics.makespan_ns):
        plan, tl = found, found_tl
        run.record.returned = "exact"
    if not tl.valid:
        return plan, tl
    above = tl.metrics.makespan_ns - st["optimum_ns"]
    run.notes.append("proven optimal over every order by the exact search" if above <= 0 else
                     f"the exact search over every order proves the optimum is {st['optimum_ns']} ns: this plan runs "
                     f"{above} ns above it")
    return plan, tl


def _bounds(run: Run, tl: Timeline, objective: str) -> None:
    """Gaps against lower bounds that hold ("vs bound"), and against the model's own bound when it was whole."""
    rec = run.record
    if objective == "peak":
        b = bounds.hbm_bound(run.graph)
        rec.bound_bytes, rec.bound_reason = b.value, b.reason
        rec.gap_vs_bound = bounds.gap(tl.metrics.peak_bytes[HBM], b.value)
        return
    b = run.makespan_bound()
    ms = tl.metrics.makespan_ns
    rec.bound_us, rec.bound_reason, rec.gap_vs_bound = b.value / 1000, b.reason, bounds.gap(ms, b.value)
    if rec.model == "whole" and rec.model_bound_us:
        # CP-SAT's bound is on the scaled model (durations rounded up to ticks, sizes up to units, the candidate
        # gaps only): a bound for that model, not for every plan.
        rec.gap_vs_model_bound = bounds.gap(ms / 1000, rec.model_bound_us)


def _better(tl: Timeline, ref: Timeline, objective: str) -> bool:
    if not tl.valid:
        return False
    if not ref.valid:
        return True
    a, b = tl.metrics, ref.metrics
    if objective == "peak":
        return (a.peak_bytes[HBM], a.makespan_ns) < (b.peak_bytes[HBM], b.makespan_ns)
    return a.speed_key < b.speed_key


# The planners cpsat may start from (``-O start=NAME``); ``auto`` tries greedy, then reactive and no offload.
STARTING_PLANNERS = {"greedy": plan_greedy, "greedy-sweep": plan_greedy_sweep, "reactive": plan_reactive,
                     "none": plan_none}


def starting_plan(run: Run, start: str = "auto") -> tuple[Plan, Timeline]:
    """The best valid plan among greedy (swept when affordable), reactive and no offload, within the clock."""
    return starting_plans(run, start)[0]


def starting_plans(run: Run, start: str = "auto", windows: bool = False
                   ) -> tuple[tuple[Plan, Timeline], tuple[Plan, Timeline]]:
    """(the best valid plan among greedy (swept when affordable), reactive and no offload, within the clock; the
    plan the search starts from: that one, or greedy's plan in an order with more room (``_search_start``)).
    ``windows``: the search will be the window search, which improves only a plan that fits, so an explicit
    ``start`` whose plan does not fit gives way to greedy's (the whole model finds plans from such a hint).

    Greedy comes first and is always run (it is the usual winner and the fallback); its replanning for static
    offsets stops where it would overrun the limit. Its sweep, reactive and no offload run only when
    their estimated cost fits in the time left (``_affordable``); no offload is skipped when its memory count
    is over the budget (it cannot be valid).
    """
    g, hw = run.graph, run.hw
    cands: list[tuple[Plan, Timeline]] = []
    # Reactive offloads as a runtime would: not a start for a remat-only run.
    names = [n for n in ("greedy", "reactive", "none") if run.offload or n != "reactive"] if start == "auto" \
        else [start]
    # An explicit start that does not fit leaves the window search no valid incumbent to improve (the windows keep
    # what fits): greedy's plan is then the fallback start.
    fallback = windows and start not in ("auto", "greedy")
    if fallback:
        names.append("greedy")
    greedy_s = None
    # The orders greedy planned (the one its defaults did best on first) and its seconds on each.
    greedy_ctxs: list[tuple[Context, float]] = []
    greedy_plans: list[tuple[Context, Planned]] = []  # and its plan in each, the same order
    deferred: list[tuple[Plan, Timeline]] = []  # greedy's plans in the deferred orders, at its defaults
    for name in names:
        fn = STARTING_PLANNERS.get(name)
        if fn is None:
            continue
        if name == "greedy" and fallback:
            if any(tl.valid for _p, tl in cands):
                break
            run.notes.append(f"the {start} start does not fit the budget; the search starts from greedy's plan, "
                             "since it improves only a plan that fits")
        t = time.monotonic()
        if name != "greedy" and cands and any(tl.valid for _p, tl in cands):
            if name == "none" and _none_over_budget(g, hw):
                run.notes.append("no offload is not a starting plan: its memory count is over the budget")
                continue
            if name == "reactive" and len(g.ops) > REACTIVE_START_MAX_OPS:
                run.notes.append(f"reactive is not a starting plan above {REACTIVE_START_MAX_OPS:,} ops: its time "
                                 "grows with the evictions it makes, which no estimate by ops bounds")
                continue
            # Estimated like a greedy run (planning, then a full executor run).
            estimate = len(g.ops) * SWEEP_S_PER_OP if run.deterministic or greedy_s is None else greedy_s
            if not _affordable(run, estimate):
                run.notes.append(f"{name} is not a starting plan: about {estimate:.0f} s, more than the time left "
                                 "allows")
                continue
            run.start_s += len(g.ops) * SWEEP_S_PER_OP
        try:
            if name == "greedy":
                # Every order greedy's auto plans (one unless optimizer steps release store-backs). Its replanning
                # for static offsets stops only where it would overrun the limit: the starting plan is the
                # fallback and usually the hint, worth the time.
                answers = answers_of(run.recompute, run.offload)
                # The order search (about 1 s per 1,000 ops) only when it leaves the time limit its search.
                contexts = auto_contexts(g, hw, answers, searched=_affordable(run, 2 * len(g.ops) * SWEEP_S_PER_OP))
                # With the searched order too (auto_contexts: only under memory pressure, where it peaks lowest;
                # remat-only on Checkmate's random n100 at 0.8: +4.0% against +139% in auto). Every order is
                # planned, as greedy does, in the same order (the searched one last, so the deadline can cut only it).
                # Greedy per order (and the order search), with the exact offsets its plans pay on small graphs.
                exact = EXACT_OFFSETS_S if len(g.ops) <= EXACT_MAX_BLOCKS else 0.0
                run.start_s += len(contexts) * (len(g.ops) * SWEEP_S_PER_OP + exact) + (
                    2 * len(g.ops) * SWEEP_S_PER_OP if any(c.order_name == "searched" for c in contexts) else 0.0)
                outs, spent = [], []
                for ctx in contexts:
                    t_ctx = time.monotonic()
                    # An order's evictions against compactions must beat the orders before it (greedy's rule).
                    outs.append(planned_with_context(ctx, Settings(), deadline=run.deadline,
                                                     beat_ns=fastest_valid_ns(outs)))
                    spent.append(time.monotonic() - t_ctx)
                    if outs[-1].plan.stats.get("deadline_cut"):
                        run.clock_cut()
                t_sampled = time.monotonic()
                for ctx, out, s in _sampled(run, answers, contexts):
                    contexts.append(ctx)
                    outs.append(out)
                    spent.append(s)
                t += time.monotonic() - t_sampled  # greedy's own time estimates reactive's: not the sampling's
                best_k = min(range(len(outs)), key=lambda k: rank_planned(outs[k]))
                # Inference graphs: the best order once more with its weights' Stores at the step's start.
                early_s = len(g.ops) * SWEEP_S_PER_OP if run.deterministic else spent[best_k]
                if waits_for_weight_store(contexts[best_k], outs[best_k]) and _affordable(run, early_s):
                    run.start_s += len(g.ops) * SWEEP_S_PER_OP
                    outs[best_k] = with_early_weight_stores(contexts[best_k], Settings(), outs[best_k],
                                                            deadline=run.deadline)
                out = outs[best_k]
                greedy_ctxs = [(contexts[k], spent[k]) for k in [best_k] + [k for k in range(len(outs)) if k != best_k]]
                greedy_plans = [(contexts[k], outs[k]) for k in [best_k] + [k for k in range(len(outs)) if k != best_k]]
                cands.append((out.plan, out.timeline))
                deferred = _deferred_starts(run, answers, max(spent))
                cands += deferred
            else:
                kw = {"recompute": run.recompute, "offload": run.offload} if name.startswith("greedy") else {}
                plan = fn(g, hw, **kw)
                cands.append((plan, simulate(g, hw, plan)))
        except KeyboardInterrupt:
            # Ctrl-C: with a valid candidate in hand, that is the answer; without one there is nothing to return.
            if not any(tl.valid for _p, tl in cands):
                raise
            run.interrupt()
            break
        except Exception as exc:  # noqa: BLE001
            run.notes.append(f"starting planner {name} failed: {exc}")
            continue
        if name == "greedy":
            greedy_s = time.monotonic() - t
            if greedy_ctxs:
                _start_sweep(run, greedy_ctxs, cands)
                if run.interrupted:
                    break
                cands += _deferred_sweep(run, answers, deferred, max(s for _ctx, s in greedy_ctxs))
                if run.interrupted:
                    break
                cands += _held_start(run, cands)
                if run.interrupted:
                    break
    # Where the whole model runs, it places the Stores itself, from the start's as a hint: a pass on the starts
    # took time from it, and its start then did better than its search on transformer_block at 1 GB with 10 s
    # (105.55 ms, against 104.84 ms from the unpassed start).
    if windows and not run.interrupted:
        cands += _polished_starts(run, cands)
    valid = [c for c in cands if c[1].valid]
    pool = valid or cands
    if not pool:
        raise RuntimeError("no starting plan")
    best = min(pool, key=lambda c: (c[1].metrics.makespan_ns, c[1].metrics.peak_bytes[HBM]))
    # The fastest of each planner's plans: greedy gives several (its orders, the deferred and sampled ones).
    fastest: dict[str, float] = {}
    for plan, tl in cands:
        if tl.valid:
            us = tl.metrics.makespan_ns / 1000
            fastest[plan.planner] = min(us, fastest.get(plan.planner, us))
    run.record.start_candidates = fastest
    return best, _search_start(run, best, greedy_plans)


def _polished_starts(run: Run, cands: list[tuple[Plan, Timeline]]) -> list[tuple[Plan, Timeline]]:
    """The fastest valid starting plans (``POLISHED_STARTS`` distinct ones within ``POLISHED_MARGIN`` of the
    fastest) with their Stores issued earlier where the executor finds that faster (``planner/polish.py``): those
    the pass made faster, as more starting candidates. A plan's pass runs with as many of its executor runs as fit
    in the time left (``_affordable``: the sweep's share for the fastest plan, the usual one for the others), halved
    down to ``polish.MIN_RUNS``.

    Why: greedy-sweep passes its best point, and the pass can reorder plans: a start that is not the fastest before
    it may be after it, and cpsat promises never to end slower than greedy-sweep. ``starting_plans`` runs it where
    the window search follows: the whole model places the Stores itself."""
    valid = sorted((c for c in cands if c[1].valid), key=lambda c: c[1].metrics.speed_key)
    if not valid:
        return []
    limit = valid[0][1].metrics.makespan_ns * (1 + POLISHED_MARGIN)
    chosen: list[tuple[Plan, Timeline]] = []
    for plan, tl in valid:
        if tl.metrics.makespan_ns > limit or len(chosen) >= POLISHED_STARTS:
            break
        # One plan per makespan and peak: plans alike in both are mostly alike in their Stores (generated-20k at
        # 60%: greedy's plan and two of its sweep's finalists, 12395.00 ms each, none of which 20 runs moved).
        if not any(tl.metrics.speed_key == t.metrics.speed_key for _p, t in chosen):
            chosen.append((plan, tl))
    # One run timed, where no estimate of the clock's is at hand: the op count's (0.38 s on deepseek-v3-paper)
    # runs ten times high on plans whose programs are short for their ops (0.03 s there).
    per_run = len(run.graph.ops) * SIM_S_PER_OP if run.deterministic else (run.sim_s or _timed_s(run, valid[0][0]))
    out: list[tuple[Plan, Timeline]] = []
    for k, (plan, tl) in enumerate(chosen):
        runs = polish.runs_allowed(plan)
        # The fastest plan's pass as greedy-sweep's own gets the sweep's share: on generated-20k at 60% (60 s,
        # 2 workers) the first move was past the 20 runs a quarter of the time left allowed, and the search had too
        # little time to gain anything there (cpsat 12395.00 ms, greedy-sweep 12391.20 ms).
        share = SWEEP_AFFORDABLE_SHARE if k == 0 else AFFORDABLE_SHARE
        while runs >= polish.MIN_RUNS and not _affordable(run, runs * per_run, share):
            runs //= 2
        if runs < polish.MIN_RUNS:
            continue
        run.start_s += runs * per_run if run.deterministic else 0.0
        moved_plan, moved_tl, moved = polish.stores_earlier(run.graph, run.hw, plan, tl, max_runs=runs,
                                                            deadline=run.deadline)
        if time.monotonic() >= run.deadline:
            run.clock_cut("the clock ended the pass that issues the starting plans' Stores earlier")
        if moved:
            out.append((replace(moved_plan, stats=dict(moved_plan.stats, stores_earlier=moved),
                                notes=(*moved_plan.notes, polish.moved_note(moved))), moved_tl))
    return out


def _timed_s(run: Run, plan: Plan) -> float:
    """Seconds of one executor run of ``plan`` (``Run.timed``, which keeps it for the estimates)."""
    run.timed(plan)
    return run.sim_s


def _held_start(run: Run, cands: list[tuple[Plan, Timeline]]) -> list[tuple[Plan, Timeline]]:
    """Greedy's fastest plan so far planned again with a large tensor held on HBM through a crowded op
    (``greedy_held.with_held``), as a starting candidate when faster; [] when it is not. (greedy-sweep does not
    make this pass: on NSA-128k at 60% it takes 28 s, which cpsat cannot spend within 60 s, and cpsat promises never
    to end slower than greedy-sweep.)

    Deterministic runs estimate its tries from the op count (greedy's cheap ranking of each candidate hold, two per
    prefetch distance, then its finalists in full) and make them all when that fits in ``HELD_SHARE`` of the time
    left (a note says when not); the others try until that share of the time left has passed. The whole run's
    deadline stops a finalist's replanning for static offsets either way, as greedy's start."""
    g, hw = run.graph, run.hw
    mine = [(p, tl) for p, tl in cands if p.planner.startswith("greedy") and tl.valid]
    if not mine:
        return []
    plan, tl = min(mine, key=lambda c: c[1].metrics.speed_key)
    holds = holds_to_try(g, hw, plan, tl)
    if not holds:
        return []
    if run.deterministic:
        # As the start sweep's estimate: a point at a share of a greedy run, a finalist a greedy run and the exact
        # offsets model's effort on small graphs.
        full = len(g.ops) * SWEEP_S_PER_OP
        exact = EXACT_OFFSETS_S if len(g.ops) <= EXACT_MAX_BLOCKS else 0.0
        estimate = full * len(holds) * len(PREFETCH_DISTANCES) * 2 * SWEEP_POINT_SHARE + HELD_FINALISTS * (full + exact)
        if not _affordable(run, estimate, HELD_SHARE):
            run.notes.append(f"no tensor held through a crowded op: about {estimate:.0f} s, more than the time "
                             "left allows")
            return []
        run.start_s += estimate
        deadline = run.deadline
    else:
        deadline = min(run.deadline, time.monotonic() + HELD_SHARE * max(0.0, run.left()))
    held, held_tl, hold = with_held(g, hw, plan, tl, deadline=deadline, holds=holds)
    if time.monotonic() > deadline:
        run.clock_cut()
    return [] if hold is None else [(held, held_tl)]


def _deferred_starts(run: Run, answers: Answers, greedy_s: float) -> list[tuple[Plan, Timeline]]:
    """Greedy's plans in the deferred orders with their re-runs (``greedy_deferred.plan_deferred``), as starting
    candidates, each estimated as a greedy run on a graph up to a fifth larger (``greedy_s``: greedy's longest run on
    an order here; deterministic runs estimate it from the op count). Below ``DEFERRED_SHARE_MIN_S`` all or none,
    when all fit in a quarter of the time left; from it one by one, in the order of ``DEFERRED_EIGHTHS``, each while
    it fits in ``DEFERRED_SHARE`` of the time left."""
    g, hw = run.graph, run.hw
    if not answers.recompute or len(g.ops) > DEFERRED_MAX_OPS or not first_release(g):
        return []
    per_run = 1.2 * (len(g.ops) * SWEEP_S_PER_OP if run.deterministic else greedy_s)
    rewritten = lambda ctx: planned_with_context(ctx, Settings(), deadline=run.deadline)  # noqa: E731
    if run.time_limit < DEFERRED_SHARE_MIN_S:
        estimate = len(DEFERRED_EIGHTHS) * per_run
        if not _affordable(run, estimate):
            run.notes.append(f"no deferred orders: about {estimate:.0f} s, more than the time left allows")
            return []
        run.start_s += estimate
        planned = [plan_deferred(g, hw, e, answers, rewritten) for e in DEFERRED_EIGHTHS]
    else:
        planned = []
        for k, eighths in enumerate(DEFERRED_EIGHTHS):
            if not _affordable(run, per_run, DEFERRED_SHARE):
                skipped = ", ".join(f"deferred-{e}" for e in DEFERRED_EIGHTHS[k:])
                run.notes.append(f"{skipped} not planned: about {per_run:.0f} s each, more than the time left allows")
                break
            run.start_s += per_run
            planned.append(plan_deferred(g, hw, eighths, answers, rewritten))
    return [(out.plan, out.timeline) for out in planned if out is not None]


def _deferred_sweep(run: Run, answers: Answers, starts: list[tuple[Plan, Timeline]], greedy_s: float
                   ) -> list[tuple[Plan, Timeline]]:
    """Greedy's sweep on the deferred order whose plan at greedy's defaults (in ``starts``) is fastest, as
    ``greedy-sweep`` sweeps it, as a starting candidate: [] when no deferred plan is valid or the sweep does not fit
    in ``SWEEP_AFFORDABLE_SHARE`` of the time left (a note says so). Estimated as ``_start_sweep`` estimates one
    order, with each full plan as a greedy run on a graph up to a fifth larger (``greedy_s``: greedy's longest run
    on an order here; deterministic runs estimate it from the op count), and each point, where the start sweep
    timed one (``Run.point_s``), as that point on a graph up to a fifth larger.

    Why: cpsat promises never to end slower than the sweep's best point, and on training graphs that point can be
    a deferred order's: on deepseek-v3-paper at 70% (60 s, 2 workers) greedy-sweep's best was ``deferred-0`` at
    prefetch distance 4 (2124.76 ms, 2.6 s for that order's sweep), while cpsat started from the order's plan at
    the defaults (2152.11 ms) and ended at 2130.23 ms."""
    valid = [(plan, tl) for plan, tl in starts if tl.valid and DEFERRED.fullmatch(plan.options.get("order", ""))]
    if not valid:
        return []
    g, hw = run.graph, run.hw
    best = min(valid, key=lambda c: (c[1].metrics.makespan_ns, c[1].metrics.peak_bytes[HBM]))[0]
    eighths = int(DEFERRED.fullmatch(best.options["order"]).group(1))
    full = 1.2 * (len(g.ops) * SWEEP_S_PER_OP if run.deterministic else greedy_s)
    if run.deterministic or not run.point_s:
        cost = full * (_sweep_points() * SWEEP_POINT_SHARE + FINALISTS)
    else:
        # The points as the start sweep's probe measured one (on a graph up to a fifth larger): a point is far
        # cheaper than the share of a greedy run assumed above on deepseek-v3-paper (0.4 of 2.2 s assumed, about
        # 0.15 s measured), where that estimate, 23 s against the 2.6-4 s the sweep takes, skipped it on a busy
        # day and cpsat ended at 2131.06 ms, slower than greedy-sweep's 2109.01 ms at 70%.
        cost = 1.2 * run.point_s * _sweep_points() + full * FINALISTS
    if not _affordable(run, cost, SWEEP_AFFORDABLE_SHARE):
        run.notes.append(f"greedy's sweep of order {best.options['order']} not planned: about {cost:.0f} s, more "
                         "than the time left allows")
        return []
    run.start_s += cost if run.deterministic else 0.0
    # Every finalist of the sweep, each mapped back as the first is: the pass that issues Stores earlier can
    # reorder them (``_polished_starts``).
    finalists: list[Planned] = []

    def rewritten(k: int, ctx: Context) -> Planned:
        if not finalists:
            finalists.extend(sweep_finalists([ctx], defaults=False))
        return finalists[k]

    out: list[tuple[Plan, Timeline]] = []
    try:
        k = 0
        while k == 0 or k < len(finalists):
            back = plan_deferred(g, hw, eighths, answers, partial(rewritten, k))
            if back is None:
                break
            out.append((back.plan, back.timeline))
            k += 1
    except KeyboardInterrupt:
        run.interrupt()
    except Exception as exc:  # noqa: BLE001
        run.notes.append(f"greedy's sweep of order {best.options['order']} failed: {exc}")
    return out


def sampled_count(run: Run) -> int:
    """How many sampled orders greedy scores before the search: the ``sampled_orders`` option, else as many as
    ``SAMPLED_SHARE`` of the limit allows (at most ``SAMPLED_MAX``) on graphs of more than ``exact.MAX_OPS`` and
    at most ``SAMPLED_MAX_OPS`` ops, else none."""
    if run.sampled_orders is not None:
        return run.sampled_orders
    if not exact.MAX_OPS < len(run.graph.ops) <= SAMPLED_MAX_OPS:
        return 0
    return min(SAMPLED_MAX, int(SAMPLED_SHARE * run.time_limit / _sampled_s(run.graph)))


def _sampled_s(graph: Graph) -> float:
    """The estimated seconds to score one sampled order: two points of greedy's sweep."""
    return 2 * len(graph.ops) * SWEEP_S_PER_OP * SWEEP_POINT_SHARE


def _sampled(run: Run, answers: Answers, known: list[Context]) -> list[tuple[Context, Planned, float]]:
    """Greedy's plans in the best of the sampled orders ``sampled-0``, ``sampled-1``, ... (``sampled_count`` of
    them, those equal to an order of ``known`` left out): up to ``SAMPLED_KEEP``, each with its context and the
    seconds its full plan took.

    Why: the whole model and the windows keep their starting plan's order, and the orders derived from rules are
    not the best ones on small training graphs (``orders.sampled_order``). Scored by greedy without static
    offsets, then the best few planned in full, as an order whose offsets do not fit loses its lead there. With
    one worker on transformer_block (60 s): 82.13 -> 78.31 ms at 60% of its peak, 103.93 -> 100.4 ms at 1 GB; with
    two the whole model reaches the same range from either start.
    """
    count = sampled_count(run)
    if count <= 0:
        return []
    g, hw = run.graph, run.hw
    exact_s = EXACT_OFFSETS_S if len(g.ops) <= EXACT_MAX_BLOCKS else 0.0
    cost = count * _sampled_s(g) + SAMPLED_FULL * (len(g.ops) * SWEEP_S_PER_OP + exact_s)
    # An optional phase like the other starting planners: with 10 s on transformer_block at 1 GB it would leave
    # greedy's sweep and the whole model no time (114.7 ms against 110.9 ms without it).
    if run.sampled_orders is None and not _affordable(run, cost):
        run.notes.append(f"no sampled orders: scoring {count} and planning the best {SAMPLED_FULL} in full (about "
                         f"{cost:.0f} s) does not fit in the time left")
        return []
    run.start_s += cost
    # Twice their share of the limit on the wall clock at most (a loaded machine), then the orders scored so far.
    stop = time.monotonic() + 2 * SAMPLED_SHARE * run.limit_s
    seen = {tuple(c.order) for c in known}
    scored: list[tuple[float, int, Context]] = []
    for k in range(count):
        if time.monotonic() > stop:
            run.clock_cut(f"greedy scored {k} of {count} sampled orders: the time for them was over")
            break
        ctx = Context(g, hw, f"sampled-{k}", answers)
        if tuple(ctx.order) in seen:
            continue
        seen.add(tuple(ctx.order))
        timelines = [simulate(g, hw, build_plan(ctx, Settings(), hw.hbm_bytes, early_fetches=early), allocator=False)
                     for early in (False, True)]
        valid = [tl.metrics.makespan_ns for tl in timelines if tl.valid]
        if valid:
            scored.append((min(valid), k, ctx))
    scored.sort(key=lambda item: item[:2])
    full: list[tuple[tuple, int, Context, Planned, float]] = []
    for _score, k, ctx in scored[:SAMPLED_FULL]:
        if run.left() <= 0:
            run.clock_cut("greedy planned fewer sampled orders in full than it scored best: no time was left")
            break
        t = time.monotonic()
        out = planned_with_context(ctx, Settings(), deadline=run.deadline)
        full.append((rank_planned(out), k, ctx, out, time.monotonic() - t))
    full.sort(key=lambda item: item[:2])
    kept = full[:SAMPLED_KEEP]
    run.record.sampled_orders = [ctx.order_name for _r, _k, ctx, _o, _s in kept]
    return [(ctx, out, s) for _r, _k, ctx, out, s in kept]


# The search starts from another order's greedy plan when that order, run with unbounded HBM, is at least this
# share faster than both the best starting plan and the best starting order run so. Measured with unbounded HBM:
# deepseek-v3-paper's store-release order runs 17.9% faster than its auto order, and the search from it wins at
# 70-90%; llama3-8b-no2-4layers' 12.4%, and 60 s from it did not beat the best start at any budget (a 5% threshold
# tried both).
ROOMIER_ORDER = 0.15


def _search_start(run: Run, best: tuple[Plan, Timeline], greedy_plans: list[tuple[Context, Planned]]
                  ) -> tuple[Plan, Timeline]:
    """The plan the search starts from: ``best``, or greedy's valid plan in the order whose no-offload program with
    unbounded HBM (the order's floor: what a plan in it can reach when HBM is no constraint) is the fastest, when
    that floor is ``ROOMIER_ORDER`` under ``best``'s makespan and under the floor of the order greedy did best on,
    and the plan is slower than ``best`` by less than the two floors differ.

    Why: the search moves ops within windows of the starting order, so it cannot leave an order's floor behind. On
    deepseek-v3-paper at 90% greedy does best in the micro-batch by micro-batch order (2335.4 ms), whose floor is
    2303.8 ms, where cpsat then ended; greedy's plan in the store-release order is slower (2375.0 ms), but that
    order's floor is 1892.2 ms, and from it the search reached 1956.8 ms in 60 s (2 workers). ``best`` stays the
    fallback: the search's result is returned only when faster.
    """
    if len(greedy_plans) < 2 or run.interrupted:
        return best
    g, hw = run.graph, run.hw
    big = hw.with_hbm(2**62)
    if not _affordable(run, len(greedy_plans) * run.estimated_sim_s()):
        return best
    floors = [simulate(g, big, no_offload_program(g, big, ctx.order)).metrics.makespan_ns for ctx, _p in greedy_plans]
    k = min(range(len(floors)), key=lambda i: (floors[i], i))
    ctx, planned = greedy_plans[k]
    ok = planned.timeline.valid and planned.plan.status == PlanStatus.FEASIBLE
    limit = (1 - ROOMIER_ORDER) * min(best[1].metrics.makespan_ns, floors[0])
    # The search from there must first make up its plan's lead of the best start: worth it only when its order's
    # floor leaves it more room than that (a lead of 540.6 ms against 471.1 ms of room at 60% on deepseek-v3-paper,
    # where 60 s from it stayed slower than the best start; 423.3 against 471.1 at 70%, where it won).
    lead = planned.timeline.metrics.makespan_ns - best[1].metrics.makespan_ns
    if k == 0 or not ok or floors[k] > limit or planned.plan is best[0] or lead >= floors[0] - floors[k]:
        return best
    run.notes.append(
        f"the search starts from greedy's plan in the {ctx.order_name} order "
        f"({planned.timeline.metrics.makespan_ns / 1e6:.1f} ms), not from the best start "
        f"({best[1].metrics.makespan_ns / 1e6:.1f} ms): that order runs {floors[k] / 1e6:.1f} ms with unbounded HBM, "
        f"the {greedy_plans[0][0].order_name} order {floors[0] / 1e6:.1f} ms")
    run.record.search_start = ctx.order_name
    return planned.plan, planned.timeline


def _none_over_budget(g: Graph, hw: Hardware) -> bool:
    """Whether the no-offload plan certainly peaks over the budget: what starts on HBM (free tensors included,
    as ``none`` places them) and what the ops produce, in its order, is a lower bound of its executed peak
    (tensors pinned remote are left out: when they arrive depends on their fetches)."""
    placed = with_placement(g, {})
    return max(live_bytes(placed, best_no_offload_order(placed), remote_resident=False), default=0) > hw.hbm_bytes


def _start_sweep(run: Run, contexts: list[tuple[Context, float]], cands: list[tuple[Plan, Timeline]]) -> None:
    """Greedy's sweep as a starting candidate (appended to ``cands``), on as many of the orders greedy planned as fit
    in the time, the one its defaults did best on (``contexts[0]``) first, with ``FINALISTS`` finalists planned in
    full or else one; when not even that fits, none (a note says so). Each order's prepared Context is reused, and
    the defaults are not planned in full again: greedy's plan at its defaults is in ``cands``.

    Deterministic runs estimate a sweep from the op count; others from what it does on each order: a point (one is
    timed per order here), then its finalists planned in full, as greedy planned that order. (A point does not pay
    the recompute chains and the replans for static offsets that make most of a greedy run on Checkmate's random
    graphs: 4.5 s of greedy against 2.8 s for the whole sweep on n500.) Sweeping only the best order of greedy's
    defaults missed the best point of another: on deepseek-v3-paper at 70% the sweep's best (2349.7 ms) was
    on the ``auto`` order, and cpsat started from 2419.8 ms and ended at 2363.4 ms.
    """
    g, hw = run.graph, run.hw
    npoints = _sweep_points()
    # Per order: (the points' cost, one finalist's cost). The defaults' full plan is greedy's, in ``cands`` already.
    costs: list[tuple[float, float]] = []
    for ctx, greedy_ctx_s in contexts:
        if run.deterministic:
            exact = EXACT_OFFSETS_S if len(g.ops) <= EXACT_MAX_BLOCKS else 0.0
            full = len(g.ops) * SWEEP_S_PER_OP
            costs.append((full * npoints * SWEEP_POINT_SHARE - FINALISTS * full, full + exact))
            continue
        t_point = time.monotonic()
        probe = build_plan(ctx, grid_points()[-1], hw.hbm_bytes, "greedy-sweep")
        simulate(g, hw, probe, allocator=False)
        run.point_s = max(run.point_s, time.monotonic() - t_point)
        costs.append(((npoints - 1) * (time.monotonic() - t_point), greedy_ctx_s))
    chosen = None
    # The most orders that fit (the best of greedy's defaults first), each with FINALISTS finalists, else with one:
    # on deepseek-v3-nsa-128k-L3-1layer at 60% (2 workers, 60 s) the points took 7 s and each finalist 15 s, so
    # the sweep did not fit and cpsat ended at 1515.5 ms against the sweep's 1255.6 ms (its first finalist's).
    for k in range(len(contexts), 0, -1):
        for finalists in sorted({FINALISTS, 1}, reverse=True):
            cost = sum(points + finalists * full for points, full in costs[:k])
            if cost <= SWEEP_LIMIT_SHARE * run.time_limit and _affordable(run, cost, SWEEP_AFFORDABLE_SHARE):
                chosen = [ctx for ctx, _s in contexts[:k]]
                run.start_s += cost if run.deterministic else 0.0
                break
        if chosen is not None:
            break
    if chosen is None:
        points, full = costs[0]
        run.notes.append(f"greedy at its default settings only: its sweep ({npoints} points and a finalist, about "
                         f"{points + full:.0f} s) does not fit in the time limit")
        if len(g.ops) > REFINE_MAX_OPS:
            # Large graphs only, where both were measured: on small ones a sweep that does not fit means a short
            # limit, left to the whole model or the windows, and greedy already searches the offsets' budget halfway
            # back up there.
            cands += _belady_start(run, contexts[0][0], full, cands)
            cands += _finer_start(run, contexts[0][0], full, cands)
        return
    try:
        # Every finalist: the pass that issues Stores earlier can reorder them (``_polished_starts``).
        cands += [(out.plan, out.timeline) for out in sweep_finalists(chosen, finalists=finalists, defaults=False)]
    except KeyboardInterrupt:
        if not any(tl.valid for _p, tl in cands):
            raise
        run.interrupt()
    except Exception as exc:  # noqa: BLE001
        run.notes.append(f"greedy sweep failed: {exc}")


def _belady_start(run: Run, ctx: Context, full_s: float, cands: list[tuple[Plan, Timeline]]
                  ) -> list[tuple[Plan, Timeline]]:
    """Greedy's plan in ``ctx``'s order with Belady's eviction rule, as a starting candidate, when one full plan
    (``full_s``) fits: where the sweep does not fit, the one point of it that is not a distance."""
    return _greedy_start(run, ctx, Settings(evict="belady"), full_s, cands,
                         "greedy with Belady's eviction rule is not a starting plan")


def _finer_start(run: Run, ctx: Context, full_s: float, cands: list[tuple[Plan, Timeline]]
                 ) -> list[tuple[Plan, Timeline]]:
    """The fastest starting plan, when greedy planned it for a lower budget so that its static offsets fit, planned
    again searching that budget closer to the HBM budget (``planned_with_context``'s ``finer``), as a starting
    candidate, when ``FINER_RUNS`` full plans of ``full_s`` fit; [] when there is no such plan."""
    valid = [(p, tl) for p, tl in cands if tl.valid]
    if not valid:
        return []
    best = min(valid, key=lambda c: c[1].metrics.speed_key)[0]
    if (best.planner != "greedy" or best.options.get("order") != ctx.order_name
            or best.stats.get("offset_attempts", 1) <= 1):
        return []
    settings = Settings(**{k: best.options[k] for k in Settings().as_dict()})
    # FINER_RUNS full plans for the first budget halfway back up, one more for each further budget.
    room = _start_room(run)
    steps = FINER_MAX_STEPS if full_s <= 0 else max(1, min(FINER_MAX_STEPS, int(room / full_s - FINER_RUNS) + 1))
    return _greedy_start(run, ctx, settings, (FINER_RUNS - 1 + steps) * full_s, cands,
                         "the static offsets' budget was not searched closer to the HBM budget", finer=steps)


def _start_room(run: Run) -> float:
    """The seconds a start on a large graph may take (``_greedy_start``): ``BELADY_SHARE`` of the time left, or
    ``START_ALL_SHARE`` when the search cannot run after the starts anyway (the room kept for it would go unused: on
    the full 29k-op graph at 49.1 GB, 120 s, one worker, the search needs about 67 s by its estimate, 49 s were
    left, and the finer start, 41 s, more than 75% of them, was refused). By the estimates in deterministic runs."""
    need, left = _search_room(run)
    return max(0.0, left) * (BELADY_SHARE if left >= need else START_ALL_SHARE)


def _greedy_start(run: Run, ctx: Context, settings: Settings, estimate_s: float, cands: list[tuple[Plan, Timeline]],
                  refused: str, finer: int = 0) -> list[tuple[Plan, Timeline]]:
    """Greedy's plan in ``ctx`` at ``settings`` (with its deadline, and the fastest valid candidate's makespan as the
    mark its evictions against compactions must beat), as a starting candidate, when ``estimate_s`` fits in the room
    for starts (``_start_room``); else [] and the note ``refused``."""
    if estimate_s > _start_room(run):
        run.notes.append(f"{refused}: about {estimate_s:.0f} s, more than the time left allows")
        return []
    run.start_s += estimate_s if run.deterministic else 0.0
    try:
        out = planned_with_context(ctx, settings, deadline=run.deadline, finer=finer, beat_ns=min(
            (tl.metrics.makespan_ns for _p, tl in cands if tl.valid), default=None))
    except KeyboardInterrupt:
        if not any(tl.valid for _p, tl in cands):
            raise
        run.interrupt()
        return []
    if out.plan.stats.get("deadline_cut"):
        run.clock_cut()
    return [(out.plan, out.timeline)]


def _search_room(run: Run, by_clock: bool = False) -> tuple[float, float]:
    """(the seconds the search on a graph above ``whole_max_ops`` needs at least: ``SEARCH_MIN_RUNS`` executor runs
    (the model, the first incumbent, one window, what follows the search) and a short solve; the seconds left for
    it): in deterministic runs by the op-count estimates and the limit (the same every run), else (or ``by_clock``)
    by the executor runs measured and the clock."""
    if run.deterministic and not by_clock:
        return (SEARCH_MIN_RUNS * len(run.graph.ops) * SIM_S_PER_OP + WINDOW_MIN_S,
                run.time_limit * (1 - RESERVE) - run.start_s)
    return SEARCH_MIN_RUNS * run.estimated_sim_s() + WINDOW_MIN_S, run.left()


def _affordable(run: Run, seconds: float, share: float = AFFORDABLE_SHARE) -> bool:
    """Whether a phase estimated at ``seconds`` fits in ``share`` of the time left, leaving room for the search after
    it. In deterministic mode the time left is counted from the limit, not the clock (the same decisions every
    run)."""
    left = run.time_limit * (1 - RESERVE) - run.start_s if run.deterministic else run.left()
    return seconds <= share * left


def _sweep_points() -> int:
    """The points of greedy's sweep on one order: its grid and the best of them with Belady's eviction rule."""
    return len(grid_points()) + BELADY_POINTS


def prepare(run: Run, base: Plan, base_tl: Timeline, target_ticks: int = 4_000_000) -> tuple[Problem, Assignment]:
    """The scaled problem in the starting plan's order, and the hint from the starting plan."""
    g, hw = run.graph, run.hw
    sizes = [t.bytes for t in g.tensors.values()] + [op.workspace_bytes for op in g.ops if op.workspace_bytes]
    scale = choose_scale(max(1, base_tl.metrics.makespan_ns), hw.hbm_bytes, sizes, target_ticks)
    ns_times = [(t.start_ns, t.end_ns) for t in base_tl.steps]
    must = set(offload_cycles(g, base, ns_times))
    order = base.compute_order()
    p = build_problem(g, hw, order, scale, horizon=1, must=must, recompute=run.recompute, offload=run.offload)
    ticks = tick_times(p, base)
    p.horizon = max(e for _s, e in ticks) if ticks else 1
    asg, notes = assignment_from_plan(p, base, ticks)
    run.notes.extend(notes[:3])
    return p, asg


def _optimise(run: Run, base: Plan, base_tl: Timeline, objective: str, makespan_limit_us, whole_max_ops: int,
              window_ops: int, log: bool) -> tuple[Plan, Timeline] | None:
    if not base_tl.valid:
        run.notes.append(f"the starting plan ({base.planner}) is not valid; cpsat has no hint")
    if len(run.graph.ops) > whole_max_ops:
        # Without the time for the search's least (``_search_room``) the starting plan is the answer. Deterministic
        # runs decide by the op-count estimates first, as their start phases do (``_affordable``): the main job on the
        # 29k-op graph skipped the search by the clock, and its notes said it may not be reproducible. The clock
        # still decides when the estimates say yes and the machine is slower.
        est_need, est_left = _search_room(run)
        need, left = _search_room(run, by_clock=True)
        skip = True
        if run.deterministic and est_left < est_need:
            run.notes.append(f"no time for the search: it needs about {est_need:.0f} s on this graph by its op count, "
                             f"{max(0.0, est_left):.0f} s are left after the starting plans by their estimates")
        elif left < need:
            run.clock_cut(f"no time for the search: it needs about {need:.0f} s on this graph, "
                          f"{max(0.0, left):.0f} s were left after the starting plan")
        else:
            skip = False
        if skip:
            run.record.model = "none"
            run.record.status = "NOT_RUN"
            run.record.stop = "no_time"
            return None
    run.report(phase="model")
    p, asg = prepare(run, base, base_tl)
    problems = check(p, asg)
    run.record.ops = len(p.ops)
    run.record.gaps = len(p.gaps)
    run.record.slots = len(p.slots)
    run.record.tick_ns = p.scale.tick_ns
    run.record.unit_bytes = p.scale.unit_bytes
    run.record.horizon_ticks = p.horizon
    run.record.hint_feasible = not problems
    if problems:
        run.notes.append(f"the hint is not feasible in the scaled model ({problems[0]}; {len(problems)} in all)")
        # The hint's makespan bounds only the hint: leave room for a plan that moves more (every op and every
        # candidate transfer one after another).
        serial = sum(o.dur for o in p.ops) + sum(max(g.fetch.values(), default=0) for g in p.gaps) + sum(
            max(s.store.values(), default=0) for s in p.slots)
        if serial > p.horizon:
            p.horizon = serial
            canonical(p, asg)
    limit_ticks = None
    if objective == "peak" and makespan_limit_us is None and (problems or not base_tl.valid):
        # An invalid start's makespan is no limit any plan within the budget need meet (a plan that fits moves
        # more): found by fuzzing, a 1-op graph whose no-offload start made the model infeasible.
        run.notes.append(f"the starting plan ({base.planner}) does not fit, so its makespan is no limit: the lowest "
                         "peak at any makespan within the horizon")
    elif objective == "peak":
        ms = makespan_limit_us * 1000 if makespan_limit_us is not None else base_tl.metrics.makespan_ns
        limit_ticks = max(asg.makespan, -(-int(ms) // p.scale.tick_ns)) if makespan_limit_us is None \
            else int(ms // p.scale.tick_ns)
    if len(p.ops) <= whole_max_ops:
        return _whole(run, p, asg, objective, limit_ticks, log)
    cands = improve(run, p, asg, base, base_tl, objective, limit_ticks, window_ops, log)
    return None if cands is None else place_hbm(run, p, cands)


def op_windows(p: Problem, horizon: int) -> tuple[dict[int, int], dict[int, int]]:
    """Earliest and latest start of every op: all its ancestors run before it and all its descendants after
    it, on the one compute stream."""
    n = len(p.ops)
    dur = [o.dur for o in p.ops]
    before = [0] * n
    after = [0] * n
    for i in range(n):
        a = p.anc[i]
        tot = 0
        j = 0
        while a:
            if a & 1:
                tot += dur[j]
                after[j] += dur[i]
            a >>= 1
            j += 1
        before[i] = tot
    lo = {i: before[i] for i in range(n)}
    hi = {i: horizon - dur[i] - after[i] for i in range(n)}
    return lo, hi


# The repair solve when the best solution's static offsets do not fit (``_whole``): this share of the main
# solve's deterministic budget, in deterministic runs, and at least this many wall seconds.
REPAIR_SHARE = 0.5
REPAIR_MIN_S = 1.0
# Joint runs (offload and recompute): the share of the search spent first on the model without re-runs, whose
# best solution then hints the joint model. The joint model alone searched its larger space less well in the same
# time (transformer_block at 1 GB, 10 s: 117.0 ms against 110.2 ms offload only).
OFFLOAD_FIRST_SHARE = 0.5


def _whole(run: Run, p: Problem, asg: Assignment, objective: str, limit_ticks, log: bool):
    """The whole model: in joint runs first without re-runs (``OFFLOAD_FIRST_SHARE`` of the time; its best
    solution hints the joint model), then whole. When the best solution's static offsets do not fit the budget, a
    repair solve hinted by it keeps the address space they needed beyond its peak free (``leave_room_for_offsets``).
    """
    lo, hi = op_windows(p, p.horizon) if len(p.ops) <= 3000 else ({}, {})
    det = DET_PER_WALL * max(0.0, run.time_limit * (1 - RESERVE - 0.1) - run.start_s) if run.deterministic else None
    det_all = det
    earlier: list[Assignment] = []
    if (run.offload and objective == "makespan" and any(g.remat is not None for g in p.gaps)
            and RECOMPUTE not in asg.off.values()):
        share = OFFLOAD_FIRST_SHARE
        first = _whole_solve(run, p, asg, objective, limit_ticks, log, lo, hi, det, share, no_remat=True)
        if first is not None:
            earlier = first
            asg = first[0]
        det = None if det is None else det * (1 - share)
        if run.interrupted:
            return finish(run, p, earlier) if earlier else None
    sols = _whole_solve(run, p, asg, objective, limit_ticks, log, lo, hi, det, 1.0)
    if sols is None and not earlier:
        return None
    sols = (sols or []) + earlier
    if objective != "makespan" or run.interrupted:
        return finish(run, p, sols)
    unfit = sols[0]
    if leave_room_for_offsets(run, p, unfit):
        return finish(run, p, sols)
    # Deterministic runs end on their budget, far from the wall-clock limit (DET_PER_WALL), which leaves the
    # repair its time; runs with several workers search to the limit, and repair only with what is left.
    repair_det = None if det_all is None else det_all * REPAIR_SHARE
    if run.left() * (1 - RESERVE) > REPAIR_MIN_S and (repair_det is None or repair_det / DET_PER_WALL < run.left()):
        more = _whole_solve(run, p, repair_hint(run, p, sols), objective, limit_ticks, log, lo, hi, repair_det, 1.0,
                            repair=True)
        sols = (more or []) + sols
    # The best solution's offsets were found not to fit: place_hbm tries the others first (and, unless one fits and
    # is faster, leaves the best to the caching allocator).
    return finish(run, p, sols, unfit=unfit)


# Solutions of the main solve the repair looks through for a hint within the lowered capacity.
REPAIR_HINTS = 12


def repair_hint(run: Run, p: Problem, sols: list[Assignment]) -> Assignment:
    """The hint of the repair solve: the best of the first ``REPAIR_HINTS`` solutions whose peak fits the lowered
    capacity (a feasible start, from which CP-SAT only improves), else the best one (CP-SAT then repairs it:
    with two workers and 11 s on LLaMA-3-8B training, it found no solution in one run of three)."""
    room = p.capacity * p.scale.unit_bytes + p.fixed_bytes
    for a in sols[:REPAIR_HINTS]:
        tl = run.timed(plan_from_assignment(p, a))
        if tl.valid and tl.metrics.peak_bytes[HBM] <= room:
            return a
    return sols[0]


def leave_room_for_offsets(run: Run, p: Problem, sol: Assignment) -> bool:
    """Whether ``sol``'s static offsets (``place_statically``) fit the budget. When they do not, the model's HBM
    capacity is lowered by the address space they need beyond its peak, so that the next solve's solutions fit
    (issue 10, point 4: the budget lowered and re-solved).

    A plan that peaks at the budget rarely packs into it: on LLaMA-3-8B training at 20 GB/s (``ho-plan paper``,
    joint, 60 s) the model's best solution peaked 16 KB under the budget and its offsets did not fit; left to the
    caching allocator it paid a compaction (30.6 ms), 9% over what the model promised.
    """
    plan = plan_from_assignment(p, sol)
    tl = run.timed(plan)
    if not tl.valid:
        return True  # finish reports it
    placed, height = place_statically(p.graph, p.hw, plan, tl, found=run.fitted_offsets(tl, EXACT_OFFSETS_S))
    if placed is not None:
        return True
    extra = height - tl.metrics.peak_bytes[HBM]
    units = -(-extra // p.scale.unit_bytes)
    if 0 < units < p.capacity:
        p.capacity -= units
        run.notes.append(f"a solution's static offsets needed {extra:,} B beyond its peak: the next solve keeps "
                         "that much of the budget free")
    return False


def _whole_solve(run: Run, p: Problem, asg: Assignment, objective: str, limit_ticks, log: bool, lo, hi,
                 det: float | None, share: float, no_remat: bool = False, repair: bool = False
                 ) -> list[Assignment] | None:
    """One solve of the whole model hinted by ``asg`` with ``share`` of the time left (and ``det`` deterministic
    seconds): its solutions, best first, or None. ``no_remat``: re-runs fixed off (the offload-only model).
    ``repair``: the solve after the main one at a capacity lowered for static offsets: the record adds its
    solutions and time to the main solve's (whose status, bound and objective stay the record's) and keeps its
    status in ``offsets_repair``."""
    # The bound every plan meets (a model solution runs no earlier than its decoded plan): CP-SAT's own bound stays far
    # below it on link-bound models (transformer_block: 61.4 ms against 66.8 ms).
    floor = run.makespan_bound().value if objective == "makespan" else 0.0
    frame = whole_frame(p, asg, lo, hi, floor_ns=floor)
    t = time.monotonic()
    m = Model(p, frame, objective=objective, makespan_limit=limit_ticks)
    if no_remat:
        for lits in m.offload_to.values():
            lit = lits.get(RECOMPUTE, 0)
            if not is_const(lit):
                m.cp.add(lit == 0)
    m.add_hints()
    run.record.build_s = round((run.record.build_s or 0) + time.monotonic() - t, 3)
    run.record.variables = len(m.cp.proto.variables)
    run.record.constraints = len(m.cp.proto.constraints)
    wall = run.left() * share
    if wall <= 0.2:
        run.clock_cut("no time left for CP-SAT after building the model")
        run.record.stop = "no_time"
        return None
    # Deterministic mode: a deterministic budget that depends on the limit only, never on the clock.
    if det is not None:
        det *= share
    params = run.params(wall, det_s=det, log=log)
    params["keep_all_feasible_solutions_in_presolve"] = True

    def on_progress(kind, elapsed, obj, bound):
        run.report(phase="solve", incumbent_us=_us(p, m, obj), bound_us=_us(p, m, bound))

    run.log(f"# cpsat: the whole model ({len(p.ops)} ops, {run.record.variables} variables)")
    res = worker.solve(m.cp, params, wall, on_progress, on_log=run.log_sink if log else None)
    run.det_used += res.deterministic_time
    run.notes.extend(res.notes)
    if repair:
        rec = run.record
        rec.offsets_repair = res.status
        rec.solutions = (rec.solutions or 0) + res.solutions
        rec.solver_wall_s = round((rec.solver_wall_s or 0) + res.wall_s, 3)
        rec.deterministic_time = round((rec.deterministic_time or 0) + res.deterministic_time, 3)
        if res.interrupted:
            run.interrupt()
        elif run.deterministic and res.killed:
            run.clock_cut("the wall-clock limit stopped the solver first: this run may not be reproducible")
        return [m.read(res.values)] + [m.read(v) for _obj, v in reversed(res.history) if v is not res.values] \
            if res.has_solution else None
    run.record.status = res.status
    run.record.solver_wall_s = round(res.wall_s, 3)
    run.record.deterministic_time = round(res.deterministic_time, 3)
    run.record.solutions = res.solutions
    run.record.model = "whole"
    if log and run.log_sink is None:
        run.record.log = res.log
    run.record.stop = stop_reason(res, det)
    if res.interrupted:
        run.interrupt()
    elif run.deterministic and (res.killed or (res.status in ("FEASIBLE", "UNKNOWN") and det is not None
                                                and res.deterministic_time < 0.99 * det)):
        # Stopped by the clock (killed, or CP-SAT's own wall-clock limit before its deterministic one): another run
        # may get further.
        run.clock_cut("the wall-clock limit stopped the solver first: this run may not be reproducible")
    if res.bound is not None:
        run.record.model_bound_ticks = res.bound
        run.record.model_bound_us = _us(p, m, res.bound)
    if not res.has_solution:
        run.notes.append(f"CP-SAT returned no solution (status {res.status})")
        return None
    run.record.objective_ticks = res.objective
    run.record.objective_us = _us(p, m, res.objective)
    # Optimal for the model without re-runs is not optimal for the joint model.
    run.record.optimal = res.status == "OPTIMAL" and not no_remat
    return [m.read(res.values)] + [m.read(v) for _obj, v in reversed(res.history) if v is not res.values]


def stop_reason(res: worker.SolveResult, det: float | None = None) -> str:
    """Why a solve ended, as a key of ``planner.quality.STOP_REASONS``; ``det``: its deterministic budget, if any."""
    if res.interrupted:
        return "interrupted"
    if res.status == "OPTIMAL":
        return "optimal"
    if res.status == "INFEASIBLE":
        return "infeasible"
    if res.status in ("CRASHED", "MODEL_INVALID"):
        return "failed"
    if det is not None and not res.killed and res.deterministic_time >= 0.99 * det:
        return "deterministic_budget"
    return "time_limit"  # FEASIBLE, UNKNOWN (no solution in time) or TIMEOUT (killed at the deadline)


def _us(p: Problem, m: Model, value) -> float | None:
    if value is None:
        return None
    if m.objective == "peak":
        return None
    return m.objective_to_makespan(value) * p.scale.tick_ns / 1000


def finish(run: Run, p: Problem, sols: list[Assignment], unfit: Assignment | None = None
           ) -> tuple[Plan, Timeline] | None:
    """Decode the solutions (best first), check them with the executor, and place HBM statically.

    Static offsets (as greedy assigns them: ``offsets_within``) can need more address space than the peak: the first
    solution whose offsets fit the budget wins unless the best one, left to the caching allocator (whose
    defragmentations cost time), is still faster; ``unfit``, a solution whose static offsets were found not to
    fit, is not placed again. None when no decoded plan is valid.
    """
    decoded: list[tuple[Plan, Timeline, bool]] = []
    for sol in sols:
        plan = plan_from_assignment(p, sol)
        tl = run.timed(plan)
        if tl.valid:
            decoded.append((plan, tl, sol is unfit))
        elif not decoded:
            shown = "; ".join(v.describe() for v in tl.violations[:2])
            run.notes.append(f"a decoded plan is not valid ({shown})")
    if not decoded:
        return None
    decoded.sort(key=lambda c: c[1].metrics.speed_key)
    return place_hbm(run, p, [(pl, tl) for pl, tl, _u in decoded], {k for k, c in enumerate(decoded) if c[2]})


# Graphs of up to this many ops have every candidate run with the caching allocator when none fits static offsets
# (its compactions differ from one candidate to the next: on NSA-128k at 60%, 1047.38 to 1059.34 ms for plans of
# 1000.52 to 1011.94 ms without the allocator model); larger graphs, where a run takes seconds, only the best. A rule
# by op count, not by the clock, so that the same input gives the same plan.
CACHING_CANDIDATES_MAX_OPS = 5000


def place_hbm(run: Run, p: Problem, cands: list[tuple[Plan, Timeline]], unfit: set[int] = frozenset()
              ) -> tuple[Plan, Timeline]:
    """The fastest of: the first candidate (best first) whose static offsets fit the budget, and the fastest
    candidate with the caching allocator (the best only, on graphs above ``CACHING_CANDIDATES_MAX_OPS`` ops).
    Candidates carry their runs without the allocator model; the timelines returned are the executor's full
    ones. Candidates at the positions ``unfit`` are known not to fit: they are not placed again.

    The best candidate's static plan needs no comparison: static offsets delay nothing, and the caching
    allocator's compactions only delay, so it is never slower than the caching run, which is then not made.
    """
    caching: list[tuple[Plan, Timeline]] = []

    def caching_run() -> tuple[Plan, Timeline]:
        if not caching:
            some = cands if len(p.ops) <= CACHING_CANDIDATES_MAX_OPS else cands[:1]
            runs = [(plan, simulate(p.graph, p.hw, plan)) for plan, _ in some]
            caching.append(min(runs, key=lambda c: (not c[1].valid, c[1].metrics.speed_key)))
        return caching[0]

    deadline = time.monotonic() + max(0.5, 0.5 * run.left())
    tried = 0
    for k, (plan, tl) in enumerate(cands):
        if k and time.monotonic() > deadline:
            run.clock_cut()
            break
        if k in unfit:
            continue
        # The exact offsets model for the first candidate tried; best fit alone for the others, so that more of
        # them are tried before the deadline (each exact attempt that fails takes its whole limit).
        limit = max(0.5, run.left()) if not tried else 0.05
        fitted, height = place_statically(p.graph, p.hw, plan, tl, found=run.fitted_offsets(tl, limit))
        tried += 1
        if fitted is not None:
            static, static_tl = fitted.plan, fitted.timeline
            if static_tl.valid and (k == 0 or static_tl.metrics.makespan_ns <= caching_run()[1].metrics.makespan_ns
                                    or not caching_run()[1].valid):
                run.record.offset_height_bytes = height
                # A slower solution than the best is not the one CP-SAT proved optimal.
                run.record.slower_solution_placed = bool(k)
                if k:
                    run.notes.append("the best solution's static HBM offsets did not fit the budget; a slightly "
                                     "slower solution's did")
                return static, static_tl
            break
    run.notes.append("static offsets did not fit the HBM budget; HBM placement is left to the caching allocator")
    placed = caching_run()
    if placed[0] is not cands[0][0]:
        run.record.slower_solution_placed = True
        run.notes.append("with the caching allocator a slightly slower solution compacts less than the best one")
    return _spare_compactions(run, p, placed)


def _spare_compactions(run: Run, p: Problem, placed: tuple[Plan, Timeline]) -> tuple[Plan, Timeline]:
    """``placed`` with the evictions that spare it compactions and make it faster (``planner/defrag.py``)."""
    plan, tl = placed
    if not tl.compactions:
        return placed
    before = tl.metrics.defrag_events
    deadline = time.monotonic() + max(0.5, run.left())
    plan, tl, added = spare_compactions(p.graph, p.hw, plan, tl, deadline=deadline)
    if time.monotonic() > deadline:
        run.clock_cut()
    if added:
        run.record.compaction_evictions = added
        run.notes.append(f"{added} eviction(s) of tensors idle on HBM spare the caching allocator "
                         f"{before - tl.metrics.defrag_events} of its {before} compactions")
    return plan, tl


def with_offsets(run: Run, p: Problem, plan: Plan, tl: Timeline) -> tuple[Plan, Timeline]:
    return place_hbm(run, p, [(plan, tl)])
