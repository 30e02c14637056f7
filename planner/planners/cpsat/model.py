"""The CP-SAT model, in layers: variables, then one function per constraint family, then the objective.

A ``Frame`` says which decisions are free and in what time region [lo, hi]; everything else keeps its value in
the frame's incumbent ``Assignment`` and enters the model as a constant. The whole model is the frame where
everything is free on [0, horizon]; a large-neighbourhood window frees the ops of a stretch of the schedule and
the offload decisions around them. Constraints whose terms are all constant are skipped (the incumbent meets
them); residencies and transfers that are fixed enter the cumulatives clipped to the region.

Families:
- ops: one interval per op on a NoOverlap (one compute stream), data-dependency precedences;
- gaps: an offload Boolean per candidate gap (a literal per tier where there are several), the Detach after the
  users before the gap, the Prefetch (an optional interval on its link) ending before the users after it; a free
  tensor's starting tier is its init gap's Boolean, tied to its end gap's (the wrap-around gap);
- slots: one optional Store per version that an offloaded gap needs, after the write that made the version and
  before every Detach that relies on it;
- tiers: one remote tier per offloaded tensor, each tier's capacity;
- links: a NoOverlap per one-channel link, a Cumulative where a link has several channels;
- remats: a recompute gap's re-run after the op's first run, with its inputs on HBM throughout;
- memory: each tensor's HBM residencies (alloc to first Detach, each Prefetch start to the next Detach, the
  last to the last use or the end) and every op's workspace in one Cumulative of capacity the budget;
- objective: makespan (ties broken by bytes moved), or peak HBM under a makespan limit.
"""

from __future__ import annotations

from planner.planners.cpsat import constraints
from planner.planners.cpsat import objective as objectives
from planner.planners.cpsat.data import Assignment, Problem
from planner.planners.cpsat.frame import Frame, whole_frame
from planner.planners.cpsat.variables import Variables, is_const


class Model(Variables):
    """The CP-SAT model of a frame, built in layers: the variables (``Variables``), each constraint family
    (``constraints``), the objective (``objective``). ``add_hints`` sets every variable, ``read`` turns values
    back into an assignment."""

    def __init__(self, p: Problem, f: Frame, objective: str = "makespan", makespan_limit: int | None = None,
                 tie_weight: bool = True) -> None:
        super().__init__(p, f, objective, makespan_limit, tie_weight)
        for family in (constraints.ops, constraints.gaps, constraints.slots, constraints.tiers, constraints.links,
                       constraints.memory, constraints.remats, constraints.ends, constraints.detach_times):
            family(self)
        objectives.objective(self)

    def objective_to_makespan(self, value: float) -> float:
        """The makespan part of an objective value (ticks)."""
        return objectives.objective_to_makespan(self, value)

    def add_hints(self) -> int:
        self.cp.clear_hints()
        for v, val in self.hints:
            self.cp.add_hint(v, val)
        return len(self.hints)

    def read(self, values: list[int]) -> Assignment:
        """The assignment the solver's ``values`` (indexed by variable) describe, the rest from the incumbent."""
        p, f = self.p, self.f
        a = f.inc.copy()

        def val(x):
            return x if is_const(x) else values[x.index]

        for o, s in self.start.items():
            a.start[o] = val(s)
        for g in self.offload:
            gap = p.gaps[g]
            tier = next((r for r, lit in self.offload_to[g].items() if val(lit)), None)
            if tier is None:
                a.off.pop(g, None)
            else:
                a.off[g] = tier
            if g in self.detach:
                a.detach[g] = val(self.detach[g])
            a.prefetch[g] = val(self.prefetch[g])
            if gap.kind == "end" and tier is not None:
                a.prefetch[g] = p.horizon
        for s, q in self.store_to.items():
            tier = next((r for r, lit in q.items() if val(lit)), None)
            if tier is None:
                a.store.pop(s, None)
            else:
                a.store[s] = tier
            a.store_start[s] = val(self.store_start[s])
        for t, F in self.freed.items():
            a.freed[t] = val(F)
        return a


__all__ = ["Frame", "Model", "whole_frame"]
