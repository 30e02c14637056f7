"""What the executor returns: when every step ran, what was resident where, what went wrong."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


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
    steps: tuple[StepTiming, ...]
    residencies: tuple[Residency, ...]
    metrics: Metrics
    violations: tuple[Violation, ...] = field(default_factory=tuple)

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
