"""Static HBM offsets by a depth-first search over canonical placements (MiniMalloc: Moffitt, ASPLOS 2024).

Best fit (``planner/offsets.py``) places the allocations largest first, each into the best gap among those placed
before it. On timelines that fill HBM to the budget the small blocks then find the gaps broken up and go on top:
on ``deepseek-v3-nsa-64k-L3-1layer`` at 70% (1,849 allocations, a 4.937 GB peak) best fit needs 5.069 GB of
addresses and the plan misses its 4.988 GB budget, where this search places the same timeline in 4.946 GB.

Every packing can be pushed down until each block rests on a block live at the same time (or on address 0), and
those "canonical" packings can be built by placing the blocks in non-decreasing order of offset, each at the top
of the blocks placed before it that overlap it in time (its floor). The search does that: at each step it takes
an unplaced block of the lowest floor (ties by a static preorder: longest-lived, then largest area, then the
largest load it meets), and backtracks when a cross-section of time can no longer fit the blocks still to place
above its floor. It prunes as MiniMalloc does: only canonical sequences (offsets non-decreasing, preorder rising
among equal offsets), no block placed at or above a height some unplaced block could reach below it (dominance),
and a block that overlaps no unplaced block is not swapped for another (it changes nothing for the rest).

The search is complete: without a limit it finds offsets within the capacity whenever they exist. Here the first
descent of each preorder runs first without a capacity (a one-pass heuristic, which fits most timelines that best
fit misses and otherwise gives the lowest height to report), then the search within the capacity for each, up to
``TRY_LIMIT`` placements beyond its first descent (deterministic: the same timeline gives the same offsets). Its
cost is quadratic in the allocations (each placement raises the floors of the unplaced blocks it overlaps), so it
is used up to ``SEARCH_MAX_BLOCKS``.
"""

from __future__ import annotations

import time

import numpy as np

from planner import offsets_search_kernel
from planner.offsets import Allocations

SEARCH_MAX_BLOCKS = 5_000
# Timelines of at least this many allocations search with the compiled loop (``offsets_search_kernel``: the same
# offsets; a placement costs microseconds instead of tens). Below, a call takes milliseconds in Python and
# numba's first compile (once per install) would cost more than it saves.
COMPILED_MIN = 500
# Placements tried per preorder beyond the first descent (one per allocation). A whole call that fits nothing (the
# three descents and three searches) took 0.43 s on a 3,685-allocation timeline of deepseek-v3-nsa-128k at 60%,
# compiled. Measured on greedy's calls there and on deepseek-v3-paper at 60%: of the searches that fit where every
# descent missed, 300 tries found as many as 2,000.
TRY_LIMIT = 300
# MiniMalloc's default preorders: W(idth: lifetime), A(rea: size x lifetime), T(otal: the largest load of a
# cross-section it spans), each descending; the first that fits wins.
PREORDERS = ("WAT", "TAW", "TWA")


def search_offsets(
    allocs: Allocations, capacity: int, try_limit: int = TRY_LIMIT, preorders: tuple[str, ...] = PREORDERS,
    time_limit_s: float = 10.0,
) -> tuple[list[int], bool] | None:
    """Return (one offset per allocation of ``allocs``, by index; whether they fit ``capacity``), or None when the
    timeline has more than ``SEARCH_MAX_BLOCKS`` allocations. No two allocations live at the same time overlap.

    Tried in turn: the first descent of each preorder of ``preorders`` without a capacity (each block at the
    lowest floor, never backtracking: a one-pass heuristic), then the search within ``capacity`` for each, up to
    ``try_limit`` placements beyond its first descent. When none fits, the lowest descent is returned.
    ``time_limit_s`` is a safety net only: the try limit bounds the work, so the same timeline gives the same
    offsets."""
    live = [i for i, (b, s, e) in enumerate(zip(allocs.size, allocs.start, allocs.end)) if e > s and b > 0]
    if len(live) > SEARCH_MAX_BLOCKS:
        return None
    blocks = _Blocks(allocs, live)
    lowest: tuple[int, np.ndarray] | None = None
    for preorder in preorders:
        offsets = blocks.search(preorder, None, 0, None)
        assert offsets is not None  # without a capacity the first descent places every block
        height = int((offsets + blocks.size).max(initial=0))
        if height <= capacity:
            return blocks.spread(offsets), True
        if lowest is None or height < lowest[0]:
            lowest = (height, offsets)
    assert lowest is not None
    if int(blocks.size.max(initial=0)) <= capacity and int(blocks.sections.load.max(initial=0)) <= capacity:
        deadline = time.monotonic() + time_limit_s
        for preorder in preorders:
            offsets = blocks.search(preorder, capacity, try_limit, deadline)
            if offsets is not None:
                return blocks.spread(offsets), True
    return blocks.spread(lowest[1]), False


def descend(allocs: Allocations, preorder: str = PREORDERS[0]) -> list[int] | None:
    """Return the offsets of the first descent of ``preorder`` without a capacity (one offset per allocation of
    ``allocs``, by index), or None when the timeline has more than ``SEARCH_MAX_BLOCKS`` allocations."""
    found = search_offsets(allocs, 0, try_limit=0, preorders=(preorder,))
    return None if found is None else found[0]


class _Blocks:
    """The allocations of some bytes live for some time, as columns, with their sections and preorders. (Empty
    ones overlap nothing: offset 0. Kept, they would end a descent early, as a block of no bytes at the lowest
    floor dominates every other choice.)"""

    def __init__(self, allocs: Allocations, live: list[int]) -> None:
        self.count, self.live = len(allocs.names), live
        self.size, self.start, self.end = (np.array([col[i] for i in live], dtype=np.int64)
                                           for col in (allocs.size, allocs.start, allocs.end))
        self.sections = _Sections(self.start, self.end, self.size)
        self._ranks: dict[str, np.ndarray] = {}
        self._keys: dict[str, np.ndarray] | None = None

    def search(self, preorder: str, capacity: int | None, try_limit: int, deadline: float | None
               ) -> np.ndarray | None:
        rank = self._ranks.get(preorder)
        if rank is None:
            if self._keys is None:  # once per timeline, for all its preorders
                self._keys = _sort_keys(self.size, self.start, self.end, self.sections)
            rank = self._ranks[preorder] = _preorder(preorder, self._keys)
        if len(self.live) < COMPILED_MIN:
            return _Search(self.size, self.start, self.end, self.sections, capacity, rank).run(
                len(self.live) + try_limit, deadline)
        # The compiled loop has no clock: its try limit alone bounds it (milliseconds per hundred tries).
        found, offsets = offsets_search_kernel.search(
            self.size, self.start, self.end, self.sections.lo, self.sections.hi, self.sections.load,
            -1 if capacity is None else capacity, rank, len(self.live) + try_limit)
        return offsets if found else None

    def spread(self, offsets: np.ndarray) -> list[int]:
        """One offset per allocation: ``offsets`` for the live ones, 0 for the others."""
        found = [0] * self.count
        for i, off in zip(self.live, offsets.tolist()):
            found[i] = off
        return found


class _Sections:
    """The cross-sections of a timeline: the sets of blocks live just before some block ends (MiniMalloc's sweep),
    each block spanning the sections ``lo[i]:hi[i]``; ``load[s]``: the bytes live in section ``s``. Capacity
    holds at every time when it holds in every section, as each time's live blocks are a subset of a section's."""

    def __init__(self, start: np.ndarray, end: np.ndarray, size: np.ndarray) -> None:
        n = len(size)
        # At equal times the ends come first: lifetimes are half-open, so a block ending at t and one starting at
        # t never share a section.
        times = np.concatenate([end, start])
        kinds = np.concatenate([np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)])
        who = np.concatenate([np.arange(n), np.arange(n)])
        lo = np.zeros(n, dtype=np.int64)
        hi = np.zeros(n, dtype=np.int64)
        count = 0
        last_end_time = None
        load = []
        live_bytes = 0
        for k in np.lexsort((who, kinds, times)).tolist():
            i = int(who[k])
            if kinds[k] == 0:
                t = int(times[k])
                if last_end_time is None or last_end_time < t:
                    last_end_time = t
                    load.append(live_bytes)
                    count += 1
                hi[i] = count
                live_bytes -= int(size[i])
            else:
                lo[i] = count
                live_bytes += int(size[i])
        self.lo, self.hi = lo, hi
        self.load = np.array(load, dtype=np.int64)


def _sort_keys(size: np.ndarray, start: np.ndarray, end: np.ndarray, sections: _Sections) -> dict[str, np.ndarray]:
    """The columns the preorders sort by, by letter (``PREORDERS``): lifetime, size x lifetime, and the largest load
    of a section the block spans."""
    width = end - start
    total = np.array([int(sections.load[a:b].max()) for a, b in zip(sections.lo.tolist(), sections.hi.tolist())],
                     dtype=np.int64)
    return {"W": width, "A": size * width, "T": total}


def _preorder(keys: str, columns: dict[str, np.ndarray]) -> np.ndarray:
    """Each block's rank in the static preorder ``keys`` (letters of ``columns``, each descending; ties by
    index)."""
    count = len(columns["W"])
    order = np.lexsort(tuple([np.arange(count)] + [-columns[c] for c in reversed(keys)]))
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)
    return rank


_PLACED = 1 << 62  # a floor above every address: placed blocks are never candidates


class _Search:
    """One depth-first search for a preorder, with the state it changes and restores: each unplaced block's floor
    (the top of the placed blocks it overlaps; ``_PLACED`` once placed), and each section's floor and unplaced
    bytes."""

    def __init__(self, size: np.ndarray, start: np.ndarray, end: np.ndarray, sections: _Sections,
                 capacity: int | None, rank: np.ndarray) -> None:
        self.size, self.start, self.end, self.rank, self.capacity = size, start, end, rank, capacity
        self.lo, self.hi = sections.lo, sections.hi
        self.section_floor = np.zeros(len(sections.load), dtype=np.int64)
        self.section_left = sections.load.copy()
        self.floor = np.zeros(len(size), dtype=np.int64)  # _PLACED for the placed blocks
        self.offset = np.zeros(len(size), dtype=np.int64)
        self.left = len(size)

    def run(self, try_limit: int, deadline: float | None) -> np.ndarray | None:
        """The offsets of a packing within the capacity, or None when none was found within ``try_limit`` placements
        (or by ``deadline``, a ``time.monotonic()``)."""
        if not len(self.size):
            return self.offset.copy()
        stack = [self._frame(-1, -1)]
        tries = 0
        while stack:
            frame = stack[-1]
            if frame[2] is not None:
                hatless = self._undo(frame[2])
                frame[2] = None
                if hatless:  # nothing else changes for the blocks left: another choice here cannot do better
                    stack.pop()
                    continue
            chosen = self._next(frame)
            if chosen is None:
                stack.pop()
                continue
            b, off = chosen
            tries += 1
            if tries > try_limit or (deadline is not None and tries % 64 == 0 and time.monotonic() > deadline):
                return None
            record = self._place(b, off)
            frame[2] = record
            if not self._fits(off):
                continue
            if not self.left:
                return self.offset.copy()
            stack.append(self._frame(off, int(self.rank[b])))
        return None

    def _frame(self, last_offset: int, last_rank: int) -> list:
        """A frame after a placement at ``last_offset`` of the block ranked ``last_rank``: [the (floor, rank) of
        the last candidate taken here, the lowest top an unplaced block can reach, the undo record of the
        candidate placed]. Its candidates are the unplaced blocks by (floor, rank) after that placement's (the
        sequence stays canonical) and below that lowest top (a block placed at or above it would leave a gap
        below that some unplaced block could fill: never needed)."""
        return [(last_offset, last_rank), int((self.floor + self.size).min()), None]

    def _next(self, frame: list) -> tuple[int, int] | None:
        """The next candidate of ``frame`` (block, offset), or None. Found by a scan rather than a sort: most
        frames try one candidate, and a scan costs a few vector operations."""
        floor, rank = self.floor, self.rank
        last_floor, last_rank = frame[0]
        tied = np.flatnonzero((floor == last_floor) & (rank > last_rank))
        off = last_floor if len(tied) else int(np.where(floor > last_floor, floor, _PLACED).min())
        if off >= frame[1]:
            return None
        level = tied if len(tied) else np.flatnonzero(floor == off)
        b = int(level[np.argmin(rank[level])])
        frame[0] = (off, int(rank[b]))
        return b, off

    def _place(self, b: int, off: int) -> tuple:
        top = off + int(self.size[b])
        self.floor[b] = _PLACED
        self.offset[b] = off
        over = np.flatnonzero((self.start < self.end[b]) & (self.end > self.start[b]) & (self.floor < _PLACED))
        old = self.floor[over]
        self.floor[over] = np.maximum(old, top)
        lo, hi = int(self.lo[b]), int(self.hi[b])
        old_sections = self.section_floor[lo:hi].copy()
        self.section_floor[lo:hi] = top
        self.section_left[lo:hi] -= self.size[b]
        self.left -= 1
        return b, off, over, old, old_sections

    def _undo(self, record: tuple) -> bool:
        """Undo a placement; return whether it was hatless (overlapping no unplaced block)."""
        b, off, over, old, old_sections = record
        lo, hi = int(self.lo[b]), int(self.hi[b])
        self.section_floor[lo:hi] = old_sections
        self.section_left[lo:hi] += self.size[b]
        self.floor[over] = old
        self.floor[b] = off  # a block is placed at its floor, which no placement changes while it is placed
        self.left += 1
        return len(over) == 0

    def _fits(self, off: int) -> bool:
        """Whether every section can still hold its unplaced bytes above its floor (and above ``off``: later
        placements are never lower, the sequence being canonical)."""
        if self.capacity is None:
            return True
        return bool((np.maximum(self.section_floor, off) + self.section_left <= self.capacity).all())


__all__ = ["TRY_LIMIT", "PREORDERS", "SEARCH_MAX_BLOCKS", "descend", "search_offsets"]
