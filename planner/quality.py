"""How good a plan is known to be: the lower bound it is measured against, the gap, and what the planner proved.

Shown by the main job's summary (``--json`` too) and written into schedule files, so that a plan can be judged
without re-running anything: ``gap_vs_bound`` is (makespan - bound) / bound against a bound that holds for every
plan on the hardware at its budget (``planner/bounds.py``), so the plan is at most that far from optimal.

For cpsat plans, ``SolverOutcome`` says how the search ended (``solver_outcome``): whether the plan is proven
optimal, a solution CP-SAT found, or the starting plan it fell back to; why the search stopped; and the bound and
gap CP-SAT proved for its own (scaled) model. It is part of ``Quality`` (``solver`` in ``--json`` and in the
schedule file's ``quality``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from planner.bounds import gap, makespan_bound
from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan, PlanStatus, StepKind
from planner.timeline import Timeline

# Why cpsat's search stopped (``Plan.stats["cpsat"]["stop"]``), and how the summary and report say it.
STOP_REASONS = {
    "optimal": "CP-SAT proved its model's optimum",
    "compute_bound": "the plan runs at the compute bound (optimal over every plan)",
    "time_limit": "time limit",
    # A deterministic run (one worker, the default) ends on CP-SAT's deterministic budget, 0.1 s per second of the
    # limit, so that it repeats; on some models that is a small part of the limit (LLaMA-3-8B training, 2 layers:
    # 8.7 s of 60; --workers 2 reached 336.3 ms there against 490.0 ms).
    "deterministic_budget": "its deterministic budget, before the time limit (so the run repeats; --workers 2 "
                            "searches the whole limit, not reproducibly)",
    "no_improvement": "no improvement left to find (every window tried)",
    "interrupted": "interrupted (Ctrl-C)",
    "no_time": "no time for the search after the starting plan",
    "failed": "the solver failed",
    "infeasible": "infeasible",
}


class SolveStatus(str, Enum):
    """How a solver's search ended for the plan it returned: ``optimal`` (proven: over every plan by the exact
    search or the compute bound, or CP-SAT proved its model's optimum and this is that solution), ``feasible`` (a
    solution it found, not proven optimal) or ``fallback`` (the starting plan: the search found nothing better
    or nothing valid)."""

    def __str__(self) -> str:
        return self.value

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    FALLBACK = "fallback"


class Proof(str, Enum):
    """What a planner proved about its plan (``proof``)."""

    def __str__(self) -> str:
        return self.value

    OPTIMAL = "optimal"  # over every plan of the executor's model
    MODEL_OPTIMAL = "model-optimal"  # CP-SAT's optimum for its model (one order, scaled times and sizes)
    FEASIBLE = "feasible"  # a solver stopped before proving anything
    HEURISTIC = "heuristic"  # what greedy, reactive and none claim when they say nothing more: nothing


@dataclass(frozen=True)
class SolverOutcome:
    """How cpsat's search ended. ``status``: ``optimal`` (proven: over every plan by the exact search or the compute
    bound, or CP-SAT proved its model's optimum and this is that solution), ``feasible`` (a solution CP-SAT found,
    not proven optimal) or ``fallback`` (the starting plan: the search found nothing better or nothing valid).
    The model bound and gap are CP-SAT's for its scaled model (whole models only): not a bound for every plan."""

    status: SolveStatus
    stop_reason: str  # a key of STOP_REASONS
    plan_from: str  # cpsat, the exact search, or the starting planner (greedy, reactive, none, ...)
    model: str  # whole, lns or none
    cp_sat_status: str | None  # CP-SAT's own: OPTIMAL, FEASIBLE, UNKNOWN, ...; LNS for the window search
    objective_us: float | None  # CP-SAT's best objective as a makespan (its scaled model)
    model_bound_us: float | None
    model_gap: float | None  # (objective - bound) / bound, in the model
    windows: int | None  # LNS windows solved, and accepted
    windows_accepted: int | None
    model_optimal: bool = False  # CP-SAT proved its model's optimum (for the plan returned or the start it kept)
    start_planner: str | None = None  # the starting plan's planner, and its makespan
    start_makespan_us: float | None = None
    search_s: float | None = None  # wall seconds of the whole run: not in ``to_dict`` (files stay byte-identical)

    @property
    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def to_dict(self) -> dict:
        """JSON-ready, with no wall-clock figure (schedule files stay byte-identical for the same input)."""
        return {"status": self.status.value, "stop_reason": self.stop_reason, "plan_from": self.plan_from,
                "model": self.model, "cp_sat_status": self.cp_sat_status,
                "objective_us": _round(self.objective_us, 3), "model_bound_us": _round(self.model_bound_us, 3),
                "model_gap": _round(self.model_gap, 6), "windows": self.windows,
                "windows_accepted": self.windows_accepted}

    @classmethod
    def from_dict(cls, d: dict) -> SolverOutcome:
        """The outcome ``to_dict`` wrote (the summary holds that dict: it is what ``--json`` prints)."""
        fields = {k: d.get(k) for k in ("stop_reason", "plan_from", "model", "cp_sat_status", "objective_us",
                                        "model_bound_us", "model_gap", "windows", "windows_accepted")}
        return cls(SolveStatus(d["status"]), **fields)

    def describe(self) -> str:
        """One line: ``feasible · stopped: time limit · CP-SAT's bound on its scaled model 61.4 ms (gap 79.5%)``."""
        head = (self.status.value if self.status is not SolveStatus.FALLBACK
                else f"fallback to the starting plan ({self.plan_from})")
        if self.status is SolveStatus.OPTIMAL and self.plan_from != "cpsat":
            head += f" ({self.plan_from}'s plan)"
        parts = [head, "stopped: " + STOP_REASONS.get(self.stop_reason, self.stop_reason)]
        if self.model_bound_us is not None:
            gap_text = "" if self.model_gap is None else f" (gap {self.model_gap:.2%})"
            parts.append(f"CP-SAT's bound on its scaled model {self.model_bound_us / 1000:.3f} ms{gap_text}")
        if self.windows is not None:
            parts.append(f"{self.windows} windows, {self.windows_accepted} accepted")
        return " · ".join(parts)


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(float(v), digits)


def solver_outcome(plan: Plan) -> SolverOutcome | None:
    """The outcome of cpsat's search, from ``plan.stats["cpsat"]``; None for a plan cpsat did not make."""
    st = plan.stats.get("cpsat") if isinstance(plan.stats, dict) else None
    if not isinstance(st, dict):
        return None
    returned = st.get("returned", "cpsat")
    plan_from = {"start": st.get("start_planner", "start"), "exact": "exact"}.get(returned, "cpsat")
    # The compute bound and the exact optimum are makespans: they prove nothing about the peak objective.
    makespan_objective = plan.options.get("objective", "makespan") == "makespan"
    if (makespan_objective and _proven_every_plan(st)) or _proven_in_model(st):
        status = SolveStatus.OPTIMAL
    elif returned == "start":
        status = SolveStatus.FALLBACK
    else:
        status = SolveStatus.FEASIBLE
    stop = st.get("stop") or ("optimal" if st.get("status") == "OPTIMAL" else "time_limit")
    bound, objective = st.get("model_bound_us"), st.get("objective_us")
    model_gap = None
    if st.get("model") == "whole" and bound and objective is not None:
        model_gap = max(0.0, (objective - bound) / bound)
    lns = st.get("lns") if isinstance(st.get("lns"), dict) else None
    return SolverOutcome(status, str(stop), str(plan_from), str(st.get("model", "none")), st.get("status"),
                         objective, bound if st.get("model") == "whole" else None, model_gap,
                         lns["windows"] if lns else None, lns["accepted"] if lns else None,
                         model_optimal=bool(st.get("optimal")), start_planner=st.get("start_planner"),
                         start_makespan_us=st.get("start_makespan_us"), search_s=st.get("runtime_s"))


def _proven_every_plan(st: dict) -> bool:
    """The plan is optimal over every plan: at the exact search's proven optimum, at the compute bound, or at the
    lower bound (planner/bounds.py), which every plan meets."""
    ms = st.get("makespan_us")
    if ms is None:
        return False
    floors = (st.get("exact_optimum_us"), st.get("compute_us"), st.get("bound_us"))
    return any(v is not None and ms <= v for v in floors)


# Records of cpsat's (``stats["cpsat"]``) saying its plan is no longer the model's solution: a slower one taken for
# its static offsets, evictions added for the caching allocator, Stores moved after the search.
ALTERED_AFTER_SEARCH = ("slower_solution_placed", "compaction_evictions", "stores_earlier")


def _proven_in_model(st: dict) -> bool:
    """CP-SAT proved its model's optimum, and the plan returned is that solution (not the start it did not beat,
    nor a slower solution taken for its static offsets, nor one with evictions added for the caching allocator or
    its Stores moved after the search)
    and runs no slower than the model's optimum says."""
    if (not st.get("optimal") or st.get("returned", "cpsat") == "start"
            or any(st.get(k) for k in ALTERED_AFTER_SEARCH)):
        return False
    ms, objective = st.get("makespan_us"), st.get("objective_us")
    return ms is None or objective is None or ms <= objective + 1e-6


@dataclass(frozen=True)
class Quality:
    bound_ns: float  # a makespan lower bound that holds for every plan
    bound_reason: str
    gap_vs_bound: float | None  # (makespan - bound) / bound
    proof: Proof
    solver: SolverOutcome | None = None  # cpsat's: how its search ended

    def to_dict(self) -> dict:
        d = {"lower_bound_us": round(self.bound_ns / 1000, 3), "lower_bound_reason": self.bound_reason,
             "gap_vs_bound": None if self.gap_vs_bound is None else round(self.gap_vs_bound, 6),
             "proof": self.proof.value}
        if self.solver is not None:
            d["solver"] = self.solver.to_dict()
        return d


def proof(plan: Plan) -> Proof:
    """What the planner proved about its plan: ``optimal`` (exact; or cpsat on graphs small enough that it runs
    the exact search too: over every order and plan of the executor's model), ``model-optimal`` (cpsat: CP-SAT
    proved its model's optimum, which fixes the starting order and scales times and sizes, so not a proof for
    every plan), ``feasible`` (a solver stopped before proving anything), or ``heuristic`` (greedy, reactive,
    none)."""
    if plan.planner == "exact":
        return Proof.OPTIMAL if plan.status is PlanStatus.OPTIMAL else Proof.FEASIBLE
    cp = plan.stats.get("cpsat")
    if isinstance(cp, dict):
        if _proven_every_plan(cp):
            return Proof.OPTIMAL
        # A starting plan CP-SAT proved no faster solution than (in its model) is model-optimal too.
        altered = any(cp.get(k) for k in ALTERED_AFTER_SEARCH)
        return Proof.MODEL_OPTIMAL if cp.get("optimal") and not altered else Proof.FEASIBLE
    return Proof.HEURISTIC


def may_recompute(plan: Plan) -> bool:
    """Whether the plan belongs to the plans that may recompute (its bound must allow for re-runs): it has recompute
    steps, or its planner was free to add them (planners that can record ``recompute`` in their options)."""
    return plan.count(StepKind.RECOMPUTE) > 0 or plan.options.get("recompute") is True


def plan_quality(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> Quality:
    """Return the plan's Quality (no gap for a plan the executor rejects). The bound is the one cpsat computed
    already when it ran, else ``planner.bounds.makespan_bound`` (seconds on 30k-op graphs)."""
    cp = plan.stats.get("cpsat")
    if isinstance(cp, dict) and cp.get("bound_us") is not None:
        value, reason = float(cp["bound_us"]) * 1000, str(cp["bound_reason"])
    else:
        b = makespan_bound(graph, hw, recompute=may_recompute(plan))
        value, reason = float(b.value), b.reason
    measured = gap(timeline.metrics.makespan_ns, value) if timeline.valid else None
    return Quality(value, reason, measured, proof(plan), solver_outcome(plan))


__all__ = ["STOP_REASONS", "Proof", "Quality", "SolveStatus", "SolverOutcome", "may_recompute", "plan_quality", "proof",
           "solver_outcome"]
