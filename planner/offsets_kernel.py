"""The compiled core of the static offsets: place allocations one at a time, each into a gap among the blocks
placed before it that are live at the same time.

``place(size, start, end, sequence, lowest)`` is ``planner/offsets.py``'s placement loop compiled with numba: on
the 38.8k-op inference graph's timelines (173k allocations, 93.5k queries over about 310 address intervals each)
the same loop in Python took 9 s, most of it per-item overhead in the segment tree's unions and queries.

The structure is the one ``offsets.py`` documents: a segment tree over the elementary time intervals, each node
keeping two unions of address ranges as one sorted flat run ``[s0, e0, s1, e1, ...]`` (disjoint, touching ranges
merged): ``cover`` for the blocks whose time range the node is part of, ``sub`` for those and the blocks of its
descendants. The blocks live at some time in a query's range are then those in ``sub`` of the nodes that make up
the range and those in ``cover`` of their ancestors.

All unions live in one int64 arena, with a table of each union's first slot, capacity and length (``_BASE``,
``_CAP``, ``_LEN``); a union that outgrows its capacity moves to the arena's end with twice the room, so merges
rarely allocate. numba compiles the module in about 12 s on its first call (then cached beside it), which is why
``offsets.py`` keeps its Python loop for small timelines. The module keeps its own binary search: numba's cache
notices changes to a function's own file only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Index of each column of the unions' table: first slot in the arena, capacity, length (ints used).
_BASE, _CAP, _LEN = 0, 1, 2


@njit(cache=True)
def _bisect(arena, lo, hi, x, right):  # pragma: no cover - compiled
    """The first slot in [lo, hi) of the sorted ``arena`` holding a value > x (``right``) or >= x, else hi.
    (np.searchsorted does the same but took 3 s of numba's compile time.)"""
    while lo < hi:
        mid = (lo + hi) >> 1
        if arena[mid] < x or (right and arena[mid] == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _merge_into(arena, table, used, u, a, b):  # pragma: no cover - compiled
    """Add the address range [a, b) to union ``u``. Returns (arena, used): the arena grows (doubles) when a
    union moves to its end and does not fit."""
    base, cap, n = table[u, _BASE], table[u, _CAP], table[u, _LEN]
    i = _bisect(arena, base, base + n, a, False) - base  # odd: a is inside a range or at its end: merge from its start
    j = _bisect(arena, base + i, base + n, b, True) - base  # odd: b is inside a range or at its start: merge to its end
    if i & 1:
        i -= 1
        a = arena[base + i]
    if j & 1:
        b = arena[base + j]
        j += 1
    grow = 2 - (j - i)
    if n + grow > cap:
        room = max(4, 2 * cap)
        if used + room > len(arena):
            bigger = np.empty(max(2 * len(arena), used + room), dtype=np.int64)
            bigger[:used] = arena[:used]
            arena = bigger
        new = used
        used += room
        arena[new:new + i] = arena[base:base + i]
        arena[new + i + 2:new + n + grow] = arena[base + j:base + n]
        table[u, _BASE], table[u, _CAP] = new, room
        base = new
    elif grow < 0:
        arena[base + i + 2:base + n + grow] = arena[base + j:base + n]  # left shift: numpy copies forward safely
    elif grow > 0:
        arena[base + i + 2:base + n + grow] = arena[base + j:base + n].copy()  # right shift: overlapping
    arena[base + i] = a
    arena[base + i + 1] = b
    table[u, _LEN] = n + grow
    return arena, used


@njit(cache=True)
def _nodes(lo, hi, leaves):  # pragma: no cover - compiled
    """(the nodes that make up the leaf range [lo, hi), their proper ancestors), each as an int64 array."""
    lo += leaves
    hi += leaves
    nodes = np.empty(128, dtype=np.int64)
    count = 0
    while lo < hi:
        if lo & 1:
            nodes[count] = lo
            count += 1
            lo += 1
        if hi & 1:
            hi -= 1
            nodes[count] = hi
            count += 1
        lo >>= 1
        hi >>= 1
    ancestors = np.empty(256, dtype=np.int64)
    up = 0
    for k in range(count):
        v = nodes[k] >> 1
        while v:
            # Two root paths at most, a few dozen nodes: a scan is cheaper than a set.
            known = False
            for q in range(count):
                known = known or nodes[q] == v
            for q in range(up):
                known = known or ancestors[q] == v
            if known:
                break
            ancestors[up] = v
            up += 1
            v >>= 1
    return nodes[:count], ancestors[:up]


@njit(cache=True)
def _gaps(arena, table, sub, nodes, ancestors):  # pragma: no cover - compiled
    """(gap starts, gap lengths, top) of the union of the placed blocks in ``sub`` of ``nodes`` and ``cover`` of
    ``ancestors`` (union ``v`` is node v's cover, ``sub + v`` its sub): gap k lies between the reach of the ranges
    below the k-th (by start) and its start (gap 0 starts at address 0); top is the highest end."""
    total = 0
    for v in nodes:
        total += table[sub + v, _LEN]
    for v in ancestors:
        total += table[v, _LEN]
    flat = np.empty(total, dtype=np.int64)
    at = 0
    for v in nodes:
        base, n = table[sub + v, _BASE], table[sub + v, _LEN]
        flat[at:at + n] = arena[base:base + n]
        at += n
    for v in ancestors:
        base, n = table[v, _BASE], table[v, _LEN]
        flat[at:at + n] = arena[base:base + n]
        at += n
    starts = flat[0::2]
    ends = flat[1::2]
    order = np.argsort(starts)
    n = len(order)
    gap_start = np.empty(n, dtype=np.int64)
    gap_len = np.empty(n, dtype=np.int64)
    reach = 0
    for k in range(n):
        gap_start[k] = reach
        gap_len[k] = starts[order[k]] - reach
        reach = max(reach, ends[order[k]])
    return gap_start, gap_len, reach


@njit(cache=True)
def _fit_run(gap_start, gap_len, top, size, count, lowest):  # pragma: no cover - compiled
    """The addresses of ``count`` blocks of ``size`` placed one after another into the gaps (each block counting
    those placed before it): the lowest gap that fits (``lowest``) or the smallest (the lowest on a tie), else on
    the top. A block placed in a gap leaves the rest of it, ``size`` higher, as a gap."""
    out = np.empty(count, dtype=np.int64)
    placed = 0
    if lowest:
        # Each gap in address order takes as many blocks as fit in it.
        for k in range(len(gap_start)):
            s, length = gap_start[k], gap_len[k]
            while length >= size and placed < count:
                out[placed] = s
                placed += 1
                s += size
                length -= size
            if placed == count:
                break
    else:
        # The smallest gap each time; a gap shrinks by ``size`` when a block takes it, so each block rescans the
        # gaps that still fit (best fit runs are on small timelines: ``tries_for``).
        left = gap_len.copy()
        at = gap_start.copy()
        while placed < count:
            best = -1
            for k in range(len(left)):
                if left[k] < size:
                    continue
                if best < 0 or left[k] < left[best] or (left[k] == left[best] and at[k] < at[best]):
                    best = k
            if best < 0:
                break
            out[placed] = at[best]
            placed += 1
            at[best] += size
            left[best] -= size
    while placed < count:
        out[placed] = top
        top += size
        placed += 1
    return out


@njit(cache=True)
def _add(arena, table, used, sub, nodes, ancestors, offs, size):  # pragma: no cover - compiled
    """Place blocks of ``size`` bytes at each of ``offs`` over the time range that ``nodes`` make up. Returns
    (arena, used)."""
    offs = np.sort(offs)
    k = 0
    while k < len(offs):
        # A run of blocks side by side is one range to add.
        a = offs[k]
        b = a + size
        k += 1
        while k < len(offs) and offs[k] <= b:
            b = max(b, offs[k] + size)
            k += 1
        for v in nodes:
            arena, used = _merge_into(arena, table, used, v, a, b)
            arena, used = _merge_into(arena, table, used, sub + v, a, b)
        for v in ancestors:
            arena, used = _merge_into(arena, table, used, sub + v, a, b)
    return arena, used


@njit(cache=True)
def _place(size, lo, hi, sequence, leaves, lowest):  # pragma: no cover - compiled
    result = np.zeros(len(size), dtype=np.int64)
    sub = 2 * leaves  # unions 0 .. 2 leaves - 1: each node's cover; sub + v: node v's sub
    table = np.zeros((2 * sub, 3), dtype=np.int64)
    arena = np.empty(max(1024, 8 * len(size)), dtype=np.int64)
    used = 0
    pos = 0
    n = len(sequence)
    while pos < n:
        i = sequence[pos]
        b, s, e = size[i], lo[i], hi[i]
        if e <= s:
            pos += 1
            continue
        # A run of blocks with the same size and time range comes next in every order (thousands of KV-cache
        # blocks): one query serves the whole run.
        run = pos + 1
        while run < n:
            j = sequence[run]
            if size[j] != b or lo[j] != s or hi[j] != e:
                break
            run += 1
        nodes, ancestors = _nodes(s, e, leaves)
        gap_start, gap_len, top = _gaps(arena, table, sub, nodes, ancestors)
        new = _fit_run(gap_start, gap_len, top, b, run - pos, lowest)
        for p in range(pos, run):
            result[sequence[p]] = new[p - pos]
        arena, used = _add(arena, table, used, sub, nodes, ancestors, new, b)
        pos = run
    return result


def place(size: list[int], start: list[int], end: list[int], sequence: list[int], lowest: bool) -> list[int]:
    """Return the offset of each allocation of ``size`` bytes live over [start, end) (by index; 0 for those never
    live), placed in the order of the indices ``sequence`` into the lowest gap that fits (``lowest``) or the
    smallest, among the blocks placed before it and live at some time in its range, else on top of them."""
    if not size:
        return []
    size_a = np.asarray(size, dtype=np.int64)
    start_a = np.asarray(start, dtype=np.int64)
    end_a = np.asarray(end, dtype=np.int64)
    live = end_a > start_a
    if not live.any():
        return [0] * len(size)
    times = np.unique(np.concatenate((start_a[live], end_a[live])))
    leaves = 1
    while leaves < max(1, len(times) - 1):
        leaves *= 2
    # Never-live allocations keep an empty range (lo == hi) and are skipped.
    lo = np.where(live, np.searchsorted(times, start_a), 0).astype(np.int64)
    hi = np.where(live, np.searchsorted(times, end_a), 0).astype(np.int64)
    return _place(size_a, lo, hi, np.asarray(sequence, dtype=np.int64), leaves, lowest).tolist()
