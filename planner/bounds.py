"""Lower bounds that hold for every plan, so every reported gap is against something true."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import op_durations_ns
from planner.graph import Graph
from planner.hardware import Hardware


@dataclass(frozen=True)
class Bound:
    """A lower bound on a metric, with the reason it holds."""

    metric: str
    value: float
    reason: str


def largest_working_set(graph: Graph) -> tuple[int, str]:
    """Return (bytes, op name) of the op whose inputs, outputs, updates and workspace are largest.

    No plan can run with less HBM than this, whatever the order or the offloading.
    """
    best = max(graph.ops, key=lambda op: (graph.working_set(op), -graph.op_index[op.name]))
    return graph.working_set(best), best.name


def hbm_bound(graph: Graph) -> Bound:
    b, op = largest_working_set(graph)
    return Bound("peak_hbm_bytes", b, f"largest single-op working set (op {op!r})")


def compute_bound(graph: Graph, hw: Hardware) -> Bound:
    """Makespan >= total compute time: there is one compute stream."""
    return Bound("makespan_ns", sum(op_durations_ns(graph, hw).values()), "total compute time on one stream")
