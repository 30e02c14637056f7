"""Greedy's recompute chains: a remat-only plan in a fixed order, by running the order against the budget.

The gap selection (``greedy_select.py``) recomputes at depth 1: a dropped tensor's producer must find its inputs
kept on HBM. Where what has to go is made from tensors that go too (Checkmate's random layered graphs at 80% of
their peak), it finds no plan. This module finds one the way a rematerializing runtime would (DTR, Kirisame et
al. 2021), but offline, knowing every future use:

* ops run in the order; before an op, each input not on HBM is made again by re-running its producer, whose own
  missing inputs are made first (a chain, to any depth);
* whenever an allocation would go over the budget, a tensor on HBM that nothing running needs is dropped (a
  Detach): the one whose re-run costs least per byte and per op until it is next read (Belady's farthest next
  use, weighed by what remaking costs); a tensor no op reads again goes first;
* a tensor is freed after its last read, except one that cannot be made again (its producer cannot re-run, or it
  is no op's output), which is held while a chain might still need it.

A run that fails because an op cannot get back a dropped input starts over with that tensor never dropped; a few
weighings (``POLICIES``) each run, and the one that re-runs least is kept.

A re-run makes every output of its op that is not on HBM (the executor's rule), so the run places them all; the
ones nothing reads again are freed after the op the chain served. Producers with several outputs re-run too
(LLaMA's RoPE and FlashAttention: without them a 2-layer training step at the recompute-on budget finds no remat
plan). A re-run must read what the op first read: it runs before the first op that writes one of the producer's
inputs in place (a training step's weights, written by the optimizer after the backward), never after.

It moves nothing, so it applies only where nothing has to move (no tensor starts on a remote tier and is read); it
returns None otherwise, or when some allocation cannot fit even with everything droppable dropped.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

from planner.graph import Graph
from planner.hardware import HBM
from planner.placement import plan_placement
from planner.plan import Plan, PlanStatus, ProgramBuilder
from planner.planners.greedy_select import Context

WORKSPACE = "workspace:"  # the executor's name of an op's workspace allocation
# How many levels of re-runs the choice of what to drop looks through; deeper chains rank after every shallower one.
CHAIN_DEPTH = 8
CHAIN_WIDTH = 64
# Runs at most: each failed run names the dropped tensors the failing op could not get back, never dropped again.
MAX_ATTEMPTS = 32
# A run that re-runs more than this many ops per op of the order gives up (and names no one to blame).
MAX_RECOMPUTES_PER_OP = 2


@dataclass(frozen=True)
class Policy:
    """How the run picks what to drop: ``early``, whether a tensor may be re-made early (at the last slot its
    producer's inputs are on HBM) rather than only right before its next read; ``tight``, whether a chain that
    would not fit beside its reader ranks last; ``reach``, the power of the ops until the next read in the
    weighing (above 1 favours the farthest next read, Belady's rule, over the cheapest re-run)."""

    early: bool = True
    tight: bool = True
    reach: float = 1.0


# The runs greedy compares, keeping the one that re-runs least. None wins everywhere: on Checkmate's random graphs at
# 80% of the peak, re-runs cost +68.9% / +68.2% / +60.1% over the compute on n100 and +21.5% / +20.2% / +21.5% on n500
# (no early re-runs, or Belady's rule alone with it, were never better than these three).
POLICIES = (Policy(), Policy(reach=2.0), Policy(tight=False))


@dataclass
class _State:
    """What is on HBM while the order runs, and the actions so far."""

    budget: int
    resident: dict[str, bool]
    mem: int = 0
    pins: dict[str, int] = field(default_factory=dict)
    # ("detach" | "free" | "recompute" | "compute", name): a "free" is where a tensor leaves the count because it is
    # not read again; it becomes a Detach only if a later step touches the tensor (else the executor frees it).
    actions: list[tuple[str, str]] = field(default_factory=list)
    recomputes: int = 0
    peak: int = 0
    on: set[str] = field(default_factory=set)  # the tensors resident, for the scan of what to drop


def chains_apply(ctx: Context) -> bool:
    """Whether a plan without transfers can exist in ``ctx``: no tensor read by an op starts on a remote tier."""
    g = ctx.graph
    return not any(gap.mandatory and not gap.droppable for gap in ctx.gaps) and not any(
        g.tensors[t].pinned and g.tensors[t].home != HBM and ctx.acc[t] for t in g.tensors if t not in g.producer)


def plan_remat_chains(ctx: Context, budget: int, name: str = "greedy", addresses: bool = False) -> Plan | None:
    """A remat-only plan of ``ctx``'s order within ``budget`` bytes (see the module doc), or None: nothing has to
    move is not true, or some op cannot fit. The plan's options and stats are the caller's to fill in.

    ``addresses``: place every allocation in the address space as the run goes (best fit, dropping tensors until a
    hole fits), and return the plan with those static offsets, which fit the budget by construction. Without, only
    bytes count: the plan can fit tighter, but its offsets, assigned afterwards, may need more than the budget
    (fragmentation: Checkmate's random graphs run out of holes at 80-90% of their peak)."""
    if not chains_apply(ctx):
        return None
    # A search that found nothing at some budget is not run again at that budget or a lower one (less room): each
    # such failure tries every policy several times (6-9 s on Checkmate's random n1000), and greedy's replanning
    # for static offsets asks at budget after lower budget.
    failed = ctx.chains_failed.get(addresses)
    if failed is not None and budget <= failed:
        return None
    # The result depends on the Context's fixed fields only: the sweep's settings ask again at the same budgets.
    key = (budget, addresses, name)
    if key in ctx.chains_plans:
        return ctx.chains_plans[key]
    best: _Chains | None = None
    facts = _Facts(ctx)
    for policy in POLICIES:
        sim = _run(ctx, facts, budget, policy, addresses)
        if sim is not None and (best is None or sim.redo_ns < best.redo_ns):
            best = sim
    if best is None:
        ctx.chains_failed[addresses] = max(budget, failed or 0)
        return None
    plan = ctx.chains_plans[key] = best.emit(name)
    return plan


def _run(ctx: Context, facts: _Facts, budget: int, policy: Policy, addresses: bool) -> _Chains | None:
    """A successful run under ``policy``, or None. A failed run names the dropped tensors the failing op could not
    get back; they are never dropped in the next run."""
    keep: set[str] = set()
    for _attempt in range(MAX_ATTEMPTS):
        sim = _Chains(ctx, facts, budget, frozenset(keep), policy, addresses)
        if sim.run():
            return sim
        if sim.blame <= keep:
            return None
        keep |= sim.blame
    return None


class _Space:
    """The run's HBM addresses: free holes, best fit (the smallest hole that fits, the lowest on a tie). The run
    places every allocation here, so its plan carries static offsets that fit the budget by construction."""

    def __init__(self, capacity: int) -> None:
        self.holes: dict[int, int] = {0: capacity} if capacity > 0 else {}  # start -> end
        self.by_end: dict[int, int] = {capacity: 0} if capacity > 0 else {}  # end -> start

    def fit(self, size: int) -> int | None:
        best = None
        for start, end in self.holes.items():
            if end - start >= size and (best is None or (end - start, start) < best):
                best = (end - start, start)
        return None if best is None else best[1]

    def take(self, off: int, size: int) -> None:
        end = self.holes.pop(off)
        del self.by_end[end]
        if off + size < end:
            self.holes[off + size] = end
            self.by_end[end] = off + size

    def give(self, off: int, size: int) -> None:
        start, end = off, off + size
        if start in self.by_end:  # the hole below
            start = self.by_end.pop(start)
            del self.holes[start]
        if end in self.holes:  # the hole above
            old = end
            end = self.holes.pop(old)
            del self.by_end[end]
        self.holes[start] = end
        self.by_end[end] = start

    def merged(self, off: int, size: int) -> int:
        """The hole freeing ``size`` bytes at ``off`` would leave, with its free neighbours."""
        below = off - self.by_end[off] if off in self.by_end else 0
        above = self.holes[off + size] - (off + size) if off + size in self.holes else 0
        return below + size + above


class _Count:
    """``_Space``'s interface without addresses: only the bytes in use count (fragmentation is left to the
    offsets assigned afterwards)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0

    def fit(self, size: int) -> int | None:
        return 0 if self.used + size <= self.capacity else None

    def take(self, off: int, size: int) -> None:
        self.used += size

    def give(self, off: int, size: int) -> None:
        self.used -= size

    def merged(self, off: int, size: int) -> float:
        return float("inf")


class _Facts:
    """What every run on one order shares, computed once: reads, which tensors can be made again, how long each is
    needed, when each leaves the count, durations and sizes."""

    def __init__(self, ctx: Context) -> None:
        g = ctx.graph
        self.g: Graph = g
        n = ctx.n
        self.pos = {op.name: i for i, op in enumerate(ctx.ops)}
        reads: dict[str, list[int]] = {t: [] for t in g.tensors}
        for i, op in enumerate(ctx.ops):
            for t in op.reads:
                reads[t].append(i)
        self.reads = reads
        updated = {t for t, ups in ctx.upd.items() if ups}
        self.remakeable: dict[str, bool] = {}
        for t in g.tensors:
            p = g.producer.get(t)
            op = g.op(p) if p is not None else None
            # A re-run makes again every output of its op that is not on HBM, so every output must be one a re-run
            # may make (none kept for good, none written in place since).
            self.remakeable[t] = bool(
                op is not None and op.recomputable
                and not any(g.tensors[o].persistent or o in updated for o in op.outputs))
        # A re-run must read what the op first read: it can run before slot ``fresh_until[t]`` at the latest, the
        # first op after the producer that writes one of its inputs in place (LLaMA's weights: the optimizer's).
        self.fresh_until: dict[str, int] = {}
        for t, ok in self.remakeable.items():
            if ok:
                p = self.pos[g.producer[t]]
                self.fresh_until[t] = min((q for x in g.op(g.producer[t]).reads for q in ctx.upd[x] if q > p),
                                          default=n)
        # How long each tensor may be needed: read, or read by a re-run that makes a tensor needed later.
        need = {t: (reads[t][-1] if reads[t] else -1) for t in g.tensors}
        for op in reversed(ctx.ops):
            for c in op.outputs:
                if self.remakeable[c]:
                    for x in op.reads:
                        need[x] = max(need[x], need[c])
        self.free_at: dict[int, list[str]] = {}
        self.last: dict[str, int] = {}  # the slot after which each tensor leaves the count by its own reads
        start_resident = {}
        for t, tensor in g.tensors.items():
            produced = t in g.producer
            on_hbm = not produced and ctx.spans[t] is not None and not (not reads[t] and not tensor.persistent)
            start_resident[t] = on_hbm
            if tensor.persistent:
                continue
            # Made again when needed: freed after the last read. Not remakeable: held while a chain may need it.
            last = (reads[t][-1] if reads[t] else -1) if self.remakeable[t] else need[t]
            if produced and last < self.pos[g.producer[t]]:
                last = self.pos[g.producer[t]]  # never read: freed when its producer ends
            if last >= 0 and (produced or on_hbm):
                self.free_at.setdefault(min(last, n - 1), []).append(t)
                self.last[t] = min(last, n - 1)
        self.start_resident = start_resident
        # Tensors that start on HBM but nothing reads and nothing keeps: dropped at once (greedy's droppable gaps).
        self.dropped = [t for t, tensor in g.tensors.items()
                        if t not in g.producer and not reads[t] and not tensor.persistent and ctx.spans[t] is not None]
        self.dur = {op.name: int(d) for op, d in zip(ctx.ops, ctx.dur.tolist())}
        self.ws = [g.working_set(op) for op in ctx.ops]
        # Per remakeable tensor: its producer's reads and duration; per tensor: bytes and last read.
        self.preads = {t: g.op(g.producer[t]).reads for t in g.tensors if self.remakeable[t]}
        self.pdur = {t: self.dur[g.producer[t]] for t in self.preads}
        # What a re-run making t allocates at most: every output of its producer.
        self.psize = {t: sum(g.tensors[o].bytes for o in g.op(g.producer[t]).outputs) for t in self.preads}
        self.size = {t: tensor.bytes for t, tensor in g.tensors.items()}
        self.last_read = {t: (r[-1] if r else -1) for t, r in reads.items()}


class _Chains:
    def __init__(self, ctx: Context, facts: _Facts, budget: int, keep: frozenset[str] = frozenset(),
                 policy: Policy | None = None, addresses: bool = False) -> None:
        self.ctx = ctx
        self.policy = policy or POLICIES[0]
        self.keep = keep  # tensors never dropped: a run that dropped them could not make them again in time
        self.blame: set[str] = set()  # after a failed run: the dropped tensors the failing op needed
        self.dropped_once: set[str] = set()
        self.max_recomputes = MAX_RECOMPUTES_PER_OP * ctx.n + 64
        self.gave_up = False
        self.redo_ns = 0  # the re-runs' compute time: with nothing moving, the plan's makespan less the compute
        f = facts
        self.g, self.pos, self.reads, self.remakeable = f.g, f.pos, f.reads, f.remakeable
        self.free_at, self.last, self.dropped, self.dur, self.ws = f.free_at, f.last, f.dropped, f.dur, f.ws
        self.fresh_until = f.fresh_until
        self.preads, self.pdur, self.size, self.last_read = f.preads, f.pdur, f.size, f.last_read
        self.psize = f.psize
        self.redo_at: dict[int, list[str]] = {}  # re-runs scheduled early, by slot
        self.state = _State(budget, dict(f.start_resident))
        self.addresses = addresses
        self.space: _Space | _Count = _Space(budget) if addresses else _Count(budget)
        self.addr: dict[str, int] = {}  # allocation name -> offset, while allocated
        self.offsets: dict[str, list[int]] = {}  # allocation name -> offset of each of its allocations, in order

    # -- the run
    def run(self) -> bool:
        s = self.state
        for t in self.dropped:  # on HBM at time 0 and dropped then: any address
            self.offsets.setdefault(t, []).append(0)
            s.actions.append(("detach", t))
        for t, on in s.resident.items():
            if on:
                if not self._alloc(t, self.size[t], 0):
                    return False
                s.on.add(t)
        for i, op in enumerate(self.ctx.ops):
            made: list[str] = []
            for t in self.redo_at.pop(i, []):
                if not s.resident[t] and self._next_read(t, i) is not None and not self._ensure([t], i, made):
                    self.blame = set() if self.gave_up else {t}
                    return False
            missing = {t for t in op.reads if not s.resident[t] and t in self.dropped_once}
            self._pin(op.reads)
            if not self._ensure(list(op.reads), i, made):
                self.blame = set() if self.gave_up else missing
                return False
            for t in op.outputs:
                if not self._alloc(t, self.size[t], i):
                    return False
                s.resident[t] = True  # not yet a candidate to drop (not in ``on``) while the others are placed
            if not self._alloc(WORKSPACE + op.name, op.workspace_bytes, i):
                return False
            s.actions.append(("compute", op.name))
            s.peak = max(s.peak, s.mem)
            self._release(WORKSPACE + op.name, op.workspace_bytes)
            s.on.update(op.outputs)
            self._unpin(op.reads)
            # Freed after the op: tensors past their last read (or need) and what a chain made for this op only.
            for t in dict.fromkeys(made + self.free_at.get(i, [])):
                if s.resident[t] and self._next_read(t, i + 1) is None:
                    self._drop(t, "free")
        return True

    def _alloc(self, name: str, size: int, i: int) -> bool:
        """Place ``size`` bytes for ``name`` before op ``i``, dropping tensors until a hole fits; False when nothing
        more can go."""
        if size == 0:
            self.offsets.setdefault(name, []).append(0)
            self.addr[name] = 0
            return True
        while (off := self.space.fit(size)) is None:
            victim = self._victim(i, size)
            if victim is None:
                return False
            t, when = victim
            self._drop(t, "detach")
            self.dropped_once.add(t)
            if when is not None:
                self.redo_at.setdefault(when, []).append(t)
        self.space.take(off, size)
        self.addr[name] = off
        self.offsets.setdefault(name, []).append(off)
        self.state.mem += size
        return True

    def _release(self, name: str, size: int) -> None:
        off = self.addr.pop(name)
        if size:
            self.space.give(off, size)
            self.state.mem -= size

    def _ensure(self, targets: list[str], i: int, made: list[str]) -> bool:
        """Make every tensor of ``targets`` resident before op ``i`` (a chain of re-runs); False when it cannot."""
        s, g = self.state, self.g
        stack = [t for t in reversed(targets) if not s.resident[t]]
        pushed: set[str] = set()
        while stack:
            x = stack[-1]
            if s.resident[x]:
                stack.pop()
                continue
            if not self.remakeable[x] or i > self.fresh_until[x]:
                return False
            op = g.op(g.producer[x])
            if x not in pushed:
                pushed.add(x)
                self._pin(op.reads)  # what this re-run reads stays while its own inputs are made
            missing = [y for y in op.reads if not s.resident[y]]
            if missing:
                stack.extend(missing)
                continue
            outs = [o for o in op.outputs if not s.resident[o]]
            self._pin(outs)  # placing one output must not drop another the re-run is making
            for o in outs:
                if not self._alloc(o, self.size[o], i):
                    return False
                s.resident[o] = True
            self._unpin(outs)
            if not self._alloc(WORKSPACE + op.name, op.workspace_bytes, i):
                return False
            s.peak = max(s.peak, s.mem)
            self._release(WORKSPACE + op.name, op.workspace_bytes)
            s.actions.append(("recompute", op.name))
            s.recomputes += 1
            self.redo_ns += self.dur[op.name]
            if s.recomputes > self.max_recomputes:
                self.gave_up = True
                return False  # thrashing: a plan re-running this much would not be worth having
            s.on.update(outs)
            self._unpin(op.reads)
            pushed.discard(x)
            made.extend(outs)
            stack.pop()
        return True

    def _victim(self, i: int, need: int) -> tuple[str, int | None] | None:
        """What to drop before op ``i`` to place ``need`` bytes, and the slot to make it again at (None: before its
        next read, lazily). Tensors whose address, with the free holes beside it, makes room first.

        Each candidate weighs what re-making costs against its bytes times the ops it is gone for, two ways: re-run
        early, at the last slot its producer's inputs are all still on HBM by their own reads (one re-run, no chain),
        or late, right before its next read (a chain when its inputs are gone by then)."""
        s = self.state
        best, best_key = None, None
        bounded = []
        for t in s.on:
            if not self.remakeable[t] or s.pins.get(t, 0) or t in self.keep:
                continue
            nxt = self._next_read(t, i)
            if nxt is not None and nxt > self.fresh_until[t]:
                continue  # a re-run then would read inputs written in place since
            b = max(1, self.size[t])
            # Dropping it must open a hole the allocation fits in (with its free neighbours) to free an address.
            short = int(self.space.merged(self.addr[t], self.size[t]) < need)
            if nxt is None:
                bounded.append(((short, 0, 0.0, -b, t), t, None, b))
            else:
                # Either way costs at least the producer's re-run over at most the ops until the next read.
                bounded.append(((short, 1, self.pdur[t] / (b * (nxt - i + 1) ** self.policy.reach), -b, t), t, nxt,
                                b))
        bounded.sort()
        for bound, t, nxt, b in bounded:
            if best_key is not None and bound >= best_key:
                break
            if nxt is None:
                best, best_key = (t, None), bound
                continue
            short = bound[0]
            cost, deep, held = self._remake_ns(t, nxt)
            # A chain that needs more than the budget beside what its reader holds will not fit then.
            tight = self.policy.tight and held + self.ws[nxt] > s.budget
            key, when = (short, 1 + deep + tight, cost / (b * (nxt - i + 1) ** self.policy.reach), -b, t), None
            early = min([nxt] + [self._kept_until(y) for y in self.preads[t]])
            if early > i and self.policy.early:
                alt = (short, 1, self.pdur[t] / (b * (early - i) ** self.policy.reach), -b, t)
                if alt < key:
                    key, when = alt, early
            if best_key is None or key < best_key:
                best, best_key = (t, when), key
        return best

    def _kept_until(self, y: str) -> int:
        """The last slot ``y`` is on HBM by its own reads (-1: not on HBM now)."""
        if not self.state.resident[y]:
            return -1
        if self.g.tensors[y].persistent:
            return self.ctx.n
        return self.last[y]

    def _remake_ns(self, t: str, when: int) -> tuple[int, int, int]:
        """(what re-making ``t`` before op ``when`` would cost, 1 if its chain is deeper than ``CHAIN_DEPTH`` or wider
        than ``CHAIN_WIDTH`` re-runs, the bytes the chain's re-runs read and make): its producer's re-run and those of
        every input gone by then (DTR's evicted neighbourhood, but at the next read: an input freed after its last
        read has to be made again)."""
        resident, remakeable, last, size = self.state.resident, self.remakeable, self.last_read, self.size
        cost, held, frontier, seen = 0, 0, [t], {t}
        for _depth in range(CHAIN_DEPTH):
            nxt: list[str] = []
            for x in frontier:
                cost += self.pdur[x]
                held += self.psize[x]
                for y in self.preads[x]:
                    if y in seen:
                        continue
                    seen.add(y)
                    if remakeable[y] and (not resident[y] or last[y] < when):
                        if when > self.fresh_until[y]:
                            return cost, 1, held  # a chain that cannot run: ranks after every one that can
                        nxt.append(y)
                    else:
                        held += size[y]
            if not nxt:
                return cost, 0, held
            if len(seen) > CHAIN_WIDTH:
                break
            frontier = nxt
        return cost, 1, held

    def _drop(self, t: str, why: str) -> None:
        s = self.state
        s.resident[t] = False
        s.on.discard(t)
        self._release(t, self.size[t])
        s.actions.append((why, t))

    def _next_read(self, t: str, i: int) -> int | None:
        r = self.reads[t]
        k = bisect.bisect_left(r, i)
        return r[k] if k < len(r) else None

    def _pin(self, names) -> None:
        for t in names:
            self.state.pins[t] = self.state.pins.get(t, 0) + 1

    def _unpin(self, names) -> None:
        for t in names:
            self.state.pins[t] -= 1

    # -- the program
    def emit(self, name: str) -> Plan:
        g, actions = self.g, self.state.actions
        last_touch: dict[str, int] = {}
        for k, (kind, target) in enumerate(actions):
            if kind in ("compute", "recompute"):
                op = g.op(target)
                for t in op.reads + op.outputs:
                    last_touch[t] = k
        pb = ProgramBuilder()
        for k, (kind, target) in enumerate(actions):
            if kind == "compute":
                pb.compute(target)
            elif kind == "recompute":
                pb.recompute(target)
            elif last_touch.get(target, -1) > k or (kind == "detach" and target in self.dropped):
                pb.detach(target)
        offsets = {k: (v[0] if len(v) == 1 else v) for k, v in self.offsets.items()} if self.addresses else {}
        return replace(pb.build(g.name, name), status=PlanStatus.FEASIBLE, offsets=offsets,
                       placement=plan_placement(g, self.ctx.unused_remote),
                       stats={"recomputes": self.state.recomputes, "estimated_peak_hbm_bytes": self.state.peak})


__all__ = ["chains_apply", "plan_remat_chains"]
