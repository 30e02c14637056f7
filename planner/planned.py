"""A plan together with the executor's timeline for it, for planners that ran the executor already.

Planners return a ``Plan`` (``planner.planners.PLANNERS``). Some of them run the executor on the plan they return
before returning it (greedy checks and times its plan; cpsat compares its candidates by their timelines); running
it again on a 30k-op graph costs seconds. Those planners also have a variant that returns ``Planned``, the plan and
that timeline, so that callers such as ``planner.api.plan`` use it instead of simulating again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.executor import with_static_offsets
from planner.graph import Graph
from planner.hardware import Hardware
from planner.offsets_cpsat import offsets_within
from planner.plan import Plan
from planner.timeline import Timeline


@dataclass(frozen=True)
class Planned:
    """``plan`` and ``timeline == simulate(graph, hw, plan)`` (the full run: allocator model and offsets)."""

    plan: Plan
    timeline: Timeline


def place_statically(graph: Graph, hw: Hardware, plan: Plan, timed: Timeline, time_limit_s: float = 10.0,
                     found: tuple[dict[str, int | list[int]], int] | None = None) -> tuple[Planned | None, int]:
    """Give ``plan`` static HBM offsets for its allocator-free run ``timed`` (``offsets_within``: the heuristic's
    (order, fit) pairs, else the exact model). Return (the plan with its offsets and its full timeline, or None
    when they do not fit the HBM budget; the offsets' height). Greedy and cpsat both place this way, and fall
    back to the caching allocator themselves when it returns None. ``found``: ``offsets_within``'s answer for
    ``timed`` when the caller has it already (the executor checks the offsets either way)."""
    offs, height = found or offsets_within(timed.residencies, hw.hbm_bytes, time_limit_s=time_limit_s)
    if height > hw.hbm_bytes:
        return None, height
    static = replace(plan, offsets=offs)
    return Planned(static, with_static_offsets(graph, hw, static, timed)), height


__all__ = ["Planned", "place_statically"]
