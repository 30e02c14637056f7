"""The reactive baseline: what a runtime without foresight does.

When an allocation does not fit, it evicts the least recently used tensors (storing first those with no valid
remote copy) while compute waits; when an op needs an evicted tensor it fetches it synchronously. With
``lookahead=k`` it also prefetches the inputs of the next k ops when they fit without evicting anything.

Where tensors start (those whose tier the graph leaves to the planner): a runtime loads them before the step
in order of first use, onto HBM while they leave room for the largest single-op working set, and the rest
onto the fastest remote tier with room (``reactive_placement``). When the step ends it restores that placement
(planner/placement.py): what started remote and was updated is stored back, what started on HBM and was
evicted is fetched back.

When the whole step fits (the no-offload working set of its order is within the budget), the runtime never runs
short: it evicts nothing and loads what is pinned to a remote tier as the step starts, in order of first use, as
runtimes that know their parameter list do (FSDP's and ZeRO-3's parameter prefetch). That is the no-offload
program, so steady state costs nothing when everything fits.
The paper cites such a runtime as 2.7x slower than its plan (5.5 s to 15 s on LLaMA3-8B) but never compares
against it; ho-plan does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.bounds import largest_working_set
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.orders import best_no_offload_order, live_bytes
from planner.placement import Placement, plan_placement, with_placement
from planner.plan import COMPUTE, Plan, PlanStatus, ProgramBuilder
from planner.planners.none import no_offload_program
from planner.units import format_bytes_exact


def reactive_placement(graph: Graph, hw: Hardware, order: list[str]) -> Placement:
    """The stated rule: free tensors (home ``auto``) in order of first use (unused ones last) go on HBM while
    the bytes pinned there plus theirs leave the largest single-op working set free under the budget; the rest
    go on the fastest remote tier with room (HBM when none has)."""
    pinned_hbm = sum(t.bytes for n, t in graph.tensors.items()
                     if n not in graph.producer and t.pinned and t.home == HBM)
    room = hw.hbm_bytes - largest_working_set(graph)[0] - pinned_hbm
    first: dict[str, int] = {}
    for i, name in enumerate(order):
        for t in graph.op(name).reads:
            first.setdefault(t, i)
    remote_room = {t.name: t.capacity_bytes for t in hw.remote_tiers}
    for n, t in graph.tensors.items():
        if n not in graph.producer and t.pinned and t.home in remote_room:
            remote_room[t.home] -= t.bytes
    tiers = sorted(remote_room, key=hw.round_trip_key)
    choice: Placement = {}
    for name in sorted(graph.free_tensors, key=lambda n: (first.get(n, len(order)), n)):
        size = graph.tensors[name].bytes
        if name in first and size <= room:
            choice[name] = HBM
            room -= size
            continue
        tier = next((x for x in tiers if remote_room[x] >= size), HBM)
        if tier != HBM:
            remote_room[tier] -= size
        choice[name] = tier
    return plan_placement(graph, choice)


def _no_offload_fits(graph: Graph, hw: Hardware, order: list[str]) -> bool:
    """Whether the no-offload program in ``order`` peaks within the budget, as ``none`` checks it. ``live_bytes``
    without the pinned-remote tensors is a lower bound of that peak and rules most budgets out without running
    the executor; above it the executor decides (pinned-remote tensors arrive over the link while transient ones
    are freed, and inputs nothing reads stay on HBM)."""
    if max(live_bytes(graph, order, remote_resident=False), default=0) > hw.hbm_bytes:
        return False
    plan = no_offload_program(graph, hw, order)
    return simulate(graph, hw, plan, allocator=False).metrics.peak_bytes.get(HBM, 0) <= hw.hbm_bytes


@dataclass
class _Memory:
    """The runtime's view of HBM between ops: what is resident, when it was last touched, what is valid where."""

    budget: int
    used: int = 0
    # tensor -> last-touch counter; kept in least-recently-used order (a touch moves the tensor to the end), so the
    # victim is the first unprotected entry rather than the minimum of a sort over everything resident.
    resident: dict[str, int] = field(default_factory=dict)
    touch_step: dict[str, int] = field(default_factory=dict)  # tensor -> step that last touched its HBM copy
    valid_remote: dict[str, set[str]] = field(default_factory=dict)  # tensor -> tiers with a current copy
    store_step: dict[str, int] = field(default_factory=dict)  # tensor -> its latest Store (a Detach waits for it)
    remote_used: dict[str, int] = field(default_factory=dict)


def plan_reactive(graph: Graph, hw: Hardware, lookahead: int = 0) -> Plan:
    """Return the program a reactive LRU runtime would run on ``hw``'s HBM budget."""
    on_hbm = with_placement(graph, {})
    order = best_no_offload_order(on_hbm)
    if _no_offload_fits(on_hbm, hw, order):
        return replace(no_offload_program(graph, hw, order, planner="reactive"), options={"lookahead": lookahead})
    placement = reactive_placement(graph, hw, order)
    graph = with_placement(graph, placement)
    runtime = _Runtime(graph, hw, placement, best_no_offload_order(graph))
    for i, name in enumerate(runtime.order):
        runtime.run(i, name, lookahead)
    runtime.restore_placement()
    return runtime.pb.build(graph.name, "reactive", options={"lookahead": lookahead}, status=runtime.status,
                            notes=tuple(runtime.notes), placement=placement)


class _Runtime:
    """A reactive runtime stepping through the compute order: it evicts least recently used tensors when an
    allocation does not fit (storing first what has no valid remote copy) and fetches what an op needs on demand,
    writing the program as it goes."""

    def __init__(self, graph: Graph, hw: Hardware, placement: dict[str, str], order: list[str]) -> None:
        self.graph, self.hw, self.placement, self.order = graph, hw, placement, order
        pos = {n: i for i, n in enumerate(order)}
        self.uses: dict[str, list[int]] = {t: [] for t in graph.tensors}
        for i, n in enumerate(order):
            for t in graph.op(n).reads:
                self.uses[t].append(i)
        self.last_use = {t: max(u + [pos[graph.producer[t]]] if t in graph.producer else u, default=-1)
                         for t, u in self.uses.items()}
        self.tiers_by_speed = sorted((t.name for t in hw.remote_tiers), key=hw.round_trip_key)
        self.mem = _Memory(budget=hw.hbm_bytes, remote_used={t.name: 0 for t in hw.remote_tiers})
        self.pb = ProgramBuilder()
        self.clock = 0
        self.prev_compute: int | None = None
        self.status = PlanStatus.FEASIBLE
        self.notes: list[str] = []
        # The Detaches of the start: the first op's fetches wait for them, as for any eviction they count on.
        self.start_frees: list[int] = []
        self._start()

    def _start(self) -> None:
        """What is where when the step starts; a runtime frees at once what nothing will read (reference count
        zero): tensors that start on HBM, are never used and do not outlive the step."""
        graph, mem = self.graph, self.mem
        for name, t in sorted(graph.tensors.items()):
            mem.valid_remote[name] = set()
            if name in graph.producer:
                continue
            if t.home == HBM:
                # The executor holds every tensor that starts on HBM until it dies or is detached, used or not.
                mem.resident[name] = -1
                mem.used += t.bytes
            else:
                mem.valid_remote[name].add(t.home)
                mem.remote_used[t.home] += t.bytes
        for name in sorted(mem.resident):
            if not graph.tensors[name].persistent and not self.uses[name]:
                self.start_frees.append(self.pb.detach(name, stream=COMPUTE))
                del mem.resident[name]
                mem.used -= graph.tensors[name].bytes
        if mem.used > self.hw.hbm_bytes:
            self.status = PlanStatus.INFEASIBLE
            self.notes.append(f"{format_bytes_exact(mem.used)} start on HBM and are still needed, over the budget of "
                              f"{format_bytes_exact(self.hw.hbm_bytes)}")

    def size(self, t: str) -> int:
        return self.graph.tensors[t].bytes

    def still_needed(self, t: str, i: int) -> bool:
        return self.graph.tensors[t].persistent or (bool(self.uses[t]) and self.uses[t][-1] > i)

    def touch(self, t: str) -> None:
        self.mem.resident.pop(t, None)
        self.mem.resident[t] = self.clock

    def _after_compute(self) -> list[int]:
        return [self.prev_compute] if self.prev_compute is not None else []

    def make_room(self, need: int, protect: set[str], i: int, frees: list[int]) -> bool:
        """Evict least recently used tensors not in ``protect`` until ``need`` more bytes fit; the Detaches go to
        ``frees``. False when nothing more can be evicted (or no remote tier has room)."""
        mem, pb, hw = self.mem, self.pb, self.hw
        base = self._after_compute()
        while mem.used + need > mem.budget:
            v = next((t for t in mem.resident if t not in protect), None)
            if v is None:
                return False
            waits = base + ([mem.touch_step[v]] if v in mem.touch_step else [])
            if self.still_needed(v, i) and not mem.valid_remote[v]:
                # A tensor that started remote goes back to its own tier (its room is held, and the step must end
                # with it there anyway).
                home = self.placement.get(v, HBM)
                tier = home if home != HBM else next(
                    (n for n in self.tiers_by_speed
                     if mem.remote_used[n] + self.size(v) <= hw.tier(n).capacity_bytes), None
                )
                if tier is None:
                    return False
                link = hw.store_link(tier).name
                s = mem.store_step[v] = pb.store(v, link, waits=waits)
                frees.append(pb.detach(v, stream=link, waits=[s]))
                mem.valid_remote[v].add(tier)
                if tier != home:
                    mem.remote_used[tier] += self.size(v)
            else:
                # The copy that makes dropping it safe may still be on its way.
                pending = [mem.store_step[v]] if v in mem.store_step and mem.valid_remote[v] else []
                frees.append(pb.detach(v, stream=COMPUTE, waits=waits + pending))
            del mem.resident[v]
            mem.touch_step.pop(v, None)
            mem.used -= self.size(v)
        return True

    def fetch(self, t: str, waits: list[int]) -> int:
        """Prefetch ``t`` from its fastest tier with a valid copy; the step's index."""
        tier = sorted(self.mem.valid_remote[t], key=self.tiers_by_speed.index)[0]
        s = self.pb.prefetch(t, self.hw.fetch_link(tier).name, waits=waits)
        self.touch(t)
        self.mem.touch_step[t] = s
        self.mem.used += self.size(t)
        return s

    def run(self, i: int, name: str, lookahead: int) -> None:
        """Op ``name`` (the i-th): make room, fetch what is missing, compute, free what is dead, then prefetch
        the next ``lookahead`` ops' inputs that fit without evicting."""
        graph, mem = self.graph, self.mem
        op = graph.op(name)
        self.clock += 1
        missing = [t for t in op.reads if t not in mem.resident]
        new = sum(self.size(t) for t in missing) + sum(self.size(t) for t in op.outputs) + op.workspace_bytes
        frees, self.start_frees = self.start_frees, []
        if not self.make_room(new, set(op.reads), i, frees):
            self.status = PlanStatus.INFEASIBLE
            self.notes.append(f"op {name!r}: cannot make room for {format_bytes_exact(new)} on HBM (budget "
                              f"{format_bytes_exact(mem.budget)})")
        base = self._after_compute()
        fetches = [self.fetch(t, base + frees) for t in missing]
        step = self.pb.compute(name, waits=fetches + frees + [mem.touch_step[t] for t in op.reads
                                                              if t in mem.touch_step])
        self.prev_compute = step
        for t in op.reads + op.outputs:
            self.touch(t)
            mem.touch_step[t] = step
        mem.used += sum(self.size(t) for t in op.outputs)
        for t in op.updates:
            mem.valid_remote[t] = set()
        for t in op.reads + op.outputs:
            if self.last_use[t] <= i and not graph.tensors[t].persistent and t in mem.resident:
                del mem.resident[t]
                mem.touch_step.pop(t, None)
                mem.used -= self.size(t)
        for j in range(i + 1, min(len(self.order), i + 1 + max(0, lookahead))):
            for t in graph.op(self.order[j]).reads:
                if t not in mem.resident and mem.valid_remote[t] and mem.used + self.size(t) <= mem.budget:
                    self.fetch(t, [step] + frees)

    def restore_placement(self) -> None:
        """Steady state: the next step starts from this step's placement, so restore it: stores first (they make
        their tensors free to drop), then fetches, never evicting what started on HBM."""
        graph, mem, placement = self.graph, self.mem, self.placement
        n = len(self.order)
        on_hbm = {t for t, tier in placement.items() if tier == HBM and graph.tensors[t].persistent}
        # The Detaches made here so far and the bytes they freed: a later fetch whose room they made waits for
        # them too (once, a fetch counted on an eviction made for the fetch before it and ran beside it).
        pending: list[int] = []
        pending_bytes = 0
        for name in sorted(placement, key=lambda t: (placement[t] == HBM, t)):
            tier = placement[name]
            if not graph.tensors[name].persistent or tier in mem.valid_remote[name] or (
                    tier == HBM and name in mem.resident):
                continue
            base = self._after_compute()
            frees: list[int] = []
            if name not in mem.resident:
                used = mem.used
                if not self.make_room(self.size(name), on_hbm, n, frees):
                    self.status = PlanStatus.INFEASIBLE
                    self.notes.append(f"tensor {name!r}: no room on HBM to bring it back before the step ends")
                    continue
                room_was_there = used + pending_bytes + self.size(name) <= mem.budget
                self.fetch(name, base + frees + ([] if room_was_there else pending))
                pending += frees
                pending_bytes += used - (mem.used - self.size(name))
            if tier != HBM:
                waits = base + ([mem.touch_step[name]] if name in mem.touch_step else [])
                mem.store_step[name] = self.pb.store(name, self.hw.store_link(tier).name, waits=waits)
                mem.valid_remote[name].add(tier)
