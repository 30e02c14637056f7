"""The no-offload baseline: everything stays on HBM; what starts on a remote tier is prefetched first."""

from __future__ import annotations

from dataclasses import replace

from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.plan import Plan, ProgramBuilder
from planner.planners.ordering import best_no_offload_order, graph_order


def plan_none(graph: Graph, hw: Hardware, order: str = "auto") -> Plan:
    """Return a plan with no cache ops but the initial prefetches of tensors that start off HBM.

    ``order``: ``auto`` (the lower-peak of the graph's order and a memory-aware one) or ``graph``.
    """
    names = best_no_offload_order(graph) if order == "auto" else graph_order(graph)
    pb = ProgramBuilder()
    fetched: dict[str, int] = {}
    used = {t for op in graph.ops for t in op.reads}
    for name, t in graph.tensors.items():
        if name not in graph.producer and t.home != HBM and name in used:
            fetched[name] = pb.prefetch(name, hw.fetch_link(t.home).name)
    for name in names:
        op = graph.op(name)
        pb.compute(name, waits=[fetched[t] for t in op.reads if t in fetched])
    plan = pb.build(graph.name, "none", options={"order": order})
    # None never offloads: when its own peak is over the budget, no plan of this planner fits. Say so.
    from planner.executor import simulate

    peak = simulate(graph, hw, plan, allocator=False).metrics.peak_bytes.get(HBM, 0)
    if peak > hw.hbm_bytes:
        return replace(plan, status="infeasible", notes=(
            f"the no-offload peak is {peak} B, over the HBM budget of {hw.hbm_bytes} B; none never offloads",
        ))
    return plan
