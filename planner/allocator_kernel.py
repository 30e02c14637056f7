"""The caching allocator's replay (``planner/allocator.py``'s ``CachingAllocator``), compiled, for long logs.

``replay(...)`` gives what ``replay_caching`` gives for the same log: best fit with splitting and coalescing,
compaction on a fragmentation failure, overflow above the arena. On the 38.8k-op plan's 396k records the Python
replay took 0.8 s of the executor's 3.7 s, which kept its run with the allocator model under 100k steps/s. Short
logs keep the Python class: numba's first compile (seconds, once per install, then cached beside the module) would
cost more than it saves.

The free blocks are kept twice, as sorted arrays: by (size, start), where best fit looks (the smallest block that
fits, the lowest address on a tie), and by start, where a freed block finds its free neighbours. Inserting and
removing move the tail of an array, which compiled is cheaper than any tree at the few thousand free blocks a
fragmented arena has.

Each compiled module is self-contained (its own binary searches): numba's cache notices changes to a function's own
file only, so a compiled helper shared with another module could leave that module's cached code stale.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

ALLOC = 1


@njit(cache=True)
def _pos_by_size(sizes, starts, count, size, start):  # pragma: no cover - compiled
    """The first position in the (size, start)-sorted arrays whose pair is not below (size, start)."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) >> 1
        if sizes[mid] < size or (sizes[mid] == size and starts[mid] < start):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _pos_by_start(starts, count, start):  # pragma: no cover - compiled
    """The first position in the start-sorted array whose start is not below ``start``."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) >> 1
        if starts[mid] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _insert(free, count, start, size):  # pragma: no cover - compiled
    """Add the free block [start, start + size) to both orders of ``free`` (rows: by-size sizes, by-size starts,
    by-start starts, by-start sizes); ``free`` grows when full. Returns (free, count)."""
    if count == free.shape[1]:
        bigger = np.empty((4, 2 * free.shape[1]), dtype=np.int64)
        bigger[:, :count] = free[:, :count]
        free = bigger
    i = _pos_by_size(free[0], free[1], count, size, start)
    for r in range(count, i, -1):  # shift right, from the end (a slice copy would allocate)
        free[0, r] = free[0, r - 1]
        free[1, r] = free[1, r - 1]
    free[0, i], free[1, i] = size, start
    j = _pos_by_start(free[2], count, start)
    for r in range(count, j, -1):
        free[2, r] = free[2, r - 1]
        free[3, r] = free[3, r - 1]
    free[2, j], free[3, j] = start, size
    return free, count + 1


@njit(cache=True)
def _remove(free, count, start, size):  # pragma: no cover - compiled
    """Remove the free block at ``start`` of ``size`` from both orders. Returns the new count."""
    i = _pos_by_size(free[0], free[1], count, size, start)
    free[0, i:count - 1] = free[0, i + 1:count]
    free[1, i:count - 1] = free[1, i + 1:count]
    j = _pos_by_start(free[2], count, start)
    free[2, j:count - 1] = free[2, j + 1:count]
    free[3, j:count - 1] = free[3, j + 1:count]
    return count - 1


@njit(cache=True)
def replay(times, ops, ids, sizes, steps, n_ids, capacity, bandwidth, max_defrags):  # pragma: no cover - compiled
    """Replay the log (per record: time, ``ALLOC`` or not, allocation id, bytes, step or -1) through the caching
    allocator over ``[0, capacity)``. Returns (failures, high water, overflows, defrags): the defragmentation
    events as an int64 array of rows (record index, free bytes before, largest free block, bytes moved, cost).
    Failures are -1 when a compaction beyond ``max_defrags`` was needed: each sorts every live block here, where
    the Python replay's numpy sort is faster (a plan replayed 10% under its budget compacted 858 times)."""
    free = np.empty((4, 64), dtype=np.int64)
    count = 0
    free_bytes = 0
    if capacity > 0:
        free, count = _insert(free, count, 0, capacity)
        free_bytes = capacity
    live = np.zeros(n_ids, dtype=np.bool_)
    at = np.zeros(n_ids, dtype=np.int64)
    held = np.zeros(n_ids, dtype=np.int64)
    over = np.zeros(n_ids, dtype=np.bool_)  # placed above the arena
    over_ids = np.empty(n_ids, dtype=np.int64)
    n_over = 0
    defrags = np.empty((16, 5), dtype=np.int64)
    n_defrags = 0
    failures = overflows = high_water = 0
    for k in range(len(ops)):
        x = ids[k]
        if ops[k] != ALLOC:
            if over[x]:
                over[x] = False
                for q in range(n_over):
                    if over_ids[q] == x:
                        over_ids[q] = over_ids[n_over - 1]
                        n_over -= 1
                        break
                continue
            if not live[x]:
                continue
            live[x] = False
            start, size = at[x], held[x]
            free_bytes += size
            j = _pos_by_start(free[2], count, start)
            if j > 0 and free[2, j - 1] + free[3, j - 1] == start:  # a free neighbour below: merge it
                below, z = free[2, j - 1], free[3, j - 1]
                count = _remove(free, count, below, z)
                start, size = below, size + z
                j -= 1
            if j < count and free[2, j] == start + size:  # a free neighbour above
                z = free[3, j]
                count = _remove(free, count, start + size, z)
                size += z
            free, count = _insert(free, count, start, size)
            continue
        size = sizes[k]
        i = _pos_by_size(free[0], free[1], count, size, -1)
        if i == count:
            if free_bytes >= size:
                failures += 1
                largest = free[0, count - 1] if count else 0
                free_before = free_bytes
                if n_defrags == max_defrags:
                    return -1, 0, 0, defrags[:0]  # left to the Python replay (see ``max_defrags``)
                # Compaction: every live block moves down, in address order (live blocks never share a start: the
                # executor allocates no zero-size block).
                order = np.flatnonzero(live)
                order = order[np.argsort(at[order])]
                cur = moved = 0
                for y in order:
                    if at[y] != cur:
                        moved += held[y]
                    at[y] = cur
                    cur += held[y]
                count = 0
                free_bytes = 0
                if cur < capacity:
                    free, count = _insert(free, count, cur, capacity - cur)
                    free_bytes = capacity - cur
                cost = math.ceil(2 * moved / bandwidth * 1e9) if moved else 0
                if n_defrags == len(defrags):
                    bigger = np.empty((2 * len(defrags), 5), dtype=np.int64)
                    bigger[:n_defrags] = defrags[:n_defrags]
                    defrags = bigger
                defrags[n_defrags, 0] = k
                defrags[n_defrags, 1] = free_before
                defrags[n_defrags, 2] = largest
                defrags[n_defrags, 3] = moved
                defrags[n_defrags, 4] = cost
                n_defrags += 1
                i = _pos_by_size(free[0], free[1], count, size, -1)
            else:
                overflows += 1
                top = capacity
                for q in range(n_over):
                    top = max(top, at[over_ids[q]] + held[over_ids[q]])
                over[x] = True
                over_ids[n_over] = x
                n_over += 1
                at[x], held[x] = top, size
                high_water = max(high_water, top + size)
                continue
        fsize, start = free[0, i], free[1, i]
        count = _remove(free, count, start, fsize)
        free_bytes -= size
        if fsize > size:
            free, count = _insert(free, count, start + size, fsize - size)
        live[x] = True
        at[x], held[x] = start, size
        high_water = max(high_water, start + size)
    return failures, high_water, overflows, defrags[:n_defrags]
