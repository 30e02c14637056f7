"""Static HBM offsets: give every allocation of an executed timeline an address, once, ahead of time.

``assign_offsets(residencies, order=..., fit=...)`` places the allocations one at a time in an order (``size``:
largest first, longer-lived first on a tie, as the "greedy by size" planners of TFLite and XLA do; or by
lifetime, by size x lifetime, by start), each into a gap between the blocks already placed that are live at the
same time (``best``: the smallest that fits; ``first``: the lowest), or on top of them when no gap fits. No pair
wins everywhere, so ``order="best"`` keeps the lowest over the pairs ``tries_for`` gives, and
``offsets_within`` (planner/offsets_cpsat.py) tries them in turn until one fits a capacity. The result maps
each allocation name to an int, or to a list of ints when a name is resident several times (the k-th entry for
its k-th residency, in start order), which is the form ``Plan.offsets`` takes.

Timelines of tens of thousands of allocations (most of them live at once, as KV-cache blocks are) are handled
by never listing the blocks a new one overlaps in time: best fit needs only the union of their address ranges,
which a segment tree over time keeps merged per node (``_Placed``). Timelines of more than ``COMPILED_MIN``
allocations run the same loop compiled (``planner/offsets_kernel.py``: 2 s instead of 8-12 s on the 38.8k-op
graph's 200k allocations); smaller ones stay in Python, where it takes milliseconds and numba's first compile
(12-15 s, once per install: then cached beside the module) would cost more than it saves.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from planner import offsets_kernel
from planner.allocator import live_end_ns, offset_of, tier_columns
from planner.hardware import HBM
from planner.timeline import Residency

# A union of address intervals, kept merged as one list [s0, e0, s1, e1, ...]: disjoint, positive sizes, touching
# ones merged, so the list is strictly increasing and an address's position in it (even: in a gap; odd: in an
# interval) says where it falls. One list, not two: a query gathers a third fewer items and makes one array.
_Union = list[int]


def _merge_into(unions: dict[int, _Union], v: int, a: int, b: int) -> None:
    """Add the address range [a, b) to the union of node ``v``."""
    flat = unions.get(v)
    if flat is None:
        unions[v] = [a, b]
        return
    i = bisect.bisect_left(flat, a)  # odd: a is inside an interval or at its end (touching): merge from its start
    j = bisect.bisect_right(flat, b, i)  # odd: b is inside an interval or at its start (touching): merge to its end
    if i & 1:
        i -= 1
        a = flat[i]
    if j & 1:
        b = flat[j]
        j += 1
    flat[i:j] = (a, b)


class _Placed:
    """Placed blocks, indexed for the query "the union of the address ranges of the blocks live at some time in
    [s, e)". Best fit depends on those blocks only through that union (its free gaps and its top), so a query
    never lists the blocks: at tens of thousands of live blocks, listing them was quadratic.

    A segment tree over the elementary time intervals between the allocations' start and end times: a block is
    added to the ``cover`` union of the O(log T) nodes that make up its time range, and to the ``sub`` union of
    those nodes and their ancestors. The blocks live in a query's range are then those in ``sub`` of the nodes
    that make up the range and those in ``cover`` of their ancestors.
    """

    def __init__(self, times: list[int]) -> None:
        self.index = {t: k for k, t in enumerate(times)}
        size = 1
        while size < max(1, len(times) - 1):
            size *= 2
        self.size = size
        self.cover: dict[int, _Union] = {}
        self.sub: dict[int, _Union] = {}
        # Many blocks share a time range (KV-cache blocks), and each range is asked for twice (query, then add).
        self._node_cache: dict[tuple[int, int], tuple[list[int], list[int]]] = {}

    def _nodes(self, s: int, e: int) -> tuple[list[int], list[int]]:
        """(the nodes that make up the time range [s, e), their proper ancestors)."""
        got = self._node_cache.get((s, e))
        if got is not None:
            return got
        lo, hi = self.index[s] + self.size, self.index[e] + self.size
        nodes = []
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo >>= 1
            hi >>= 1
        ancestors: list[int] = []
        seen = set(nodes)
        for v in nodes:
            v >>= 1
            while v and v not in seen:
                seen.add(v)
                ancestors.append(v)
                v >>= 1
        got = self._node_cache[(s, e)] = (nodes, ancestors)
        return got

    def add(self, s: int, e: int, offs: list[int], size: int) -> None:
        """Place blocks of ``size`` bytes at each of ``offs``, all live over the time range [s, e)."""
        nodes, ancestors = self._nodes(s, e)
        # Merge the blocks among themselves first: a run of blocks side by side is one interval to add.
        merged: list[list[int]] = []
        for off in sorted(offs):
            if merged and off <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], off + size)
            else:
                merged.append([off, off + size])
        cover, sub = self.cover, self.sub
        for a, b in merged:
            for v in nodes:
                _merge_into(cover, v, a, b)
                _merge_into(sub, v, a, b)
            for v in ancestors:
                _merge_into(sub, v, a, b)

    def overlapping(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (starts, ends) of address intervals whose union is that of the placed blocks live at some
        time in [s, e)."""
        nodes, ancestors = self._nodes(s, e)
        sub, cover = self.sub, self.cover
        flat: list[int] = []
        for part in [sub.get(v) for v in nodes] + [cover.get(v) for v in ancestors]:
            if part is not None:
                flat += part
        both = np.array(flat, dtype=np.int64)
        return both[0::2], both[1::2]


def best_fit_offset(offs: np.ndarray, ends: np.ndarray, size: int) -> int:
    """The address of the smallest gap of at least ``size`` among the blocks [offs, ends), or the top."""
    return best_fit_run(offs, ends, size, 1)[0]


# How a block picks its gap among those that fit: ``best``, the smallest (the lowest on a tie); ``first``, the
# lowest. Neither wins everywhere: on Checkmate's random_layered_n500 timelines first fit needs 1-6% less address
# space, on the 38.8k-op inference graph's second greedy attempt 1.5% less (the offsets fit, best fit's do not).
FITS = ("best", "first")


def best_fit_run(offs: np.ndarray, ends: np.ndarray, size: int, count: int, fit: str = "best") -> list[int]:
    """The addresses of ``count`` blocks of ``size`` placed one after another among the blocks [offs, ends),
    each also counting those placed before it: in the gap that ``fit`` picks (``FITS``), else on the top.

    The gaps are listed once and kept in a heap, as placing a block in a gap only shortens that gap: a run of
    thousands of KV-cache blocks no longer re-sorts every block placed so far for each one. First fit keys the
    heap by address (a shortened gap keeps its place: it now starts ``size`` higher and is still the lowest).
    """
    lowest = fit == "first"
    top = 0
    heap: list[tuple[int, int]] = []
    if len(offs):
        order = np.argsort(offs, kind="stable")
        o = offs[order]
        reach = np.maximum.accumulate(ends[order])
        # Gap k lies between the end of blocks 0..k-1 and the start of block k (gap 0 starts at address 0); gaps
        # long enough for a block start strictly higher as k grows, so (length, start) breaks ties by address.
        gap_start = np.concatenate(([0], reach[:-1]))
        gap_len = o - gap_start
        ok = np.flatnonzero(gap_len >= size)
        if count == 1:
            # One block (most queries): the heap's first pop, without building the heap.
            if not len(ok):
                return [int(reach[-1])]
            k = ok[0] if lowest else ok[int(np.argmin(gap_len[ok]))]  # argmin: the lowest address on a tie
            return [int(gap_start[k])]
        if lowest:
            heap = list(zip(gap_start[ok].tolist(), gap_len[ok].tolist()))
        else:
            heap = list(zip(gap_len[ok].tolist(), gap_start[ok].tolist()))
        heapq.heapify(heap)
        top = int(reach[-1])
    out: list[int] = []
    for _ in range(count):
        if heap:
            if lowest:
                start, length = heapq.heappop(heap)
            else:
                length, start = heapq.heappop(heap)
            out.append(start)
            if length - size >= size:
                heapq.heappush(heap, (start + size, length - size) if lowest else (length - size, start + size))
        else:
            out.append(top)
            top += size
    return out


# Timelines up to EVERY_TRY_MAX allocations try every (order, fit) pair (milliseconds each at a few hundred);
# up to FEW_TRIES_MAX the first three (0.3-0.5 s each at 2,000); larger ones (seconds each: 8-10 s at 173k
# allocations) only LARGE_TRIES.
EVERY_TRY_MAX = 1500
FEW_TRIES_MAX = 5000
# Timelines of more allocations than this place with the compiled loop (the same offsets): 8x faster at 2,023
# allocations (greedy's plan of deepseek-v3-nsa-64k-L3-1layer at 60%: 29-36 ms -> 4.2-4.9 ms a placement), where
# greedy places tens of timelines.
COMPILED_MIN = 1000

# Sort keys of an allocation of ``size`` bytes live over [start, end) (``end``: its live end), before the tie-break
# by (name, instance) that makes every order total.
ORDERS = {
    "size": lambda size, start, end: (-size, -(end - start), start),
    "lifetime": lambda size, start, end: (-(end - start), -size, start),
    "area": lambda size, start, end: (-size * (end - start), -size, start),
    "start": lambda size, start, end: (start, -size),
}

# (order, fit) pairs in the order ``offsets_within`` tries them, the most often lowest first. Measured on the
# timelines of greedy's attempts (height over the budget): on deepseek-v3-paper at 50% and llama3-8b-no2-4layers
# at 60% (26 timelines of 1,184-2,517 allocations) area/first is the lowest on 19, and size/best (the only rule
# before) on 1, 1-6 points above the lowest; on Checkmate's random_layered_n500 at 80% (13 timelines) no pair is
# the lowest on more than 4 and size/best on none. On the 38.8k-op inference graph's first two attempts (173k
# allocations) area/first reaches 1.036 and 0.988, size/first 1.048 and 0.985, size/best 1.049 and 1.0001.
TRIES = (("area", "first"), ("size", "first"), ("area", "best"), ("lifetime", "first"), ("lifetime", "best"),
         ("size", "best"), ("start", "first"), ("start", "best"))
# Above FEW_TRIES_MAX: size/first. On the 38.8k-op graph greedy then fits at its second attempt (51,995.8 ms,
# 99.9 s); with area/first, whose lower first height made greedy's second budget higher, at its third, planned
# for 42.3 GB, slower than the caching allocator (55,933.0 ms, 137.6 s).
LARGE_TRIES = (("size", "first"),)


def tries_for(count: int) -> tuple[tuple[str, str], ...]:
    """The (order, fit) pairs worth trying on a timeline of ``count`` allocations."""
    if count <= EVERY_TRY_MAX:
        return TRIES
    return TRIES[:3] if count <= FEW_TRIES_MAX else LARGE_TRIES


class Allocations(NamedTuple):
    """One tier's allocations as columns, in ``residency_instances``' order (by start, end, name): each one's name,
    instance number (the k-th residency of its name), bytes, start and live end (``live_end``)."""

    names: list[str]
    instance: list[int]
    size: list[int]
    start: list[int]
    end: list[int]


def allocations(residencies: Iterable[Residency], tier: str = HBM) -> Allocations:
    """Return the ``tier`` allocations of a timeline as ``Allocations``. From the executor's ``Residencies``
    without making an object per allocation (1.1 s of 7.4 for the offsets of a 38.8k-op plan)."""
    names, sizes, starts, ends, held = tier_columns(residencies, tier)
    rows = sorted(range(len(names)), key=lambda j: (starts[j], ends[j], names[j]))
    count: dict[str, int] = {}
    instance = []
    for j in rows:
        k = count.get(names[j], 0)
        count[names[j]] = k + 1
        instance.append(k)
    live = list(map(live_end_ns, starts, ends, held))
    return Allocations([names[j] for j in rows], instance, [sizes[j] for j in rows], [starts[j] for j in rows],
                       [live[j] for j in rows])


def assign_offsets(
    residencies: Iterable[Residency], tier: str = HBM, order: str = "best", fit: str = "best"
) -> dict[str, int | list[int]]:
    """Return an offset for every ``tier`` allocation of the timeline, each allocation in the given order going
    into the gap ``fit`` picks (``FITS``) among the blocks placed before it that are live at the same time.

    ``order``: ``size`` (largest first, longer-lived first on a tie), ``area`` (largest size x lifetime first),
    ``lifetime``, ``start`` (in time order, as an allocator would), or ``best``: the lowest height over the
    (order, fit) pairs ``tries_for`` gives (``fit`` is then ignored).
    """
    residencies = list(residencies)
    allocs = allocations(residencies, tier)
    if order == "best":
        tries = [place_allocations(allocs, o, f) for o, f in tries_for(len(residencies))]
        return offsets_by_name(allocs, min(tries, key=lambda offs: allocations_height(allocs, offs)))
    return offsets_by_name(allocs, place_allocations(allocs, order, fit))


def place_allocations(allocs: Allocations, order: str, fit: str) -> list[int]:
    """Return the offset of each of ``allocs`` (by index), placed one at a time in ``order`` (``ORDERS``; ties by
    name and instance) into the gap ``fit`` picks (``FITS``) among the blocks placed before it that are live at
    the same time."""
    key = ORDERS[order]
    names, instance, size, start, end = allocs
    sequence = sorted(range(len(names)), key=lambda i: key(size[i], start[i], end[i]) + (names[i], instance[i]))
    return _place(size, start, end, sequence, fit)


def allocations_height(allocs: Allocations, offsets: list[int]) -> int:
    """The highest address end ``offsets`` (``place_allocations``') reach, over the allocations live for some
    time."""
    return max((off + b for off, b, s, e in zip(offsets, allocs.size, allocs.start, allocs.end) if e > s),
               default=0)


def _place(size: list[int], start: list[int], end: list[int], sequence: list[int], fit: str) -> list[int]:
    """Offsets of the allocations of ``size`` bytes live over [start, end) (by index), placed in the order of the
    indices ``sequence`` by ``fit``."""
    if len(size) > COMPILED_MIN:
        return offsets_kernel.place(size, start, end, sequence, lowest=fit == "first")
    result = [0] * len(size)
    live = [i for i in range(len(size)) if end[i] > start[i]]
    if not live:
        return result
    placed = _Placed(sorted({start[i] for i in live} | {end[i] for i in live}))
    pos = 0
    while pos < len(sequence):
        i = sequence[pos]
        b, s, e = size[i], start[i], end[i]
        if e <= s:
            pos += 1
            continue
        # A run of blocks with the same size and time range comes next in every order (thousands of KV-cache
        # blocks): one query serves the whole run, each block placed also counting the ones placed before it.
        run = pos + 1
        while run < len(sequence):
            j = sequence[run]
            if size[j] != b or start[j] != s or end[j] != e:
                break
            run += 1
        new = best_fit_run(*placed.overlapping(s, e), b, run - pos, fit)
        for p, off in zip(range(pos, run), new):
            result[sequence[p]] = off
        placed.add(s, e, new, b)
        pos = run
    return result


def offsets_by_name(allocs: Allocations, offsets: list[int]) -> dict[str, int | list[int]]:
    """``Plan.offsets``'s form of one offset per allocation (by index): a name's k-th entry for its k-th residency
    (by start), a single int for a name resident once; names in sorted order."""
    out: dict[str, list[int]] = {}
    for name, _k, off in sorted(zip(allocs.names, allocs.instance, offsets)):
        out.setdefault(name, []).append(off)
    return {name: (v[0] if len(v) == 1 else v) for name, v in out.items()}


def offsets_height(residencies: Iterable[Residency], offsets: dict, tier: str = HBM) -> int:
    """The highest address end the offsets reach on ``tier``."""
    allocs = allocations(residencies, tier)
    h = 0
    for name, k, b, s, e in zip(*allocs):
        off = offset_of(offsets, name, k)
        if off is not None and e > s:
            h = max(h, off + b)
    return h


__all__ = ["FITS", "ORDERS", "TRIES", "Allocations", "allocations", "allocations_height", "assign_offsets",
           "best_fit_offset", "best_fit_run", "offsets_by_name", "offsets_height", "place_allocations", "tries_for"]
