"""How good a plan is known to be: the lower bound it is measured against, the gap, and what the planner proved.

Shown by the main job's summary (``--json`` too) and written into schedule files, so that a plan can be judged
without re-running anything: ``gap_vs_bound`` is (makespan - bound) / bound against a bound that holds for every
plan on the hardware at its budget (``planner/bounds.py``), so the plan is at most that far from optimal.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.bounds import gap, makespan_bound
from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan
from planner.timeline import Timeline

# What each planner proves about its plan when it says nothing more (cpsat and exact say more, see ``proof``).
HEURISTIC = "heuristic"


@dataclass(frozen=True)
class Quality:
    bound_ns: float  # a makespan lower bound that holds for every plan
    bound_reason: str
    gap_vs_bound: float | None  # (makespan - bound) / bound
    proof: str  # see ``proof``

    def to_dict(self) -> dict:
        return {"lower_bound_us": round(self.bound_ns / 1000, 3), "lower_bound_reason": self.bound_reason,
                "gap_vs_bound": None if self.gap_vs_bound is None else round(self.gap_vs_bound, 6),
                "proof": self.proof}


def proof(plan: Plan) -> str:
    """What the planner proved about its plan: ``optimal`` (exact; or cpsat on graphs small enough that it runs
    the exact search too: over every order and plan of the executor's model), ``model-optimal`` (cpsat: CP-SAT
    proved its model's optimum, which fixes the starting order and scales times and sizes, so not a proof for
    every plan), ``feasible`` (a solver stopped before proving anything), or ``heuristic`` (greedy, reactive,
    none)."""
    if plan.planner == "exact":
        return "optimal" if plan.status == "optimal" else "feasible"
    cp = plan.stats.get("cpsat")
    if isinstance(cp, dict):
        proven = cp.get("exact_optimum_us")
        if proven is not None and cp.get("makespan_us") is not None and cp["makespan_us"] <= proven:
            return "optimal"
        return "model-optimal" if cp.get("optimal") else "feasible"
    return HEURISTIC


def plan_quality(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> Quality:
    """Return the plan's Quality (no gap for a plan the executor rejects). The bound is the one cpsat computed
    already when it ran, else ``planner.bounds.makespan_bound`` (seconds on 30k-op graphs)."""
    cp = plan.stats.get("cpsat")
    if isinstance(cp, dict) and cp.get("bound_us") is not None:
        value, reason = float(cp["bound_us"]) * 1000, str(cp["bound_reason"])
    else:
        b = makespan_bound(graph, hw)
        value, reason = float(b.value), b.reason
    measured = gap(timeline.metrics.makespan_ns, value) if timeline.valid else None
    return Quality(value, reason, measured, proof(plan))


__all__ = ["HEURISTIC", "Quality", "plan_quality", "proof"]
