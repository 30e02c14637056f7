"""Static HBM offsets: give every allocation of an executed timeline an address, once, ahead of time.

``assign_offsets(residencies)`` is a best-fit heuristic ordered by size and lifetime (the "greedy by size"
planners of TFLite and XLA do the same): allocations are taken largest first (longer-lived first on a tie, then
earlier), and each goes into the smallest gap between the blocks already placed that are live at the same time
(the lowest such gap on a tie), or on top of them when no gap fits. It also tries the order by size x lifetime
and keeps whichever reaches the lower height. The result maps each allocation name to an
int, or to a list of ints when a name is resident several times (the k-th entry for its k-th residency, in
start order), which is the form ``Plan.offsets`` takes.

Timelines of tens of thousands of allocations are handled with two indexes: long-lived blocks are few and
scanned whole; short-lived ones are kept sorted by start so that only a window of them is scanned.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from planner.allocator import live_end, residency_instances
from planner.timeline import Residency


class _Rows:
    """A growable array of (start, end, offset, size) rows."""

    def __init__(self) -> None:
        self.a = np.zeros((16, 4), dtype=np.int64)
        self.n = 0

    def add(self, row: tuple[int, int, int, int]) -> None:
        if self.n == len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
        self.a[self.n] = row
        self.n += 1

    def view(self) -> np.ndarray:
        return self.a[: self.n]


class _Placed:
    """Placed blocks, indexed for the query "which blocks are live at some time in [s, e)".

    Blocks that live longer than ``long_cut`` are few and scanned whole; the others sit in buckets by start
    time, and a query scans only the buckets that can hold a block overlapping [s, e).
    """

    def __init__(self, horizon: int) -> None:
        self.long_cut = max(1, horizon // 32)
        self.width = max(1, self.long_cut // 2)
        self.long = _Rows()
        self.buckets: dict[int, _Rows] = {}

    def add(self, s: int, e: int, off: int, size: int) -> None:
        if e - s > self.long_cut:
            self.long.add((s, e, off, size))
        else:
            self.buckets.setdefault(s // self.width, _Rows()).add((s, e, off, size))

    def overlapping(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (offsets, ends in address) of the placed blocks live at some time in [s, e)."""
        parts = [self.long.view()]
        for b in range((s - self.long_cut) // self.width, (e - 1) // self.width + 1):
            rows = self.buckets.get(b)
            if rows is not None:
                parts.append(rows.view())
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        m = (rows[:, 0] < e) & (rows[:, 1] > s)
        sel = rows[m]
        return sel[:, 2], sel[:, 2] + sel[:, 3]


def best_fit_offset(offs: np.ndarray, ends: np.ndarray, size: int) -> int:
    """The address of the smallest gap of at least ``size`` among the blocks [offs, ends), or the top."""
    if len(offs) == 0:
        return 0
    order = np.argsort(offs, kind="stable")
    o = offs[order]
    top = np.maximum.accumulate(ends[order])
    # Gap k lies between the end of blocks 0..k-1 and the start of block k (gap 0 starts at address 0).
    gap_start = np.concatenate(([0], top[:-1]))
    gap_len = o - gap_start
    ok = np.flatnonzero(gap_len >= size)
    if len(ok) == 0:
        return int(top[-1])
    best = ok[np.argmin(gap_len[ok])]  # argmin returns the first (lowest address) on a tie
    return int(gap_start[best])


BEST_OF_TWO_MAX = 5000

ORDERS = {
    "size": lambda r: (-r.bytes, -(live_end(r) - r.start_ns), r.start_ns),
    "lifetime": lambda r: (-(live_end(r) - r.start_ns), -r.bytes, r.start_ns),
    "area": lambda r: (-r.bytes * (live_end(r) - r.start_ns), -r.bytes, r.start_ns),
    "start": lambda r: (r.start_ns, -r.bytes),
}


def assign_offsets(
    residencies: Iterable[Residency], tier: str = "hbm", order: str = "best"
) -> dict[str, int | list[int]]:
    """Return an offset for every ``tier`` allocation of the timeline, by best fit in the given order.

    ``order``: ``size`` (largest first, longer-lived first on a tie), ``area`` (largest size x lifetime first),
    ``lifetime``, ``start`` (in time order, as an allocator would), or ``best``: ``size`` and ``area``, whichever
    gives the lower height (only ``size`` above ``BEST_OF_TWO_MAX`` allocations).
    """
    residencies = list(residencies)
    if order == "best":
        # Both orders on timelines up to BEST_OF_TWO_MAX allocations; on larger ones (seconds each) only by size.
        orders = ("size", "area") if len(residencies) <= BEST_OF_TWO_MAX else ("size",)
        tries = [assign_offsets(residencies, tier, o) for o in orders]
        return min(tries, key=lambda offs: offsets_height(residencies, offs, tier))
    inst = residency_instances(residencies, tier)
    if not inst:
        return {}
    horizon = max(live_end(r) for r, _ in inst) - min(r.start_ns for r, _ in inst)
    placed = _Placed(horizon)
    result: dict[tuple[str, int], int] = {}
    key = ORDERS[order]
    order = sorted(range(len(inst)), key=lambda i: key(inst[i][0]) + (inst[i][0].name, inst[i][1]))
    for i in order:
        r, k = inst[i]
        end = live_end(r)
        if end <= r.start_ns:
            result[(r.name, k)] = 0
            continue
        offs, ends = placed.overlapping(r.start_ns, end)
        off = best_fit_offset(offs, ends, r.bytes)
        placed.add(r.start_ns, end, off, r.bytes)
        result[(r.name, k)] = off
    out: dict[str, list[int]] = {}
    for (name, _k), off in sorted(result.items()):
        out.setdefault(name, []).append(off)
    return {name: (v[0] if len(v) == 1 else v) for name, v in out.items()}


def offsets_height(residencies: Iterable[Residency], offsets: dict, tier: str = "hbm") -> int:
    """The highest address end the offsets reach on ``tier``."""
    from planner.allocator import offset_of

    h = 0
    for r, k in residency_instances(residencies, tier):
        off = offset_of(offsets, r.name, k)
        if off is not None and live_end(r) > r.start_ns:
            h = max(h, off + r.bytes)
    return h


__all__ = ["ORDERS", "assign_offsets", "best_fit_offset", "offsets_height"]
