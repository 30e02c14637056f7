"""The CP-SAT model's variables for a frame, and the small helpers every constraint family uses.

``Variables`` creates one decision per free choice of the frame (a constant where the frame fixes it) with its
hint from the frame's incumbent: op starts, per gap the offload literal (per tier), the Detach time and the
Prefetch start, per slot the Store literal (per tier) and start, per tensor the end of its last residency and
its remote tier. ``constraints.py`` adds the constraint families, ``objective.py`` the objective; ``model.py``
puts the three together.
"""

from __future__ import annotations

from ortools.sat.python import cp_model
from ortools.util.python import sorted_interval_list

from planner.planners.cpsat.data import RECOMPUTE, Problem
from planner.planners.cpsat.frame import Frame


def is_const(x) -> bool:
    return isinstance(x, int)


class Variables:
    """The decisions of a frame's model, and helpers that add terms over them."""

    def __init__(self, p: Problem, f: Frame, objective: str = "makespan", makespan_limit: int | None = None,
                 tie_weight: bool = True) -> None:
        self.p, self.f = p, f
        self.cp = cp_model.CpModel()
        self.objective = objective
        self.makespan_limit = makespan_limit
        self.tie_weight = tie_weight
        self.hints: list[tuple[object, int]] = []
        self.dom: dict[int, tuple[int, int]] = {}
        self.start: dict[int, object] = {}
        # Decisions, each a constant where the frame fixes it (the paper's letters in brackets).
        self.offload: dict[int, object] = {}  # gap -> Boolean: the gap is spent off HBM (b)
        self.offload_to: dict[int, dict[str, object]] = {}  # gap -> tier -> Boolean, where several tiers (pr)
        self.detach: dict[int, object] = {}  # gap -> Detach time (X)
        self.prefetch: dict[int, object] = {}  # gap -> Prefetch start (Y)
        self.store_to: dict[int, dict[str, object]] = {}  # slot -> tier -> Boolean: a Store of the version (q)
        self.store_start: dict[int, object] = {}  # slot -> Store start (S)
        self.freed: dict[int, object] = {}  # tensor -> end of its last residency (F)
        self.tier_of: dict[int, dict[str, object]] = {}  # tensor -> tier -> Boolean: its one remote tier (z)
        self.tie_terms: list[tuple[object, int]] = []
        self.makespan = None  # (M)
        self.peak = None  # peak HBM, for the peak objective (P)
        self.op_iv: dict[int, object] = {}  # op -> its interval (constraints.ops)
        self.remat_iv: dict[int, object] = {}  # recompute gap -> its re-run's interval (constraints.ops)
        self.fixed_transfer_end = 0  # the latest fixed transfer (constraints.links)
        self.mem_base = None  # the fixed HBM profile under the window (constraints.memory)
        self.tie_max = 0  # the tie-break's largest value (objective)
        self._variables()

    # ------------------------------------------------------------------ variables
    def int_var(self, lo: int, hi: int, name: str, hint: int):
        hi = max(lo, hi)
        v = self.cp.new_int_var(lo, hi, name)
        self.dom[v.index] = (lo, hi)
        self.hints.append((v, min(max(hint, lo), hi)))
        return v

    def bool_var(self, name: str, hint: int):
        v = self.cp.new_bool_var(name)
        self.hints.append((v, int(bool(hint))))
        return v

    def _variables(self) -> None:
        p, f, inc = self.p, self.f, self.f.inc
        lo, hi = f.lo, f.hi
        for o in sorted(f.ops):
            d = p.ops[o].dur
            a = max(lo, f.op_lo.get(o, lo))
            b = min(f.ops_end - d, f.op_hi.get(o, f.ops_end - d))
            self.start[o] = self.int_var(a, b, f"s{o}", inc.start[o])
        # Which tensors the frame touches: their gaps, slots and residencies are built as terms.
        touched = set(f.free_end) | set(f.free_tier)
        for o in sorted(f.ops):
            touched.update(p.ops[o].reads)
            touched.update(p.ops[o].outputs)
        for g in f.free_offload | f.free_detach | f.free_prefetch:
            touched.add(p.gaps[g].tensor)
        for s in f.free_store_tier | f.free_store_start:
            touched.add(p.slots[s].tensor)
        self.touched = sorted(t for t in touched if p.tensors[t].modelled)
        for t in self.touched:
            ti = p.tensors[t]
            if t in f.free_tier:
                cur = self.incumbent_tier(t)
                self.tier_of[t] = {r: self.bool_var(f"z{t}_{r}", cur == r) for r in ti.tiers}
            if t in f.free_end:
                self.freed[t] = self.int_var(lo, hi, f"F{t}", inc.freed[t])
            for g in ti.gaps:
                self.gap_vars(g)
        for s in p.slots:
            if p.slots[s.index].tensor in self.tier_of or s.index in f.free_store_tier or s.index in f.free_store_start:
                self.slot_vars(s.index)

    def incumbent_tier(self, t: int) -> str | None:
        inc = self.f.inc
        for g in self.p.tensors[t].gaps:
            if g in inc.off and inc.off[g] != RECOMPUTE:
                return inc.off[g]
        return None

    def gap_vars(self, g: int) -> None:
        p, f, inc = self.p, self.f, self.f.inc
        gap = p.gaps[g]
        cur = inc.off.get(g)
        if g in f.free_offload:
            self.offload[g] = self.bool_var(f"b{g}", cur is not None)
            if len(gap.tiers) == 1:
                self.offload_to[g] = {gap.tiers[0]: self.offload[g]}
            else:
                self.offload_to[g] = {r: self.bool_var(f"p{g}_{r}", cur == r) for r in gap.tiers}
                self.cp.add(sum(self.offload_to[g].values()) == self.offload[g])
        else:
            self.offload[g] = int(cur is not None)
            self.offload_to[g] = {r: int(cur == r) for r in gap.tiers}
        if gap.kind != "init":
            if g in f.free_detach:
                was = inc.detach[g]
                self.detach[g] = self.int_var(min(f.lo, was), max(f.hi, was), f"X{g}", was)
            else:
                self.detach[g] = inc.detach[g]
        if g in f.free_prefetch:
            ylo = min(f.lo, inc.prefetch[g]) if gap.kind != "end" or g not in inc.off else f.lo
            if gap.kind == "end" and p.horizon > f.hi:
                top = max(f.hi, inc.prefetch[g]) if inc.prefetch[g] < p.horizon else f.hi
                dom = sorted_interval_list.Domain.from_intervals([[ylo, top], [p.horizon, p.horizon]])
                v = self.cp.new_int_var_from_domain(dom, f"Y{g}")
                self.dom[v.index] = (ylo, p.horizon)
                self.hints.append((v, inc.prefetch[g]))
                self.prefetch[g] = v
            else:
                self.prefetch[g] = self.int_var(ylo, max(f.hi, inc.prefetch[g]), f"Y{g}", inc.prefetch[g])
        else:
            self.prefetch[g] = inc.prefetch[g]

    def slot_vars(self, s: int) -> None:
        p, f, inc = self.p, self.f, self.f.inc
        sl = p.slots[s]
        if s in self.store_to:
            return
        cur = inc.store.get(s)
        if s in f.free_store_tier:
            self.store_to[s] = {r: self.bool_var(f"q{s}_{r}", cur == r) for r in sl.tiers}
        else:
            self.store_to[s] = {r: int(cur == r) for r in sl.tiers}
        if s in f.free_store_start:
            was = inc.store_start[s]
            self.store_start[s] = self.int_var(min(f.lo, was), max(f.hi, was), f"S{s}", was)
        else:
            self.store_start[s] = inc.store_start[s]

    # ------------------------------------------------------------------ helpers
    def st(self, o: int):
        return self.start.get(o, self.f.inc.start[o]) if o in self.start else self.f.inc.start[o]

    def en(self, o: int):
        return self.st(o) + self.p.ops[o].dur

    def le(self, a, b, lits=()) -> None:
        """Post a <= b, enforced by the literals (constants 1 are dropped, a constant 0 drops the constraint)."""
        ls = []
        for lit in lits:
            if is_const(lit):
                if lit == 0:
                    return
                continue
            ls.append(lit)
        if is_const(a) and is_const(b):
            if a <= b:
                return
            if not ls:
                raise ValueError(f"constant constraint {a} <= {b} violated")
            self.cp.add_bool_or([x.Not() for x in ls])
            return
        ct = self.cp.add(a <= b)
        if ls:
            ct.only_enforce_if(ls)

    def eq(self, a, b, lits=()) -> None:
        self.le(a, b, lits)
        self.le(b, a, lits)

    def implies(self, a, b) -> None:
        """a => b for literals or constants."""
        if is_const(a):
            if a:
                if is_const(b):
                    if not b:
                        raise ValueError("constant implication violated")
                else:
                    self.cp.add(b == 1)
            return
        if is_const(b):
            if not b:
                self.cp.add(a == 0)
            return
        self.cp.add_implication(a, b)

    def transfer(self, start, size: int, lit, name: str):
        if is_const(lit):
            return self.cp.new_fixed_size_interval_var(start, size, name)
        return self.cp.new_optional_fixed_size_interval_var(start, size, lit, name)

    def tie(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.tie_unit))

    @property
    def tie_unit(self) -> int:
        if not hasattr(self, "_tie_unit"):
            total = sum(t.nbytes * max(1, len(t.gaps)) for t in self.p.tensors if t.gaps) or 1
            self._tie_unit = max(1, total // 1_000_000)
        return self._tie_unit

    def max_of(self, exprs: list, name: str, hint: int, hi: int | None = None):
        """A term equal to the largest of ``exprs`` (a constant or single expression when it can be), at most
        ``hi`` (default the horizon)."""
        var = [e for e in exprs if not is_const(e)]
        const = [e for e in exprs if is_const(e)]
        if not var:
            return max(const)
        if len(var) == 1 and not const:
            return var[0]
        v = self.int_var(0, self.p.horizon if hi is None else hi, name, hint)
        self.cp.add_max_equality(v, var + ([max(const)] if const else []))
        return v


__all__ = ["Variables", "is_const"]
