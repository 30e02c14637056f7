"""Sweeps: HBM budget, link bandwidth, and the longest sequence that fits. Plain data in, plain data out.

- ``budget_sweep``: each planner at budgets given as fractions of the no-offload peak (the peak-memory against
  makespan trade-off);
- ``bandwidth_sweep``: each planner at one budget while the D2H/H2D bandwidth goes from 20 to 400 GB/s
  (the paper's bandwidth-robustness curve);
- ``seqlen_sweep``: per planner, the longest sequence a workload generator's graph can run with within a budget,
  by bisection over its ``seq_len`` on a grid of ``step`` tokens.

Points run on a backend (``planner.backends``: one by one, in ``jobs`` local worker processes, or as tasks on a
Ray cluster); a point's result never depends on which. Wall-clock solve times are kept apart from the data, under
``"timing"``, since they differ run to run. A point that fails (its planner raises, or its Ray worker dies twice)
is a row of status ``error`` with the reason (``error_point``); the rest of the sweep completes around it.

Budget and bandwidth sweeps are monotone by construction (``seed_looser``): a plan valid at a tighter budget is
valid at a looser one with the same timing, and a plan made for a slower link usually still is on a faster one
(the executor re-times it and checks it). So, per planner, each point also tries the best plan of the tighter
points, re-simulated there, and keeps it when it is faster than its own (``seeded_from`` says where it came from).
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from planner import api
from planner.backends import BackendSpec, Progress, worker_graph
from planner.errors import InputError
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import bytes_by_kind
from planner.planners import REGISTRY
from planner.report.compare import ERROR, VALID, available_planners, lower_bounds, metrics_row, run_planner
from planner.workloads import generator

DEFAULT_FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DEFAULT_BANDWIDTHS_GBPS = (20.0, 33.6, 40.0, 50.0, 70.0, 100.0, 200.0, 400.0)

# Keys of a point that are measurements of the machine, not of the plan.
TIMING_KEYS = ("solve_time_s",)
# A point's plan, carried from the worker to ``seed_looser`` and dropped before the sweep is returned.
PLAN_KEY = "plan"
# The compact row of a point.
POINT_KEYS = ("planner", "status", "valid", "violations", "hbm_budget_bytes", "peak_hbm_bytes", "makespan_us",
              "overhead", "bytes_moved", "stall_us", "defrag_events", "gap_vs_bound", "solve_time_s")


# -- running points -------------------------------------------------------------------------------------------


def _spec(backend: BackendSpec | None, jobs: int) -> BackendSpec:
    """The backend to run on: ``backend`` when given, else the local one with ``jobs`` processes."""
    return backend if backend is not None else BackendSpec("local", jobs)


def run_points(fn: Callable[[dict], dict], points: Sequence[dict], jobs: int = 1, progress: Progress | None = None,
               graph: Graph | None = None, backend: BackendSpec | None = None,
               on_error: Callable[[dict, str], dict] | None = None) -> list[dict]:
    """Return ``[fn(p) for p in points]``, in that order, on ``backend`` (default: ``jobs`` local processes)."""
    spec = _spec(backend, jobs)
    with spec.open(graph, jobs=spec.jobs if len(points) > 1 else 1) as b:
        return b.map(fn, points, progress, on_error)


def error_point(p: dict, reason: str) -> dict:
    """The row of a point that failed (its worker died twice, or its planner raised): the point's coordinates,
    status ``error`` and the reason; no measurement."""
    out = {k: None for k in POINT_KEYS if k not in TIMING_KEYS}
    out.update(planner=p.get("planner"), status=ERROR, valid=False, violations=0, error=reason, notes=[reason],
               hbm_budget_bytes=p.get("hbm_bytes"), fits=False, seeded_from=None,
               timing={k: None for k in TIMING_KEYS})
    for k in ("fraction", "bandwidth_GBps", "seq_len", "tag"):
        if k in p:
            out[k] = p[k]
    return out


def _split_timing(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in TIMING_KEYS}
    out["timing"] = {k: row.get(k) for k in TIMING_KEYS}
    return out


def _point_row(graph: Graph, hw: Hardware, planner: str, options: dict | None, keep_plan: bool = False) -> dict:
    """One planner at one hardware, as a compact point: status, peak, makespan, overhead, moved, stall (and the
    plan under ``PLAN_KEY`` when ``keep_plan``)."""
    reference = api.no_offload_reference(graph, hw)
    bounds = lower_bounds(graph, hw)
    run = run_planner(graph, hw, planner, reference, bounds, options)
    out = {k: run.row.get(k) for k in POINT_KEYS}
    if keep_plan:
        out[PLAN_KEY] = run.plan if out["status"] == VALID else None
    out["no_offload_makespan_us"] = reference.metrics.makespan_ns / 1000
    out["no_offload_peak_hbm_bytes"] = reference.metrics.peak_bytes.get(HBM, 0)
    out["makespan_bound_us"] = bounds["makespan_us"]["value"]
    out["notes"] = run.row.get("notes", [])[:3]
    return out


def seed_looser(graph: Graph, rows: list[dict], order: Callable[[dict], float],
                hardware_of: Callable[[dict], Hardware]) -> list[dict]:
    """Per planner, from the tightest point (smallest ``order``) to the loosest: re-simulate the best plan of the
    tighter points at this point and take it when it is valid and faster than the point's own plan. Returns the
    rows (updated in place), without their plans."""
    by_planner: dict[str, list[dict]] = {}
    for r in rows:
        by_planner.setdefault(r["planner"], []).append(r)
    for points in by_planner.values():
        carried: tuple[object, float] | None = None  # (plan, order of the point it was made for)
        for r in sorted(points, key=order):
            if r["status"] == ERROR:
                continue  # a failed point stays one: its row says why, and no other plan hides that
            own_ok = r["status"] == VALID
            if carried is not None:
                plan, source = carried
                hw = hardware_of(r)
                tl = simulate(graph, hw, plan)
                if tl.valid and (not own_ok or tl.metrics.makespan_ns / 1000 < r["makespan_us"]):
                    row = metrics_row({"planner": r["planner"], "hbm_budget_bytes": hw.hbm_bytes}, hw, plan, tl,
                                      api.no_offload_reference(graph, hw), lower_bounds(graph, hw), 0.0)
                    r.update({k: row.get(k) for k in POINT_KEYS if k not in ("planner", "solve_time_s")})
                    r[PLAN_KEY], r["seeded_from"] = plan, source
                    if "start_placement" in r:
                        r["start_placement"] = bytes_by_kind(graph, plan.placement)
                    r["notes"] = [f"the plan made for the tighter point {source:g} is faster here"] + r["notes"][:2]
            if r["status"] == VALID and r.get(PLAN_KEY) is not None:
                if carried is None or r[PLAN_KEY] is not carried[0]:
                    carried = (r[PLAN_KEY], r.get("seeded_from", order(r)))
    for r in rows:
        r.pop(PLAN_KEY, None)
        r.setdefault("seeded_from", None)
    return rows


# Sweep points run in parallel processes; each planner runs with its deterministic options there
# (``PlannerSpec.deterministic``: cpsat single-worker), so a sweep's data do not depend on --jobs.
DETERMINISTIC = {name: spec.deterministic for name, spec in REGISTRY.items() if spec.deterministic}


def sweep_planner_options(options: dict[str, dict] | None) -> dict[str, dict]:
    """``options`` with the deterministic defaults filled in where the user set nothing."""
    out = {k: dict(v) for k, v in (options or {}).items()}
    for name, defaults in DETERMINISTIC.items():
        for k, v in defaults.items():
            out.setdefault(name, {}).setdefault(k, v)
    return out


def with_hbm(hw: Hardware, nbytes: int) -> Hardware:
    return hw.with_hbm(nbytes)


def with_bandwidth(hw: Hardware, links: Sequence[str], bandwidth_Bps: float) -> Hardware:
    names = set(links)
    missing = names - {ln.name for ln in hw.links}
    if missing:
        raise InputError("command line", "--links", f"hardware {hw.name!r} has no link(s) {sorted(missing)}")
    return replace(hw, links=tuple(replace(ln, bandwidth_Bps=bandwidth_Bps) if ln.name in names else ln
                                   for ln in hw.links))


# -- budget sweep ---------------------------------------------------------------------------------------------


def _budget_point(p: dict) -> dict:
    graph = worker_graph()
    hw = with_hbm(Hardware.from_dict(p["hardware"]), p["hbm_bytes"])
    out = _point_row(graph, hw, p["planner"], p["options"], keep_plan=True)
    out["fraction"] = p["fraction"]
    return _split_timing(out)


def budget_sweep(graph: Graph, hw: Hardware, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                 planners: Sequence[str] | None = None, options: dict[str, dict] | None = None, jobs: int = 1,
                 progress: Progress | None = None, backend: BackendSpec | None = None) -> dict:
    """Each planner at HBM budgets of ``fraction`` x the no-offload peak (on ``backend``, default ``jobs`` local
    processes)."""
    peak = api.no_offload_reference(graph, hw).metrics.peak_bytes[HBM]
    options = sweep_planner_options(options)
    names = available_planners(planners)
    points = [
        {"planner": n, "fraction": f, "hbm_bytes": int(math.floor(peak * f)), "hardware": hw.to_dict(),
         "options": (options or {}).get(n)}
        for f in fractions for n in names
    ]
    rows = run_points(_budget_point, points, jobs, progress, graph, backend, error_point)
    rows = seed_looser(graph, rows, lambda r: r["fraction"], lambda r: with_hbm(hw, r["hbm_budget_bytes"]))
    return {"kind": "budget", "graph": graph.name, "hardware": hw.name, "no_offload_peak_hbm_bytes": peak,
            "fractions": list(fractions), "planners": names, "points": rows}


# -- bandwidth sweep ------------------------------------------------------------------------------------------


def _bandwidth_point(p: dict) -> dict:
    graph = worker_graph()
    hw = with_bandwidth(Hardware.from_dict(p["hardware"]), p["links"], p["bandwidth_GBps"] * 1e9)
    out = _point_row(graph, hw, p["planner"], p["options"], keep_plan=True)
    out["bandwidth_GBps"] = p["bandwidth_GBps"]
    return _split_timing(out)


def bandwidth_sweep(graph: Graph, hw: Hardware, bandwidths_GBps: Sequence[float] = DEFAULT_BANDWIDTHS_GBPS,
                    links: Sequence[str] = ("d2h", "h2d"), planners: Sequence[str] | None = None,
                    options: dict[str, dict] | None = None, jobs: int = 1,
                    progress: Progress | None = None, backend: BackendSpec | None = None) -> dict:
    """Each planner at ``hw``'s HBM budget while ``links`` all run at each bandwidth (GB/s, 10^9 B/s)."""
    with_bandwidth(hw, links, 1.0)  # check the link names up front
    options = sweep_planner_options(options)
    names = available_planners(planners)
    points = [
        {"planner": n, "bandwidth_GBps": float(b), "links": list(links), "hardware": hw.to_dict(),
         "options": (options or {}).get(n)}
        for b in bandwidths_GBps for n in names
    ]
    rows = run_points(_bandwidth_point, points, jobs, progress, graph, backend, error_point)
    rows = seed_looser(graph, rows, lambda r: r["bandwidth_GBps"],
                       lambda r: with_bandwidth(hw, links, r["bandwidth_GBps"] * 1e9))
    return {"kind": "bandwidth", "graph": graph.name, "hardware": hw.name, "hbm_budget_bytes": hw.hbm_bytes,
            "links": list(links), "bandwidths_GBps": [float(b) for b in bandwidths_GBps], "planners": names,
            "points": rows}


# -- sequence-length sweep ------------------------------------------------------------------------------------


def resolve_generator(name: str) -> Callable[..., Graph]:
    """A workload name of ``ho-plan generate`` (``inference``, a preset: ``planner.workloads.generator``) or
    ``module:function``."""
    if ":" not in name:
        return generator(name, "GENERATOR")
    mod, _, fn = name.partition(":")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError):
        raise InputError("command line", "--generator", f"no workload generator {name!r} ({mod}.{fn})") from None


_GENERATED: dict[str, Graph] = {}


def generate(generator: str, generator_args: dict, seq_param: str, seq_len: int) -> Graph:
    """The generator's graph at ``seq_len``; the last few are kept, since every planner probes the same length."""
    key = json.dumps([generator, generator_args, seq_param, seq_len], sort_keys=True)
    if key not in _GENERATED:
        if len(_GENERATED) >= 4:
            _GENERATED.pop(next(iter(_GENERATED)))
        _GENERATED[key] = resolve_generator(generator)(**{**generator_args, seq_param: seq_len})
    return _GENERATED[key]


def _seqlen_point(p: dict) -> dict:
    graph = generate(p["generator"], p["generator_args"], p["seq_param"], p["seq_len"])
    hw = Hardware.from_dict(p["hardware"])
    out = _point_row(graph, hw, p["planner"], p["options"])
    out["seq_len"] = p["seq_len"]
    out["fits"] = fits(out, p.get("max_overhead"))
    return _split_timing(out)


def fits(row: dict, max_overhead: float | None = None) -> bool:
    """A valid plan within the budget, and, when ``max_overhead`` is set, no slower than that over no offload."""
    if row.get("status") != VALID:
        return False
    return max_overhead is None or (row.get("overhead") is not None and row["overhead"] <= max_overhead)


def _bisect(names, state, cache, run_round, lo_k: int, hi_k: int) -> None:
    """Bisection on the grid [lo_k, hi_k] for every planner at once; fills ``state[n]["good"/"bad"]``.

    A point "fits" at k means it fits at every smaller k; ``good`` ends as the largest k that fits (None when
    even lo_k does not), ``bad`` as the smallest that does not (None when hi_k fits).
    """
    # Ends first: the far end (all planners at once), then the near end for those that did not fit.
    run_round([(n, hi_k) for n in names])
    for n in names:
        if cache[(n, hi_k)]["fits"]:
            state[n]["good"] = hi_k
    run_round([(n, lo_k) for n in names if state[n]["good"] is None])
    for n in names:
        s = state[n]
        if s["good"] is None:
            if cache[(n, lo_k)]["fits"]:
                s["good"], s["bad"] = lo_k, hi_k
            else:
                s["bad"] = lo_k
    while True:
        pairs = [(n, (s["good"] + s["bad"]) // 2) for n, s in state.items()
                 if s["good"] is not None and s["bad"] is not None and s["bad"] - s["good"] > 1]
        if not pairs:
            break
        run_round(pairs)
        for n, k in pairs:
            if cache[(n, k)]["fits"]:
                state[n]["good"] = k
            else:
                state[n]["bad"] = k


def _search(names: list[str], lo_k: int, hi_k: int, make_point: Callable[[str, int], dict],
            fn: Callable[[dict], dict], jobs: int, progress: Progress | None, graph: Graph | None = None,
            backend: BackendSpec | None = None):
    """Run the bisection of every planner over [lo_k, hi_k], probing with ``fn(make_point(n, k))``.

    Returns (state, cache); ``cache[(n, k)]`` is the probe's row, which must carry ``fits``.
    """
    state = {n: {"good": None, "bad": None} for n in names}
    cache: dict[tuple[str, int], dict] = {}
    done_count = [0]
    with _spec(backend, jobs).open(graph) as runner:

        def run_round(pairs: list[tuple[str, int]]) -> None:
            todo = [(n, k) for n, k in pairs if (n, k) not in cache]
            if not todo:
                return

            def prog(d: int, t: int, label: str) -> None:
                if progress:
                    progress(done_count[0] + d, done_count[0] + t, label)

            rows = runner.map(fn, [make_point(n, k) for n, k in todo], prog, error_point)
            done_count[0] += len(todo)
            for (n, k), r in zip(todo, rows):
                cache[(n, k)] = r

        _bisect(names, state, cache, run_round, lo_k, hi_k)
    return state, cache


def seqlen_sweep(generator: str, generator_args: dict, hw: Hardware, lo: int, hi: int, step: int = 1024,
                 seq_param: str = "seq_len", planners: Sequence[str] | None = None,
                 options: dict[str, dict] | None = None, max_overhead: float | None = None, jobs: int = 1,
                 progress: Progress | None = None, backend: BackendSpec | None = None) -> dict:
    """Per planner, the longest ``seq_len`` in [lo, hi] (a multiple of ``step``) whose graph fits ``hw``.

    Bisection assumes that what fits at a length fits at every shorter one. Each round probes the midpoint of
    every planner still searching, in parallel; the probe sequence does not depend on ``jobs``.
    """
    if step <= 0 or lo <= 0 or hi < lo:
        raise InputError("command line", "--range", f"need 0 < lo <= hi and step > 0, got {lo}..{hi} step {step}")
    options = sweep_planner_options(options)
    names = available_planners(planners)
    lo_k, hi_k = math.ceil(lo / step), hi // step  # search over multiples of step
    if lo_k > hi_k:
        raise InputError("command line", "--range", f"no multiple of {step} between {lo} and {hi}")

    def point(n: str, k: int) -> dict:
        return {"planner": n, "seq_len": k * step, "generator": generator, "generator_args": generator_args,
                "seq_param": seq_param, "hardware": hw.to_dict(), "options": (options or {}).get(n),
                "max_overhead": max_overhead}

    state, cache = _search(names, lo_k, hi_k, point, _seqlen_point, jobs, progress, backend=backend)
    longest = {}
    for n, s in state.items():
        if s["good"] is None:
            first = cache[(n, lo_k)]
            longest[n] = {"seq_len": None, "first_failing": lo_k * step, "at_least": False,
                          "status_at_first_failing": first["status"],
                          "note": f"nothing fits, even {lo_k * step} tokens"}
            continue
        best = cache[(n, s["good"])]
        longest[n] = {"seq_len": s["good"] * step, "first_failing": None if s["bad"] is None else s["bad"] * step,
                      "at_least": s["bad"] is None, "peak_hbm_bytes": best["peak_hbm_bytes"],
                      "makespan_us": best["makespan_us"], "overhead": best["overhead"],
                      "status_at_first_failing": None if s["bad"] is None else cache[(n, s["bad"])]["status"],
                      "note": f"the longest tried ({hi_k * step}) fits: at least that" if s["bad"] is None else ""}
    probes = sorted(cache.values(), key=lambda r: (names.index(r["planner"]), r["seq_len"]))
    return {"kind": "seqlen", "generator": generator, "generator_args": generator_args, "seq_param": seq_param,
            "hardware": hw.name, "hbm_budget_bytes": hw.hbm_bytes, "range": [lo_k * step, hi_k * step],
            "step": step, "max_overhead": max_overhead, "planners": names, "longest": longest, "points": probes}


# -- lowest budget ----------------------------------------------------------------------------------------------


def _minbudget_point(p: dict) -> dict:
    graph = worker_graph()
    hw = with_hbm(Hardware.from_dict(p["hardware"]), p["hbm_bytes"])
    out = _point_row(graph, hw, p["planner"], p["options"])
    out["fits"] = fits(out, p.get("max_overhead"))
    return _split_timing(out)


def min_budget_search(graph: Graph, hw: Hardware, planners: Sequence[str] | None = None,
                      options: dict[str, dict] | None = None, max_overhead: float | None = None,
                      resolution: float = 0.005, jobs: int = 1, progress: Progress | None = None,
                      backend: BackendSpec | None = None) -> dict:
    """Per planner, the lowest HBM budget at which it finds a valid plan (no more than ``max_overhead`` slower
    than no offload, when set), by bisection between the largest single-op working set and the no-offload peak
    on a grid of ``resolution`` x that peak. Reports the peak HBM the plan at that budget actually reaches.
    """
    ref = api.no_offload_reference(graph, hw)
    peak = ref.metrics.peak_bytes[HBM]
    floor_ = int(lower_bounds(graph, hw)["peak_hbm_bytes"]["value"])
    step = max(1, int(peak * resolution))
    options = sweep_planner_options(options)
    names = available_planners(planners)
    n_steps = max(0, (peak - floor_) // step)  # k steps below the peak: budget = peak - k * step >= floor

    def budget(k: int) -> int:
        return peak - k * step

    def point(n: str, k: int) -> dict:
        return {"planner": n, "hbm_bytes": budget(k), "hardware": hw.to_dict(), "options": (options or {}).get(n),
                "max_overhead": max_overhead}

    state, cache = _search(names, 0, n_steps, point, _minbudget_point, jobs, progress, graph, backend)
    lowest = {}
    for n, s in state.items():
        if s["good"] is None:
            lowest[n] = {"hbm_budget_bytes": None, "peak_hbm_bytes": None, "makespan_us": None, "overhead": None,
                         "note": f"no valid plan even at the no-offload peak ({peak} B)"
                         + ("" if max_overhead is None else f" within {max_overhead:.0%} overhead")}
            continue
        best = cache[(n, s["good"])]
        lowest[n] = {"hbm_budget_bytes": budget(s["good"]), "peak_hbm_bytes": best["peak_hbm_bytes"],
                     "makespan_us": best["makespan_us"], "overhead": best["overhead"],
                     "defrag_events": best.get("defrag_events"),
                     "note": "reaches the largest single-op working set" if s["bad"] is None else ""}
    probes = sorted(cache.values(), key=lambda r: (names.index(r["planner"]), -r["hbm_budget_bytes"]))
    return {"kind": "minbudget", "graph": graph.name, "hardware": hw.name, "no_offload_peak_hbm_bytes": peak,
            "working_set_bytes": floor_, "resolution_bytes": step, "max_overhead": max_overhead, "planners": names,
            "lowest": lowest, "points": probes}


def strip_timing(sweep: dict) -> dict:
    """The sweep without wall-clock measurements: what must be identical whatever ``jobs`` was."""
    out = dict(sweep)
    out["points"] = [{k: v for k, v in p.items() if k != "timing"} for p in sweep["points"]]
    return out


__all__ = [
    "DEFAULT_FRACTIONS", "DEFAULT_BANDWIDTHS_GBPS", "run_points", "budget_sweep", "bandwidth_sweep", "seqlen_sweep",
    "min_budget_search", "error_point",
    "fits", "strip_timing", "resolve_generator", "with_hbm", "with_bandwidth",
]
