"""From the model's values to a Plan the executor reproduces.

The executor runs every step as soon as its stream and its waits allow; a solution has times. The program is
the solution's steps in time order, with waits chosen so that, by induction over the program, every step starts
in the executor no later than in the solution, and no HBM allocation starts before a free that came before it
in the solution:

- each stream runs its steps in the solution's order (links: by start; the compute stream: ops by start, each
  Detach placed on it right after the last use before its gap);
- a step only waits for steps that end, in the solution, no later than it starts;
- an allocation (an op's outputs and workspace, a Prefetch) waits for every free the solution placed no later:
  ops do through the compute stream and an explicit wait on each Detach that runs on a link; a Prefetch waits
  for the last compute-stream step that ends before it and for the link Detaches that step does not cover.

Then the executed HBM occupancy never exceeds the solution's, and the executed makespan is no longer. A Detach
goes as early as the solution allows: when the last user before the gap and the Store (if any) have ended. It
runs on the compute stream after that user when the user ends last, else on the Store's link after the Store.
"""

from __future__ import annotations

import bisect

from planner.hardware import HBM
from planner.placement import plan_placement
from planner.plan import COMPUTE, Plan, ProgramBuilder
from planner.planners.cpsat.data import Assignment, Problem, needs_store, op_end

_DETACH, _STORE, _OP, _PREFETCH = 0, 1, 2, 3


def plan_from_assignment(p: Problem, a: Assignment, planner: str = "cpsat", **kwargs) -> Plan:
    """The program for assignment ``a`` (see the module doc)."""
    ops = p.ops
    ev: list[tuple[int, int, int, object]] = []
    for o in range(len(ops)):
        ev.append((a.start[o], _OP, o, o))
    for s in a.store:
        ev.append((a.store_start[s], _STORE, s, s))
    detach_info: dict[int, tuple[str, int | None]] = {}
    for g in a.off:
        gap = p.gaps[g]
        if gap.has_fetch:
            ev.append((a.prefetch[g], _PREFETCH, g, g))
        if gap.kind == "init":
            continue
        users_end, last_user = -1, None
        for u in gap.before:
            e = op_end(p, a, u)
            if e > users_end:
                users_end, last_user = e, u
        when = max(users_end, 0)
        stream = COMPUTE
        if gap.slot in a.store and needs_store(p, a, gap):
            sl = p.slots[gap.slot]
            store_end = a.store_start[gap.slot] + sl.store[a.store[gap.slot]]
            if store_end > when:
                when = store_end
                stream = p.tiers[a.store[gap.slot]].store_link
        detach_info[g] = (stream, last_user)
        ev.append((when, _DETACH, g, g))
    ev.sort(key=lambda e: (e[0], e[1], e[2]))

    # Per tensor, its offloaded gaps with a Prefetch, by n_before: an op waits for the latest one before it.
    fetch_gaps: dict[int, list[tuple[int, int]]] = {}
    for g in a.off:
        gap = p.gaps[g]
        if gap.has_fetch:
            fetch_gaps.setdefault(gap.tensor, []).append((gap.n_before, g))
    for v in fetch_gaps.values():
        v.sort()
    rank = {}
    for t in p.tensors:
        if t.index in fetch_gaps:
            for r, u in enumerate(t.users):
                rank[(t.index, u)] = r

    pb = ProgramBuilder()
    op_step: dict[int, int] = {}
    store_step: dict[int, int] = {}
    prefetch_step: dict[int, int] = {}
    detach_step: dict[int, int] = {}
    cs_ends: list[int] = []  # solution end of each compute-stream step, in program order
    cs_ids: list[int] = []
    cs_cover: list[int] = []  # link Detaches up to this time are covered by waiting on that step
    last_op_start = -1
    link_detach_times: list[int] = []
    link_detach_ids: list[int] = []
    pending: list[int] = []
    for time, kind, _k, x in ev:
        if kind == _OP:
            o = x
            waits = list(pending)
            pending = []
            for t in ops[o].reads:
                fg = fetch_gaps.get(t)
                if fg:
                    r = rank[(t, o)]
                    j = bisect.bisect_right(fg, (r, 1 << 60)) - 1
                    if j >= 0:
                        waits.append(prefetch_step[fg[j][1]])
            i = pb.compute(ops[o].name, waits)
            op_step[o] = i
            last_op_start = time
            cs_ends.append(time + ops[o].dur)
            cs_ids.append(i)
            cs_cover.append(time)
        elif kind == _STORE:
            s = x
            sl = p.slots[s]
            waits = [op_step[sl.writer]] if sl.writer is not None else []
            link = p.tiers[a.store[s]].store_link
            store_step[s] = pb.store(p.tensors[sl.tensor].name, link, waits)
        elif kind == _DETACH:
            g = x
            gap = p.gaps[g]
            stream, last_user = detach_info[g]
            waits = []
            if gap.slot in store_step and needs_store(p, a, gap):
                waits.append(store_step[gap.slot])
            name = p.tensors[gap.tensor].name
            if stream == COMPUTE:
                i = pb.detach(name, COMPUTE, waits)
                cs_ends.append(time)
                cs_ids.append(i)
                cs_cover.append(last_op_start)
            else:
                if last_user is not None:
                    waits.append(op_step[last_user])
                i = pb.detach(name, stream, waits)
                link_detach_times.append(time)
                link_detach_ids.append(i)
                pending.append(i)
            detach_step[g] = i
        else:
            g = x
            gap = p.gaps[g]
            waits = []
            if g in detach_step:
                waits.append(detach_step[g])
            j = bisect.bisect_right(cs_ends, time) - 1
            cover = -1
            if j >= 0:
                waits.append(cs_ids[j])
                cover = cs_cover[j]
            lo = bisect.bisect_right(link_detach_times, cover)
            hi = bisect.bisect_right(link_detach_times, time)
            waits.extend(link_detach_ids[lo:hi])
            link = p.tiers[a.off[g]].fetch_link
            prefetch_step[g] = pb.prefetch(p.tensors[gap.tensor].name, link, waits)
    choice = {t.name: a.off.get(t.placement_gap, HBM) if t.free else t.home
              for t in p.tensors if t.producer is None}
    return pb.build(p.graph.name, planner, placement=plan_placement(p.graph, choice), **kwargs)
