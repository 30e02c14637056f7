"""HBM address-space models: a framework-style caching allocator and the check of static offsets.

The executor tracks bytes per tier; this module adds where in HBM each allocation sits.

* ``CachingAllocator`` models a framework's device allocator at run time: one arena of the HBM budget, **best
  fit** (the smallest free block that fits, the lowest address on a tie), **block splitting** (the rest of the
  block stays free) and **coalescing** of a freed block with its free neighbours, as PyTorch's CUDA caching
  allocator does within a segment. What it does when no free block is large enough although the free bytes add
  up to enough (a *fragmentation failure*) is **not** PyTorch's: PyTorch never moves a live block; it frees its
  cached, unused segments and retries, then raises out-of-memory (``DeviceCachingAllocator::malloc`` in
  ``c10/cuda/CUDACachingAllocator.cpp``). This model instead compacts (a *defragmentation event*): every live
  block moves down to the lowest addresses, in address order, and the allocation is retried; moving a block
  reads and writes it once, so an event costs ``2 * bytes moved / HBM bandwidth``. That is the behaviour the
  HyperOffload paper measures on its platform (MindSpore on Ascend: "defragmentation events 57 -> 0", each a
  stall of the step), and it lets a plan that would fail under PyTorch still be timed, with the price of its
  fragmentation in the makespan. ``Metrics.fragmentation_failures`` counts the allocations that found no room in
  the arena without moving a live block (where PyTorch, out of cached segments to release, raises
  out-of-memory). An allocation larger than all free bytes together is over capacity (the executor reports
  that as a ``capacity`` violation); the allocator places it above the arena and counts it as an overflow.
* ``check_offsets`` checks a plan's static offsets: every HBM allocation has one, no two allocations that are
  live at the same time overlap in address, and none ends above the HBM capacity.

Times are the executor's integer nanoseconds; intervals are half-open ``[start, end)`` (a free at a time comes
before an allocation at the same time, as in the executor).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from planner import allocator_kernel
from planner.hardware import HBM
from planner.timeline import Residency, Violation

ALLOC, FREE = 1, -1


class AllocRecord(NamedTuple):
    """One entry of the executor's HBM allocation log, in the order the executor replayed them."""

    time_ns: int
    op: int  # ALLOC or FREE
    name: str
    bytes: int
    step: int | None = None  # the program step whose start made the allocation (None: before the step)


@dataclass(frozen=True)
class DefragEvent:
    """A compaction forced by a fragmentation failure."""

    time_ns: int
    step: int | None
    name: str  # the allocation that failed
    requested: int
    free_bytes: int
    largest_free: int
    bytes_moved: int
    cost_ns: int


@dataclass(frozen=True)
class AllocatorReport:
    fragmentation_failures: int
    defrags: tuple[DefragEvent, ...]
    high_water_bytes: int  # the highest address end any block reached
    overflows: int  # allocations larger than all free bytes (over capacity)

    @property
    def defrag_ns(self) -> int:
        return sum(d.cost_ns for d in self.defrags)


class CachingAllocator:
    """Best-fit allocator with splitting, coalescing and compaction on demand, over ``[0, capacity)``."""

    def __init__(self, capacity: int, hbm_bandwidth_Bps: float = 1.6e12, alignment: int = 1) -> None:
        self.capacity = int(capacity)
        self.bandwidth = float(hbm_bandwidth_Bps)
        self.alignment = max(1, int(alignment))
        self.free_start: dict[int, int] = {}  # start -> size
        self.free_end: dict[int, int] = {}  # end -> start
        # Free blocks by (size, start), sorted, each kept as the int size * key + start (key: above every start):
        # ints compare and insert faster than tuples, and the replay does it for every allocation and free.
        self.key = self.capacity + 1
        self.by_size: list[int] = []
        # Live blocks in the arena: name -> slot of arrays of starts and sizes (and whether the slot is live), so
        # that a compaction moves them all at once in numpy. Lists between compactions cost a list-to-array copy of
        # every block per compaction: 742 compactions of ~100k blocks, 7 s, on the 38.8k-op graph's first plan;
        # numpy's per-element access costs tens of ms per 100k allocations instead.
        self._slot: dict[str, int] = {}
        self._starts = np.zeros(1024, dtype=np.int64)
        self._sizes = np.zeros(1024, dtype=np.int64)
        self._live = np.zeros(1024, dtype=bool)
        self._used = 0  # slots handed out so far
        self._spare: list[int] = []  # freed slots
        self.overflow: dict[str, tuple[int, int]] = {}  # name -> (start, size) above the arena
        self.free_bytes = 0
        self.high_water = 0
        self.failures = 0
        self.overflows = 0
        self.defrags: list[DefragEvent] = []
        if self.capacity > 0:
            self._add_free(0, self.capacity)

    @property
    def blocks(self) -> dict[str, tuple[int, int]]:
        """Live blocks in the arena: name -> (start, size)."""
        return {name: (self._starts.item(s), self._sizes.item(s)) for name, s in self._slot.items()}

    def _put(self, name: str, start: int, size: int) -> None:
        if self._spare:
            slot = self._spare.pop()
        else:
            slot = self._used
            self._used += 1
            if slot == len(self._starts):
                grow = len(self._starts)
                self._starts = np.concatenate([self._starts, np.zeros(grow, dtype=np.int64)])
                self._sizes = np.concatenate([self._sizes, np.zeros(grow, dtype=np.int64)])
                self._live = np.concatenate([self._live, np.zeros(grow, dtype=bool)])
        self._starts[slot] = start
        self._sizes[slot] = size
        self._live[slot] = True
        self._slot[name] = slot

    # -- the free list
    def _add_free(self, start: int, size: int) -> None:
        self.free_start[start] = size
        self.free_end[start + size] = start
        bisect.insort(self.by_size, size * self.key + start)
        self.free_bytes += size

    def _remove_free(self, start: int) -> int:
        size = self.free_start.pop(start)
        del self.free_end[start + size]
        i = bisect.bisect_left(self.by_size, size * self.key + start)
        del self.by_size[i]
        self.free_bytes -= size
        return size

    def _round(self, n: int) -> int:
        a = self.alignment
        return n if a == 1 else -(-n // a) * a

    # -- the interface
    def alloc(self, name: str, nbytes: int, time_ns: int = 0, step: int | None = None) -> int:
        """Allocate ``nbytes`` for ``name``; return its address (compacting first when fragmentation demands)."""
        size = nbytes if self.alignment == 1 else self._round(nbytes)
        key = self.key
        i = bisect.bisect_left(self.by_size, size * key)  # the smallest free block of at least size, lowest first
        if i == len(self.by_size):
            if self.free_bytes >= size:
                self.failures += 1
                largest = self.by_size[-1] // key if self.by_size else 0
                free_before = self.free_bytes
                moved = self._compact()
                cost = math.ceil(2 * moved / self.bandwidth * 1e9) if moved else 0
                self.defrags.append(DefragEvent(time_ns, step, name, size, free_before, largest, moved, cost))
                i = bisect.bisect_left(self.by_size, size * key)
            else:
                self.overflows += 1
                top = max([self.capacity] + [s + z for s, z in self.overflow.values()])
                self.overflow[name] = (top, size)
                self.high_water = max(self.high_water, top + size)
                return top
        # The free list's helpers, inline: alloc and free run once per allocation record (100k+ on large plans).
        by_size = self.by_size
        fsize, start = divmod(by_size[i], key)
        del by_size[i]
        del self.free_start[start]
        del self.free_end[start + fsize]
        self.free_bytes -= size
        if fsize > size:
            rest = start + size
            self.free_start[rest] = fsize - size
            self.free_end[start + fsize] = rest
            bisect.insort(by_size, (fsize - size) * key + rest)
        self._put(name, start, size)
        if start + size > self.high_water:
            self.high_water = start + size
        return start

    def free(self, name: str) -> None:
        if name in self.overflow:
            del self.overflow[name]
            return
        slot = self._slot.pop(name)
        self._spare.append(slot)
        self._live[slot] = False
        start, size = self._starts.item(slot), self._sizes.item(slot)
        end = start + size
        free_start, free_end, by_size, key = self.free_start, self.free_end, self.by_size, self.key
        self.free_bytes += size
        below = free_end.pop(start, None)
        if below is not None:  # a free neighbour below: merge it (the free list's helpers, inline)
            z = free_start.pop(below)
            del by_size[bisect.bisect_left(by_size, z * key + below)]
            size += z
            start = below
        z = free_start.pop(end, None)
        if z is not None:  # a free neighbour above
            del free_end[end + z]
            del by_size[bisect.bisect_left(by_size, z * key + end)]
            size += z
        free_start[start] = size
        free_end[start + size] = start
        bisect.insort(by_size, size * key + start)

    def _compact(self) -> int:
        """Move every live block down, in address order; return the bytes moved."""
        cur = moved = 0
        if self._slot:
            slots = np.flatnonzero(self._live)
            starts = self._starts[slots]
            order = np.argsort(starts, kind="stable")  # live blocks never share a start
            slots, starts = slots[order], starts[order]
            sizes = self._sizes[slots]
            new = np.cumsum(sizes) - sizes
            moved = int(sizes[starts != new].sum())
            cur = int(sizes.sum())
            self._starts[slots] = new
        self.free_start.clear()
        self.free_end.clear()
        self.by_size.clear()
        self.free_bytes = 0
        if cur < self.capacity:
            self._add_free(cur, self.capacity - cur)
        return moved

    def report(self) -> AllocatorReport:
        return AllocatorReport(self.failures, tuple(self.defrags), self.high_water, self.overflows)


def replay_caching(
    log: Iterable[AllocRecord | tuple[int, int, str, int, int | None]], capacity: int, hbm_bandwidth_Bps: float,
    alignment: int = 1, compiled: bool = True,
) -> AllocatorReport:
    """Replay an allocation log (``AllocRecord``s, or tuples of its fields) through a ``CachingAllocator`` and
    return what it counted (``compiled``: long logs through ``allocator_kernel``, the same report)."""
    if not isinstance(log, list):
        log = list(log)
    if compiled and len(log) > COMPILED_MIN:
        return _replay_compiled(log, capacity, hbm_bandwidth_Bps, alignment)
    a = CachingAllocator(capacity, hbm_bandwidth_Bps, alignment)
    alloc, free, live, overflow = a.alloc, a.free, a._slot, a.overflow
    for time_ns, op, name, nbytes, step in log:
        if op == ALLOC:
            alloc(name, nbytes, time_ns, step)
        elif name in live or name in overflow:
            free(name)
    return a.report()


# Logs of more records than this replay in the compiled loop (``allocator_kernel``: the same report), up to
# COMPILED_MAX_DEFRAGS compactions (then the Python replay runs instead: its compactions are faster). Once compiled
# (once per install) the loop costs a load of about 0.2 s per process and then a tenth of the Python replay's time
# a run: 5.5 -> 0.5 ms on the 4,044-record log of deepseek-v3-nsa-64k-L3-1layer at 60%, 53 -> 2.9 ms on the
# 36,159 of the 20k-op generated graph. Planners run the executor tens to hundreds of times on such plans.
COMPILED_MIN = 2_000
COMPILED_MAX_DEFRAGS = 32


def _replay_compiled(log: list, capacity: int, hbm_bandwidth_Bps: float, alignment: int) -> AllocatorReport:
    """``replay_caching`` through ``allocator_kernel.replay``, on the log as arrays (allocation names as ids)."""
    times, ops, names, nbytes, steps = zip(*log)
    ids: dict[str, int] = {}
    setdefault = ids.setdefault
    aids = [setdefault(n, len(ids)) for n in names]
    return replay_caching_columns(
        np.array(times, dtype=np.int64), np.array(ops, dtype=np.int64), np.array(aids, dtype=np.int64),
        np.array(nbytes, dtype=np.int64), np.array([-1 if x is None else x for x in steps], dtype=np.int64),
        list(ids), capacity, hbm_bandwidth_Bps, alignment)


def replay_caching_columns(
    times: np.ndarray, ops: np.ndarray, ids: np.ndarray, sizes: np.ndarray, steps: np.ndarray, names: Sequence[str],
    capacity: int, hbm_bandwidth_Bps: float, alignment: int = 1,
) -> AllocatorReport:
    """``replay_caching`` on a log given as int64 arrays, one entry per record: time, ``ALLOC`` or ``FREE``,
    allocation id (an index into ``names``), bytes, step (-1: before the step). Compiled when the log is long. The
    executor's log comes this way: a tuple per record, made only to be taken apart again, was a quarter of its run
    with the allocator model on the 38.8k-op plan."""
    if len(ids) <= COMPILED_MIN:
        return replay_caching(
            zip(times.tolist(), ops.tolist(), [names[x] for x in ids.tolist()], sizes.tolist(),
                [None if x < 0 else x for x in steps.tolist()]), capacity, hbm_bandwidth_Bps, alignment, compiled=False)
    a = max(1, int(alignment))
    if a > 1:
        sizes = -(-sizes // a) * a
    failures, high_water, overflows, defrags = allocator_kernel.replay(
        times, ops, ids, sizes, steps, len(names), int(capacity), float(hbm_bandwidth_Bps), COMPILED_MAX_DEFRAGS)
    if failures < 0:
        return replay_caching(
            zip(times.tolist(), ops.tolist(), [names[x] for x in ids.tolist()], sizes.tolist(),
                [None if x < 0 else x for x in steps.tolist()]), capacity, hbm_bandwidth_Bps, 1, compiled=False)
    events = tuple(DefragEvent(int(times[k]), None if steps[k] < 0 else int(steps[k]), names[ids[k]],
                               int(sizes[k]), free_before, largest, moved, cost)
                   for k, free_before, largest, moved, cost in defrags.tolist())
    return AllocatorReport(int(failures), events, int(high_water), int(overflows))


def live_end(r: Residency) -> int:
    """The end of ``r``'s live interval: its end, or one past its start for a copy still held at the step's end
    that was allocated at the very end (the executor counts those, so the address checks do too)."""
    return live_end_ns(r.start_ns, r.end_ns, r.until_end)


def live_end_ns(start: int, end: int, until_end: bool) -> int:
    """``live_end`` of a residency given as columns (start, end, held until the step's end)."""
    return end if end > start or not until_end else start + 1


def residency_instances(residencies: Iterable[Residency], tier: str = HBM) -> list[tuple[Residency, int]]:
    """Return the ``tier`` residencies with their instance number: the k-th residency of a name, by start."""
    count: dict[str, int] = {}
    out = []
    for r in sorted([r for r in residencies if r.tier == tier], key=attrgetter("start_ns", "end_ns", "name")):
        k = count.get(r.name, 0)
        count[r.name] = k + 1
        out.append((r, k))
    return out


def offset_of(offsets: Mapping[str, int | Sequence[int]], name: str, instance: int) -> int | None:
    """The offset a plan gives the ``instance``-th residency of ``name`` (an int applies to every instance)."""
    v = offsets.get(name)
    if v is None:
        return None
    if isinstance(v, int):
        return v
    return int(v[instance]) if instance < len(v) else None


def check_offsets(
    residencies: Iterable[Residency], offsets: Mapping[str, int | Sequence[int]], capacity: int, tier: str = HBM
) -> tuple[list[Violation], int]:
    """Check static offsets against the executed residencies; return (violations, offset height).

    Violations: ``offset_missing`` (an allocation with no offset), ``capacity`` (offset + bytes over the
    capacity), ``offset_overlap`` (two allocations live at the same time share addresses; one violation per
    allocation that overlaps one already live). Allocations of zero duration are not checked.
    """
    violations: list[Violation] = []
    names, sizes, r_starts, r_ends, held = tier_columns(residencies, tier)
    rows: list[int] = []
    offs: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    get = offsets.get
    # residency_instances and offset_of, inline: this loop runs once per HBM allocation (100k+ on large plans).
    count: dict[str, int] = {}
    for j in sorted(range(len(names)), key=lambda j: (r_starts[j], r_ends[j], names[j])):
        name = names[j]
        k = count.get(name, 0)
        count[name] = k + 1
        start, end = r_starts[j], live_end_ns(r_starts[j], r_ends[j], held[j])
        if end <= start:  # zero duration: not checked
            continue
        v = get(name)
        off = v if v is None or isinstance(v, int) else int(v[k]) if k < len(v) else None
        if off is None or off < 0:
            tensor, op = _tensor_or_op(name)
            violations.append(Violation("offset_missing", start, f"no HBM offset for allocation #{k} of "
                                        f"{name!r}", tensor=tensor, op=op))
            continue
        if off + sizes[j] > capacity:
            tensor, op = _tensor_or_op(name)
            violations.append(Violation(
                "capacity", start,
                f"offset {off} + {sizes[j]} B ends at {off + sizes[j]} B, above the {tier} capacity of {capacity} B",
                tensor=tensor, op=op,
            ))
        rows.append(j)
        offs.append(off)
        starts.append(start)
        ends.append(end)
    tops = [off + sizes[j] for j, off in zip(rows, offs)]
    height = max(tops, default=0)
    # Sweep in time; frees before allocations at equal times. An event is its item's index (an allocation) or its
    # complement (a free).
    n = len(rows)
    idx = np.arange(n, dtype=np.int64)
    order = np.lexsort((
        np.concatenate((idx, idx)), np.concatenate((np.ones(n, dtype=np.int8), np.zeros(n, dtype=np.int8))),
        np.array(starts + ends, dtype=np.int64),
    ))
    events = np.where(order < n, order, ~(order - n)).tolist()
    if not _disjoint(events, offs, tops):
        items = [(Residency(tier, names[j], "", sizes[j], r_starts[j], r_ends[j], held[j]), off)
                 for j, off in zip(rows, offs)]
        violations += _overlaps(events, items)
    return violations, height


def tier_columns(residencies: Iterable[Residency], tier: str) -> tuple[list[str], list[int], list[int], list[int],
                                                                        list[bool]]:
    """The ``tier`` residencies as lists: (names, bytes, starts, ends, held until the end). From the executor's
    ``Residencies`` without making an object per allocation."""
    columns = getattr(residencies, "columns", None)
    if columns is not None:
        return columns(tier)
    rs = [r for r in residencies if r.tier == tier]
    return ([r.name for r in rs], [r.bytes for r in rs], [r.start_ns for r in rs], [r.end_ns for r in rs],
            [r.until_end for r in rs])


def _tensor_or_op(name: str) -> tuple[str | None, str | None]:
    """A Violation's (tensor, op) for an allocation: a tensor, or the op of a ``workspace:OP``."""
    return (None, name[len("workspace:"):]) if name.startswith("workspace:") else (name, None)


def _disjoint(events: list[int], offs: list[int], tops: list[int], load: int = 256) -> bool:
    """True when no allocation overlaps (in address) one live when it is made: ``_overlaps`` would find nothing.

    While the live blocks are disjoint, only the live block just below an allocation's offset and the one just
    above can overlap it. They are kept sorted by offset in chunks of at most ``2 * load`` (offsets are unique
    among disjoint blocks of positive size): a single sorted list of tens of thousands of live blocks spent most
    of the check moving its entries on each insertion.
    """
    chunks: list[list[int]] = []  # sorted, non-empty
    maxes: list[int] = []  # each chunk's last offset
    top_at: dict[int, int] = {}  # live offset -> its end address
    bisect_left = bisect.bisect_left
    for idx in events:
        if idx < 0:
            off = offs[~idx]
            c = bisect_left(maxes, off)
            chunk = chunks[c]
            j = bisect_left(chunk, off)
            del chunk[j]
            del top_at[off]
            if not chunk:
                del chunks[c]
                del maxes[c]
            elif j == len(chunk):
                maxes[c] = chunk[-1]
            continue
        off = offs[idx]
        c = bisect_left(maxes, off)
        top = tops[idx]
        if c < len(chunks):
            chunk = chunks[c]
            j = bisect_left(chunk, off)
            if chunk[j] < top:  # the block at or above ``off``
                return False
            below = chunk[j - 1] if j else (maxes[c - 1] if c else None)
        else:
            chunk = None
            below = maxes[-1] if maxes else None
        if below is not None and top_at[below] > off:
            return False
        top_at[off] = top
        if chunk is None:
            if chunks:
                chunks[-1].append(off)
                maxes[-1] = off
                c = len(chunks) - 1
            else:
                chunks.append([off])
                maxes.append(off)
                continue
        else:
            chunk.insert(j, off)
        chunk = chunks[c]
        if len(chunk) > 2 * load:
            chunks[c:c + 1] = [chunk[:load], chunk[load:]]
            maxes[c:c + 1] = [chunk[load - 1], chunk[-1]]
    return True


def _overlaps(events: list[int], items: list[tuple[Residency, int]]) -> list[Violation]:
    """The ``offset_overlap`` violations of ``check_offsets``, from its time-ordered events (item index: an
    allocation; its complement: a free)."""
    violations: list[Violation] = []
    live: list[tuple[int, int, int]] = []  # (offset, end address, idx)
    max_size = max((r.bytes for r, _ in items), default=0)
    # Live allocations that overlapped another when they started. While there are none, the live blocks are
    # disjoint, so sorted by offset their ends are sorted too and only the block just below can reach ``off``:
    # the backward scan below (the same answer) is needed only then, and was quadratic on large timelines.
    clashing: set[int] = set()
    for e in events:
        idx = e if e >= 0 else ~e
        r, off = items[idx]
        key = (off, off + r.bytes, idx)
        if e < 0:
            j = bisect.bisect_left(live, key)
            if j < len(live) and live[j] == key:
                del live[j]
                clashing.discard(idx)
            continue
        j = bisect.bisect_left(live, key)
        clash = None
        if j < len(live) and live[j][0] < off + r.bytes:
            clash = live[j]
        if clash is None and not clashing:
            if j > 0 and live[j - 1][1] > off:
                clash = live[j - 1]
        else:
            k = j - 1
            while clash is None and k >= 0 and live[k][0] > off - max_size:
                if live[k][1] > off:
                    clash = live[k]
                k -= 1
        if clash is not None:
            clashing.add(idx)
        if clash is not None:
            other = items[clash[2]][0]
            tensor, op = _tensor_or_op(r.name)
            violations.append(Violation(
                "offset_overlap", r.start_ns,
                f"HBM [{off}, {off + r.bytes}) overlaps {other.name!r} at [{clash[0]}, {clash[1]}), live since "
                f"{other.start_ns / 1000:.3f}us",
                tensor=tensor, op=op,
            ))
        live.insert(j, key)
    return violations


__all__ = [
    "ALLOC", "FREE", "AllocRecord", "AllocatorReport", "CachingAllocator", "DefragEvent", "check_offsets",
    "live_end", "live_end_ns", "offset_of", "replay_caching", "replay_caching_columns", "residency_instances",
    "tier_columns",
]
