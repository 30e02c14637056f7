"""From a Plan to the model's values: time the program in ticks, then read off every decision.

``tick_times`` runs the executor's timing rules (a step starts when its stream, or for a link its first free
channel, is free and every step it waits for has ended) with the scaled durations. ``assignment_from_plan``
maps the program onto the problem's gaps and slots: each Detach-to-Prefetch cycle of a tensor becomes the gap
whose users-before are the users that ran before the Detach; each Store becomes the slot of the version it
copies; each recompute step becomes the recompute gap of its op's output that it ends. The result hints every
variable of the model; ``check`` lists what it violates in the scaled model
(empty: the hint is feasible).
"""

from __future__ import annotations

from planner.cost import transfer_duration_ns
from planner.plan import COMPUTE, Plan, StepKind
from planner.planners.cpsat.data import (
    RECOMPUTE,
    Assignment,
    Problem,
    alloc_time,
    canonical,
    chain,
    needed_slots,
    needs_store,
    op_end,
)
from planner.timeline import peak_of_intervals


def tick_times(p: Problem, plan: Plan) -> list[tuple[int, int]]:
    """(start, end) in ticks of every step of ``plan``, by the executor's timing rules."""
    hw, g, sc = p.hw, p.graph, p.scale
    index = g.op_index
    channel_free = {ln.name: [0] * ln.channels for ln in hw.links}
    links = hw.links_by_name
    cache: dict[tuple[str, str], int] = {}
    compute_free = 0
    out: list[tuple[int, int]] = []
    for s in plan.steps:
        ready = max((out[w][1] for w in s.waits), default=0)
        if s.stream == COMPUTE:
            start = max(compute_free, ready)
            end = start + (p.ops[index[s.target]].dur if s.kind.runs_op else 0)
            compute_free = end
            out.append((start, end))
            continue
        free = channel_free[s.stream]
        ch = min(range(len(free)), key=lambda c: (free[c], c))
        start = max(free[ch], ready)
        if s.kind is StepKind.DETACH:
            end = start
        else:
            key = (s.target, s.stream)
            if key not in cache:
                cache[key] = sc.ticks(transfer_duration_ns(g.tensors[s.target].bytes, links[s.stream]))
            end = start + cache[key]
        free[ch] = end
        out.append((start, end))
    return out


def offload_cycles(graph, plan: Plan, times) -> list[tuple[str, int]]:
    """(tensor, n_before) of every gap the plan offloads, where n_before counts the tensor's users that start
    before the Detach (or before the Prefetch for a tensor that starts remote). Times in any unit."""
    users_start: dict[str, list[int]] = {}
    for i, s in enumerate(plan.steps):
        if s.kind is StepKind.COMPUTE:
            for t in graph.op(s.target).reads:
                users_start.setdefault(t, []).append(times[i][0])
    out = set()
    for i, s in enumerate(plan.steps):
        if s.kind in (StepKind.DETACH, StepKind.PREFETCH):
            starts = users_start.get(s.target, [])
            out.add((s.target, sum(1 for u in starts if u < times[i][0])))
        elif s.kind is StepKind.RECOMPUTE:
            for t in graph.op(s.target).outputs:
                out.add((t, sum(1 for u in users_start.get(t, []) if u < times[i][0])))
    return sorted(out)


def assignment_from_plan(p: Problem, plan: Plan, times: list[tuple[int, int]]) -> tuple[Assignment, list[str]]:
    """The model's values for ``plan`` timed by ``times`` (ticks), and the notes on what did not map."""
    g = p.graph
    index = g.op_index
    tindex = {t.name: t.index for t in p.tensors}
    links = p.links
    notes: list[str] = []
    start = [0] * len(p.ops)
    for i, s in enumerate(plan.steps):
        if s.kind is StepKind.COMPUTE:
            start[index[s.target]] = times[i][0]
    a = Assignment(start=start)
    a.makespan = max((e for _s, e in times), default=0)
    slot_of = {(sl.tensor, sl.version): sl for sl in p.slots}
    per_tensor: dict[int, list[int]] = {}
    for i, s in enumerate(plan.steps):
        if s.kind is StepKind.RECOMPUTE:
            for t in g.op(s.target).outputs:
                per_tensor.setdefault(tindex[t], []).append(i)
        elif s.kind is not StepKind.COMPUTE:
            per_tensor.setdefault(tindex[s.target], []).append(i)
    for k, steps in per_tensor.items():
        t = p.tensors[k]
        user_starts = sorted((start[u], u) for u in t.users)
        ref_rank = {u: r for r, u in enumerate(t.users)}

        def n_before(time: int, user_starts=user_starts, ref_rank=ref_rank) -> int | None:
            before = [u for st, u in user_starts if st < time]
            if sorted(ref_rank[u] for u in before) != list(range(len(before))):
                return None
            return len(before)

        steps.sort(key=lambda i: (times[i][0], 0 if plan.steps[i].kind is StepKind.DETACH else 1, i))
        open_gap = None
        for i in steps:
            s = plan.steps[i]
            when = times[i][0]
            if s.kind is StepKind.STORE:
                version = sum(1 for u in t.updaters if op_end(p, a, u) <= when)
                slot = slot_of.get((k, version))
                if slot is not None and links[s.stream].tier not in slot.store:
                    notes.append(f"store of {t.name!r} (step {i}) goes to a tier the model does not offer for it")
                    continue
                if slot is not None and slot.index not in a.store:
                    a.store[slot.index] = links[s.stream].tier
                    a.store_start[slot.index] = when
                continue
            nb = n_before(when)
            gap = p.gap_of(k, nb) if nb is not None else None
            if gap is None:
                if s.kind is StepKind.DETACH and t.users and nb == len(t.users) and not t.until_end:
                    continue  # a Detach after the last use of a tensor freed then anyway
                notes.append(f"{s.kind.value} of {t.name!r} (step {i}) maps to no candidate gap")
                continue
            if s.kind is StepKind.DETACH:
                if gap.index not in a.detach or open_gap != gap.index:
                    a.detach.setdefault(gap.index, when)
                open_gap = gap.index
                if gap.kind == "end":
                    a.off[gap.index] = a.off.get(gap.index) or _end_tier(p, a, gap)
            elif s.kind is StepKind.RECOMPUTE:
                if RECOMPUTE not in gap.tiers:
                    notes.append(f"recompute of {t.name!r} (step {i}) maps to no recompute candidate")
                    continue
                a.prefetch[gap.index] = when
                a.off[gap.index] = RECOMPUTE
                open_gap = None
            else:
                if links[s.stream].tier not in gap.tiers:
                    # A tier that another beats on every count is not offered (data.usable_tiers); a plan that uses
                    # it is outside the model.
                    notes.append(f"prefetch of {t.name!r} (step {i}) comes from a tier the model does not offer "
                                 "for it")
                    continue
                a.prefetch[gap.index] = when
                a.off[gap.index] = links[s.stream].tier
                open_gap = None
    # End gaps take the tier of their Store (or the home tier); the rest of the values are canonical.
    for gi, tier in list(a.off.items()):
        gap = p.gaps[gi]
        if gap.kind == "end":
            a.off[gi] = a.store.get(gap.slot, tier) if gap.slot is not None else p.tensors[gap.tensor].tiers[0]
        if gap.kind != "init" and gi not in a.detach:
            notes.append(f"prefetch of {p.tensors[gap.tensor].name!r} with no Detach before it")
            del a.off[gi]
    # Steady state: a free tensor's end gap is offloaded exactly when it starts remote (a plan may keep the HBM
    # copy to the end, which holds more memory than the model's value), and a required end gap always is.
    for t in p.tensors:
        if not t.gaps:
            continue
        end = p.gaps[t.gaps[-1]]
        if end.kind != "end":
            continue
        if t.free:
            init = t.placement_gap
            if init in a.off:
                a.off.setdefault(end.index, a.off[init])
            else:
                a.off.pop(end.index, None)
        elif end.required:
            a.off.setdefault(end.index, t.home)
    remat_ends: dict[int, int] = {}
    for gi, (_s, e) in remat_intervals(p, a).items():
        for x in p.gaps[gi].remat.inputs:
            remat_ends[x] = max(remat_ends.get(x, 0), e)
    for t in p.tensors:
        if t.modelled and not t.until_end:
            ends = [op_end(p, a, u) for u in t.users]
            if t.producer is not None:
                ends.append(op_end(p, a, t.producer))
            if t.index in remat_ends:
                ends.append(remat_ends[t.index])
            a.freed[t.index] = max(ends, default=alloc_time(p, a, t))
    # Slots whose Store no offloaded gap needs are dropped.
    needed = needed_slots(p, a)
    for s in list(a.store):
        if s not in needed:
            del a.store[s]
    for gi in a.off:
        sl = p.gaps[gi].slot
        if sl is not None and sl not in a.store and needs_store(p, a, p.gaps[gi]):
            notes.append(f"gap of {p.tensors[p.gaps[gi].tensor].name!r} offloaded with no Store of its version")
    return canonical(p, a), notes


def _end_tier(p: Problem, a: Assignment, gap) -> str:
    return p.tensors[gap.tensor].tiers[0]


def check(p: Problem, a: Assignment, lo: int = 0, hi: int | None = None) -> list[str]:
    """Every constraint of the scaled model that ``a`` violates (in [lo, hi) for the time-indexed ones)."""
    hi = p.horizon if hi is None else hi
    out: list[str] = []
    ops = p.ops
    runs = [(a.start[o], op_end(p, a, o), ops[o].name) for o in range(len(ops))]
    for g, (s, e) in remat_intervals(p, a).items():
        runs.append((s, e, f"re-run of {ops[p.gaps[g].remat.op].name}"))
        if s < op_end(p, a, p.gaps[g].remat.op):
            out.append(f"gap {g}: re-run before {ops[p.gaps[g].remat.op].name!r} first ends")
    runs.sort()
    for (_s, e, x), (s2, _e2, y) in zip(runs, runs[1:]):
        if e > s2:
            out.append(f"{x!r} and {y!r} overlap on the compute stream")
    for g, (s, e) in remat_intervals(p, a).items():
        for x in p.gaps[g].remat.inputs:
            tx = p.tensors[x]
            if tx.modelled and not any(a0 <= s and e <= b0 for a0, b0 in chain(p, a, tx)):
                out.append(f"gap {g}: the re-run reads {tx.name!r}, which is not on HBM throughout")
    for o in ops:
        for q in o.preds:
            if op_end(p, a, q) > a.start[o.index]:
                out.append(f"op {o.name!r} starts before its predecessor {ops[q].name!r} ends")
    for gap in p.gaps:
        gi = gap.index
        name = p.tensors[gap.tensor].name
        on = gi in a.off
        if gap.mandatory and not on:
            what = "store back to its home tier" if gap.required else "initial fetch"
            out.append(f"{what} of {name!r} missing")
        if gap.kind == "end" and p.tensors[gap.tensor].free and on != (p.tensors[gap.tensor].placement_gap in a.off):
            out.append(f"end gap of {name!r} offloaded {'without' if on else 'but not'} its starting tier remote")
        if gap.kind != "init" and a.detach[gi] > a.prefetch[gi]:
            out.append(f"gap {gi} of {name!r}: detach after prefetch")
        if not on:
            if gap.kind != "init" and a.detach[gi] != a.prefetch[gi]:
                out.append(f"gap {gi} of {name!r}: not offloaded but X != Y")
            continue
        tier = a.off[gi]
        if tier not in gap.tiers:
            out.append(f"gap {gi} of {name!r}: {tier!r} is not one of its tiers")
            continue
        if gap.kind != "init":
            for u in gap.before:
                if op_end(p, a, u) > a.detach[gi]:
                    out.append(f"gap {gi} of {name!r}: detached before {ops[u].name!r} ends")
        if gap.has_fetch:
            for u in gap.after:
                if a.prefetch[gi] + gap.fetch[tier] > a.start[u]:
                    out.append(f"gap {gi} of {name!r}: prefetch ends after {ops[u].name!r} starts")
        elif a.prefetch[gi] != p.horizon:
            out.append(f"end gap {gi} of {name!r}: Y is not the horizon")
        if needs_store(p, a, gap):
            st = a.store.get(gap.slot)
            if st != tier:
                out.append(f"gap {gi} of {name!r}: no Store to {tier} of its version")
            elif a.store_start[gap.slot] + p.slots[gap.slot].store[tier] > a.detach[gi]:
                out.append(f"gap {gi} of {name!r}: detached before its Store ends")
    for s in p.slots:
        if s.writer is not None and a.store_start[s.index] < op_end(p, a, s.writer):
            out.append(f"store of {p.tensors[s.tensor].name!r} v{s.version} before its writer ends")
    # Tier choice: one tier per tensor.
    stored: dict[int, set[str]] = {}
    for si, tier in a.store.items():
        stored.setdefault(p.slots[si].tensor, set()).add(tier)
    for t in p.tensors:
        used = {a.off[g] for g in t.gaps if g in a.off and a.off[g] != RECOMPUTE} | stored.get(t.index, set())
        if len(used) > 1:
            out.append(f"{t.name!r} offloaded to several tiers {sorted(used)}")
    for name, ivs in transfer_intervals(p, a).items():
        ch = p.links[name].channels
        if _max_overlap([(s, e, 1) for s, e, _ in ivs]) > ch:
            out.append(f"link {name}: more than {ch} transfers at once")
    peak, when = memory_peak(p, a, lo, hi)
    if peak > p.capacity:
        out.append(f"HBM {peak} units at tick {when}, over the capacity of {p.capacity}")
    for t in p.tensors:
        if not t.modelled:
            continue
        for s, e in chain(p, a, t):
            if e < s:
                out.append(f"{t.name!r}: residency chain out of order")
    return out


def transfer_intervals(p: Problem, a: Assignment) -> dict[str, list[tuple[int, int, str]]]:
    """Link name -> (start, end, what) of every transfer in ``a``."""
    out: dict[str, list[tuple[int, int, str]]] = {name: [] for name in p.links}
    for gi, tier in a.off.items():
        gap = p.gaps[gi]
        if gap.has_fetch and tier != RECOMPUTE:
            out[p.tiers[tier].fetch_link].append((a.prefetch[gi], a.prefetch[gi] + gap.fetch[tier], f"fetch g{gi}"))
    for si, tier in a.store.items():
        s = p.slots[si]
        out[p.tiers[tier].store_link].append((a.store_start[si], a.store_start[si] + s.store[tier], f"store s{si}"))
    return out


def remat_intervals(p: Problem, a: Assignment) -> dict[int, tuple[int, int]]:
    """Recompute gap -> (start, end) of its re-run on the compute stream, for every gap ``a`` recomputes."""
    return {gi: (a.prefetch[gi], a.prefetch[gi] + p.gaps[gi].fetch[RECOMPUTE])
            for gi, tier in a.off.items() if tier == RECOMPUTE}


def memory_items(p: Problem, a: Assignment) -> list[tuple[int, int, int]]:
    """(start, end, units) of every HBM residency and workspace in ``a`` (re-runs' workspaces included)."""
    items = []
    for t in p.tensors:
        if t.modelled:
            items.extend((s, e, t.units) for s, e in chain(p, a, t) if e > s)
    for o in p.ops:
        if o.ws:
            items.append((a.start[o.index], op_end(p, a, o.index), o.ws))
    for gi, (s, e) in remat_intervals(p, a).items():
        if p.gaps[gi].remat.ws:
            items.append((s, e, p.gaps[gi].remat.ws))
    return items


def memory_peak(p: Problem, a: Assignment, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
    """(peak units, tick) of the model's HBM profile."""
    hi = p.horizon if hi is None else hi
    best, when = peak_of_intervals((max(s, lo), min(e, hi), u) for s, e, u in memory_items(p, a))
    return best, when if best else lo


def _max_overlap(ivs: list[tuple[int, int, int]]) -> int:
    return peak_of_intervals(ivs)[0]
