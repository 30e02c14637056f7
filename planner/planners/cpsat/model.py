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
- memory: each tensor's HBM residencies (alloc to first Detach, each Prefetch start to the next Detach, the
  last to the last use or the end) and every op's workspace in one Cumulative of capacity the budget;
- objective: makespan (ties broken by bytes moved), or peak HBM under a makespan limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.sat.python import cp_model
from ortools.util.python import sorted_interval_list

from planner.planners.cpsat.data import Assignment, Problem, chain, op_end
from planner.planners.cpsat.hint import memory_items, transfer_intervals


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

    @property
    def ops_end(self) -> int:
        return self.hi if self.ops_hi is None else self.ops_hi


def whole_frame(p: Problem, inc: Assignment, op_lo=None, op_hi=None) -> Frame:
    """Everything free on [0, horizon]."""
    return Frame(
        lo=0, hi=p.horizon, inc=inc, ops=set(range(len(p.ops))),
        free_offload={g.index for g in p.gaps if not g.mandatory}, free_detach={g.index for g in p.gaps},
        free_prefetch={g.index for g in p.gaps}, free_store_tier={s.index for s in p.slots},
        free_store_start={s.index for s in p.slots},
        free_end={t.index for t in p.tensors if t.modelled and not t.until_end},
        free_tier={t.index for t in p.tensors if len(t.tiers) > 1},
        op_lo=op_lo or {}, op_hi=op_hi or {}, whole=True, final=True,
    )


def _const(x) -> bool:
    return isinstance(x, int)


class Model:
    """Builds the CP-SAT model for a frame; ``hint`` sets every variable, ``read`` turns values back."""

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
        self._variables()
        self._ops()
        self._gaps()
        self._slots()
        self._tiers()
        self._links()
        self._memory()
        self._ends()
        self._detach_times()
        self._objective()

    # ------------------------------------------------------------------ variables
    def _int(self, lo: int, hi: int, name: str, hint: int):
        hi = max(lo, hi)
        v = self.cp.new_int_var(lo, hi, name)
        self.dom[v.index] = (lo, hi)
        self.hints.append((v, min(max(hint, lo), hi)))
        return v

    def _bool(self, name: str, hint: int):
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
            self.start[o] = self._int(a, b, f"s{o}", inc.start[o])
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
                cur = self._tier_of(t)
                self.tier_of[t] = {r: self._bool(f"z{t}_{r}", cur == r) for r in ti.tiers}
            if t in f.free_end:
                self.freed[t] = self._int(lo, hi, f"F{t}", inc.freed[t])
            for g in ti.gaps:
                self._gap_vars(g)
        for s in p.slots:
            if p.slots[s.index].tensor in self.tier_of or s.index in f.free_store_tier or s.index in f.free_store_start:
                self._slot_vars(s.index)

    def _tier_of(self, t: int) -> str | None:
        inc = self.f.inc
        for g in self.p.tensors[t].gaps:
            if g in inc.off:
                return inc.off[g]
        return None

    def _gap_vars(self, g: int) -> None:
        p, f, inc = self.p, self.f, self.f.inc
        gap = p.gaps[g]
        cur = inc.off.get(g)
        if g in f.free_offload:
            self.offload[g] = self._bool(f"b{g}", cur is not None)
            if len(gap.tiers) == 1:
                self.offload_to[g] = {gap.tiers[0]: self.offload[g]}
            else:
                self.offload_to[g] = {r: self._bool(f"p{g}_{r}", cur == r) for r in gap.tiers}
                self.cp.add(sum(self.offload_to[g].values()) == self.offload[g])
        else:
            self.offload[g] = int(cur is not None)
            self.offload_to[g] = {r: int(cur == r) for r in gap.tiers}
        if gap.kind != "init":
            if g in f.free_detach:
                self.detach[g] = self._int(min(f.lo, inc.detach[g]), max(f.hi, inc.detach[g]), f"X{g}", inc.detach[g])
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
                self.prefetch[g] = self._int(ylo, max(f.hi, inc.prefetch[g]), f"Y{g}", inc.prefetch[g])
        else:
            self.prefetch[g] = inc.prefetch[g]

    def _slot_vars(self, s: int) -> None:
        p, f, inc = self.p, self.f, self.f.inc
        sl = p.slots[s]
        if s in self.store_to:
            return
        cur = inc.store.get(s)
        if s in f.free_store_tier:
            self.store_to[s] = {r: self._bool(f"q{s}_{r}", cur == r) for r in sl.tiers}
        else:
            self.store_to[s] = {r: int(cur == r) for r in sl.tiers}
        if s in f.free_store_start:
            was = inc.store_start[s]
            self.store_start[s] = self._int(min(f.lo, was), max(f.hi, was), f"S{s}", was)
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
            if _const(lit):
                if lit == 0:
                    return
                continue
            ls.append(lit)
        if _const(a) and _const(b):
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
        if _const(a):
            if a:
                if _const(b):
                    if not b:
                        raise ValueError("constant implication violated")
                else:
                    self.cp.add(b == 1)
            return
        if _const(b):
            if not b:
                self.cp.add(a == 0)
            return
        self.cp.add_implication(a, b)

    # ------------------------------------------------------------------ ops
    def _ops(self) -> None:
        p, f = self.p, self.f
        intervals = []
        self.op_iv = {}
        for o, s in self.start.items():
            iv = self.cp.new_fixed_size_interval_var(s, p.ops[o].dur, f"op{o}")
            self.op_iv[o] = iv
            intervals.append(iv)
        if len(intervals) > 1:
            self.cp.add_no_overlap(intervals)
        for o in self.start:
            for q in p.ops[o].preds:
                if q in self.start or op_end(p, f.inc, q) > f.lo:
                    self.le(self.en(q), self.st(o))
            for s in p.ops[o].succs:
                if s not in self.start and f.inc.start[s] < f.ops_end:
                    self.le(self.en(o), self.st(s))

    # ------------------------------------------------------------------ gaps
    def _gaps(self) -> None:
        """Offload decisions: not offloaded, X = Y (no hole); offloaded, the Prefetch (on its tier's link) ends
        before the users after the gap, after the gap's Store; an offloaded end gap has no residency after."""
        p, f, H = self.p, self.f, self.p.horizon
        for t in self.touched:
            ti = p.tensors[t]
            placed = self.offload[ti.placement_gap] if ti.placement_gap is not None else None
            for g in ti.gaps:
                gap = p.gaps[g]
                b, X, Y = self.offload[g], self.detach.get(g), self.prefetch[g]
                if gap.placement:
                    # Starts on HBM: resident from time 0, no Prefetch.
                    if _const(b):
                        if b == 0:
                            self.eq(Y, 0)
                    else:
                        self.eq(Y, 0, [b.Not()])
                elif ti.free and gap.kind == "end":
                    self.eq(b, placed)
                if gap.kind != "init":
                    self.le(X, Y)
                    if not _const(b):
                        self.eq(X, Y, [b.Not()])
                    elif b == 0:
                        self.eq(X, Y)
                if gap.kind == "end":
                    self.eq(Y, H, [b])
                for r, lit in self.offload_to[g].items():
                    if _const(lit) and lit == 0:
                        continue
                    if gap.has_fetch:
                        for u in gap.after:
                            self.le(Y + gap.fetch[r], self.st(u), [lit])
                        if not f.whole and not (_const(lit) and _const(Y)):
                            # A transfer the window moves stays inside the window.
                            self.le(f.lo, Y, [lit])
                            self.le(Y + gap.fetch[r], f.hi, [lit])
                    if gap.slot is not None:
                        self._slot_vars(gap.slot)
                        if gap.store_unless_placed:
                            self._implies_unless(lit, placed, self.store_to[gap.slot][r])
                        else:
                            self.implies(lit, self.store_to[gap.slot][r])

    def _implies_unless(self, a, c, b) -> None:
        """a and not c => b, for literals or constants."""
        if _const(c):
            if not c:
                self.implies(a, b)
            return
        if _const(a):
            if a:
                self.implies(c.Not(), b)
            return
        if _const(b):
            if not b:
                self.cp.add_implication(a, c)
            return
        self.cp.add_bool_or([a.Not(), c, b])

    # ------------------------------------------------------------------ slots
    def _slots(self) -> None:
        """One Store per version at most, after its writer; none that no offloaded gap needs."""
        p, f = self.p, self.f
        for s, q in self.store_to.items():
            sl = p.slots[s]
            S = self.store_start[s]
            if sl.writer is not None:
                self.le(self.en(sl.writer), S)
            qs = [v for v in q.values() if not _const(v)]
            if not f.whole and not _const(S):
                for r, lit in q.items():
                    self.le(f.lo, S, [lit])
                    self.le(S + sl.store[r], f.hi, [lit])
            if qs:
                consts = sum(v for v in q.values() if _const(v))
                self.cp.add(sum(qs) + consts <= 1)
                if len(qs) == len(q):
                    bs = [self.offload.get(g, int(g in self.f.inc.off)) for g in sl.gaps]
                    self.cp.add(sum(qs) <= sum(bs))
                    # In the whole model an absent Store sits at its writer's end.
                    canon = self.en(sl.writer) if sl.writer is not None else 0
                    if f.whole and not _const(S):
                        self.cp.add(S == canon).only_enforce_if([v.Not() for v in qs])

    # ------------------------------------------------------------------ tiers
    def _tiers(self) -> None:
        p = self.p
        for t, z in self.tier_of.items():
            self.cp.add(sum(z.values()) <= 1)
            for g in p.tensors[t].gaps:
                for r, lit in self.offload_to[g].items():
                    self.implies(lit, z[r])
        for s, q in self.store_to.items():
            t = p.slots[s].tensor
            if t in self.tier_of:
                for r, lit in q.items():
                    self.implies(lit, self.tier_of[t][r])
        if not self.tier_of:
            return
        for r, tier in p.tiers.items():
            terms = []
            fixed = tier.home_bytes
            for t in p.tensors:
                if r not in t.tiers or t.starts_remote or not t.gaps:
                    continue
                if t.index in self.tier_of:
                    terms.append((self.tier_of[t.index][r], t.nbytes))
                elif self._tier_of(t.index) == r:
                    fixed += t.nbytes
            if fixed + sum(b for _v, b in terms) > tier.capacity_bytes:
                self.cp.add(sum(v * b for v, b in terms) <= tier.capacity_bytes - fixed)

    # ------------------------------------------------------------------ links
    def _links(self) -> None:
        p, f = self.p, self.f
        lo, hi = f.lo, f.hi
        per_link: dict[str, list] = {name: [] for name in p.links}
        built: set[tuple[str, int]] = set()
        for g, lits in self.offload_to.items():
            gap = p.gaps[g]
            if not gap.has_fetch:
                continue
            for r, lit in lits.items():
                Y = self.prefetch[g]
                if _const(lit) and (lit == 0 or _const(Y)):
                    continue  # absent, or fixed (added below with the incumbent's fixed transfers)
                per_link[p.tiers[r].fetch_link].append(self._transfer(Y, gap.fetch[r], lit, f"pf{g}_{r}"))
                built.add(("g", g))
                if not _const(lit):
                    self.tie_terms.append((lit, self._tie(p.tensors[gap.tensor].nbytes)))
        for s, q in self.store_to.items():
            sl = p.slots[s]
            for r, lit in q.items():
                S = self.store_start[s]
                if _const(lit) and (lit == 0 or _const(S)):
                    continue
                per_link[p.tiers[r].store_link].append(self._transfer(S, sl.store[r], lit, f"st{s}_{r}"))
                built.add(("s", s))
                if not _const(lit):
                    self.tie_terms.append((lit, self._tie(p.tensors[sl.tensor].nbytes)))
        # The incumbent's transfers that the frame fixes, clipped to the region.
        self.fixed_transfer_end = 0
        for name, ivs in transfer_intervals(p, f.inc).items():
            for s, e, what in ivs:
                kind, idx = what.split()
                if (("g" if kind == "fetch" else "s"), int(idx[1:])) in built:
                    continue
                self.fixed_transfer_end = max(self.fixed_transfer_end, e)
                s2, e2 = max(s, lo), min(e, hi)
                if e2 > s2:
                    per_link[name].append(self.cp.new_fixed_size_interval_var(s2, e2 - s2, f"fx_{name}_{s}"))
        for name, ivs in per_link.items():
            if len(ivs) < 2:
                continue
            ch = p.links[name].channels
            if ch == 1:
                self.cp.add_no_overlap(ivs)
            else:
                self.cp.add_cumulative(ivs, [1] * len(ivs), ch)

    def _transfer(self, start, size: int, lit, name: str):
        if _const(lit):
            return self.cp.new_fixed_size_interval_var(start, size, name)
        return self.cp.new_optional_fixed_size_interval_var(start, size, lit, name)

    def _tie(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.tie_unit))

    @property
    def tie_unit(self) -> int:
        if not hasattr(self, "_tie_unit"):
            total = sum(t.nbytes * max(1, len(t.gaps)) for t in self.p.tensors if t.gaps) or 1
            self._tie_unit = max(1, total // 1_000_000)
        return self._tie_unit

    # ------------------------------------------------------------------ memory
    def _memory(self) -> None:
        p, f = self.p, self.f
        lo, hi = f.lo, f.hi
        intervals, demands = [], []
        touched = set(self.touched)
        for t in self.touched:
            ti = p.tensors[t]
            for (a, b), (ha, hb) in zip(self._chain_terms(ti), chain(p, f.inc, ti)):
                if _const(a) and _const(b):
                    continue  # fixed: in the profile below
                a2, b2 = self._clip(a, ha), self._clip(b, hb)
                if _const(a2) and _const(b2) and b2 <= a2:
                    continue
                size = self._int(0, hi - lo, f"sz{t}", max(0, min(max(hb, lo), hi) - min(max(ha, lo), hi)))
                self.cp.add(size == b2 - a2)
                intervals.append(self.cp.new_interval_var(a2, size, b2, f"res{t}"))
                demands.append(ti.units)
        for o in self.start:
            if p.ops[o].ws:
                intervals.append(self.op_iv[o])
                demands.append(p.ops[o].ws)
        # The fixed profile: residencies of untouched tensors, and the constant pieces of touched ones.
        ev = []
        for t in p.tensors:
            if not t.modelled:
                continue
            if t.index in touched:
                pieces = [(a, b) for a, b in self._chain_terms(t) if _const(a) and _const(b)]
            else:
                pieces = chain(p, f.inc, t)
            for a, b in pieces:
                a2, b2 = max(a, lo), min(b, hi)
                if b2 > a2:
                    ev.append((a2, t.units))
                    ev.append((b2, -t.units))
        for o in p.ops:
            if o.ws and o.index not in self.start:
                a2, b2 = max(f.inc.start[o.index], lo), min(op_end(p, f.inc, o.index), hi)
                if b2 > a2:
                    ev.append((a2, o.ws))
                    ev.append((b2, -o.ws))
        profile = _profile(ev, lo, hi)
        base = min((lvl for _s, _e, lvl in profile), default=0)
        for s, e, lvl in profile:
            if lvl > base:
                intervals.append(self.cp.new_fixed_size_interval_var(s, e - s, f"mem{s}"))
                demands.append(lvl - base)
        self.mem_base = base
        cap = p.capacity - base
        if self.objective == "peak":
            self.peak = self._int(0, max(0, cap), "peak", max(0, cap))
            self.cp.add_cumulative(intervals, demands, self.peak)
        elif intervals:
            self.cp.add_cumulative(intervals, demands, max(0, cap))

    def _clip(self, x, hint: int):
        """``x`` clamped to the region [lo, hi] (a new variable only when x's domain reaches outside it)."""
        lo, hi = self.f.lo, self.f.hi
        if _const(x):
            return min(max(x, lo), hi)
        dlo, dhi = self.dom.get(x.index, (lo, hi))
        if dlo < lo:
            v = self._int(lo, hi, "clip", min(max(hint, lo), hi))
            self.cp.add_max_equality(v, [x, lo])
            x, dlo = v, lo
        if dhi > hi:
            v = self._int(dlo, hi, "clip", min(max(hint, lo), hi))
            self.cp.add_min_equality(v, [x, hi])
            x = v
        return x

    def _chain_terms(self, ti) -> list[tuple[object, object]]:
        p = self.p
        gaps = [g for g in ti.gaps if p.gaps[g].kind != "init"]
        if ti.producer is not None:
            cur = self.st(ti.producer)
        elif ti.starts_remote or ti.free:
            cur = self.prefetch[ti.gaps[0]] if ti.gaps[0] in self.prefetch else self.f.inc.prefetch[ti.gaps[0]]
        else:
            cur = 0
        out = []
        for g in gaps:
            out.append((cur, self.detach[g] if g in self.detach else self.f.inc.detach[g]))
            cur = self.prefetch[g] if g in self.prefetch else self.f.inc.prefetch[g]
        end = p.horizon if ti.until_end else self.freed.get(ti.index, self.f.inc.freed.get(ti.index, 0))
        if not ti.until_end and ti.index not in self.freed:
            end = self.f.inc.freed[ti.index]
        out.append((cur, end))
        return out

    # ------------------------------------------------------------------ transient ends
    def _ends(self) -> None:
        """A tensor freed after its last use is freed exactly then: F = the latest end of its users."""
        p = self.p
        for t, F in self.freed.items():
            ti = p.tensors[t]
            ends = [self.en(u) for u in ti.users]
            if ti.producer is not None:
                ends.append(self.en(ti.producer))
            var = [e for e in ends if not _const(e)]
            const = max((e for e in ends if _const(e)), default=None)
            if const is not None:
                var.append(const)
            if len(var) == 1:
                self.cp.add(F == var[0])
            else:
                self.cp.add_max_equality(F, var)

    def _detach_times(self) -> None:
        """The Detach goes as early as it can (later only holds HBM longer): X = the end of the last user before
        the gap, or of the Store when that ends later. A gap that is not offloaded has X = Y = that same end."""
        p, inc = self.p, self.f.inc
        for t in self.touched:
            for g in p.tensors[t].gaps:
                gap = p.gaps[g]
                X, b = self.detach.get(g), self.offload[g]
                if gap.kind == "init" or _const(X):
                    continue
                ends = [self.en(u) for u in gap.before] or [0]
                users_end = max((op_end(p, inc, u) for u in gap.before), default=0)
                last = self._max(ends, f"L{g}", users_end)
                if gap.slot is None:
                    self.eq(X, last)
                    continue
                if _const(b):
                    if b == 0:
                        self.eq(X, last)
                else:
                    self.eq(X, last, [b.Not()])
                sl = p.slots[gap.slot]
                S = self.store_start[gap.slot]
                # A free tensor that starts remote needs no Store of its first version: then X = the users' end.
                unless = []
                if gap.store_unless_placed:
                    placed = self.offload[p.tensors[gap.tensor].placement_gap]
                    if _const(placed):
                        if placed:
                            self.eq(X, last)
                            continue
                    else:
                        self.eq(X, last, [placed])
                        unless = [placed.Not()]
                for r, lit in self.offload_to[g].items():
                    if _const(lit) and lit == 0:
                        continue
                    hint = max(users_end, inc.store_start[gap.slot] + sl.store[r])
                    # A Store that is not made may still sit late (its writer's end): leave room past the horizon.
                    xr = self._max(ends + [S + sl.store[r]], f"Xr{g}_{r}", hint, hi=self.p.horizon + sl.store[r])
                    self.eq(X, xr, [lit] + unless)

    def _max(self, exprs: list, name: str, hint: int, hi: int | None = None):
        """A term equal to the largest of ``exprs`` (a constant or single expression when it can be), at most
        ``hi`` (default the horizon)."""
        var = [e for e in exprs if not _const(e)]
        const = [e for e in exprs if _const(e)]
        if not var:
            return max(const)
        if len(var) == 1 and not const:
            return var[0]
        v = self._int(0, self.p.horizon if hi is None else hi, name, hint)
        self.cp.add_max_equality(v, var + ([max(const)] if const else []))
        return v

    # ------------------------------------------------------------------ objective
    def _objective(self) -> None:
        p, f = self.p, self.f
        inc = f.inc
        ends = [self.en(o) for o in self.start if not any(s in self.start for s in p.ops[o].succs)]
        hint_m = max([op_end(p, inc, o) for o in self.start] + [f.lo])
        floor = f.lo
        if f.final:
            floor = max(floor, self.fixed_transfer_end)
            for o in range(len(p.ops)):
                if o not in self.start:
                    floor = max(floor, op_end(p, inc, o))
        top = p.horizon if f.final else f.ops_end
        self.makespan = self._int(floor, top, "makespan", max(hint_m, floor, _hint_end(p, inc, self) if f.final else 0))
        for e in ends:
            self.le(e, self.makespan)
        if f.final:
            # A tensor fetched back before the step ends (a back gap) is there by the makespan.
            for g, lits in self.offload_to.items():
                gap = p.gaps[g]
                if gap.kind == "back" and not _const(self.prefetch[g]):
                    for r, lit in lits.items():
                        self.le(self.prefetch[g] + gap.fetch[r], self.makespan, [lit])
            for s, q in self.store_to.items():
                sl = p.slots[s]
                if any(p.gaps[g].kind == "end" for g in sl.gaps):
                    for r, lit in q.items():
                        self.le(self.store_start[s] + sl.store[r], self.makespan, [lit])
        if self.makespan_limit is not None:
            self.cp.add(self.makespan <= self.makespan_limit)
        tie = sum(v * w for v, w in self.tie_terms) if self.tie_terms else 0
        tie_max = sum(w for _v, w in self.tie_terms)
        if self.objective == "peak":
            self.cp.minimize(self.peak * (top + 1) + self.makespan)
        elif self.tie_weight and self.tie_terms:
            self.cp.minimize(self.makespan * (tie_max + 1) + tie)
        else:
            self.cp.minimize(self.makespan)
        self.tie_max = tie_max

    def objective_to_makespan(self, value: float) -> float:
        """The makespan part of an objective value (ticks)."""
        if self.objective == "peak":
            return value
        if self.tie_weight and self.tie_terms:
            return value / (self.tie_max + 1)
        return value

    # ------------------------------------------------------------------ hint and read
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
            return x if _const(x) else values[x.index]

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


def _hint_end(p: Problem, inc: Assignment, model: Model) -> int:
    return inc.makespan


def _profile(ev: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Piecewise-constant level over [lo, hi) from (time, delta) events: (start, end, level) segments."""
    ev.sort()
    out = []
    cur = 0
    t0 = lo
    i = 0
    while i < len(ev):
        t = ev[i][0]
        if t > t0 and t0 < hi:
            if out and out[-1][2] == cur and out[-1][1] == t0:
                out[-1] = (out[-1][0], min(t, hi), cur)
            else:
                out.append((t0, min(t, hi), cur))
        while i < len(ev) and ev[i][0] == t:
            cur += ev[i][1]
            i += 1
        t0 = max(t, lo)
    if t0 < hi:
        if out and out[-1][2] == cur and out[-1][1] == t0:
            out[-1] = (out[-1][0], hi, cur)
        else:
            out.append((t0, hi, cur))
    return out


__all__ = ["Frame", "Model", "whole_frame", "memory_items"]
