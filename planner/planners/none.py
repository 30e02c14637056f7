"""The no-offload baseline: everything stays on HBM; what is pinned to a remote tier is prefetched first and,
when updated in place, stored back after its last update (steps repeat: see planner/placement.py)."""

from __future__ import annotations

from dataclasses import replace

from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.orders import named_order
from planner.placement import plan_placement, with_placement
from planner.plan import Plan, PlanStatus, ProgramBuilder
from planner.units import format_bytes_exact


def plan_none(graph: Graph, hw: Hardware, order: str = "auto") -> Plan:
    """Return a plan with no cache ops but the initial prefetches of tensors pinned off HBM and the store-back of
    those updated in place. Tensors whose tier the planner chooses start on HBM.

    ``order``: ``auto`` (the lower-peak of the graph's order and a memory-aware one, with the updates that
    release store-backs moved up: ``orders.best_no_offload_order``), ``lowest-peak`` (without that) or ``graph``.
    """
    plan = program_none(graph, hw, order)
    # None never offloads: when its own peak is over the budget, no plan of this planner fits. Say so.
    peak = simulate(graph, hw, plan, allocator=False).metrics.peak_bytes.get(HBM, 0)
    if peak > hw.hbm_bytes:
        return replace(plan, status=PlanStatus.INFEASIBLE, notes=(
            f"the no-offload peak is {format_bytes_exact(peak)}, over the HBM budget of "
            f"{format_bytes_exact(hw.hbm_bytes)}; none never offloads "
            "(every tensor whose tier it may choose starts on HBM)",
        ))
    return plan


def program_none(graph: Graph, hw: Hardware, order: str = "auto") -> Plan:
    """``plan_none``'s program without the check of its peak against the budget (which runs the executor): for
    callers that run it anyway, or whose HBM is unbounded."""
    placed = with_placement(graph, plan_placement(graph))
    names = named_order(placed, order)
    return replace(no_offload_program(graph, hw, names), options={"order": order})


def no_offload_program(graph: Graph, hw: Hardware, names: list[str], planner: str = "none") -> Plan:
    """The no-offload program in the compute order ``names``: every tensor pinned remote is fetched at the start,
    in the order the ops first need it, and stored back after its last update; free tensors start on HBM."""
    placement = plan_placement(graph)
    pb = ProgramBuilder()
    fetched: dict[str, int] = {}
    for name in names:
        for t in graph.op(name).reads:
            tier = placement.get(t, HBM)
            if tier != HBM and t not in fetched:
                fetched[t] = pb.prefetch(t, hw.fetch_link(tier).name)
    last_update = {t: name for name in names for t in graph.op(name).updates}
    for name in names:
        op = graph.op(name)
        step = pb.compute(name, waits=[fetched[t] for t in op.reads if t in fetched])
        for t in sorted(t for t in op.updates if last_update[t] == name and placement.get(t, HBM) != HBM):
            pb.store(t, hw.store_link(placement[t]).name, waits=[step])
    return pb.build(graph.name, planner, placement=placement)
