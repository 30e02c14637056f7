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

A mid gap of a tensor made by a recomputable op with a single output has a second answer besides offloading: a
*recompute* gap. The tensor is dropped after the use before the gap (a Detach, nothing stored) and made again by
re-running its producer right before the use after it; its cost is the producer's duration on the compute stream,
its ``stall`` estimate, so it competes with offloading in the budget sweep. Single output: a recomputation makes
again every output that is not on HBM at its start, so with one output the bytes it allocates are exactly the
gap's and the count stays exact. Depth 1: the producer's inputs must be on HBM during the use after the gap in the
no-offload count (their span covers it), not updated in place since the producer ran, and none of their gaps
that strictly cover that use may be offloaded or recomputed (``Gap.holds``). ``Answers`` says which answers a
run may give: ``offload=False`` keeps only the mandatory transfer gaps (a remat-only planner, the Checkmate
problem), ``recompute=False`` adds no recompute gaps (the paper's planner).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from planner.bounds import initial_hbm_bytes
from planner.cost import op_durations_ns, transfer_duration_ns
from planner.graph import AUTO, Graph, TensorKind
from planner.hardware import HBM, Hardware
from planner.orders import named_order
from planner.placement import master_copies
from planner.plan import Plan
from planner.planners import greedy_kernel


@dataclass(frozen=True)
class Answers:
    """What greedy may do with a gap besides keeping the tensor on HBM: offload it (Store, Detach, Prefetch) and
    recompute it (Detach, then re-run its producer). Mandatory transfers (tensors that start remote, unused
    tensors dropped, store-backs to a pinned tier) are made either way."""

    offload: bool = True
    recompute: bool = True

    def options(self) -> dict:
        """Both answers, as plan options: always recorded, since the bound a report quotes for a plan depends on
        whether it could recompute (``planner.quality.may_recompute``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def allows(self, gap: Gap) -> bool:
        """Whether ``gap`` is a candidate under these answers (mandatory gaps always are)."""
        if gap.recompute is not None:
            return self.recompute
        return self.offload or gap.mandatory

    def used(self, gaps: list[Gap]) -> list[str]:
        """The answers ``gaps`` (selected) give, for the plan's stats."""
        out = []
        if any(g.recompute is None and not g.mandatory for g in gaps):
            out.append("offload")
        if any(g.recompute is not None for g in gaps):
            out.append("recompute")
        return out


@dataclass(slots=True)  # a million of them on the 38.8k-op graph: no per-instance dict
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
    recompute: int | None = None  # a recompute gap: the producer's position in the order, re-run before op u
    index: int = -1  # position in Context.gaps
    twin: int | None = None  # the other answer for the same stretch (offload <-> recompute): one at most is taken
    holds: tuple[int, ...] = ()  # a recompute gap: the gaps of the producer's inputs that cover op u (kept off)
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


@dataclass(frozen=True)
class GapTable:
    """The gaps' fixed fields as arrays (index = ``Gap.index``), so that a selection sweeps a million gaps (the
    38.8k-op inference graph) in numpy rather than a Python loop over ``Gap`` objects."""

    a: np.ndarray
    u: np.ndarray
    nbytes: np.ndarray
    lo: np.ndarray  # ``Gap.lo``
    pre_absent: np.ndarray
    stores: np.ndarray  # left by a Store (not dropped, not recomputed): its nominal Detach waits ``release_distance``
    fetches: np.ndarray  # ``Context.fetches``
    redo: np.ndarray  # a recompute gap
    mandatory: np.ndarray
    wrap: np.ndarray
    stall: list[int]
    stall_array: np.ndarray  # ``stall`` as an array
    rank: list[int]  # position in the order (-gap time, -score, tensor, a, index): the selection's tie-breaks
    rank_array: np.ndarray  # ``rank`` as an array
    by_rank: list[int]  # the gap at each rank

    def allowed(self, answers: Answers) -> np.ndarray:
        """``Answers.allows`` for every gap."""
        return np.where(self.redo, answers.recompute, answers.offload | self.mandatory)

    @cached_property
    def farthest(self) -> tuple[np.ndarray, list[int]]:
        """(rank of every gap, the gap at each rank) in Belady's order for the ``belady`` eviction rule: the use
        after the gap farthest ahead first, then ``rank``."""
        order = np.lexsort((self.rank_array, -self.u))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return rank, order.tolist()

    def nominal(self, prefetch_distance: int, release_distance: int) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of every gap at its nominal placement (``select_gaps``)."""
        lo = np.where(self.pre_absent, 0, np.where(self.stores, np.maximum(self.lo, self.a + release_distance),
                                                   self.lo))
        hi = np.where(self.fetches, np.maximum(lo, self.u - prefetch_distance), self.u)
        return lo, hi


# The selection ranks gaps longest first on graphs up to this many ops, by bytes x gap time alone above. On the
# 38.8k-op NSA-128k graph with weights on host (53.8 GB), longest first took 68.7k Prefetches against 32.1k, and its
# plan ran 52,720.93 against 51,337.74 ms, greedy 31.5 against 17.6 s (`ho-plan bench --suite scale`).
LONGEST_FIRST_MAX_OPS = 5000


class Context:
    """What every greedy run on one graph and one hardware shares: order, times, uses, gaps, baseline."""

    def __init__(self, graph: Graph, hw: Hardware, order: str = "auto", answers: Answers | None = None) -> None:
        self.graph, self.hw = graph, hw
        self.answers = answers if answers is not None else Answers()
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
        self.tiers = sorted((t.name for t in hw.remote_tiers), key=hw.round_trip_key)
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
        # Weights that nothing in the step writes: their bytes are final when the step starts.
        self.inference_weights = frozenset(t for t, x in graph.tensors.items() if x.kind is TensorKind.WEIGHT
                                           and not upd[t] and t not in graph.producer)
        self.early_weight_stores = False  # issue their Stores at the step's start (``refine.store_issued_after``)
        self.workspace = ws
        # Free tensors (home auto) that no op uses start on the fastest remote tier: nothing to gain on HBM.
        self.unused_remote = {t: self.tiers[0] for t in graph.free_tensors if not acc[t] and self.tiers}
        # Free tensors placed remote by the current selection (their wrap-around gap is taken): tensor -> tier.
        self.wrapped: dict[str, str] = {}
        # Free tensors that nothing writes: placed on HBM, they keep their master copy on the fastest remote tier
        # (planner/placement.py), so a gap of theirs needs no Store whatever the selection places. The program has
        # none (``refine.resolve_copies``), but the selection still scores their gaps with one (``has_home_copy``,
        # ``_gaps``): scored free, their gaps won over the wrap-around ones and greedy dropped the 1.85 GB embedding
        # table between the prefill's chunks of the 29k-op NSA graph at 64 GB, two 45 ms fetches back in the open
        # (18,196.92 ms, +1.36%, against 17,985.26 scored with the Store), and on NSA-64k-L3-1layer at 60% of its
        # peak greedy-sweep gave 476.41 ms against 461.31 (2026-12-08).
        self.mastered = frozenset(master_copies(graph, hw)) if self.tiers else frozenset()
        # Every gap's links as columns (``LinkCalendar.link_columns``), each made on first use (and a mask of those).
        self.gap_links: tuple[np.ndarray, ...] | None = None
        self.spans = {t: self._span(t) for t in graph.tensors}
        self.base = self._baseline()
        self.gaps = self._gaps()
        # The recompute chains (greedy_remat): the highest budget at which they found no plan, with and without
        # addresses, and the plans they found, by (budget, addresses, name).
        self.chains_failed: dict[bool, int] = {}
        self.chains_plans: dict[tuple[int, bool, str], Plan] = {}
        # Offsets found for a timeline's allocations (``greedy._offsets``), by the id of its residencies: the last
        # few only, each with the residencies it was found for.
        self.offsets_found: dict[int, tuple] = {}

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
            span = self.spans[t]
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
        # Score and stall of every gap: its Store (unless a valid home copy exists, ``has_home_copy`` with nothing
        # wrapped yet) plus its fetch on the fastest tier, beyond its compute time. Inline, over a million gaps on
        # the 38.8k-op inference graph (its KV-cache blocks' between the decode steps' reads).
        S = self.S.tolist()  # S[0] = 0: the end of "op -1"
        tiers = bool(self.tiers)
        home_hbm = {t: self.home_of(t) == HBM for t in g.tensors} if tiers else {}
        store_ns: dict[int, int] = {}  # by bytes, on the fastest tier
        fetch_ns: dict[int, int] = {}
        for gap in out:
            a, u, b = gap.a, gap.u, gap.bytes
            window = S[u if u < n else n] - S[a + 1]
            gap.score = float(b) * float(window)
            if not tiers or gap.droppable:
                continue  # no transfer: stall 0
            t = gap.tensor
            if gap.pre_absent:
                cost = 0
            else:
                ups = self.upd[t]
                home_copy = t not in g.producer and (gap.wrap or not home_hbm[t]) and (not ups or ups[0] > a)
                cost = 0
                if not home_copy:
                    cost = store_ns.get(b)
                    if cost is None:
                        cost = store_ns[b] = self.store_ns(b)
            if u < n or gap.back:
                f = fetch_ns.get(b)
                if f is None:
                    f = fetch_ns[b] = self.fetch_ns(b)
                cost += f
            gap.stall = max(0, cost - window)
        for gap in out:
            if gap.wrap and gap.pre_absent:
                # One candidate: both parts rank by what they free and cost together.
                tail = out[gap.partner]
                gap.score = tail.score = gap.score + tail.score
                gap.stall = tail.stall = gap.stall + tail.stall
        if not self.answers.offload:
            # Remat only: the transfers no plan can avoid stay (no wrap-around gap does, so no partner moves).
            out = [gap for gap in out if gap.mandatory]
        if self.answers.recompute:
            out += self._recompute_gaps(out)  # after the others: their indices (and tie-breaks) do not change
        for k, gap in enumerate(out):
            gap.index = k
        return out

    def _recompute_gaps(self, offload: list[Gap]) -> list[Gap]:
        """A recompute gap for every mid gap (a, u) of a tensor whose producer may run again (module doc).

        Excluded: producers with several outputs (a recomputation would allocate the others too, when they are off
        HBM), a tensor updated in place before op u (the recomputation would make an old version), an input off
        HBM at op u in the no-offload count or updated in place since the producer ran, and a producer whose
        workspace is more than what op u allocates itself (its outputs and workspace): the recomputation runs in
        op u's slot before op u, holding what op u's count holds less what op u allocates, plus its workspace, so
        this keeps op u's count an upper bound without a separate count for the recomputation.
        """
        g = self.graph
        pos = {op.name: i for i, op in enumerate(self.ops)}
        by_tensor: dict[str, list[int]] = {}
        for k, gap in enumerate(offload):
            by_tensor.setdefault(gap.tensor, []).append(k)
        adds = [sum(g.tensors[t].bytes for t in op.outputs) + op.workspace_bytes for op in self.ops]
        out: list[Gap] = []
        for t, tensor in g.tensors.items():
            name = g.producer.get(t)
            if name is None:
                continue
            op = g.op(name)
            if not op.recomputable or len(op.outputs) != 1:
                continue
            p = pos[name]
            uses, ups = self.acc[t], self.upd[t]
            for a, u in zip(uses, uses[1:]):
                if u - a < 2:
                    continue
                if ups and ups[0] < u:
                    break  # made again, it would be the version before the update (and so at every later use)
                if op.workspace_bytes > adds[u]:
                    continue
                if not all(self._kept_for(x, p, u) for x in op.reads):
                    continue
                # Depth 1: the inputs' gaps strictly covering op u stay off while this one is taken. A gap ending at
                # u (a prefetch for op u) is fine: the recomputation waits for that prefetch.
                holds = tuple(k for x in op.reads for k in by_tensor.get(x, ()) if offload[k].a < u < offload[k].u)
                twin = next((k for k in by_tensor.get(t, ()) if (offload[k].a, offload[k].u) == (a, u)), None)
                gap = Gap(t, tensor.bytes, a, u, recompute=p, twin=twin, holds=holds)
                gap.score = float(gap.bytes) * float(self.start_of(u) - self.end_of(a))
                gap.stall = int(self.dur[p])  # paid on the compute stream, always
                out.append(gap)
        # Their holds name the inputs' recompute gaps too (those covering op u), and each twin points back.
        base = len(offload)
        redo_by_tensor: dict[str, list[int]] = {}
        for j, gap in enumerate(out):
            redo_by_tensor.setdefault(gap.tensor, []).append(j)
        for j, gap in enumerate(out):
            op = self.ops[gap.recompute]
            gap.holds += tuple(base + i for x in op.reads for i in redo_by_tensor.get(x, ())
                               if out[i].a < gap.u < out[i].u)
            if gap.twin is not None:
                offload[gap.twin].twin = base + j
        return out

    def _kept_for(self, x: str, p: int, u: int) -> bool:
        """Whether input ``x`` of the op at ``p`` can be read again before op ``u`` as the op first read it: on HBM
        during op u in the no-offload count, and not updated in place by an op between p and u."""
        span, ups = self.spans[x], self.upd[x]
        return span is not None and span[1] >= u and bisect.bisect_left(ups, u) == bisect.bisect_right(ups, p)

    @cached_property
    def table(self) -> GapTable:
        """The gaps' fixed fields as arrays (``GapTable``), built once per Context."""
        gaps = self.gaps
        m = len(gaps)

        n = self.n

        def col(values: list, dtype) -> np.ndarray:
            return np.array(values, dtype=dtype).reshape(m)  # list comprehensions: a million gaps on large graphs

        a, u = col([g.a for g in gaps], np.int64), col([g.u for g in gaps], np.int64)
        pre_absent = col([g.pre_absent for g in gaps], bool)
        names = sorted({g.tensor for g in gaps})
        code = {t: k for k, t in enumerate(names)}
        score = col([g.score for g in gaps], float)
        stall = [g.stall for g in gaps]
        # The longest gap first, as Belady's rule evicts the page used farthest ahead: a gap costs its bytes on the
        # links and frees bytes x gap time, so per byte moved the longest frees the most. Bytes x gap time first
        # took the large per-step weights' one-step gaps, which together fill the link (NSA decode).
        # Not above LONGEST_FIRST_MAX_OPS ops: there it doubled the Prefetches and lost time (see that constant).
        keys = [np.arange(m), a, col([code[g.tensor] for g in gaps], np.int64), -score]
        if self.n <= LONGEST_FIRST_MAX_OPS:
            keys.append(-np.rint(score / np.maximum(col([g.bytes for g in gaps], float), 1.0)))  # whole ns
        order = np.lexsort(tuple(keys))
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        return GapTable(
            a=a, u=u, nbytes=col([g.bytes for g in gaps], np.int64), lo=np.where(pre_absent, 0, a + 1),  # Gap.lo
            pre_absent=pre_absent,
            stores=col([not (g.droppable or g.recompute is not None) for g in gaps], bool),
            fetches=col([(g.u < n or g.back) and g.recompute is None for g in gaps], bool),  # Context.fetches
            redo=col([g.recompute is not None for g in gaps], bool),
            mandatory=col([g.mandatory for g in gaps], bool), wrap=col([g.wrap for g in gaps], bool),
            stall=stall, stall_array=np.array(stall, dtype=np.int64).reshape(m), rank=rank.tolist(),
            rank_array=rank, by_rank=order.tolist(),
        )

    def fetches(self, gap: Gap) -> bool:
        """Whether the gap ends with a Prefetch (before a use, or before the step ends); a recompute gap ends with
        its recomputation instead."""
        return (gap.u < self.n or gap.back) and gap.recompute is None

    def home_of(self, t: str) -> str:
        """The tier ``t`` starts on under the current selection (``hbm`` for tensors an op produces)."""
        tensor = self.graph.tensors[t]
        if t in self.graph.producer:
            return HBM
        if tensor.pinned:
            return tensor.home
        return self.wrapped.get(t) or self.unused_remote.get(t) or HBM

    def has_home_copy(self, gap: Gap) -> bool:
        """Whether the tensor's home copy on a remote tier is still valid at the start of the gap, as the selection
        scores it (a master copy, ``mastered``, is not counted: see there)."""
        if gap.tensor in self.graph.producer:
            return False
        if not gap.wrap and self.home_of(gap.tensor) == HBM:
            return False
        ups = self.upd[gap.tensor]
        return not ups or ups[0] > gap.a


# How the budget sweep of ``select_gaps`` picks among the gaps that cover an op over the budget.
EVICT_RULES = ("stall", "belady")

# Slots summed first when booking a transfer on the link calendar (then 4x more at a time).
TAKE_CHUNK = 64
# Graphs of more ops than this book transfers in a compiled loop (``greedy_kernel.take_slots``: the same booking).
COMPILED_MIN_OPS = 5000
# The distance rule's first block of candidates checked at once (``LinkCalendar.fit``; then 4x more at a time).
FIT_BLOCK = 256
# ``LinkCalendar``'s ``at`` for a gap taken for every op over the budget in its span, not for one op.
OVER_BUDGET = -1


class LinkCalendar:
    """How much transfer time each link has left in each op's time slot (the op's duration x channels).

    Selection books a gap's Store from the front of its window and its Prefetch from the back, and estimates a
    gap's stall as what does not fit: a coarse model of link contention, so that the distance rule and the budget
    do not pick more transfers than the links can hide. (The refinement then places the cache ops with a finer
    schedule.)

    A gap taken to relieve ops over the budget keeps the tensor off HBM while they run, so its window is cut
    there: its Store must end before them and its Prefetch start after them. Over the whole gap, an optimizer
    state offloaded from the step's start to its update had its Prefetch booked behind the forward and backward
    passes, when the HBM those passes fill holds it back to the optimizer's few short ops: on LLaMA-3-8B training
    at 20 GB/s greedy stalled 289 ms. The distance rule cuts at every op over the budget with nothing offloaded
    (``OVER_BUDGET``); the budget sweep at the op it is relieving.
    """

    def __init__(self, ctx: Context, budget: int | None = None) -> None:
        self.ctx = ctx
        self.free = {ln.name: ctx.dur * ln.channels for ln in ctx.hw.links}
        self.compiled = ctx.n > COMPILED_MIN_OPS
        # The ops over ``budget`` with nothing offloaded: a tensor that relieves them is off HBM while they run.
        self.over = np.flatnonzero(ctx.base > budget) if budget is not None else np.zeros(0, dtype=np.int64)
        # The same as a list, for binary searches one value at a time (numpy's cost more per call than they save).
        self.over_list = self.over.tolist()
        # ``links`` per gap index, where it cannot change during a selection (see ``links``).
        self.fixed_links: dict[int, tuple[str | None, int, str | None, int]] = {}

    def _windows(self, gap: Gap, at: int | None) -> tuple[int, int, int, int]:
        """Return (store lo, store hi, fetch lo, fetch hi): the op slots the gap's Store and Prefetch may use.

        ``at``: the op the gap relieves, or ``OVER_BUDGET`` for every op of its span over the budget with nothing
        offloaded; the Store ends before it and the Prefetch starts after it. None, or nothing to relieve in the
        span: the whole span."""
        lo, hi = gap.lo, min(gap.u, self.ctx.n)
        if at is None:
            return lo, hi, lo, hi
        if at != OVER_BUDGET:
            return (lo, at, at + 1, hi) if lo <= at < hi else (lo, hi, lo, hi)
        over = self.over_list
        k = bisect.bisect_left(over, lo)
        if k == len(over) or over[k] >= hi:
            return lo, hi, lo, hi
        return lo, over[k], over[bisect.bisect_left(over, hi) - 1] + 1, hi

    def links(self, gap: Gap) -> tuple[str | None, int, str | None, int]:
        """(store link, store ns, fetch link, fetch ns) the gap would use, on the fastest tier.

        Kept per gap (half a million calls per selection on the 29k-op graph) unless the tensor's starting tier is
        the planner's, which the selection itself decides (``Context.home_of``)."""
        got = self.fixed_links.get(gap.index)
        if got is not None:
            return got
        got = self._links(gap)
        if not self._placed(gap):
            self.fixed_links[gap.index] = got
        return got

    def _placed(self, gap: Gap) -> bool:
        """Whether the gap's tensor starts on a tier the selection decides (a free tensor): its links may change."""
        graph = self.ctx.graph
        return gap.tensor not in graph.producer and not graph.tensors[gap.tensor].pinned

    def _links(self, gap: Gap) -> tuple[str | None, int, str | None, int]:
        ctx = self.ctx
        if not ctx.tiers or gap.droppable or gap.recompute is not None:
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

    def stall(self, gap: Gap, at: int | None = None) -> int:
        store, ts, fetch, tf = self.links(gap)
        s_lo, s_hi, f_lo, f_hi = self._windows(gap, at)
        short = 0
        if store is not None:
            short += max(0, ts - int(self.free[store][s_lo:s_hi].sum()))
        if fetch is not None:
            short += max(0, tf - int(self.free[fetch][f_lo:f_hi].sum()))
        return max(gap.stall, short)

    def link_columns(self, ks: np.ndarray) -> tuple[np.ndarray, ...]:
        """``links`` of the gaps of the indices ``ks`` as columns, for ``fit``: (store link, store ns, fetch link,
        fetch ns, whether the gap has no stall of its own); a link by its position in ``free``, -1 for none.

        Every gap's columns are kept in the Context (the selections of every budget and setting share them), but
        those of the tensors whose starting tier the selection decides."""
        ctx = self.ctx
        if ctx.gap_links is None:
            m = len(ctx.gaps)
            ints = [np.full(m, -1, dtype=np.int64), np.zeros(m, dtype=np.int64)] * 2  # link, ns: store, fetch
            ctx.gap_links = (*(c.copy() for c in ints), *(np.zeros(m, dtype=bool) for _ in range(3)))
        *kept, placed, known = ctx.gap_links
        # Made on first use (a selection that finds its gaps early asks for few), and again each time for the
        # tensors whose starting tier the selection decides.
        todo = ks[~known[ks] | placed[ks]]
        if len(todo):
            for c, fresh in zip((*kept, placed), self._columns(todo)):
                c[todo] = fresh
            known[todo] = True
        return tuple(c[ks] for c in kept)

    def _columns(self, ks: np.ndarray) -> tuple[np.ndarray, ...]:
        """``link_columns`` of ``ks`` from ``links``, and whether each gap's tensor has a starting tier the selection
        decides (a free tensor: its columns may change)."""
        ctx = self.ctx
        gaps = ctx.gaps
        link_id = {name: k for k, name in enumerate(self.free)}
        m = len(ks)
        s_link = np.full(m, -1, dtype=np.int64)
        f_link = np.full(m, -1, dtype=np.int64)
        ts = np.zeros(m, dtype=np.int64)
        tf = np.zeros(m, dtype=np.int64)
        own = np.zeros(m, dtype=bool)
        placed = np.zeros(m, dtype=bool)
        for j, k in enumerate(ks.tolist()):
            gap = gaps[k]
            store, ts[j], fetch, tf[j] = self._links(gap)
            if store is not None:
                s_link[j] = link_id[store]
            if fetch is not None:
                f_link[j] = link_id[fetch]
            own[j] = gap.stall == 0
            placed[j] = self._placed(gap)
        return s_link, ts, f_link, tf, own, placed

    def fit(self, ks: np.ndarray, at: int | None, columns: tuple[np.ndarray, ...]) -> np.ndarray:
        """Whether each gap of the indices ``ks`` fits the links as they stand, ``stall(gap, at) == 0`` for each: a
        gap with no stall of its own whose Store and Prefetch fit in what their links have left in its windows.
        ``columns``: ``link_columns(ks)`` (the links a gap uses do not change while the distance rule runs: it
        places no tensor).

        The distance rule asked ``stall`` of every candidate in turn (two million calls per plan on the 29k-op graph,
        a third of greedy's time); it now asks this of a block of them, through one prefix sum per link, a few array
        passes per block. ``at`` is None or ``OVER_BUDGET``."""
        s_link, ts, f_link, tf, own = columns
        n = self.ctx.n
        prefix = np.zeros((len(self.free), n + 1), dtype=np.int64)
        for k, free in enumerate(self.free.values()):
            np.cumsum(free, out=prefix[k, 1:])
        tab = self.ctx.table
        lo = tab.lo[ks]
        hi = np.minimum(tab.u[ks], n)
        s_lo, s_hi, f_lo, f_hi = lo, hi, lo, hi
        if at is not None and len(self.over):
            if at != OVER_BUDGET:
                raise ValueError("fit: at is None or OVER_BUDGET")
            over = self.over
            k = np.searchsorted(over, lo)
            first = over[np.minimum(k, len(over) - 1)]
            cut = (k < len(over)) & (first < hi)
            last = over[np.maximum(np.searchsorted(over, hi) - 1, 0)] + 1
            s_hi = np.where(cut, first, hi)
            f_lo = np.where(cut, last, lo)

        def room(link: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
            row = np.maximum(link, 0)
            return prefix[row, np.maximum(a, b)] - prefix[row, a]

        return (own & ((s_link < 0) | (ts <= room(s_link, s_lo, s_hi)))
                & ((f_link < 0) | (tf <= room(f_link, f_lo, f_hi))))

    def book(self, gap: Gap, at: int | None = None) -> None:
        store, ts, fetch, tf = self.links(gap)
        s_lo, s_hi, f_lo, f_hi = self._windows(gap, at)
        if self.compiled:
            if store is not None:
                greedy_kernel.take_slots(self.free[store], s_lo, s_hi, ts, False)
            if fetch is not None:
                greedy_kernel.take_slots(self.free[fetch], f_lo, f_hi, tf, True)
            return
        if store is not None:
            self._take(self.free[store][s_lo:s_hi], ts)
        if fetch is not None:
            self._take(self.free[fetch][f_lo:f_hi][::-1], tf)

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


def cover_all(L: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray) -> None:
    """Tensors of ``nbytes`` leave HBM for ops lo .. hi-1 (each, where hi > lo): ``L`` is lowered in place, through
    one difference array (a slice update per gap cost a second on the 38.8k-op graph's 124k selected gaps)."""
    keep = hi > lo
    if not keep.any():
        return
    d = np.zeros(len(L) + 1, dtype=np.int64)
    np.add.at(d, lo[keep], -nbytes[keep])
    np.add.at(d, hi[keep], nbytes[keep])
    L += np.cumsum(d[:-1])


def start_on_remote(ctx: Context, budget: int, take: Callable[[Gap], list[Gap]]) -> list[Gap]:
    """Free tensors (home ``auto``) start remote, the last used first, while what starts on HBM is over ``budget``;
    return the gaps taken (both parts of each wrap-around gap). After the selection, which rarely leaves it over.

    The count is per op, and at time 0, before the first op, everything that starts on HBM is held: what is
    pinned there and still needed (no Store has ended yet to let it go) and the free tensors that start there. The
    count at op 0 does not see it, since there a pinned tensor may already be gone (found by ``HO_PLAN_FUZZ``: a
    2 B unread weight pinned to HBM and a 1 B free weight in a 2 B budget). ``take`` selects a wrap-around gap."""
    g = ctx.graph
    heads = [gap for gap in ctx.gaps if gap.wrap and gap.pre_absent and not gap.selected]
    held = initial_hbm_bytes(g) + sum(gap.bytes for gap in heads)
    taken: list[Gap] = []
    for gap in sorted(heads, key=lambda gap: (-gap.u, -gap.bytes, gap.tensor)):
        if held <= budget:
            break
        parts = take(gap)
        if parts:
            held -= gap.bytes
            taken += parts
    return taken


def select_gaps(
    ctx: Context, budget: int, select_distance: int, select_num: int, prefetch_distance: int, release_distance: int,
    answers: Answers | None = None, cut_windows: bool = True, evict: str = EVICT_RULES[0],
) -> tuple[list[Gap], np.ndarray, int | None]:
    """Choose the gaps to offload or recompute; return (selected gaps, HBM count per op with each at its widest,
    first op still over ``budget`` or None).

    1. mandatory gaps (tensors that start remote; unused tensors that can simply be dropped);
    2. the distance rule: gaps at least ``select_distance`` ops long whose store and fetch fit in the gap's
       compute time and in what the links have left (``LinkCalendar``), outside the ops over the budget the gap
       spans, the ``select_num`` longest (farthest next use, as Belady's rule), then largest bytes x gap time;
    3. the budget: sweeping the ops in order, while an op is over budget, the gap covering it whose transfers
       the cost model says stall least (none, when store and fetch fit in the gap's compute time and in the
       links' remaining time), then the longest, then the largest bytes x gap time, counted with its nominal
       placement (detach ``release_distance`` ops after the use, prefetch ``prefetch_distance`` ops before the
       next). With ``evict="belady"`` instead: a gap the cost model says is free first, then the one whose next
       use lies farthest ahead (Belady's rule), whatever the stall estimates of the others;
    4. if an op is still over, every gap counted at its widest (detach right after the use, prefetch right
       before the next), and more gaps by the same rule.

    Recompute gaps (see the module doc) take part in steps 3 and 4 only, with their producer's duration as their
    stall: recomputing always costs compute time, so it is a budget decision, never one the distance rule makes.
    ``answers`` (at most ``ctx.answers``; default those) narrows the candidates: with ``recompute=False`` the
    selection is exactly the one a context without recompute gaps makes (they come last and are never taken).
    ``cut_windows=False`` books every transfer over its whole gap (``LinkCalendar``), as before the cut.

    Why two eviction rules (``EVICT_RULES``): the least estimated stall first takes small tensors first, since
    their transfers fit in what the links have left; where the same small tensors are read at every step, it
    sends them out and back at every step (NSA-64k's decode at 60% of its peak: the shared experts' and
    attention's weights, 10 to 13 times each over 16 steps, beside the routed experts). Belady's rule keeps what
    is read soon. Neither wins everywhere (greedy-sweep plans its best points with both).
    """
    if evict not in EVICT_RULES:
        raise ValueError(f"unknown eviction rule {evict!r} (known: {', '.join(EVICT_RULES)})")
    answers = answers if answers is not None else ctx.answers
    for gap in ctx.gaps:
        gap.selected = gap.mandatory
    # ``Gap.selected`` as an array, kept beside it (reading a million gaps' flags cost 0.1 s each time).
    chosen = ctx.table.mandatory.copy()
    ctx.wrapped = {}
    pd, rd = max(0, prefetch_distance), max(1, release_distance)

    def nominal(gap: Gap) -> tuple[int, int]:
        # Nothing to store: a dropped or recomputed tensor leaves right after its use.
        stores = not (gap.droppable or gap.recompute is not None)
        lo = 0 if gap.pre_absent else (max(gap.lo, gap.a + rd) if stores else gap.lo)
        hi = max(lo, gap.u - pd) if ctx.fetches(gap) else gap.u
        return lo, hi

    # Room on each remote tier for tensors placed there by a wrap-around gap (pinned homes hold theirs).
    room = {t: ctx.hw.tier(t).capacity_bytes for t in ctx.tiers}
    for name, tensor in ctx.graph.tensors.items():
        home = ctx.home_of(name) if name not in ctx.graph.producer else HBM
        if home in room:
            room[home] -= tensor.bytes

    cal = LinkCalendar(ctx, budget)
    rule = OVER_BUDGET if cut_windows else None
    belady = evict == "belady"
    m = max(1, len(ctx.gaps))

    def parts(gap: Gap) -> list[Gap]:
        return [gap] if gap.partner is None else [gap, ctx.gaps[gap.partner]]

    blocked: set[int] = set()  # gaps a selected recompute gap holds on HBM (its producer's inputs)

    def take(gap: Gap, at: int | None = None) -> list[Gap]:
        """Select ``gap`` (with its other part, placing the tensor, for a wrap-around gap; its transfers booked
        around ``at``, see ``LinkCalendar``); return what was
        selected (nothing when no remote tier has room for the tensor, when the other answer for the same stretch
        is taken, or when a recompute gap and the inputs it reads exclude each other)."""
        if any(p.index in blocked or (p.twin is not None and ctx.gaps[p.twin].selected) for p in parts(gap)):
            return []
        if any(ctx.gaps[k].selected for k in gap.holds):
            return []
        if gap.wrap:
            tier = next((t for t in ctx.tiers if room[t] >= gap.bytes), None)
            if tier is None:
                return []
            room[tier] -= gap.bytes
            ctx.wrapped[gap.tensor] = tier
        taken = parts(gap)
        for p in taken:
            p.selected = True
            chosen[p.index] = True
            cal.book(p, at)
        blocked.update(gap.holds)
        return taken

    for gap in ctx.gaps:
        if gap.selected:
            cal.book(gap)
    if select_num > 0 and ctx.tiers:
        # Where a tensor starts is a budget decision (step 3), not one the distance rule makes for its own sake:
        # its first fetch has only the ops before the first use to hide behind.
        tab = ctx.table
        ok = (~chosen & (tab.stall_array == 0) & (tab.u - tab.a >= max(2, select_distance)) & ~tab.wrap
              & ~tab.redo & answers.offload)
        pool = np.array(sorted(np.flatnonzero(ok).tolist(), key=tab.rank.__getitem__), dtype=np.int64)
        # In rank order, each gap that fits the links as they stand then, up to ``select_num``. Booking only takes
        # link time away, so the gaps between two takes all see the links as the first take left them: they are
        # checked together, a block at a time (growing while none is taken: where the first candidates fit, as on
        # the 38.8k-op graph with weights on host, the rest are never looked at), and again after each take.
        taken, p, block = 0, 0, FIT_BLOCK
        while taken < select_num and p < len(pool):
            part = pool[p:p + block]
            for h in np.flatnonzero(cal.fit(part, rule, cal.link_columns(part))).tolist():
                if take(ctx.gaps[int(part[h])], rule):
                    taken += 1
                    p += h + 1
                    break
            else:
                p += len(part)
                block *= 4

    def sweep(L: np.ndarray, rng, ranges: tuple[np.ndarray, np.ndarray]) -> int | None:
        # Candidates by (lo, hi, index); in the heap by (stall, rank): the estimated stall, then (-gap time,
        # -score, tensor, a, index). A heap entry is the int stall * m + rank (ranks are distinct and below m, so
        # ints order as those pairs do): a million entries on the 38.8k-op graph, where tuples cost twice the time
        # to compare.
        tab = ctx.table
        lo, hi = ranges
        ks = np.flatnonzero(~chosen & tab.allowed(answers) & (hi > lo))
        ks = ks[np.lexsort((hi[ks], lo[ks]))]
        stall = tab.stall_array[ks]
        rank_array, by_rank = tab.farthest if belady else (tab.rank_array, tab.by_rank)
        if belady:
            stall = (stall > 0).astype(np.int64)
        # Python ints where stall * m could overflow int64.
        stall = stall.astype(object) if len(ks) and int(stall.max()) >= (1 << 62) // m else stall
        c_lo, c_key = lo[ks].tolist(), (stall * m + rank_array[ks]).tolist()
        hi_of = hi.tolist()
        heap: list[int] = []
        j = 0
        first_over = None
        # L as it stands at op i is count[i] + run: a take covers the ops ahead through ``ahead`` (a difference
        # list) and reaches L itself once, at the end; a slice update per take was a tenth of the sweep.
        n = ctx.n
        count = L.tolist()
        ahead = [0] * (n + 1)
        run = 0
        covers: list[tuple[int, int, int]] = []
        for i in range(n):
            run += ahead[i]
            if count[i] + run <= budget:
                continue
            if j < len(c_lo) and c_lo[j] <= i:
                start = j
                while j < len(c_lo) and c_lo[j] <= i:
                    j += 1
                if j - start > len(heap):
                    heap.extend(c_key[start:j])
                    heapq.heapify(heap)
                else:
                    for key in c_key[start:j]:
                        heapq.heappush(heap, key)
            while count[i] + run > budget and heap:
                st, rk = divmod(heapq.heappop(heap), m)
                k = by_rank[rk]
                gap = ctx.gaps[k]
                if hi_of[k] <= i or gap.selected:
                    continue
                now = cal.stall(gap, i if cut_windows else None)
                if belady:
                    now = int(now > 0)
                if now > st and heap:
                    if now * m + rk > heap[0]:
                        heapq.heappush(heap, now * m + rk)  # the links got busier: look again later
                        continue
                for p in take(gap, i if cut_windows else None):
                    p_lo, p_hi = rng(p)
                    if p_hi > p_lo:
                        covers.append((p_lo, p_hi, p.bytes))
                        if p_hi > i:
                            if p_lo <= i:
                                run -= p.bytes
                            else:
                                ahead[p_lo] -= p.bytes
                            ahead[p_hi] += p.bytes
            if count[i] + run > budget and first_over is None:
                first_over = i
        if covers:
            c = np.array(covers, dtype=np.int64)
            cover_all(L, c[:, 0], c[:, 1], c[:, 2])
        return first_over

    tab = ctx.table
    nominal_ranges = tab.nominal(pd, rd)
    L = ctx.base.copy()
    sel = chosen.copy()
    cover_all(L, nominal_ranges[0][sel], nominal_ranges[1][sel], tab.nbytes[sel])
    over = sweep(L, nominal, nominal_ranges)
    widest = lambda gap: (gap.lo, gap.hi)  # noqa: E731
    L = ctx.base.copy()
    sel = chosen.copy()
    cover_all(L, tab.lo[sel], tab.u[sel], tab.nbytes[sel])
    if over is not None:
        over = sweep(L, widest, (ctx.table.lo, ctx.table.u))
    if answers.offload:
        late = start_on_remote(ctx, budget, take)
        cover_all(L, np.array([p.lo for p in late], dtype=np.int64), np.array([p.u for p in late], dtype=np.int64),
                  np.array([p.bytes for p in late], dtype=np.int64))
    return [gap for gap in ctx.gaps if gap.selected], L, over


__all__ = ["EVICT_RULES", "Answers", "Context", "Gap", "GapTable", "cover_all", "select_gaps"]
