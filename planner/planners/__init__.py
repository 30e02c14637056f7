"""Planners: each takes (graph, hardware, options) and returns a Plan. They never compute times themselves;
the executor does. ``PLANNERS`` maps the names the CLI accepts to the functions.

``TIMED`` maps the planners that run the executor on the plan they return to a variant with the same options that
returns a ``Planned`` (the plan and that timeline), so that callers do not run it again.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import InputError
from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan
from planner.planned import Planned
from planner.planners.cpsat import plan_cpsat, plan_cpsat_timed
from planner.planners.exact import plan_exact
from planner.planners.greedy import plan_greedy, plan_greedy_timed
from planner.planners.greedy_sweep import plan_greedy_sweep
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive

PlannerFn = Callable[..., Plan]
TimedPlannerFn = Callable[..., Planned]

PLANNERS: dict[str, PlannerFn] = {
    "none": plan_none,
    "reactive": plan_reactive,
    "greedy": plan_greedy,
    "greedy-sweep": plan_greedy_sweep,
    "cpsat": plan_cpsat,
    "exact": plan_exact,
}


TIMED: dict[str, TimedPlannerFn] = {
    "greedy": plan_greedy_timed,
    "cpsat": plan_cpsat_timed,
}


def get_timed_planner(name: str) -> TimedPlannerFn | None:
    """The variant of planner ``name`` that also returns its plan's timeline, if it has one."""
    return TIMED.get(name)


def get_planner(name: str) -> PlannerFn:
    try:
        return PLANNERS[name]
    except KeyError:
        known = ", ".join(PLANNERS)
        raise InputError("command line", "--planner", f"unknown planner {name!r} (known: {known})") from None


__all__ = ["PLANNERS", "TIMED", "get_planner", "get_timed_planner", "Planned", "Graph", "Hardware", "Plan"]
