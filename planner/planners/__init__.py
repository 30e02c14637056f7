"""Planners: each takes (graph, hardware, options) and returns a Plan. They never compute times themselves;
the executor does. ``PLANNERS`` maps the names the CLI accepts to the functions.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan
from planner.planners.cpsat import plan_cpsat
from planner.planners.exact import plan_exact
from planner.planners.greedy import plan_greedy
from planner.planners.greedy_sweep import plan_greedy_sweep
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive

PlannerFn = Callable[..., Plan]

PLANNERS: dict[str, PlannerFn] = {
    "none": plan_none,
    "reactive": plan_reactive,
    "greedy": plan_greedy,
    "greedy-sweep": plan_greedy_sweep,
    "cpsat": plan_cpsat,
    "exact": plan_exact,
}


def get_planner(name: str) -> PlannerFn:
    from planner.errors import InputError

    try:
        return PLANNERS[name]
    except KeyError:
        known = ", ".join(PLANNERS)
        raise InputError("command line", "--planner", f"unknown planner {name!r} (known: {known})") from None


__all__ = ["PLANNERS", "get_planner", "Graph", "Hardware", "Plan"]
