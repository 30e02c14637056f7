"""The compiled core of ``planner/offsets_search.py``: its depth-first search over canonical placements, with
numba.

``search(size, start, end, lo, hi, load, capacity, rank, try_limit)`` is ``_Search.run`` step for step: the same
candidates in the same order, the same pruning, the same count of tries, so it returns the same offsets. In Python
each placement costs a dozen vector operations over all blocks (80 us at 3,700 allocations: a descent of
``deepseek-v3-nsa-128k-L3-1layer``'s timelines took 0.3 s, and greedy makes a dozen such calls a plan); here it
is a few plain loops. numba compiles the module on its first call (then cached beside it), which is why
``offsets_search.py`` keeps its Python loop for small timelines, where a call takes milliseconds.

The undo records live in two logs that grow by doubling: the floors each placement raised (block, old floor) and
the section floors it covered (old floor), each frame keeping where its records start.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_PLACED = 1 << 62  # a floor above every address, as in offsets_search


@njit(cache=True)
def _grown(log, used, more):  # pragma: no cover - compiled
    """``log`` with room for ``more`` entries after its first ``used``."""
    if used + more <= len(log):
        return log
    bigger = np.empty(max(2 * len(log), used + more), dtype=np.int64)
    bigger[:used] = log[:used]
    return bigger


@njit(cache=True)
def search(size, start, end, lo, hi, load, capacity, rank, try_limit):  # pragma: no cover - compiled
    """(whether offsets within ``capacity`` were found, the offsets): ``_Search.run`` of ``offsets_search`` for
    blocks of ``size`` bytes live over [start, end), spanning the sections lo:hi of bytes ``load``, placed by
    ``rank`` among equal floors, within ``try_limit`` placements. ``capacity`` < 0: none (a descent)."""
    n = len(size)
    sections = len(load)
    offset = np.zeros(n, dtype=np.int64)
    if n == 0:
        return True, offset
    floor = np.zeros(n, dtype=np.int64)
    section_floor = np.zeros(sections, dtype=np.int64)
    section_left = load.copy()
    # Per depth: the (floor, rank) of the last candidate taken, the lowest top an unplaced block can reach, the
    # block placed (-1: none) at its offset, where its undo records start in the two logs.
    last_floor = np.empty(n + 1, dtype=np.int64)
    last_rank = np.empty(n + 1, dtype=np.int64)
    min_top = np.empty(n + 1, dtype=np.int64)
    chosen = np.full(n + 1, -1, dtype=np.int64)
    chosen_offset = np.empty(n + 1, dtype=np.int64)
    raised_from = np.empty(n + 1, dtype=np.int64)
    covered_from = np.empty(n + 1, dtype=np.int64)
    raised_block = np.empty(16 * n, dtype=np.int64)
    raised_old = np.empty(16 * n, dtype=np.int64)
    covered_old = np.empty(16 * n, dtype=np.int64)
    raised_used = 0
    covered_used = 0
    left = n
    depth = 0
    last_floor[0] = -1
    last_rank[0] = -1
    top = _PLACED
    for i in range(n):
        top = min(top, size[i])
    min_top[0] = top
    tries = 0
    while depth >= 0:
        b = chosen[depth]
        if b >= 0:  # undo the placement made at this depth
            off = chosen_offset[depth]
            k = covered_from[depth]
            for s in range(lo[b], hi[b]):
                section_floor[s] = covered_old[k]
                section_left[s] += size[b]
                k += 1
            for k in range(raised_used - 1, raised_from[depth] - 1, -1):
                floor[raised_block[k]] = raised_old[k]
            hatless = raised_used == raised_from[depth]
            raised_used = raised_from[depth]
            covered_used = covered_from[depth]
            floor[b] = off
            left += 1
            chosen[depth] = -1
            if hatless:
                depth -= 1
                continue
        # The next candidate: the lowest rank at the last floor above the last rank taken, else the lowest rank at
        # the next floor up, if below the lowest top.
        lf = last_floor[depth]
        lr = last_rank[depth]
        b = -1
        up = -1
        off = _PLACED
        for i in range(n):  # one pass for both
            f = floor[i]
            if f == lf:
                if rank[i] > lr and (b < 0 or rank[i] < rank[b]):
                    b = i
            elif lf < f < _PLACED and (f < off or (f == off and rank[i] < rank[up])):
                off = f
                up = i
        if b >= 0:
            off = lf
        else:
            b = up
        if off >= min_top[depth]:
            depth -= 1
            continue
        last_floor[depth] = off
        last_rank[depth] = rank[b]
        tries += 1
        if tries > try_limit:
            return False, offset
        # Place b at off: raise the floors of the unplaced blocks it overlaps, cover its sections.
        top = off + size[b]
        floor[b] = _PLACED
        offset[b] = off
        raised_from[depth] = raised_used
        covered_from[depth] = covered_used
        raised_block = _grown(raised_block, raised_used, n)
        raised_old = _grown(raised_old, raised_used, n)
        for i in range(n):
            if floor[i] < _PLACED and start[i] < end[b] and end[i] > start[b]:
                raised_block[raised_used] = i
                raised_old[raised_used] = floor[i]
                raised_used += 1
                if floor[i] < top:
                    floor[i] = top
        covered_old = _grown(covered_old, covered_used, hi[b] - lo[b])
        for s in range(lo[b], hi[b]):
            covered_old[covered_used] = section_floor[s]
            covered_used += 1
            section_floor[s] = top
            section_left[s] -= size[b]
        left -= 1
        chosen[depth] = b
        chosen_offset[depth] = off
        if capacity >= 0:
            fits = True
            for s in range(sections):
                if max(section_floor[s], off) + section_left[s] > capacity:
                    fits = False
                    break
            if not fits:
                continue
        if left == 0:
            return True, offset
        depth += 1
        last_floor[depth] = off
        last_rank[depth] = rank[b]
        chosen[depth] = -1
        top = _PLACED
        for i in range(n):
            if floor[i] < _PLACED:
                top = min(top, floor[i] + size[i])
        min_top[depth] = top
    return False, offset
