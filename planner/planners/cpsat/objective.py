"""The CP-SAT model's objective: the makespan (ties broken by bytes moved), or the HBM peak under a makespan
limit; and the makespan part of an objective value."""

from __future__ import annotations

from planner.planners.cpsat.data import Assignment, Problem, op_end
from planner.planners.cpsat.variables import Variables, is_const


# ------------------------------------------------------------------ objective
def objective(m: Variables) -> None:
    p, f = m.p, m.f
    inc = f.inc
    ends = [m.en(o) for o in m.start if not any(s in m.start for s in p.ops[o].succs)]
    hint_m = max([op_end(p, inc, o) for o in m.start] + [f.lo])
    floor = f.lo
    if f.final:
        floor = max(floor, m.fixed_transfer_end, f.makespan_floor)
        for o in range(len(p.ops)):
            if o not in m.start:
                floor = max(floor, op_end(p, inc, o))
    top = p.horizon if f.final else f.ops_end
    m.makespan = m.int_var(floor, top, "makespan", max(hint_m, floor, _hint_end(p, inc, m) if f.final else 0))
    for e in ends:
        m.le(e, m.makespan)
    if f.final:
        # A tensor fetched back before the step ends (a back gap) is there by the makespan.
        for g, lits in m.offload_to.items():
            gap = p.gaps[g]
            if gap.kind == "back" and not is_const(m.prefetch[g]):
                for r, lit in lits.items():
                    m.le(m.prefetch[g] + gap.fetch[r], m.makespan, [lit])
        for s, q in m.store_to.items():
            sl = p.slots[s]
            if any(p.gaps[g].kind == "end" for g in sl.gaps):
                for r, lit in q.items():
                    m.le(m.store_start[s] + sl.store[r], m.makespan, [lit])
    if m.makespan_limit is not None:
        m.cp.add(m.makespan <= m.makespan_limit)
    tie = sum(v * w for v, w in m.tie_terms) if m.tie_terms else 0
    tie_max = sum(w for _v, w in m.tie_terms)
    if m.objective == "peak":
        m.cp.minimize(m.peak * (top + 1) + m.makespan)
    elif m.tie_weight and m.tie_terms:
        m.cp.minimize(m.makespan * (tie_max + 1) + tie)
    else:
        m.cp.minimize(m.makespan)
    m.tie_max = tie_max


def objective_to_makespan(m: Variables, value: float) -> float:
    """The makespan part of an objective value (ticks)."""
    if m.objective == "peak":
        return value
    if m.tie_weight and m.tie_terms:
        return value / (m.tie_max + 1)
    return value


def _hint_end(p: Problem, inc: Assignment, model: Variables) -> int:
    return inc.makespan


__all__ = ["objective", "objective_to_makespan"]
