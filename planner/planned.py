"""A plan together with the executor's timeline for it, for planners that ran the executor already.

Planners return a ``Plan`` (``planner.planners.PLANNERS``). Some of them run the executor on the plan they return
before returning it (greedy checks and times its plan; cpsat compares its candidates by their timelines); running
it again on a 30k-op graph costs seconds. Those planners also have a variant that returns ``Planned``, the plan and
that timeline, so that callers such as ``planner.api.plan`` use it instead of simulating again.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.plan import Plan
from planner.timeline import Timeline


@dataclass(frozen=True)
class Planned:
    """``plan`` and ``timeline == simulate(graph, hw, plan)`` (the full run: allocator model and offsets)."""

    plan: Plan
    timeline: Timeline


__all__ = ["Planned"]
