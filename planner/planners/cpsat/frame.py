"""A frame: which decisions of the CP-SAT model are free, in what time region, around which incumbent.

The whole model is the frame where everything is free on [0, horizon]; a large-neighbourhood window frees the ops
of a stretch of the schedule and the offload decisions around them (``lns.window_frame``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.planners.cpsat.data import Assignment, Problem


@dataclass
class Frame:
    lo: int
    hi: int
    inc: Assignment
    ops: set[int]
    free_offload: set[int] = field(default_factory=set)  # offload decision free
    free_detach: set[int] = field(default_factory=set)  # Detach time free
    free_prefetch: set[int] = field(default_factory=set)  # Prefetch start free
    free_store_tier: set[int] = field(default_factory=set)  # Store presence and tier free
    free_store_start: set[int] = field(default_factory=set)  # Store start free
    free_end: set[int] = field(default_factory=set)  # end of the last residency free
    free_tier: set[int] = field(default_factory=set)  # tier free
    op_lo: dict[int, int] = field(default_factory=dict)
    op_hi: dict[int, int] = field(default_factory=dict)  # latest start
    whole: bool = False
    final: bool = True  # no fixed op after the free ones: the objective is the true makespan
    ops_hi: int | None = None  # free ops end by then (default hi); transfers and memory are modelled to hi
    # A lower bound on the makespan (ticks) that every plan meets (planner/bounds.py): a redundant constraint that
    # lets CP-SAT prove optimality where its own bound stays far below.
    makespan_floor: int = 0

    @property
    def ops_end(self) -> int:
        return self.hi if self.ops_hi is None else self.ops_hi


def whole_frame(p: Problem, inc: Assignment, op_lo=None, op_hi=None, floor_ns: float = 0.0) -> Frame:
    """Everything free on [0, horizon]; ``floor_ns``: a makespan no plan beats (a bound), kept in ticks rounded up."""
    return Frame(
        lo=0, hi=p.horizon, inc=inc, ops=set(range(len(p.ops))),
        free_offload={g.index for g in p.gaps if not g.mandatory}, free_detach={g.index for g in p.gaps},
        free_prefetch={g.index for g in p.gaps}, free_store_tier={s.index for s in p.slots},
        free_store_start={s.index for s in p.slots},
        free_end={t.index for t in p.tensors if t.modelled and not t.until_end},
        free_tier={t.index for t in p.tensors if len(t.tiers) > 1},
        op_lo=op_lo or {}, op_hi=op_hi or {}, whole=True, final=True,
        makespan_floor=-(-int(floor_ns) // p.scale.tick_ns),
    )


__all__ = ["Frame", "whole_frame"]
