"""What a graph needs before it is planned: its sizes, the no-offload peak, the HBM floor and budgets to try.

    from planner import api
    from planner.inspect import inspect_graph
    info = inspect_graph(api.load_graph("graphs/transformer_block.json"), api.hardware("ascend-910c"))
    info.hbm_floor_bytes, [b.hbm_bytes for b in info.budgets]

The no-offload peak and makespan are the executor's (``api.no_offload_reference``: the figures ``ho-plan GRAPH``
prints) on graphs of up to ``SIMULATE_MAX_OPS`` ops. Above that the run costs seconds (2.8 s at 29k ops), so the
peak comes from tensor sizes in the graph's order instead (``planner.orders.live_bytes``, a third of a
second at 29k ops): an upper bound of the executor's figure, with no makespan. ``simulate`` forces either.
``at_budget=True`` adds the makespan lower bound at the hardware's HBM budget (seconds on 30k-op graphs too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner import api
from planner.bounds import compute_bound, hbm_floor, largest_working_set, makespan_bound
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.orders import graph_order, live_bytes

# Shares of the no-offload peak suggested as budgets; `ho-plan sweep budget` tries them among its default fractions.
BUDGET_SHARES = (0.9, 0.8, 0.7, 0.6)

# Largest graph whose no-offload plan is run in the executor unless told otherwise: 0.1 s at 2k ops, 0.5 s at 5k.
SIMULATE_MAX_OPS = 4000

# Where the no-offload peak comes from (``GraphInspection.no_offload_source``).
SIZES = "sizes"
EXECUTOR = "executor"


@dataclass(frozen=True)
class SuggestedBudget:
    """An HBM budget at ``share`` of the no-offload peak; ``feasible`` when it is at or above the HBM floor (below
    it no plan fits)."""

    share: float
    hbm_bytes: int
    feasible: bool


@dataclass(frozen=True)
class GraphInspection:
    """A graph's figures for choosing an HBM budget. Bytes are bytes, times microseconds.

    ``bytes_by_kind``: kind -> bytes of all its tensors. ``start_bytes``: kind -> where the tensors no op produces
    start the step (a tier name, or ``auto`` when the planner chooses) -> bytes; ``made_bytes``: kind -> bytes of
    the tensors ops produce. ``no_offload_source`` says where the no-offload figures come from: ``sizes``
    (tensor sizes in the graph's order: an upper bound of the no-offload plan's peak, equal to it unless tensors
    pinned off HBM arrive after the peak; no makespan) or ``executor`` (the no-offload plan run, as
    ``api.no_offload_reference``). The makespan bound is given when asked for (``at_budget``), at ``hbm_bytes``.
    """

    graph: str
    hardware: str
    ops: int
    tensors: int
    total_bytes: int
    bytes_by_kind: dict[str, int]
    start_bytes: dict[str, dict[str, int]]
    made_bytes: dict[str, int]
    free_tensors: int
    hbm_bytes: int
    no_offload_source: str
    no_offload_peak_bytes: int
    no_offload_makespan_us: float | None
    hbm_floor_bytes: int
    hbm_floor_reason: str
    largest_working_set_bytes: int
    largest_working_set_op: str
    compute_bound_us: float
    compute_bound_reason: str
    budgets: tuple[SuggestedBudget, ...]
    makespan_bound_us: float | None = None
    makespan_bound_reason: str | None = None

    def to_dict(self) -> dict:
        """Return the inspection as JSON-ready data (the budgets as a list of objects)."""
        d = asdict(self)
        d["budgets"] = [asdict(b) for b in self.budgets]
        return d


def inspect_graph(graph: Graph, hw: Hardware, *, simulate: bool | None = None, at_budget: bool = False,
                  source: str = "<graph>") -> GraphInspection:
    """Return a GraphInspection of ``graph`` on ``hw``.

    ``simulate``: take the no-offload peak and makespan from the executor (``api.no_offload_reference``): True,
    or None (the default) on graphs of at most ``SIMULATE_MAX_OPS`` ops; otherwise the peak from sizes, and no
    makespan. ``at_budget``: also the makespan lower bound at ``hw``'s HBM (``bounds.makespan_bound``).
    Raises InputError (naming ``source``) when a tensor is pinned to a tier ``hw`` does not have.
    """
    api.check_compatible(graph, hw, source)
    by_kind: dict[str, int] = {}
    start: dict[str, dict[str, int]] = {}
    made: dict[str, int] = {}
    for name, t in graph.tensors.items():
        kind = t.kind.value
        by_kind[kind] = by_kind.get(kind, 0) + t.bytes
        if name in graph.producer:
            made[kind] = made.get(kind, 0) + t.bytes
        else:
            per = start.setdefault(kind, {})
            per[t.home] = per.get(t.home, 0) + t.bytes

    ws, ws_op = largest_working_set(graph)
    floor, floor_reason = hbm_floor(graph)
    if simulate is None:
        simulate = len(graph.ops) <= SIMULATE_MAX_OPS
    if simulate:
        ref = api.no_offload_reference(graph, hw).metrics
        peak, makespan_us, peak_source = ref.peak_bytes.get(HBM, 0), ref.makespan_ns / 1000, EXECUTOR
    else:
        # The graph's order, not the no-offload plan's (best_no_offload_order): finding that order costs seconds on
        # 30k-op graphs, and it never peaks above the graph's order, so this stays an upper bound of its peak.
        peak, makespan_us, peak_source = max(live_bytes(graph, graph_order(graph)), default=0), None, SIZES
    compute = compute_bound(graph, hw)
    bound = makespan_bound(graph, hw) if at_budget else None
    budgets = tuple(SuggestedBudget(share, int(peak * share), int(peak * share) >= floor) for share in BUDGET_SHARES)
    return GraphInspection(
        graph=graph.name,
        hardware=hw.name,
        ops=len(graph.ops),
        tensors=len(graph.tensors),
        total_bytes=sum(by_kind.values()),
        bytes_by_kind=_by_bytes(by_kind),
        start_bytes={k: dict(sorted(v.items())) for k, v in sorted(start.items())},
        made_bytes=_by_bytes(made),
        free_tensors=len(graph.free_tensors),
        hbm_bytes=hw.hbm_bytes,
        no_offload_source=peak_source,
        no_offload_peak_bytes=peak,
        no_offload_makespan_us=makespan_us,
        hbm_floor_bytes=floor,
        hbm_floor_reason=floor_reason,
        largest_working_set_bytes=ws,
        largest_working_set_op=ws_op,
        compute_bound_us=compute.value / 1000,
        compute_bound_reason=compute.reason,
        budgets=budgets,
        makespan_bound_us=bound.value / 1000 if bound is not None else None,
        makespan_bound_reason=bound.reason if bound is not None else None,
    )


def _by_bytes(d: dict[str, int]) -> dict[str, int]:
    """``d`` with the largest values first, so that tables and JSON lead with what matters."""
    return dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))


__all__ = ["BUDGET_SHARES", "SIMULATE_MAX_OPS", "SuggestedBudget", "GraphInspection", "inspect_graph"]
