"""The greedy planner's model of the graph, and its selection of what to offload.

Everything here is sequential and size-based: positions are indices into the compute order, and a tensor is
"on HBM during op i" when the executor would count it then. The conventions the planner emits (see
``greedy.py``) make this count an upper bound of the executed HBM occupancy at every instant:

* a Detach placed before op ``r`` (on the compute stream) frees the copy before op ``r`` starts;
* a Prefetch placed before op ``q`` waits for the last compute-stream step before it, so its HBM copy is
  allocated no earlier than op ``q``'s slot;
* the executor frees a tensor that does not outlive the step at the end of its last use.

A *gap* is a stretch of ops during which a tensor is not used: between two uses (``mid``), before the first
use of a tensor that starts on HBM (``head``), after the last use of a tensor that outlives the step
(``tail``), or the whole step for a tensor no op uses. Offloading a gap removes the tensor from HBM for ops
``r .. q-1`` with ``a < r < q <= u``, where ``a`` is the use before the gap (-1 for none) and ``u`` the use after
it (``n`` for none). A tensor that starts on a remote tier has a mandatory gap before its first use.

Steps repeat (planner/placement.py), so a tensor that outlives the step ends it where it started: one pinned to
HBM may leave after its last use only to come back before the step ends (a *back* gap: Store, Detach, Prefetch),
and one pinned remote and updated in place has a mandatory tail gap whose Store goes to its own tier. A tensor
whose tier the planner chooses has a *wrap-around gap*: from its last use in one step to its first use in the
next, i.e. a head part (off HBM until its first use: it starts remote, nothing to store) and a tail part (off HBM
after its last use: stored back when updated). The two parts are one candidate, selected together; selecting it
places the tensor on the fastest remote tier, leaving it places it on HBM.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from planner.cost import op_durations_ns, transfer_duration_ns
from planner.graph import AUTO, Graph
from planner.hardware import HBM, Hardware
from planner.orders import named_order


@dataclass
class Gap:
    tensor: str
    bytes: int
    a: int  # the use before the gap (-1: none, the tensor exists before the step)
    u: int  # the use after the gap (n: none)
    pre_absent: bool = False  # starts on a remote tier: nothing to store or detach, only to prefetch
    droppable: bool = False  # never used and not needed after the step: a Detach with no Store frees it
    mandatory: bool = False
    wrap: bool = False  # a part of a wrap-around gap (see the module doc)
    partner: int | None = None  # the other part of a wrap-around gap (index into Context.gaps)
    back: bool = False  # after the last use of a tensor that starts on HBM: fetched back before the step ends
    score: float = 0.0  # bytes x the gap's compute time
    stall: int = 0  # estimated stall if offloaded alone: store + fetch time beyond the gap's compute time
    selected: bool = False
    # Resolved after selection.
    needs_store: bool = False
    store_tier: str | None = None
    fetch_tier: str | None = None
    # Placement: the tensor is off HBM for ops r .. q-1.
    r: int = 0
    q: int = 0

    @property
    def lo(self) -> int:
        """The first op the tensor can be off HBM."""
        return 0 if self.pre_absent else self.a + 1

    @property
    def hi(self) -> int:
        """One past the last op the tensor can be off HBM."""
        return self.u


class Context:
    """What every greedy run on one graph and one hardware shares: order, times, uses, gaps, baseline."""

    def __init__(self, graph: Graph, hw: Hardware, order: str = "auto") -> None:
        self.graph, self.hw = graph, hw
        self.order = named_order(graph, order)
        self.order_name = order
        n = self.n = len(self.order)
        self.ops = [graph.op(name) for name in self.order]
        durations = op_durations_ns(graph, hw)
        self.dur = np.array([durations[name] for name in self.order], dtype=np.int64)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.dur, out=starts[1:])
        self.S = starts  # S[i]: op i's start with no stall; S[n]: the compute total
        self.S_list = starts[:n].tolist()
        # Remote tiers, fastest round trip first.
        self.tiers = sorted(
            (t.name for t in hw.remote_tiers),
            key=lambda name: (1 / hw.store_link(name).bandwidth_Bps + 1 / hw.fetch_link(name).bandwidth_Bps, name),
        )
        self.store_link = {t: hw.store_link(t).name for t in self.tiers}  # tier -> link name
        self.fetch_link = {t: hw.fetch_link(t).name for t in self.tiers}
        self._links = hw.links_by_name
        self._ns: dict[tuple[int, str], int] = {}
        acc: dict[str, list[int]] = {t: [] for t in graph.tensors}
        upd: dict[str, list[int]] = {t: [] for t in graph.tensors}
        ws = np.zeros(n, dtype=np.int64)
        for i, op in enumerate(self.ops):
            for t in dict.fromkeys(op.reads + op.outputs):
                acc[t].append(i)
            for t in op.updates:
                upd[t].append(i)
            ws[i] = op.workspace_bytes
        self.acc, self.upd = acc, upd
        self.workspace = ws
        # Free tensors (home auto) that no op uses start on the fastest remote tier: nothing to gain on HBM.
        self.unused_remote = {t: self.tiers[0] for t in graph.free_tensors if not acc[t] and self.tiers}
        # Free tensors placed remote by the current selection (their wrap-around gap is taken): tensor -> tier.
        self.wrapped: dict[str, str] = {}
        self.base = self._baseline()
        self.gaps = self._gaps()

    # -- times
    def end_of(self, a: int) -> int:
        """When op ``a`` ends with no stall (0 for a = -1, the start of the step)."""
        return 0 if a < 0 else int(self.S[a + 1])

    def start_of(self, u: int) -> int:
        return int(self.S[min(u, self.n)])

    def transfer_ns(self, nbytes: int, link: str) -> int:
        key = (nbytes, link)
        ns = self._ns.get(key)
        if ns is None:
            ns = self._ns[key] = transfer_duration_ns(nbytes, self._links[link])
        return ns

    def store_ns(self, nbytes: int, tier: str | None = None) -> int:
        return self.transfer_ns(nbytes, self.store_link[tier or self.tiers[0]]) if self.tiers else 0

    def fetch_ns(self, nbytes: int, tier: str | None = None) -> int:
        return self.transfer_ns(nbytes, self.fetch_link[tier or self.tiers[0]]) if self.tiers else 0

    # -- the no-offload count
    def _span(self, t: str) -> tuple[int, int] | None:
        """Ops [first, last] during which ``t`` is on HBM when nothing is offloaded (None: never)."""
        g, n = self.graph, self.n
        tensor = g.tensors[t]
        uses = self.acc[t]
        if t in g.producer:
            return (uses[0], n - 1 if tensor.persistent else uses[-1])
        if not uses and (t in self.unused_remote or (tensor.pinned and tensor.home != HBM)):
            return None
        last = n - 1 if (tensor.persistent or not uses) else uses[-1]
        return (0, last)

    def _baseline(self) -> np.ndarray:
        diff = np.zeros(self.n + 1, dtype=np.int64)
        for t, tensor in self.graph.tensors.items():
            span = self._span(t)
            if span is not None:
                diff[span[0]] += tensor.bytes
                diff[span[1] + 1] -= tensor.bytes
        return np.cumsum(diff[:-1]) + self.workspace

    # -- gaps
    def _gaps(self) -> list[Gap]:
        g, n = self.graph, self.n
        out: list[Gap] = []
        for t, tensor in g.tensors.items():
            b = tensor.bytes
            uses = self.acc[t]
            produced = t in g.producer
            if not produced:
                if tensor.home == AUTO:
                    if uses:
                        head = Gap(t, b, -1, uses[0], pre_absent=True, wrap=True, partner=len(out) + 1)
                        tail = Gap(t, b, uses[-1], n, wrap=True, partner=len(out))
                        out += [head, tail]
                elif tensor.home != HBM:
                    if uses:
                        out.append(Gap(t, b, -1, uses[0], pre_absent=True, mandatory=True))
                elif not uses:
                    if not tensor.persistent:
                        out.append(Gap(t, b, -1, n, droppable=True, mandatory=True))
                    else:  # stored, dropped and fetched back before the step ends
                        out.append(Gap(t, b, -1, n, back=True))
                elif uses[0] >= 1:
                    out.append(Gap(t, b, -1, uses[0]))
            for a, u in zip(uses, uses[1:]):
                if u - a >= 2:
                    out.append(Gap(t, b, a, u))
            if not uses or not tensor.persistent:
                continue
            if produced:
                if uses[-1] <= n - 2:
                    out.append(Gap(t, b, uses[-1], n))
            elif tensor.pinned and tensor.home == HBM:
                # Off HBM after its last use, back before the step ends (the next step finds it there).
                if uses[-1] <= n - 2:
                    out.append(Gap(t, b, uses[-1], n, back=True))
            elif tensor.pinned:
                # Back to its own tier: a Store after the last update is required; a Detach alone is free.
                if self.upd[t]:
                    out.append(Gap(t, b, uses[-1], n, mandatory=True))
                elif uses[-1] <= n - 2:
                    out.append(Gap(t, b, uses[-1], n))
        for gap in out:
            window = self.start_of(gap.u) - self.end_of(gap.a)
            gap.score = float(gap.bytes) * float(window)
            gap.stall = max(0, self.transfer_cost(gap) - window)
        for gap in out:
            if gap.wrap and gap.pre_absent:
                # One candidate: both parts rank by what they free and cost together.
                tail = out[gap.partner]
                gap.score = tail.score = gap.score + tail.score
                gap.stall = tail.stall = gap.stall + tail.stall
        return out

    def fetches(self, gap: Gap) -> bool:
        """Whether the gap ends with a Prefetch (before a use, or before the step ends)."""
        return gap.u < self.n or gap.back

    def home_of(self, t: str) -> str:
        """The tier ``t`` starts on under the current selection (``hbm`` for tensors an op produces)."""
        tensor = self.graph.tensors[t]
        if t in self.graph.producer:
            return HBM
        if tensor.pinned:
            return tensor.home
        return self.wrapped.get(t) or self.unused_remote.get(t) or HBM

    def has_home_copy(self, gap: Gap) -> bool:
        """Whether the tensor's home copy on a remote tier is still valid at the start of the gap."""
        if gap.tensor in self.graph.producer:
            return False
        if not gap.wrap and self.home_of(gap.tensor) == HBM:
            return False
        ups = self.upd[gap.tensor]
        return not ups or ups[0] > gap.a

    def transfer_cost(self, gap: Gap) -> int:
        """Store (unless a valid home copy exists) plus fetch time of the gap on the fastest tier, in ns."""
        if not self.tiers or gap.droppable:
            return 0
        store = 0 if (gap.pre_absent or self.has_home_copy(gap)) else self.store_ns(gap.bytes)
        return store + (self.fetch_ns(gap.bytes) if self.fetches(gap) else 0)


# Slots summed first when booking a transfer on the link calendar (then 4x more at a time).
TAKE_CHUNK = 64


class LinkCalendar:
    """How much transfer time each link has left in each op's time slot (the op's duration x channels).

    Selection books a gap's Store from the front of its window and its Prefetch from the back, and estimates a
    gap's stall as what does not fit: a coarse model of link contention, so that the distance rule and the budget
    do not pick more transfers than the links can hide. (The refinement then places the cache ops with a finer
    schedule.)
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.free = {ln.name: ctx.dur * ln.channels for ln in ctx.hw.links}

    def links(self, gap: Gap) -> tuple[str | None, int, str | None, int]:
        """(store link, store ns, fetch link, fetch ns) the gap would use, on the fastest tier."""
        ctx = self.ctx
        if not ctx.tiers or gap.droppable:
            return None, 0, None, 0
        store = fetch = None
        ts = tf = 0
        if not gap.pre_absent and not ctx.has_home_copy(gap):
            store = ctx.store_link[ctx.tiers[0]]
            ts = ctx.transfer_ns(gap.bytes, store)
        if ctx.fetches(gap):
            home = ctx.home_of(gap.tensor)
            tier = home if store is None and home != HBM else ctx.tiers[0]
            fetch = ctx.fetch_link[tier]
            tf = ctx.transfer_ns(gap.bytes, fetch)
        return store, ts, fetch, tf

    def stall(self, gap: Gap) -> int:
        store, ts, fetch, tf = self.links(gap)
        lo, hi = gap.lo, min(gap.u, self.ctx.n)
        short = 0
        if store is not None:
            short += max(0, ts - int(self.free[store][lo:hi].sum()))
        if fetch is not None:
            short += max(0, tf - int(self.free[fetch][lo:hi].sum()))
        return max(gap.stall, short)

    def book(self, gap: Gap) -> None:
        store, ts, fetch, tf = self.links(gap)
        lo, hi = gap.lo, min(gap.u, self.ctx.n)
        if store is not None:
            self._take(self.free[store][lo:hi], ts)
        if fetch is not None:
            self._take(self.free[fetch][lo:hi][::-1], tf)

    @staticmethod
    def _take(free: np.ndarray, need: int) -> None:
        """Use ``need`` ns of ``free`` (a view), first slots first.

        The slots are summed a chunk at a time (growing), not all at once: a gap can span most of the graph while
        its transfer fits in its first few slots, and summing every slot of every such gap was a large share of
        greedy's time on 30k-op graphs. The result is the same.
        """
        if need <= 0 or len(free) == 0:
            return
        n = len(free)
        start, chunk = 0, TAKE_CHUNK
        while start < n:
            part = free[start:start + chunk]
            c = np.cumsum(part)
            k = int(np.searchsorted(c, need))
            if k < len(part):
                part[:k] = 0
                part[k] = int(c[k]) - need
                return
            need -= int(c[-1])
            part[:] = 0
            start += chunk
            chunk *= 4


def _cover(L: np.ndarray, lo: int, hi: int, b: int) -> None:
    """The tensor of ``b`` bytes leaves HBM for ops lo .. hi-1."""
    if hi > lo:
        L[lo:hi] -= b


def select_gaps(
    ctx: Context, budget: int, select_distance: int, select_num: int, prefetch_distance: int, release_distance: int
) -> tuple[list[Gap], np.ndarray, int | None]:
    """Choose the gaps to offload; return (selected gaps, HBM count per op with each at its widest, first op
    still over ``budget`` or None).

    1. mandatory gaps (tensors that start remote; unused tensors that can simply be dropped);
    2. the distance rule: gaps at least ``select_distance`` ops long whose store and fetch fit in the gap's
       compute time and in what the links have left (``LinkCalendar``), the ``select_num`` largest by
       bytes x gap time;
    3. the budget: sweeping the ops in order, while an op is over budget, the gap covering it whose transfers
       the cost model says stall least (none, when store and fetch fit in the gap's compute time and in the
       links' remaining time), then the
       largest bytes x gap time, counted with its nominal placement (detach ``release_distance`` ops after the
       use, prefetch ``prefetch_distance`` ops before the next);
    4. if an op is still over, every gap counted at its widest (detach right after the use, prefetch right
       before the next), and more gaps by the same rule.
    """
    for gap in ctx.gaps:
        gap.selected = gap.mandatory
    ctx.wrapped = {}
    pd, rd = max(0, prefetch_distance), max(1, release_distance)

    def nominal(gap: Gap) -> tuple[int, int]:
        lo = 0 if gap.pre_absent else (gap.lo if gap.droppable else max(gap.lo, gap.a + rd))
        hi = max(lo, gap.u - pd) if ctx.fetches(gap) else gap.u
        return lo, hi

    # Room on each remote tier for tensors placed there by a wrap-around gap (pinned homes hold theirs).
    room = {t: ctx.hw.tier(t).capacity_bytes for t in ctx.tiers}
    for name, tensor in ctx.graph.tensors.items():
        home = ctx.home_of(name) if name not in ctx.graph.producer else HBM
        if home in room:
            room[home] -= tensor.bytes

    cal = LinkCalendar(ctx)

    def parts(gap: Gap) -> list[Gap]:
        return [gap] if gap.partner is None else [gap, ctx.gaps[gap.partner]]

    def take(gap: Gap) -> list[Gap]:
        """Select ``gap`` (with its other part, placing the tensor, for a wrap-around gap); return what was
        selected (nothing when no remote tier has room for the tensor)."""
        if gap.wrap:
            tier = next((t for t in ctx.tiers if room[t] >= gap.bytes), None)
            if tier is None:
                return []
            room[tier] -= gap.bytes
            ctx.wrapped[gap.tensor] = tier
        taken = parts(gap)
        for p in taken:
            p.selected = True
            cal.book(p)
        return taken

    for gap in ctx.gaps:
        if gap.selected:
            cal.book(gap)
    if select_num > 0 and ctx.tiers:
        # Where a tensor starts is a budget decision (step 3), not one the distance rule makes for its own sake:
        # its first fetch has only the ops before the first use to hide behind.
        pool = [gap for gap in ctx.gaps
                if not gap.selected and gap.stall == 0 and gap.u - gap.a >= max(2, select_distance)
                and not gap.wrap]
        pool.sort(key=lambda g: (-g.score, g.tensor, g.a))
        taken = 0
        for gap in pool:
            if taken >= select_num:
                break
            if cal.stall(gap) == 0 and take(gap):
                taken += 1

    def sweep(L: np.ndarray, rng) -> int | None:
        cands = sorted(
            ((lo, hi, k) for k, gap in enumerate(ctx.gaps) if not gap.selected for lo, hi in [rng(gap)] if hi > lo),
        )
        heap: list[tuple[int, float, str, int, int, int]] = []
        j = 0
        first_over = None
        for i in range(ctx.n):
            if L[i] <= budget:
                continue
            while j < len(cands) and cands[j][0] <= i:
                lo, hi, k = cands[j]
                gap = ctx.gaps[k]
                heapq.heappush(heap, (gap.stall, -gap.score, gap.tensor, gap.a, k, hi))
                j += 1
            while L[i] > budget and heap:
                st, sc, t, a, k, hi = heapq.heappop(heap)
                gap = ctx.gaps[k]
                if hi <= i or gap.selected:
                    continue
                now = cal.stall(gap)
                if now > st and heap and (now, sc) > heap[0][:2]:
                    heapq.heappush(heap, (now, sc, t, a, k, hi))  # the links got busier: look again later
                    continue
                for p in take(gap):
                    _cover(L, *rng(p), p.bytes)
            if L[i] > budget and first_over is None:
                first_over = i
        return first_over

    L = ctx.base.copy()
    for gap in ctx.gaps:
        if gap.selected:
            _cover(L, *nominal(gap), gap.bytes)
    over = sweep(L, nominal)
    widest = lambda gap: (gap.lo, gap.hi)  # noqa: E731
    L = ctx.base.copy()
    for gap in ctx.gaps:
        if gap.selected:
            _cover(L, gap.lo, gap.hi, gap.bytes)
    if over is not None:
        over = sweep(L, widest)
    return [gap for gap in ctx.gaps if gap.selected], L, over


__all__ = ["Context", "Gap", "select_gaps"]
