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

A recompute gap's re-run is a compute-stream step at its solution time (after the link Detaches before it, and
after the latest Prefetch or re-run of each tensor it reads); its Detach, with no Store, runs on the compute
stream. Then the executed HBM occupancy never exceeds the solution's, and the executed makespan is no longer. A Detach
goes as early as the solution allows: when the last user before the gap and the Store (if any) have ended. It
runs on the compute stream after that user when the user ends last, else on the Store's link after the Store.
"""

from __future__ import annotations

import bisect

from planner.hardware import HBM
from planner.placement import plan_placement
from planner.plan import COMPUTE, Plan, ProgramBuilder
from planner.planners.cpsat.data import RECOMPUTE, Assignment, Problem, needed_slots, needs_store, op_end

_DETACH, _STORE, _OP, _REDO, _PREFETCH = 0, 1, 2, 3, 4


def plan_from_assignment(p: Problem, a: Assignment, planner: str = "cpsat", **kwargs) -> Plan:
    """The program for assignment ``a`` (see the module doc): its steps in solution-time order, each waiting for
    what it must."""
    events, detach_info = _events(p, a)
    program = _Emitter(p, a, detach_info)
    for time, kind, _k, x in events:
        if kind == _OP:
            program.op(time, x)
        elif kind == _STORE:
            program.store(x)
        elif kind == _DETACH:
            program.detach(time, x)
        elif kind == _REDO:
            program.recompute(time, x)
        else:
            program.prefetch(time, x)
    choice = {t.name: a.off.get(t.placement_gap, HBM) if t.free else t.home
              for t in p.tensors if t.producer is None}
    return program.pb.build(p.graph.name, planner, placement=plan_placement(p.graph, choice), **kwargs)


def _events(p: Problem, a: Assignment) -> tuple[list[tuple[int, int, int, int]], dict[int, tuple[str, int | None]]]:
    """Every step of the program at its solution time, sorted (time, kind, index); and per offloaded gap with a
    Detach, its stream and the last op before it. A Detach goes after the users before its gap and, when it needs
    its slot's Store, after that Store on its link."""
    ev: list[tuple[int, int, int, int]] = [(a.start[o], _OP, o, o) for o in range(len(p.ops))]
    needed = needed_slots(p, a)
    ev.extend((a.store_start[s], _STORE, s, s) for s in a.store if s in needed)
    detach_info: dict[int, tuple[str, int | None]] = {}
    for g in a.off:
        gap = p.gaps[g]
        if gap.has_fetch:
            ev.append((a.prefetch[g], _REDO if a.off[g] == RECOMPUTE else _PREFETCH, g, g))
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
    return ev, detach_info


class _Emitter:
    """Writes the steps in event order, recording what later steps wait for."""

    def __init__(self, p: Problem, a: Assignment, detach_info: dict[int, tuple[str, int | None]]) -> None:
        self.p, self.a, self.detach_info = p, a, detach_info
        # Per tensor, its offloaded gaps with a Prefetch, by n_before: an op waits for the latest one before it.
        self.fetch_gaps: dict[int, list[tuple[int, int]]] = {}
        for g in a.off:
            gap = p.gaps[g]
            if gap.has_fetch:
                self.fetch_gaps.setdefault(gap.tensor, []).append((gap.n_before, g))
        for v in self.fetch_gaps.values():
            v.sort()
        self.rank = {(t.index, u): r for t in p.tensors if t.index in self.fetch_gaps for r, u in enumerate(t.users)}
        self.pb = ProgramBuilder()
        self.op_step: dict[int, int] = {}
        self.store_step: dict[int, int] = {}
        self.prefetch_step: dict[int, int] = {}
        self.detach_step: dict[int, int] = {}
        self.cs_ends: list[int] = []  # solution end of each compute-stream step, in program order
        self.cs_ids: list[int] = []
        self.cs_cover: list[int] = []  # link Detaches up to this time are covered by waiting on that step
        self.last_op_start = -1
        self.link_detach_times: list[int] = []
        self.link_detach_ids: list[int] = []
        self.pending: list[int] = []  # link Detaches the next op waits for
        self.latest_copy: dict[int, int] = {}  # tensor -> its latest Prefetch or re-run step so far

    def op(self, time: int, o: int) -> None:
        """Op ``o``: after the link Detaches since the last op and the latest Prefetch of each tensor it reads."""
        ops = self.p.ops
        waits, self.pending = list(self.pending), []
        for t in ops[o].reads:
            fg = self.fetch_gaps.get(t)
            if fg:
                j = bisect.bisect_right(fg, (self.rank[(t, o)], 1 << 60)) - 1
                if j >= 0:
                    waits.append(self.prefetch_step[fg[j][1]])
        i = self.pb.compute(ops[o].name, waits)
        self.op_step[o] = i
        self.last_op_start = time
        self.cs_ends.append(time + ops[o].dur)
        self.cs_ids.append(i)
        self.cs_cover.append(time)

    def store(self, s: int) -> None:
        """Slot ``s``'s Store, after the op that wrote the version."""
        p = self.p
        sl = p.slots[s]
        waits = [self.op_step[sl.writer]] if sl.writer is not None else []
        link = p.tiers[self.a.store[s]].store_link
        self.store_step[s] = self.pb.store(p.tensors[sl.tensor].name, link, waits)

    def detach(self, time: int, g: int) -> None:
        """Gap ``g``'s Detach: on the compute stream, or on the store link after the Store it relies on."""
        p = self.p
        gap = p.gaps[g]
        stream, last_user = self.detach_info[g]
        waits = []
        if gap.slot in self.store_step and needs_store(p, self.a, gap):
            waits.append(self.store_step[gap.slot])
        name = p.tensors[gap.tensor].name
        if stream == COMPUTE:
            i = self.pb.detach(name, COMPUTE, waits)
            self.cs_ends.append(time)
            self.cs_ids.append(i)
            self.cs_cover.append(self.last_op_start)
        else:
            if last_user is not None:
                waits.append(self.op_step[last_user])
            i = self.pb.detach(name, stream, waits)
            self.link_detach_times.append(time)
            self.link_detach_ids.append(i)
            self.pending.append(i)
        self.detach_step[g] = i

    def prefetch(self, time: int, g: int) -> None:
        """Gap ``g``'s Prefetch: after its Detach, the last compute-stream step that ends by then, and the link
        Detaches that step does not cover (the memory it needs is free by then)."""
        p = self.p
        waits = []
        if g in self.detach_step:
            waits.append(self.detach_step[g])
        j = bisect.bisect_right(self.cs_ends, time) - 1
        cover = -1
        if j >= 0:
            waits.append(self.cs_ids[j])
            cover = self.cs_cover[j]
        lo = bisect.bisect_right(self.link_detach_times, cover)
        hi = bisect.bisect_right(self.link_detach_times, time)
        waits.extend(self.link_detach_ids[lo:hi])
        link = p.tiers[self.a.off[g]].fetch_link
        self.prefetch_step[g] = self.pb.prefetch(p.tensors[p.gaps[g].tensor].name, link, waits)
        self.latest_copy[p.gaps[g].tensor] = self.prefetch_step[g]

    def recompute(self, time: int, g: int) -> None:
        """Gap ``g``'s re-run of its producer: after the link Detaches since the last compute-stream step (the
        memory it allocates is free by then) and the latest Prefetch or re-run of each tensor it reads."""
        p = self.p
        rm = p.gaps[g].remat
        waits, self.pending = list(self.pending), []
        waits += [self.latest_copy[x] for x in rm.inputs if x in self.latest_copy]
        i = self.pb.recompute(p.ops[rm.op].name, waits)
        self.prefetch_step[g] = i
        self.latest_copy[p.gaps[g].tensor] = i
        self.last_op_start = time
        self.cs_ends.append(time + rm.dur)
        self.cs_ids.append(i)
        self.cs_cover.append(time)
