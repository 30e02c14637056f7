"""Cost model: how long an op or a transfer takes, in integer nanoseconds.

Integer time keeps the executor exact and its output byte-identical across runs and machines.
"""

from __future__ import annotations

import math

from planner.graph import Graph, Op
from planner.hardware import Hardware, Link

NS_PER_S = 1_000_000_000


def op_duration_ns(op: Op, hw: Hardware) -> int:
    """Return the op's duration: its measured duration if the graph gives one, else a roofline estimate.

    Roofline: max(flops / peak_flops, bytes_accessed / hbm_bandwidth) plus the launch overhead.
    """
    if op.duration_s is not None:
        seconds = op.duration_s
    else:
        seconds = max(op.flops / hw.peak_flops, op.bytes_accessed / hw.hbm_bandwidth_Bps) + hw.launch_overhead_s
    return _ceil_ns(seconds)


def _ceil_ns(seconds: float) -> int:
    """Round up to whole ns, ignoring float noise (360 * 1e-5 s is 3600000 ns, not 3600001)."""
    return max(1, math.ceil(round(seconds * NS_PER_S, 6)))


def transfer_duration_ns(nbytes: int, link: Link) -> int:
    """Return latency + bytes / bandwidth for one transfer on one channel of ``link``."""
    return _ceil_ns(link.latency_s + nbytes / link.bandwidth_Bps)


def op_durations_ns(graph: Graph, hw: Hardware) -> dict[str, int]:
    """Return every op's duration, by op name (a new dict: the caller may change it)."""
    return dict(_durations(graph, hw))


def _durations(graph: Graph, hw: Hardware) -> dict[str, int]:
    """Every op's duration, computed once per graph and compute model (kept in ``graph.home_free``: durations do
    not depend on homes). Every executor run needs them, and on a 20k-op graph computing them was a quarter of a
    run without the allocator model."""
    key = ("op_durations_ns", hw.peak_flops, hw.hbm_bandwidth_Bps, hw.launch_overhead_s)
    got = graph.home_free.get(key)
    if got is None:
        got = graph.home_free[key] = {op.name: op_duration_ns(op, hw) for op in graph.ops}
    return got
