"""What the executor returns: when every step ran, what was resident where, what went wrong."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class StepTiming:
    start_ns: int
    end_ns: int
    channel: int = 0

    def __init__(self, start_ns: int, end_ns: int, channel: int = 0) -> None:
        # The dataclass's own __init__ of a frozen class sets each field through object.__setattr__; the executor
        # makes one of these per step, and one Residency per allocation (hundreds of thousands on large plans),
        # so both write their fields straight into the instance dict instead. Keep in step with the fields.
        d = self.__dict__
        d["start_ns"] = start_ns
        d["end_ns"] = end_ns
        d["channel"] = channel


@dataclass(frozen=True)
class Residency:
    """One allocation on a tier: a tensor copy (or an op's workspace) from ``start_ns`` to ``end_ns``."""

    tier: str
    name: str
    kind: str
    bytes: int
    start_ns: int
    end_ns: int
    until_end: bool = False  # still held when the step ends (end_ns is then the makespan)
    seq: int = 0  # allocation order in the replay: breaks ties between allocations at the same time

    def __init__(self, tier: str, name: str, kind: str, bytes: int, start_ns: int, end_ns: int,
                 until_end: bool = False, seq: int = 0) -> None:
        # As StepTiming's: the fields straight into the instance dict. Keep in step with the fields.
        d = self.__dict__
        d["tier"] = tier
        d["name"] = name
        d["kind"] = kind
        d["bytes"] = bytes
        d["start_ns"] = start_ns
        d["end_ns"] = end_ns
        d["until_end"] = until_end
        d["seq"] = seq


class StepTimes(Sequence[StepTiming]):
    """Every step's ``StepTiming``, kept as three lists of ints and made into objects when read.

    A 350k-step plan held as objects cost the executor about a fifth of its run: making them, and the cyclic
    garbage collector's scan of them once it runs again. Reads, iteration, slices and equality behave as the tuple
    of objects did.
    """

    __slots__ = ("starts", "ends", "channels")

    def __init__(self, starts: list[int], ends: list[int], channels: list[int]) -> None:
        self.starts, self.ends, self.channels = starts, ends, channels

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(map(StepTiming, self.starts[i], self.ends[i], self.channels[i]))
        return StepTiming(self.starts[i], self.ends[i], self.channels[i])

    def __iter__(self) -> Iterator[StepTiming]:
        return map(StepTiming, self.starts, self.ends, self.channels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepTimes):
            return (self.starts, self.ends, self.channels) == (other.starts, other.ends, other.channels)
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((tuple(self.starts), tuple(self.ends), tuple(self.channels)))

    def __repr__(self) -> str:
        return f"StepTimes({len(self)} steps)"


class Residencies(Sequence[Residency]):
    """Every allocation's ``Residency``, kept as arrays (tier, allocation, start, end, held until the end,
    sequence number) with the names, kinds and sizes they index, and made into objects when read (as
    ``StepTimes``; 330k residencies on a 38.8k-op plan). ``columns`` gives one tier's as lists, for the passes
    over every allocation (offsets, their checks)."""

    __slots__ = ("tier_names", "names", "kinds", "sizes", "tier", "aid", "start", "end", "until_end", "seq")

    def __init__(self, tier_names: list[str], names: list[str], kinds: list[str], sizes: list[int],
                 tier: np.ndarray, aid: np.ndarray, start: np.ndarray, end: np.ndarray, until_end: np.ndarray,
                 seq: np.ndarray) -> None:
        self.tier_names, self.names, self.kinds, self.sizes = tier_names, names, kinds, sizes
        self.tier, self.aid, self.start, self.end, self.until_end, self.seq = tier, aid, start, end, until_end, seq

    def __len__(self) -> int:
        return len(self.aid)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self._objects(np.arange(len(self))[i]))
        if not -len(self) <= i < len(self):
            raise IndexError("residency index out of range")
        a = int(self.aid[i])
        return Residency(self.tier_names[self.tier[i]], self.names[a], self.kinds[a], self.sizes[a], int(self.start[i]),
                         int(self.end[i]), bool(self.until_end[i]), int(self.seq[i]))

    def __iter__(self) -> Iterator[Residency]:
        return self._objects(None)

    def _objects(self, rows: np.ndarray | None) -> Iterator[Residency]:
        pick = (lambda x: x) if rows is None else (lambda x: x[rows])
        tiers, names, kinds, sizes = self.tier_names, self.names, self.kinds, self.sizes
        for k, a, st, en, until, seq in zip(pick(self.tier).tolist(), pick(self.aid).tolist(),
                                            pick(self.start).tolist(), pick(self.end).tolist(),
                                            pick(self.until_end).tolist(), pick(self.seq).tolist()):
            yield Residency(tiers[k], names[a], kinds[a], sizes[a], st, en, until, seq)

    def columns(self, tier: str) -> tuple[list[str], list[int], list[int], list[bool], list[int]]:
        """The residencies on ``tier`` as lists: (names, bytes, starts, ends, held until the end), in sequence
        order."""
        if tier not in self.tier_names:
            return [], [], [], [], []
        rows = self.tier == self.tier_names.index(tier)
        aid = self.aid[rows].tolist()
        names, sizes = self.names, self.sizes
        return ([names[a] for a in aid], [sizes[a] for a in aid], self.start[rows].tolist(), self.end[rows].tolist(),
                self.until_end[rows].tolist())

    def live_at(self, tier: str, at_ns: int) -> list[Residency]:
        """The residencies on ``tier`` held at ``at_ns`` (start <= at_ns < end), in sequence order: a mask over the
        arrays, objects made only for the few it keeps (a pass over every compaction of a 20,000-op plan made 12
        million, 15 s)."""
        if tier not in self.tier_names:
            return []
        rows = np.flatnonzero((self.tier == self.tier_names.index(tier)) & (self.start <= at_ns) & (at_ns < self.end))
        return list(self._objects(rows))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Residencies({len(self)} allocations)"


@dataclass(frozen=True)
class Violation:
    kind: str
    time_ns: int
    message: str
    step: int | None = None
    op: str | None = None
    tensor: str | None = None

    def describe(self) -> str:
        where = []
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.op:
            where.append(f"op {self.op!r}")
        if self.tensor:
            where.append(f"tensor {self.tensor!r}")
        return f"[{self.kind}] t={self.time_ns / 1000:.3f}us {' '.join(where)}: {self.message}"


@dataclass(frozen=True)
class Metrics:
    makespan_ns: int
    compute_ns: int
    stall_ns: int
    peak_bytes: dict[str, int]
    bytes_moved: dict[str, int]
    transfer_ns: int
    hidden_transfer_ns: int
    defrag_events: int = 0
    defrag_ns: int = 0
    fragmentation_failures: int = 0
    offset_height_bytes: int | None = None
    # Who placed the HBM allocations: "static" (the plan's offsets), "caching" (the caching allocator model; then
    # offset_height_bytes is its high-water address), or "none" (simulate(..., allocator=False)).
    allocator: str = "caching"
    # The part of compute_ns spent re-running ops (recompute steps).
    recompute_ns: int = 0

    @property
    def speed_key(self) -> tuple[int, int]:
        """Sort key of plans, faster first: the makespan, then the bytes moved (as fast with less traffic is
        better)."""
        return self.makespan_ns, sum(self.bytes_moved.values())

    @property
    def hidden_share(self) -> float:
        """Share of transfer time that overlaps compute (1.0 when nothing moves)."""
        return 1.0 if self.transfer_ns == 0 else self.hidden_transfer_ns / self.transfer_ns

    def to_dict(self) -> dict:
        return {
            "makespan_us": self.makespan_ns / 1000,
            "compute_us": self.compute_ns / 1000,
            "recompute_us": self.recompute_ns / 1000,
            "stall_us": self.stall_ns / 1000,
            "peak_bytes": dict(sorted(self.peak_bytes.items())),
            "bytes_moved": dict(sorted(self.bytes_moved.items())),
            "transfer_us": self.transfer_ns / 1000,
            "hidden_transfer_share": round(self.hidden_share, 6),
            "defrag_events": self.defrag_events,
            "defrag_us": self.defrag_ns / 1000,
            "fragmentation_failures": self.fragmentation_failures,
            "offset_height_bytes": self.offset_height_bytes,
            "allocator": self.allocator,
        }


@dataclass(frozen=True)
class Timeline:
    steps: Sequence[StepTiming]  # a StepTimes when the executor made it
    residencies: Sequence[Residency]  # a Residencies when the executor made it
    metrics: Metrics
    violations: tuple[Violation, ...] = field(default_factory=tuple)
    # The steps whose HBM allocation made the caching allocator compact (``Metrics.defrag_events`` of them; none
    # before the step's first): where a planner looks for what fragments HBM (planner/defrag.py).
    compactions: tuple[int, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.violations


def peak_of_intervals(intervals: Iterable[tuple[int, int | None, int]]) -> tuple[int, int]:
    """Return (the most bytes live at once, the first time that many are) over intervals ``(start, end, bytes)``,
    live on [start, end); ``end`` None is live to the end. Ends count before starts at the same time, as the
    executor frees before it allocates, so back-to-back intervals do not add up. Empty: (0, 0)."""
    events = []
    for start, end, size in intervals:
        if end is None or end > start:
            events.append((start, 1, size))
            if end is not None:
                events.append((end, 0, -size))
    events.sort()
    cur = best = when = 0
    for time_ns, _order, delta in events:
        cur += delta
        if cur > best:
            best, when = cur, time_ns
    return best, when
