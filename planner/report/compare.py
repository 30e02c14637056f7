"""Run several planners on one graph and one hardware and return plain rows, one per planner.

    from planner.report.compare import compare
    cmp = compare(graph, hw)                  # every report planner that exists: none, reactive, greedy, cpsat
    cmp.rows[0]["makespan_us"], cmp.runs["greedy"].timeline

Every plan is run in the executor. A plan with violations is kept and marked ``invalid`` (with its violations);
a budget below the largest single-op working set is ``infeasible``; a planner that raises is ``error``. Nothing
is dropped silently.

Rows are plain dicts with machine units (bytes, microseconds, seconds) so they go straight to JSON and CSV.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from planner import api
from planner import bounds as B
from planner.errors import InfeasibleBudget
from planner.executor import simulate
from planner.formats.hograph import graph_sha256
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import bytes_by_kind
from planner.plan import Plan, StepKind
from planner.planners import REGISTRY, REPORT_PLANNERS
from planner.quality import solver_outcome
from planner.timeline import Timeline

# Row statuses.
VALID, INVALID, INFEASIBLE, ERROR = "valid", "invalid", "infeasible", "error"


@dataclass
class Run:
    """One planner's outcome: the plain row plus the objects behind it (absent when no plan was made)."""

    row: dict
    plan: Plan | None = None
    timeline: Timeline | None = None


@dataclass
class Comparison:
    """Planners side by side on one graph and hardware."""

    graph: Graph
    hw: Hardware
    reference: Timeline
    bounds: dict
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def rows(self) -> list[dict]:
        return [r.row for r in self.runs.values()]

    def to_dict(self) -> dict:
        return {
            "graph": graph_info(self.graph),
            "hardware": self.hw.to_dict(),
            "no_offload": reference_info(self.reference),
            "bounds": self.bounds,
            "rows": self.rows,
        }


def available_planners(wanted: Iterable[str] | None = None) -> list[str]:
    """The report planners (``REPORT_PLANNERS``, in registry order), or the registered subset of ``wanted``."""
    names = REPORT_PLANNERS if wanted is None else tuple(wanted)
    return [n for n in names if n in REGISTRY]


def graph_info(graph: Graph) -> dict:
    kv = sum(t.bytes for t in graph.tensors.values() if t.kind.value == "kv_cache")
    return {
        "name": graph.name,
        "ops": len(graph.ops),
        "tensors": len(graph.tensors),
        "sha256": graph_sha256(graph),
        "total_bytes": graph.total_bytes(),
        "kv_cache_bytes": kv,
    }


def reference_info(ref: Timeline) -> dict:
    m = ref.metrics
    return {"makespan_us": m.makespan_ns / 1000, "peak_hbm_bytes": m.peak_bytes.get(HBM, 0)}


def lower_bounds(graph: Graph, hw: Hardware) -> dict:
    """The lower bounds every gap is reported against: ``{"makespan_us": {value, reason}, "peak_hbm_bytes": ...}``
    (``bounds.makespan_bound`` and ``bounds.hbm_floor``)."""
    minimum, reason = B.hbm_floor(graph)
    best = B.makespan_bound(graph, hw)
    return {"peak_hbm_bytes": {"value": minimum, "reason": reason},
            "makespan_us": {"value": best.value / 1000, "reason": best.reason}}


def planner_fn(name: str) -> Callable[..., Plan]:
    """The function a report calls for ``name`` (``PlannerSpec.for_report``: greedy at its best sweep setting)."""
    return REGISTRY[name].for_report()


def run_planner(
    graph: Graph, hw: Hardware, name: str, reference: Timeline, bounds: dict, options: dict | None = None,
) -> Run:
    """Plan with ``name``, simulate, and return the Run. Never raises for a planner failure."""
    options = dict(options or {})
    minimum = bounds["peak_hbm_bytes"]["value"]
    base = {"planner": name, "options": options, "hbm_budget_bytes": hw.hbm_bytes}
    if hw.hbm_bytes < minimum:
        row = _empty_row(base, hw, INFEASIBLE,
                         f"budget below the lower bound on peak HBM, {minimum} B "
                         f"({bounds['peak_hbm_bytes']['reason']}): no plan can fit")
        return Run(row)
    t0 = time.perf_counter()
    try:
        plan = planner_fn(name)(graph, hw, **options)
    except InfeasibleBudget as exc:
        return Run(_empty_row(base, hw, INFEASIBLE, str(exc), solve_time_s=time.perf_counter() - t0))
    except Exception as exc:  # shown in the report as an error, never hidden
        msg = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return Run(_empty_row(base, hw, ERROR, msg if msg.strip() else tb, solve_time_s=time.perf_counter() - t0))
    solve = time.perf_counter() - t0
    tl = simulate(graph, hw, plan)
    row = metrics_row(base, hw, plan, tl, reference, bounds, solve)
    # Where the tensors no op produces start the step: bytes per kind and tier, and what starts off HBM.
    row["start_placement"] = bytes_by_kind(graph, plan.placement)
    row["start_remote_bytes"] = sum(b for tiers in row["start_placement"].values()
                                    for tier, b in tiers.items() if tier != HBM)
    return Run(row, plan, tl)


def metrics_row(base: dict, hw: Hardware, plan: Plan, tl: Timeline, reference: Timeline, bounds: dict,
                solve_time_s: float) -> dict:
    """The plain row of one simulated plan."""
    m = tl.metrics
    ref = reference.metrics.makespan_ns
    bound_us = bounds["makespan_us"]["value"]
    outcome = solver_outcome(plan)
    makespan_us = m.makespan_ns / 1000
    row = dict(base)
    row.update({
        "status": VALID if tl.valid else INVALID,
        "plan_status": str(plan.status),
        "valid": tl.valid,
        "violations": len(tl.violations),
        "violation_kinds": sorted({v.kind for v in tl.violations}),
        "first_violations": [v.describe() for v in tl.violations[:5]],
        "peak_hbm_bytes": m.peak_bytes.get(HBM, 0),
        "peak_bytes": dict(sorted(m.peak_bytes.items())),
        "makespan_us": makespan_us,
        "overhead": round(m.makespan_ns / ref - 1, 6) if ref else 0.0,
        "bytes_moved": {ln.name: m.bytes_moved.get(ln.name, 0) for ln in hw.links},
        "stall_us": m.stall_ns / 1000,
        "hidden_transfer_share": round(m.hidden_share, 6),
        "defrag_events": m.defrag_events,
        "defrag_us": m.defrag_ns / 1000,
        "fragmentation_failures": m.fragmentation_failures,
        "allocator": getattr(m, "allocator", None),
        "offset_height_bytes": m.offset_height_bytes,
        "makespan_bound_us": bound_us,
        "gap_vs_bound": round(makespan_us / bound_us - 1, 6) if bound_us else None,
        "solver_bound_us": outcome.model_bound_us if outcome else None,
        "solver_optimal": outcome.model_optimal if outcome else None,
        "solve_time_s": round(solve_time_s, 3),
        "notes": list(plan.notes) + _sweep_note(plan),
        "made_by": plan.planner,
        "plan_options": _plain(plan.options),
    })
    if plan.count(StepKind.RECOMPUTE):
        # Only for plans that recompute, so rows (and the tables made from them) of other plans stay as they were;
        # ``compare`` fills in zeros for the other plans of a comparison where one recomputes.
        row.update(recompute_fields(plan, tl))
    return row


# The row keys of recomputation: recompute steps, and their compute time (part of the makespan's compute).
RECOMPUTE_KEYS = ("recomputes", "recompute_us")


def recompute_fields(plan: Plan, tl: Timeline) -> dict:
    """The recompute keys of a simulated plan's row."""
    return {"recomputes": plan.count(StepKind.RECOMPUTE), "recompute_us": tl.metrics.recompute_ns / 1000}


def fill_recompute(rows: list[dict]) -> None:
    """When some row's plan recomputes, give every row with a simulated plan the recompute keys (0 when its plan
    does not), so each row of a comparison has the same columns; rows without a plan keep None. Rows of plans that
    never recompute are left as they are."""
    if not any(r.get("recomputes") for r in rows):
        return
    for r in rows:
        simulated = r.get("makespan_us") is not None
        for k in RECOMPUTE_KEYS:
            r.setdefault(k, (0 if k == "recomputes" else 0.0) if simulated else None)


def _sweep_note(plan: Plan) -> list[str]:
    st = plan.stats or {}
    if "sweep_points" not in st:
        return []
    chosen = ", ".join(f"{k}={v}" for k, v in plan.options.items() if k not in ("sweep", "order", "offsets"))
    return [f"best of {st['sweep_points']} settings ({st.get('sweep_valid', '?')} valid): {chosen}"]


def _plain(d: dict) -> dict:
    """JSON-safe copy of planner options."""
    return json.loads(json.dumps(d, default=str))


def _empty_row(base: dict, hw: Hardware, status: str, message: str, solve_time_s: float = 0.0) -> dict:
    row = dict(base)
    row.update({
        "status": status, "plan_status": status, "valid": False, "violations": 0, "violation_kinds": [],
        "first_violations": [], "peak_hbm_bytes": None, "peak_bytes": {}, "makespan_us": None, "overhead": None,
        "bytes_moved": {ln.name: None for ln in hw.links}, "stall_us": None, "hidden_transfer_share": None,
        "defrag_events": None, "defrag_us": None, "fragmentation_failures": None, "allocator": None,
        "offset_height_bytes": None, "makespan_bound_us": None, "gap_vs_bound": None,
        "solver_bound_us": None, "solver_optimal": None, "solve_time_s": round(solve_time_s, 3), "notes": [message],
    })
    return row


def compare(
    graph: Graph,
    hw: Hardware,
    planners: Iterable[str] | None = None,
    options: dict[str, dict] | None = None,
    source: str = "<graph>",
    on_planner: Callable[[str], None] | None = None,
) -> Comparison:
    """Run each planner (default: every registered report planner) on ``graph`` and ``hw``.

    ``options`` maps a planner name to its keyword options (``{"cpsat": {"time_limit": 10}}``).
    ``on_planner(name)`` is called before each planner runs (for progress displays).
    """
    api.check_compatible(graph, hw, source)
    reference = api.no_offload_reference(graph, hw)
    bounds = lower_bounds(graph, hw)
    cmp = Comparison(graph, hw, reference, bounds)
    for name in available_planners(planners):
        if on_planner:
            on_planner(name)
        cmp.runs[name] = run_planner(graph, hw, name, reference, bounds, (options or {}).get(name))
    fill_recompute(cmp.rows)
    return cmp


__all__ = [
    "REPORT_PLANNERS", "VALID", "INVALID", "INFEASIBLE", "ERROR", "Run", "Comparison", "available_planners",
    "lower_bounds", "run_planner", "metrics_row", "compare", "graph_info", "planner_fn", "RECOMPUTE_KEYS",
    "recompute_fields", "fill_recompute",
]
