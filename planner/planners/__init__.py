"""Planners: each takes (graph, hardware, options) and returns a Plan. They never compute times themselves; the
executor does.

``REGISTRY`` holds one ``PlannerSpec`` per planner: its function, what reports, plots, sweeps, the stored solutions
and schedule files need to know of it. The CLI, reports, sweeps, solutions and bench read it, so adding a planner
is a module here, one entry below and its tests (docs/extending.md).

A planner's options are its function's keyword parameters after (graph, hw); their types come from the
annotations (``api.option_types``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from planner.errors import InputError
from planner.plan import Plan
from planner.planned import Planned
from planner.planners.cpsat import plan_cpsat, plan_cpsat_timed
from planner.planners.exact import plan_exact
from planner.planners.greedy import GREEDY_SETTINGS, plan_greedy, plan_greedy_timed
from planner.planners.greedy_sweep import plan_greedy_sweep
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive

PlannerFn = Callable[..., Plan]
TimedPlannerFn = Callable[..., Planned]


@dataclass(frozen=True)
class PlannerSpec:
    """Everything the package knows about one planner besides its code.

    ``timed``: a variant with the same options that returns a ``Planned`` (the plan and the timeline it ran
    anyway), so that callers do not run the executor again. ``report``: compared by reports and sweeps when the
    user names no planners (in registry order). ``report_plan``: what a report runs under this name (greedy runs
    at the best point of its sweep). ``family``: the report planner a plan of this name belongs to (a
    ``greedy-sweep`` plan was run as ``greedy``). ``deterministic``: options that make a run repeatable, set by
    sweeps (which run points in parallel processes) and bench. ``solution_options``: what the stored solutions
    in ``solutions/`` are made with. ``recorded``: options the planner records in its plans beyond those it
    takes (with their types), which schedule files may hold."""

    name: str
    plan: PlannerFn
    summary: str
    timed: TimedPlannerFn | None = None
    report: bool = False
    report_plan: PlannerFn | None = None
    family: str | None = None
    color: str = "#8c564b"
    marker: str = "o"
    deterministic: dict = field(default_factory=dict)
    solution_options: dict = field(default_factory=dict)
    recorded: dict[str, type] = field(default_factory=dict)

    @property
    def reported_as(self) -> str:
        return self.family or self.name

    def for_report(self) -> PlannerFn:
        return self.report_plan or self.plan


# cpsat single-worker with a fixed seed is deterministic (CP-SAT's deterministic time limit).
_CPSAT_DETERMINISTIC = {"workers": 1}

REGISTRY: dict[str, PlannerSpec] = {spec.name: spec for spec in (
    PlannerSpec("none", plan_none, "no offload: everything stays on HBM (what is pinned remote is fetched once)",
                report=True, color="#7f7f7f", marker="s"),
    PlannerSpec("reactive", plan_reactive, "a runtime's LRU eviction and on-demand fetches, no lookahead",
                report=True, color="#d62728", marker="v"),
    PlannerSpec("greedy", plan_greedy, "the paper's greedy refinement of cache-op placement",
                timed=plan_greedy_timed, report=True, report_plan=plan_greedy_sweep, color="#1f77b4", marker="o"),
    PlannerSpec("greedy-sweep", plan_greedy_sweep, "greedy over a grid of its four settings, the best valid plan",
                family="greedy", color="#1f77b4", marker="o",
                recorded={**{k: int for k in GREEDY_SETTINGS}, "evict": str, "sweep": bool}),
    PlannerSpec("cpsat", plan_cpsat, "CP-SAT over cache-op placement and order, from the best heuristic plan",
                timed=plan_cpsat_timed, report=True, color="#2ca02c", marker="D",
                deterministic=_CPSAT_DETERMINISTIC, solution_options={"time_limit": 10.0, **_CPSAT_DETERMINISTIC}),
    PlannerSpec("exact", plan_exact, "proven optimum over every order, for graphs of up to a dozen ops",
                color="#9467bd", marker="*"),
)}

# Derived views, for callers that need only one field.
PLANNERS: dict[str, PlannerFn] = {name: spec.plan for name, spec in REGISTRY.items()}
TIMED: dict[str, TimedPlannerFn] = {name: spec.timed for name, spec in REGISTRY.items() if spec.timed}
REPORT_PLANNERS: tuple[str, ...] = tuple(name for name, spec in REGISTRY.items() if spec.report)


def get_spec(name: str, item: str = "--planner", source: str = "command line") -> PlannerSpec:
    """The registry entry of planner ``name``; InputError naming ``item`` when there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputError(source, item, f"unknown planner {name!r} (known: {', '.join(REGISTRY)})") from None


def get_planner(name: str) -> PlannerFn:
    """The function of planner ``name``; InputError when there is none."""
    return get_spec(name).plan


def get_timed_planner(name: str) -> TimedPlannerFn | None:
    """The variant of planner ``name`` that also returns its plan's timeline, if it has one."""
    return get_spec(name).timed


__all__ = ["PLANNERS", "REGISTRY", "REPORT_PLANNERS", "TIMED", "PlannerSpec", "get_planner", "get_spec",
           "get_timed_planner"]
