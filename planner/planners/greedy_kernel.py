"""Greedy's inner loops compiled, for large graphs: each does what a Python loop of greedy does, on arrays.

* ``place_gaps``: the refinement (``planner/planners/refine.py``'s ``place``). On the 38.8k-op inference graph
  greedy places 155k gaps three times per plan (placing gives gaps up, and the copies are resolved again), and
  the Python loop, each gap scanning the HBM count over its span, took 1.5-2 s a time.
* ``take_slots``: booking a transfer on the link calendar (``greedy_select.LinkCalendar``), 170k times per
  selection there, each a few numpy calls in Python.

Small graphs keep the Python loops: numba's first compile (a few seconds, once per install, then cached beside
the module) would cost more than it saves.

Each compiled module is self-contained (its own binary searches): numba's cache notices changes to a function's own
file only, so a compiled helper shared with another module could leave that module's cached code stale.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _bisect_left(a, x):  # pragma: no cover - compiled
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _bisect_right(a, x):  # pragma: no cover - compiled
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True)
def place_gaps(order, a, u, lo, nbytes, needs_store, fetches, pre_absent, keepable, redo, store_end, latest,
               has_latest, starts, L, budget, prefetch_distance, release_distance):  # pragma: no cover - compiled
    """Place the gaps in ``order`` as ``refine.place`` does; ``L`` is updated in place. Returns (r, q, kept): the
    ops r .. q-1 each gap is off HBM, and whether it was given up (kept on HBM).

    Per gap (by index): its uses ``a`` and ``u``, ``lo`` (``Gap.lo``), bytes, whether it stores, whether it
    fetches, ``pre_absent``, ``keepable`` (not mandatory, not pre-absent, not wrap-around: may stay on HBM),
    ``redo`` (a recompute gap), its estimated Store end, its Prefetch's latest start (where ``has_latest``).
    ``starts``: each op's start with no stall, and the compute total last (``Context.S``)."""
    n = len(starts) - 1
    S = starts[:n]
    m = len(a)
    r_out = np.zeros(m, dtype=np.int64)
    q_out = np.zeros(m, dtype=np.int64)
    kept = np.zeros(m, dtype=np.bool_)
    pd = max(0, prefetch_distance)
    rd = max(1, release_distance)
    for k in order:
        b = nbytes[k]
        g_lo, g_u = lo[k], u[k]
        limit = budget - b
        # Detach: as early as the Store allows without stalling, not before release_distance ops after the use.
        r = g_lo
        if needs_store[k]:
            want = max(a[k] + rd, _bisect_left(S, store_end[k]))
            cap = g_u - 1 if g_u < n else n - 1
            hidden = want <= cap
            want = min(want, cap)
            if want > g_lo:
                r = want
                for i in range(g_lo, want):
                    if L[i] > limit:
                        r = i
                        break
        else:
            hidden = not redo[k]
        # Prefetch: as late as its link allows it to end in time, at least prefetch_distance ops before the use.
        q = g_u
        if fetches[k]:
            first = 0 if pre_absent[k] else r + 1
            ls = latest[k]
            known = has_latest[k]
            q_hide = _bisect_right(S, ls) - 1 if known and ls >= 0 else 0
            want = max(first, min(g_u - pd, q_hide))
            hidden = hidden and known and ls >= starts[min(first, n)]
            if want < g_u:
                q = want
                for i in range(g_u - 1, want - 1, -1):
                    if L[i] > limit:
                        q = i + 1
                        break
        if not hidden and keepable[k]:
            # Cannot hide both transfers: keep the tensor on HBM if the budget allows.
            most = 0
            for i in range(r, q):
                most = max(most, L[i])
            if most + b <= budget:
                for i in range(g_lo, g_u):
                    L[i] += b
                kept[k] = True
                continue
        for i in range(g_lo, r):
            L[i] += b
        for i in range(q, g_u):
            L[i] += b
        r_out[k] = r
        q_out[k] = q
    return r_out, q_out, kept


@njit(cache=True)
def take_slots(free, lo, hi, need, backward):  # pragma: no cover - compiled
    """Use ``need`` ns of the slots ``free[lo:hi]``, first slots first (the last first when ``backward``), as
    ``LinkCalendar._take`` does."""
    if need <= 0:
        return
    for k in range(hi - lo):
        i = hi - 1 - k if backward else lo + k
        f = free[i]
        if f >= need:
            free[i] = f - need
            return
        need -= f
        free[i] = 0
