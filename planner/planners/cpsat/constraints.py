"""The CP-SAT model's constraint families, one function each, over a frame's ``Variables``.

- ops: one interval per op and per re-run of a recompute gap on a NoOverlap (one compute stream), data-dependency
  precedences;
- gaps: not offloaded, Detach = Prefetch (no hole); offloaded, the Prefetch (an optional interval on its tier's
  link) ends before the users after the gap; a free tensor's starting tier is its init gap's literal, tied to
  its end gap's (the wrap-around gap);
- slots: one optional Store per version an offloaded gap needs, after the write that made the version and before
  every Detach that relies on it;
- tiers: one remote tier per offloaded tensor, each tier's capacity;
- links: a NoOverlap per one-channel link, a Cumulative where a link has several channels;
- memory: each tensor's HBM residencies and every op's workspace in one Cumulative of capacity the budget;
- remats: a re-run after the op's first run and before the in-place writes of what it reads, with every input on
  HBM for its whole length (the input's offloaded gaps end before it or start after it);
- ends and detach times: the end of each tensor's last residency (a re-run reading it is a use), and each
  Detach after the users before its gap and the Store it relies on.
"""

from __future__ import annotations

from planner.planners.cpsat.data import RECOMPUTE, chain, op_end
from planner.planners.cpsat.hint import remat_intervals, transfer_intervals
from planner.planners.cpsat.variables import Variables, is_const


# ------------------------------------------------------------------ ops
def ops(m: Variables) -> None:
    p, f = m.p, m.f
    intervals = []
    m.op_iv = {}
    for o, s in m.start.items():
        iv = m.cp.new_fixed_size_interval_var(s, p.ops[o].dur, f"op{o}")
        m.op_iv[o] = iv
        intervals.append(iv)
    # Re-runs: optional where the frame decides them; the incumbent's fixed ones where they fall in the region.
    m.remat_iv = {}
    for g, lits in m.offload_to.items():
        lit = lits.get(RECOMPUTE, 0)
        if is_const(lit) and lit == 0:
            continue
        Y = m.prefetch[g]
        if is_const(lit) and is_const(Y):
            continue  # fixed: added with the incumbent's below
        m.remat_iv[g] = m.transfer(Y, p.gaps[g].fetch[RECOMPUTE], lit, f"re{g}")
        intervals.append(m.remat_iv[g])
    for g, (s, e) in remat_intervals(p, f.inc).items():
        if g in m.remat_iv:
            continue
        s2, e2 = max(s, f.lo), min(e, f.ops_end)
        if e2 > s2 and not f.whole:
            intervals.append(m.cp.new_fixed_size_interval_var(s2, e2 - s2, f"fre{g}"))
        elif f.whole:
            intervals.append(m.cp.new_fixed_size_interval_var(s, e - s, f"fre{g}"))
    if len(intervals) > 1:
        m.cp.add_no_overlap(intervals)
    for o in m.start:
        for q in p.ops[o].preds:
            if q in m.start or op_end(p, f.inc, q) > f.lo:
                m.le(m.en(q), m.st(o))
        for s in p.ops[o].succs:
            if s not in m.start and f.inc.start[s] < f.ops_end:
                m.le(m.en(o), m.st(s))


# ------------------------------------------------------------------ gaps
def gaps(m: Variables) -> None:
    """Offload decisions: not offloaded, X = Y (no hole); offloaded, the Prefetch (on its tier's link) ends
    before the users after the gap, after the gap's Store; an offloaded end gap has no residency after."""
    p, f, H = m.p, m.f, m.p.horizon
    for t in m.touched:
        ti = p.tensors[t]
        placed = m.offload[ti.placement_gap] if ti.placement_gap is not None else None
        for g in ti.gaps:
            gap = p.gaps[g]
            b, X, Y = m.offload[g], m.detach.get(g), m.prefetch[g]
            if gap.placement:
                # Starts on HBM: resident from time 0, no Prefetch.
                if is_const(b):
                    if b == 0:
                        m.eq(Y, 0)
                else:
                    m.eq(Y, 0, [b.Not()])
            elif ti.free and gap.kind == "end":
                m.eq(b, placed)
            if gap.kind != "init":
                m.le(X, Y)
                if not is_const(b):
                    m.eq(X, Y, [b.Not()])
                elif b == 0:
                    m.eq(X, Y)
            if gap.kind == "end":
                m.eq(Y, H, [b])
            for r, lit in m.offload_to[g].items():
                if is_const(lit) and lit == 0:
                    continue
                if gap.has_fetch:
                    for u in gap.after:
                        m.le(Y + gap.fetch[r], m.st(u), [lit])
                    if not f.whole and not (is_const(lit) and is_const(Y)):
                        # A transfer the window moves stays inside the window; a re-run, among the window's ops.
                        m.le(f.lo, Y, [lit])
                        m.le(Y + gap.fetch[r], f.ops_end if r == RECOMPUTE else f.hi, [lit])
                if r == RECOMPUTE:
                    continue  # dropped, not stored
                if gap.slot is not None:
                    m.slot_vars(gap.slot)
                    if gap.store_unless_placed:
                        _implies_unless(m, lit, placed, m.store_to[gap.slot][r])
                    else:
                        m.implies(lit, m.store_to[gap.slot][r])


def _implies_unless(m: Variables, a, c, b) -> None:
    """a and not c => b, for literals or constants."""
    if is_const(c):
        if not c:
            m.implies(a, b)
        return
    if is_const(a):
        if a:
            m.implies(c.Not(), b)
        return
    if is_const(b):
        if not b:
            m.cp.add_implication(a, c)
        return
    m.cp.add_bool_or([a.Not(), c, b])


# ------------------------------------------------------------------ slots
def slots(m: Variables) -> None:
    """One Store per version at most, after its writer; none that no offloaded gap needs."""
    p, f = m.p, m.f
    for s, q in m.store_to.items():
        sl = p.slots[s]
        S = m.store_start[s]
        if sl.writer is not None:
            m.le(m.en(sl.writer), S)
        qs = [v for v in q.values() if not is_const(v)]
        if not f.whole and not is_const(S):
            for r, lit in q.items():
                m.le(f.lo, S, [lit])
                m.le(S + sl.store[r], f.hi, [lit])
        if qs:
            consts = sum(v for v in q.values() if is_const(v))
            m.cp.add(sum(qs) + consts <= 1)
            if len(qs) == len(q):
                bs = [m.offload.get(g, int(g in m.f.inc.off)) for g in sl.gaps]
                m.cp.add(sum(qs) <= sum(bs))
                # In the whole model an absent Store sits at its writer's end.
                canon = m.en(sl.writer) if sl.writer is not None else 0
                if f.whole and not is_const(S):
                    m.cp.add(S == canon).only_enforce_if([v.Not() for v in qs])


# ------------------------------------------------------------------ tiers
def tiers(m: Variables) -> None:
    p = m.p
    for t, z in m.tier_of.items():
        m.cp.add(sum(z.values()) <= 1)
        for g in p.tensors[t].gaps:
            for r, lit in m.offload_to[g].items():
                if r != RECOMPUTE:
                    m.implies(lit, z[r])
    for s, q in m.store_to.items():
        t = p.slots[s].tensor
        if t in m.tier_of:
            for r, lit in q.items():
                m.implies(lit, m.tier_of[t][r])
    if not m.tier_of:
        return
    for r, tier in p.tiers.items():
        terms = []
        fixed = tier.home_bytes
        for t in p.tensors:
            if r not in t.tiers or t.starts_remote or t.mastered or not t.gaps:  # held in home_bytes
                continue
            if t.index in m.tier_of:
                terms.append((m.tier_of[t.index][r], t.nbytes))
            elif m.incumbent_tier(t.index) == r:
                fixed += t.nbytes
        if fixed + sum(b for _v, b in terms) > tier.capacity_bytes:
            m.cp.add(sum(v * b for v, b in terms) <= tier.capacity_bytes - fixed)


# ------------------------------------------------------------------ links
def links(m: Variables) -> None:
    p, f = m.p, m.f
    lo, hi = f.lo, f.hi
    per_link: dict[str, list] = {name: [] for name in p.links}
    built: set[tuple[str, int]] = set()
    for g, lits in m.offload_to.items():
        gap = p.gaps[g]
        if not gap.has_fetch:
            continue
        for r, lit in lits.items():
            if r == RECOMPUTE:
                continue  # on the compute stream (ops)
            Y = m.prefetch[g]
            if is_const(lit) and (lit == 0 or is_const(Y)):
                continue  # absent, or fixed (added below with the incumbent's fixed transfers)
            per_link[p.tiers[r].fetch_link].append(m.transfer(Y, gap.fetch[r], lit, f"pf{g}_{r}"))
            built.add(("g", g))
            if not is_const(lit):
                m.tie_terms.append((lit, m.tie(p.tensors[gap.tensor].nbytes)))
    for s, q in m.store_to.items():
        sl = p.slots[s]
        for r, lit in q.items():
            S = m.store_start[s]
            if is_const(lit) and (lit == 0 or is_const(S)):
                continue
            per_link[p.tiers[r].store_link].append(m.transfer(S, sl.store[r], lit, f"st{s}_{r}"))
            built.add(("s", s))
            if not is_const(lit):
                m.tie_terms.append((lit, m.tie(p.tensors[sl.tensor].nbytes)))
    # The incumbent's transfers that the frame fixes, clipped to the region.
    m.fixed_transfer_end = 0
    for name, ivs in transfer_intervals(p, f.inc).items():
        for s, e, what in ivs:
            kind, idx = what.split()
            if (("g" if kind == "fetch" else "s"), int(idx[1:])) in built:
                continue
            m.fixed_transfer_end = max(m.fixed_transfer_end, e)
            s2, e2 = max(s, lo), min(e, hi)
            if e2 > s2:
                per_link[name].append(m.cp.new_fixed_size_interval_var(s2, e2 - s2, f"fx_{name}_{s}"))
    for name, ivs in per_link.items():
        if len(ivs) < 2:
            continue
        ch = p.links[name].channels
        if ch == 1:
            m.cp.add_no_overlap(ivs)
        else:
            m.cp.add_cumulative(ivs, [1] * len(ivs), ch)


# ------------------------------------------------------------------ memory
def memory(m: Variables) -> None:
    p, f = m.p, m.f
    lo, hi = f.lo, f.hi
    intervals, demands = [], []
    touched = set(m.touched)
    for t in m.touched:
        ti = p.tensors[t]
        for (a, b), (ha, hb) in zip(_chain_terms(m, ti), chain(p, f.inc, ti)):
            if is_const(a) and is_const(b):
                continue  # fixed: in the profile below
            a2, b2 = _clip(m, a, ha), _clip(m, b, hb)
            if is_const(a2) and is_const(b2) and b2 <= a2:
                continue
            size = m.int_var(0, hi - lo, f"sz{t}", max(0, min(max(hb, lo), hi) - min(max(ha, lo), hi)))
            m.cp.add(size == b2 - a2)
            intervals.append(m.cp.new_interval_var(a2, size, b2, f"res{t}"))
            demands.append(ti.units)
    for o in m.start:
        if p.ops[o].ws:
            intervals.append(m.op_iv[o])
            demands.append(p.ops[o].ws)
    for g, iv in m.remat_iv.items():
        ws = p.gaps[g].remat.ws
        if ws:
            intervals.append(iv)
            demands.append(ws)
    # The fixed profile: residencies of untouched tensors, and the constant pieces of touched ones.
    ev = []
    for t in p.tensors:
        if not t.modelled:
            continue
        if t.index in touched:
            pieces = [(a, b) for a, b in _chain_terms(m, t) if is_const(a) and is_const(b)]
        else:
            pieces = chain(p, f.inc, t)
        for a, b in pieces:
            a2, b2 = max(a, lo), min(b, hi)
            if b2 > a2:
                ev.append((a2, t.units))
                ev.append((b2, -t.units))
    for o in p.ops:
        if o.ws and o.index not in m.start:
            a2, b2 = max(f.inc.start[o.index], lo), min(op_end(p, f.inc, o.index), hi)
            if b2 > a2:
                ev.append((a2, o.ws))
                ev.append((b2, -o.ws))
    for g, (s, e) in remat_intervals(p, f.inc).items():
        ws = p.gaps[g].remat.ws
        a2, b2 = max(s, lo), min(e, hi)
        if ws and g not in m.remat_iv and b2 > a2:
            ev.append((a2, ws))
            ev.append((b2, -ws))
    profile = _profile(ev, lo, hi)
    base = min((lvl for _s, _e, lvl in profile), default=0)
    for s, e, lvl in profile:
        if lvl > base:
            intervals.append(m.cp.new_fixed_size_interval_var(s, e - s, f"mem{s}"))
            demands.append(lvl - base)
    m.mem_base = base
    cap = p.capacity - base
    if m.objective == "peak":
        m.peak = m.int_var(0, max(0, cap), "peak", max(0, cap))
        m.cp.add_cumulative(intervals, demands, m.peak)
    elif intervals:
        m.cp.add_cumulative(intervals, demands, max(0, cap))


def _clip(m: Variables, x, hint: int):
    """``x`` clamped to the region [lo, hi] (a new variable only when x's domain reaches outside it)."""
    lo, hi = m.f.lo, m.f.hi
    if is_const(x):
        return min(max(x, lo), hi)
    dlo, dhi = m.dom.get(x.index, (lo, hi))
    if dlo < lo:
        v = m.int_var(lo, hi, "clip", min(max(hint, lo), hi))
        m.cp.add_max_equality(v, [x, lo])
        x, dlo = v, lo
    if dhi > hi:
        v = m.int_var(dlo, hi, "clip", min(max(hint, lo), hi))
        m.cp.add_min_equality(v, [x, hi])
        x = v
    return x


def _chain_terms(m: Variables, ti) -> list[tuple[object, object]]:
    p = m.p
    gaps = [g for g in ti.gaps if p.gaps[g].kind != "init"]
    if ti.producer is not None:
        cur = m.st(ti.producer)
    elif ti.starts_remote or ti.free:
        cur = m.prefetch[ti.gaps[0]] if ti.gaps[0] in m.prefetch else m.f.inc.prefetch[ti.gaps[0]]
    else:
        cur = 0
    out = []
    for g in gaps:
        out.append((cur, m.detach[g] if g in m.detach else m.f.inc.detach[g]))
        cur = m.prefetch[g] if g in m.prefetch else m.f.inc.prefetch[g]
    end = p.horizon if ti.until_end else m.freed.get(ti.index, m.f.inc.freed.get(ti.index, 0))
    if not ti.until_end and ti.index not in m.freed:
        end = m.f.inc.freed[ti.index]
    out.append((cur, end))
    return out


# ------------------------------------------------------------------ transient ends
def ends(m: Variables) -> None:
    """A tensor freed after its last use is freed exactly then: F = the latest end of its users."""
    p = m.p
    readers = remat_readers(m)
    for t, F in m.freed.items():
        ti = p.tensors[t]
        ends = [m.en(u) for u in ti.users]
        if ti.producer is not None:
            ends.append(m.en(ti.producer))
        ends += [_remat_end(m, g, lit) for g, lit in readers.get(t, ())]
        var = [e for e in ends if not is_const(e)]
        const = max((e for e in ends if is_const(e)), default=None)
        if const is not None:
            var.append(const)
        if len(var) == 1:
            m.cp.add(F == var[0])
        else:
            m.cp.add_max_equality(F, var)


def remat_readers(m: Variables) -> dict[int, list[tuple[int, object]]]:
    """Tensor -> the re-runs that may read it in this frame: (gap, its RECOMPUTE literal or constant)."""
    p, inc = m.p, m.f.inc
    out: dict[int, list[tuple[int, object]]] = {}
    seen = set()
    for g, lits in m.offload_to.items():
        lit = lits.get(RECOMPUTE, 0)
        seen.add(g)
        if not (is_const(lit) and lit == 0):
            for x in p.gaps[g].remat.inputs:
                out.setdefault(x, []).append((g, lit))
    for g, tier in inc.off.items():
        if tier == RECOMPUTE and g not in seen:
            for x in p.gaps[g].remat.inputs:
                out.setdefault(x, []).append((g, 1))
    return out


def _remat_end(m: Variables, g: int, lit):
    """The end of gap ``g``'s re-run when it is made, else 0 (a term for the max of a tensor's uses)."""
    p, inc = m.p, m.f.inc
    Y = m.prefetch.get(g, inc.prefetch.get(g, 0))
    end = Y + p.gaps[g].fetch[RECOMPUTE]
    if is_const(lit):
        return end if lit else 0
    hint = inc.prefetch[g] + p.gaps[g].fetch[RECOMPUTE] if inc.off.get(g) == RECOMPUTE else 0
    e = m.int_var(0, p.horizon, f"E{g}", hint)
    m.cp.add(e == end).only_enforce_if(lit)
    m.cp.add(e == 0).only_enforce_if(lit.Not())
    return e


def remats(m: Variables) -> None:
    """Each re-run after the op's first run and before the in-place writes of what it reads; each input on HBM for
    the whole re-run. An input's offloaded or recomputed gap is, by the reference order, either before the re-run
    (its Prefetch, or its own re-run, ends before this one starts: for the gap that spans the re-run's anchor, that
    makes a chain of re-runs) or after it (its Detach comes after this one ends). An input freed after its last use
    is freed no earlier than the re-run's end (``ends``; here when its end is fixed)."""
    p, inc = m.p, m.f.inc
    pos = p.pos
    for x, readers in remat_readers(m).items():
        tx = p.tensors[x]
        if not tx.modelled:
            continue
        x_users = tx.users
        for g, lit in readers:
            gap = p.gaps[g]
            rm = gap.remat
            Y = m.prefetch.get(g, inc.prefetch[g])
            end = Y + gap.fetch[RECOMPUTE]
            k = sum(1 for u in x_users if pos[u] < pos[rm.anchor])
            for h in tx.gaps:
                hg = p.gaps[h]
                lits = m.offload_to.get(h)
                if lits is None:
                    tier = inc.off.get(h)
                    lits = {tier: 1} if tier is not None else {}
                for r, lit_h in lits.items():
                    if is_const(lit_h) and lit_h == 0:
                        continue
                    if hg.has_fetch and hg.n_before <= k:
                        # Back before the re-run: for the gap across the anchor, earlier than its own users need
                        # (the input then stays from there to its next use).
                        Yh = m.prefetch.get(h, inc.prefetch[h])
                        _soft_le(m, Yh + hg.fetch[r], Y, [lit, lit_h])
                    elif hg.kind != "init":
                        Xh = m.detach.get(h, inc.detach.get(h, 0))
                        _soft_le(m, end, Xh, [lit, lit_h])
            if not tx.until_end and x not in m.freed:
                _soft_le(m, end, inc.freed[x], [lit])
    for g, lits in m.offload_to.items():
        lit = lits.get(RECOMPUTE, 0)
        if is_const(lit) and lit == 0:
            continue
        gap = p.gaps[g]
        rm = gap.remat
        Y = m.prefetch[g]
        _soft_le(m, m.en(rm.op), Y, [lit])
        for w in rm.before_updates:
            _soft_le(m, Y + gap.fetch[RECOMPUTE], m.st(w), [lit])


def _soft_le(m: Variables, a, b, lits) -> None:
    """``m.le``, except that a constraint whose terms and literals are all constant is left out: it is the
    incumbent's, which the frame cannot change."""
    if is_const(a) and is_const(b) and all(is_const(x) for x in lits):
        return
    m.le(a, b, lits)


def detach_times(m: Variables) -> None:
    """The Detach goes as early as it can (later only holds HBM longer): X = the end of the last user before
    the gap, or of the Store when that ends later. A gap that is not offloaded has X = Y = that same end."""
    p, inc = m.p, m.f.inc
    for t in m.touched:
        for g in p.tensors[t].gaps:
            gap = p.gaps[g]
            X, b = m.detach.get(g), m.offload[g]
            if gap.kind == "init" or is_const(X):
                continue
            ends = [m.en(u) for u in gap.before] or [0]
            users_end = max((op_end(p, inc, u) for u in gap.before), default=0)
            last = m.max_of(ends, f"L{g}", users_end)
            if gap.slot is None:
                m.eq(X, last)
                continue
            if is_const(b):
                if b == 0:
                    m.eq(X, last)
            else:
                m.eq(X, last, [b.Not()])
            sl = p.slots[gap.slot]
            # The slot has model terms only when its Store or its tensor's tier is free in this frame; otherwise its
            # Store starts where the incumbent's does (a window that frees a Detach alone, deepseek-v3-paper at 70%
            # from the store-release order: KeyError before).
            S = m.store_start.get(gap.slot, inc.store_start[gap.slot])
            # A free tensor that starts remote needs no Store of its first version: then X = the users' end.
            unless = []
            if gap.store_unless_placed:
                placed = m.offload[p.tensors[gap.tensor].placement_gap]
                if is_const(placed):
                    if placed:
                        m.eq(X, last)
                        continue
                else:
                    m.eq(X, last, [placed])
                    unless = [placed.Not()]
            for r, lit in m.offload_to[g].items():
                if is_const(lit) and lit == 0:
                    continue
                if r == RECOMPUTE:
                    m.eq(X, last, [lit])  # dropped: no Store to wait for
                    continue
                hint = max(users_end, inc.store_start[gap.slot] + sl.store[r])
                # A Store that is not made may still sit late (its writer's end): leave room past the horizon.
                xr = m.max_of(ends + [S + sl.store[r]], f"Xr{g}_{r}", hint, hi=m.p.horizon + sl.store[r])
                m.eq(X, xr, [lit] + unless)


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


__all__ = ["detach_times", "ends", "gaps", "links", "memory", "ops", "remats", "slots", "tiers"]
