"""The greedy planner's execution-order refinement: where each selected gap's Store, Detach and Prefetch go.

Every gap starts at its widest (Detach right after the use before it, Prefetch right before the use after it:
the least HBM, the most stall). Then, in the order of the gaps, each cache op is moved over its feasible
positions to where the cost model says the stall is lowest, and among those to the one that holds the least
memory, without letting the HBM count of any op exceed the budget:

* a Store starts when the use before the gap ends and its link is free (links are modelled as FIFO queues of
  their channels, stores as soon as possible in order of their gaps); the Detach waits for it on the compute
  stream, so the Detach goes to the first op that starts after the Store is estimated to end, and at least
  ``release_distance`` ops after the use;
* Prefetches are scheduled as late as possible on their link, backwards from their deadlines (the start of the
  op that needs the tensor), so that each one ends in time if the links allow; the Prefetch goes to the last op
  that starts before that latest start, and at least ``prefetch_distance`` ops before the use;
* a position that would put an op over the budget is not taken: the cache op stops at the last position that
  fits, and the plan stalls there instead;
* a gap whose Store and Prefetch cannot both be hidden and that the budget does not need is given up (the
  tensor stays on HBM); so is a recompute gap the budget does not need (a recomputation is never hidden). A
  recompute gap has nothing to store or fetch: its Detach stays right after the use, its recomputation right
  before the next.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection

import numpy as np

from planner.hardware import HBM
from planner.planners import greedy_kernel
from planner.planners.greedy_select import Context, Gap


def resolve_copies(ctx: Context, gaps: list[Gap], tensors: Collection[str] | None = None) -> list[str]:
    """Decide, per gap, whether it needs a Store, and which tier stores and fetches it.

    A remote copy is valid until the next in-place update: the home copy of a tensor that starts on a remote
    tier, or the copy an earlier gap stored. A gap stores only when no valid copy exists and the tensor is still
    needed. The Store goes to the fastest remote tier with room (room is counted without frees, so it is never
    overcommitted). Returns notes on gaps given up because no remote tier had room (they are unselected).

    ``tensors``: decide for the gaps of these tensors only; the others keep what an earlier call on a superset of
    ``gaps`` decided. The same decisions as a call on all of them only when ``room_never_binds(ctx, gaps)``: then
    a tensor's copies depend on its own gaps alone.
    """
    notes: list[str] = []
    g, hw = ctx.graph, ctx.hw
    used = _home_bytes(ctx)
    holds: dict[str, set[str]] = {}
    by_tensor: dict[str, list[Gap]] = {}
    for gap in gaps:
        if tensors is None or gap.tensor in tensors:
            by_tensor.setdefault(gap.tensor, []).append(gap)
    for t, tgaps in by_tensor.items():
        tensor = g.tensors[t]
        home = ctx.home_of(t)
        tgaps.sort(key=lambda x: x.a)
        # On HBM, a tensor nothing writes that the graph leaves to the planner keeps its master copy on the fastest
        # tier (planner/placement.py).
        valid: set[str] = {home} if home != HBM else {ctx.tiers[0]} if t in ctx.mastered else set()
        cursor = -1
        updates = ctx.upd[t]
        for gap in tgaps:
            i = bisect.bisect_right(updates, cursor)
            if i < len(updates) and updates[i] <= gap.a:
                valid = set()
            cursor = max(cursor, gap.a)
            gap.needs_store = False
            gap.store_tier = None
            if gap.recompute is not None:
                # Made again, not moved: no copy is made or read (an earlier stored copy stays valid: no update
                # came in between, or the gap would not be a candidate).
                gap.fetch_tier = None
                continue
            if gap.u >= ctx.n and home != HBM and tensor.persistent and t not in g.producer:
                # The step ends with the tensor back on its own tier (its room there is held).
                if home not in valid:
                    gap.needs_store, gap.store_tier = True, home
                    valid = {home}
            elif not gap.pre_absent and not gap.droppable and not valid:
                tier = next(
                    (x for x in ctx.tiers
                     if x in holds.get(t, set()) or used[x] + gap.bytes <= hw.tier(x).capacity_bytes),
                    None,
                )
                if tier is None:
                    gap.selected = False
                    notes.append(f"tensor {t!r} stays on HBM for ops {gap.a + 1}..{gap.u - 1}: no remote tier has "
                                 f"room for its {gap.bytes} B")
                    continue
                if tier not in holds.setdefault(t, set()):
                    holds[t].add(tier)
                    used[tier] += gap.bytes
                gap.needs_store, gap.store_tier = True, tier
                valid = {tier}
            gap.fetch_tier = min(valid, key=ctx.tiers.index) if (valid and ctx.fetches(gap)) else None
    return notes


def room_never_binds(ctx: Context, gaps: list[Gap]) -> bool:
    """Whether the fastest remote tier has room for what starts there and one copy of every tensor of ``gaps``.

    Then every Store ``resolve_copies`` decides goes to that tier whatever the other tensors hold, so each tensor's
    copies depend on its own gaps only, and after gaps are given up only their tensors need deciding again (the
    38.8k-op graph's replans give gaps up twice, at 1.5 s a full decision)."""
    if not ctx.tiers:
        return True
    fastest = ctx.tiers[0]
    copies = sum(ctx.graph.tensors[t].bytes for t in {gap.tensor for gap in gaps})
    return _home_bytes(ctx)[fastest] + copies <= ctx.hw.tier(fastest).capacity_bytes


def _home_bytes(ctx: Context) -> dict[str, int]:
    """Remote tier -> the bytes of the tensors that start the step there (master copies included)."""
    used = {t: 0 for t in ctx.tiers}
    producer = ctx.graph.producer
    for t, tensor in ctx.graph.tensors.items():
        if t in producer:
            continue  # made on HBM: 164k of the 165k tensors of the 38.8k-op graph, asked 4 times a plan
        home = ctx.home_of(t)
        if home in used:
            used[home] += tensor.bytes
        elif t in ctx.mastered:
            used[ctx.tiers[0]] += tensor.bytes
    return used


def store_issued_after(ctx: Context, gap: Gap) -> int:
    """The op after which the gap's Store is issued: the use before the gap; with ``ctx.early_weight_stores``, -1
    (the step's start) for an inference weight (a weight that nothing in the step writes), whose bytes are final
    before any op runs, so that its Store runs while the link is idle and its Detach need not wait for it.

    Why a switch: on NSA-64k at 60% the embedding table (1.85 GB, placed on HBM) was stored only after the chunks'
    first reads, while the first attention waited for its room (greedy 557.24 -> 532.74 ms with the Stores at the
    start); on NSA-128k at 60% the chunks' inputs then wait behind the table on the store link instead (1060.46 ->
    1079.66 ms). ``greedy.with_early_weight_stores`` plans both and keeps the faster. Only weights: the same rule
    for the inputs moved transformer_block's ``x`` ahead of the Stores that free room at 1 GB (114.73 -> 116.55 ms),
    and queueing every Store at its write cost LLaMA-3-8B training 9% (its weights' Stores crowded out the
    activations')."""
    if ctx.early_weight_stores and gap.a >= 0 and gap.tensor in ctx.inference_weights:
        return -1
    return gap.a


def _store_ends(ctx: Context, gaps: list[Gap]) -> dict[int, int]:
    """Estimated end of each gap's Store: as soon as possible, FIFO per link, in the order they are issued (by
    ``store_issued_after``, then the use before the gap, then the use after it, then index)."""
    S = ctx.S.tolist()  # S[a + 1]: the end of op a (``Context.end_of``), in one list lookup per gap
    free = {ln.name: [0] * ln.channels for ln in ctx.hw.links}
    store_link, transfer_ns = ctx.store_link, ctx.transfer_ns
    out: dict[int, int] = {}
    # Over a hundred thousand Stores on the 38.8k-op graph, placed up to three times a plan: tuples sorted as they
    # are, and one-channel links (the common case) without the search for the freest channel.
    early = ctx.early_weight_stores  # the rule's call only where it can move a Store
    queue = sorted([(store_issued_after(ctx, gp) if early else gp.a, gp.a, gp.u, k)
                    for k, gp in enumerate(gaps) if gp.needs_store])
    for a, _a, _u, k in queue:
        gap = gaps[k]
        link = store_link[gap.store_tier]
        ch = free[link]
        ready = S[a + 1] if a >= 0 else 0
        c = 0 if len(ch) == 1 else min(range(len(ch)), key=ch.__getitem__)
        end = (ready if ready > ch[c] else ch[c]) + transfer_ns(gap.bytes, link)
        ch[c] = out[k] = end
    return out


def _fetch_latest_starts(ctx: Context, gaps: list[Gap]) -> dict[int, int]:
    """Latest start of each gap's Prefetch that still ends by its deadline, scheduled backwards per link (from the
    latest deadline; ties by tensor name, then index)."""
    S = ctx.S.tolist()  # S[min(u, n)]: the start of op u (``Context.start_of``)
    n = ctx.n
    never = int(np.iinfo(np.int64).max)
    nxt = {ln.name: [never] * ln.channels for ln in ctx.hw.links}
    fetch_link, transfer_ns, fetches = ctx.fetch_link, ctx.transfer_ns, ctx.fetches
    out: dict[int, int] = {}
    for _u, _t, k in sorted([(-gp.u, gp.tensor, k) for k, gp in enumerate(gaps) if fetches(gp) and gp.fetch_tier]):
        gap = gaps[k]
        link = fetch_link[gap.fetch_tier]
        ch = nxt[link]
        c = 0 if len(ch) == 1 else max(range(len(ch)), key=ch.__getitem__)
        deadline = S[gap.u if gap.u < n else n]
        start = (deadline if deadline < ch[c] else ch[c]) - transfer_ns(gap.bytes, link)
        ch[c] = out[k] = start
    return out


def place(ctx: Context, gaps: list[Gap], L: np.ndarray, budget: int, prefetch_distance: int,
          release_distance: int) -> None:
    """Set every selected gap's ``r`` and ``q`` (see the module doc); ``L`` is updated in place.

    On entry every gap in ``gaps`` is counted in ``L`` at its widest.
    """
    pd, rd = max(0, prefetch_distance), max(1, release_distance)
    store_end = _store_ends(ctx, gaps)
    latest = _fetch_latest_starts(ctx, gaps)
    order = [k for _a, _u, _t, k in sorted([(gp.a, gp.u, gp.tensor, k) for k, gp in enumerate(gaps)])]
    if len(gaps) > COMPILED_MIN:
        _place_compiled(ctx, gaps, L, budget, prefetch_distance, release_distance, order, store_end, latest)
        return
    S = ctx.S_list
    n = ctx.n
    for k in order:
        gap = gaps[k]
        b = gap.bytes
        lo, u = gap.lo, gap.u
        # Detach: as early as the Store allows without stalling, not before release_distance ops after the use.
        r = lo
        if gap.needs_store:
            want = max(gap.a + rd, bisect.bisect_left(S, store_end[k]))
            cap = u - 1 if u < n else n - 1
            hidden = want <= cap
            want = min(want, cap)
            if want > lo:
                r = lo + _first_over(L[lo:want], budget - b, want - lo)
        else:
            # A recomputation is never hidden: it always costs its producer's time on the compute stream.
            hidden = gap.recompute is None
        # Prefetch: as late as its link allows it to end in time, at least prefetch_distance ops before the use.
        q = u
        if ctx.fetches(gap):
            first = 0 if gap.pre_absent else r + 1
            ls = latest.get(k)
            q_hide = bisect.bisect_right(S, ls) - 1 if ls is not None and ls >= 0 else 0
            want = max(first, min(u - pd, q_hide))
            hidden = hidden and ls is not None and ls >= ctx.start_of(first)
            if want < u:
                q = want + _last_over(L[want:u], budget - b)
        if not hidden and not gap.mandatory and not gap.pre_absent and not gap.wrap:
            # Cannot hide both transfers: keep the tensor on HBM if the budget allows.
            if int(L[r:q].max(initial=0)) + b <= budget:
                L[lo:u] += b
                gap.selected = False
                continue
        if r > lo:
            L[lo:r] += b
        if q < u:
            L[q:u] += b
        gap.r, gap.q = r, q


# Plans of more gaps than this place them with the compiled loop (``greedy_kernel``: the same placement).
COMPILED_MIN = 20_000


def _place_compiled(ctx: Context, gaps: list[Gap], L: np.ndarray, budget: int, prefetch_distance: int,
                    release_distance: int, order: list[int], store_end: dict[int, int], latest: dict[int, int]
                    ) -> None:
    """``place``'s loop in ``greedy_kernel.place_gaps``, on the gaps' fields as arrays."""
    m = len(gaps)

    def col(values: list, dtype) -> np.ndarray:
        return np.array(values, dtype=dtype).reshape(m)

    table = ctx.table
    index = col([g.index for g in gaps], np.int64)
    r, q, kept = greedy_kernel.place_gaps(
        np.array(order, dtype=np.int64), table.a[index], table.u[index], table.lo[index], table.nbytes[index],
        col([g.needs_store for g in gaps], bool), table.fetches[index], table.pre_absent[index],
        ~(table.mandatory[index] | table.pre_absent[index] | table.wrap[index]), table.redo[index],
        col([store_end.get(k, 0) for k in range(m)], np.int64), col([latest.get(k, 0) for k in range(m)], np.int64),
        col([k in latest for k in range(m)], bool), ctx.S, L, budget, prefetch_distance, release_distance)
    for gap, gr, gq, gk in zip(gaps, r.tolist(), q.tolist(), kept.tolist()):
        if gk:
            gap.selected = False
        else:
            gap.r, gap.q = gr, gq


def _first_over(counts: np.ndarray, limit: int, none: int) -> int:
    """Index of the first count above ``limit``, or ``none`` (argmax on the mask: no index array is built)."""
    over = counts > limit
    i = int(over.argmax())
    return i if over[i] else none


def _last_over(counts: np.ndarray, limit: int) -> int:
    """One past the index of the last count above ``limit``, or 0."""
    over = counts[::-1] > limit
    i = int(over.argmax())
    return len(counts) - i if over[i] else 0


__all__ = ["place", "resolve_copies", "room_never_binds"]
