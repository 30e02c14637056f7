"""The local search over topological orders (planner/order_search.py): its live-bytes count, and what it finds."""

import random

import networkx as nx
import numpy as np
import pytest
from conftest import GRAPHS, SHARED

from planner import api, bench
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.order_search import _Profile, lower_peak_order
from planner.orders import live_bytes, named_order
from planner.plan import StepKind
from planner.planners.greedy import answers_of, plan_greedy
from planner.planners.greedy_remat import plan_remat_chains
from planner.planners.greedy_select import Context

RANDOM_N100 = SHARED / "graphs" / "checkmate" / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json"


def _profile_live(graph: Graph, order: list[str]) -> list[int]:
    pos = np.empty(len(order), dtype=np.int64)
    pos[[graph.op_index[name] for name in order]] = np.arange(len(order))
    return _Profile(graph).live(pos).tolist()


def branches(k: int = 4) -> Graph:
    """k branches x -> big_i -> small_i joined by one op: run branch by branch, one big tensor lives at a time;
    the given order makes every big tensor first."""
    t = [Tensor("x", 10, TensorKind.INPUT)]
    ops = []
    for i in range(k):
        t += [Tensor(f"big{i}", 1000), Tensor(f"small{i}", 10)]
        ops.append(Op(f"make{i}", "F", ("x",), (f"big{i}",), duration_s=1e-6))
    for i in range(k):
        ops.append(Op(f"use{i}", "F", (f"big{i}",), (f"small{i}",), duration_s=1e-6))
    t.append(Tensor("y", 10, TensorKind.OUTPUT))
    ops.append(Op("join", "F", tuple(f"small{i}" for i in range(k)), ("y",), duration_s=1e-6))
    return Graph.build("branches", t, ops)


def _is_topological(graph: Graph, order: list[str]) -> bool:
    pos = {name: i for i, name in enumerate(order)}
    return sorted(order) == sorted(op.name for op in graph.ops) and all(
        pos[u] < pos[v] for u, v in graph.dag.edges)


@pytest.mark.parametrize("name", ["transformer_block.json", "remote_weights_chain.json",
                                  "llama3-8b-no2-4layers.json"])
def test_the_profile_counts_as_live_bytes_does(name):
    g = api.load_graph(GRAPHS / name)
    rng = random.Random(1)
    orders = [named_order(g, "graph"), named_order(g, "auto")]
    # Random topological orders too: the count must not depend on the order being a good one.
    dag = g.dag
    for _ in range(3):
        indeg = {v: dag.in_degree(v) for v in dag}
        ready, out = [v for v, d in indeg.items() if d == 0], []
        while ready:
            v = ready.pop(rng.randrange(len(ready)))
            out.append(v)
            for w in dag.successors(v):
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        orders.append(out)
    for order in orders:
        assert _profile_live(g, order) == live_bytes(g, order)


def test_the_search_runs_one_branch_at_a_time():
    g = branches()
    start = named_order(g, "graph")
    assert max(live_bytes(g, start)) >= 4000
    found = lower_peak_order(g, start)
    assert _is_topological(g, found)
    # One big tensor at a time, beside x and the small ones made so far.
    assert max(live_bytes(g, found)) <= 1000 + 10 + 4 * 10 + 10


def test_the_search_never_raises_the_peak_and_is_deterministic():
    g = api.load_graph(GRAPHS / "transformer_block.json")
    start = named_order(g, "lowest-peak")
    found = lower_peak_order(g, start)
    assert _is_topological(g, found)
    assert max(live_bytes(g, found)) <= max(live_bytes(g, start))
    assert lower_peak_order(g, start) == found
    assert named_order(g, "searched") == found  # the named order is the search from lowest-peak, kept per graph


def test_the_work_cap_stops_the_search_with_a_valid_order():
    g = branches(6)
    start = named_order(g, "graph")
    found = lower_peak_order(g, start, max_cells=1)
    assert _is_topological(g, found) and max(live_bytes(g, found)) <= max(live_bytes(g, start))


def test_dag_edges_are_the_only_constraints_the_search_keeps():
    # In-place updates order their readers: the dag says so, and the searched order keeps it.
    g = api.load_graph(GRAPHS / "transformer_block.json")
    found = named_order(g, "searched")
    assert nx.is_directed_acyclic_graph(g.dag) and _is_topological(g, found)


@pytest.mark.skipif(not RANDOM_N100.is_file(), reason="../shared/graphs/checkmate is not here")
def test_on_checkmate_n100_the_searched_order_needs_far_fewer_recomputes():
    g = api.load_graph(RANDOM_N100, size_unit_bytes=1e6)
    given = max(live_bytes(g, named_order(g, "graph")))
    assert max(live_bytes(g, named_order(g, "searched"))) < 0.95 * given
    peak = bench.no_offload_reference(g, "ascend-910c", {}, order="graph").metrics.peak_bytes[HBM]
    hw = api.hardware("ascend-910c", hbm=str(int(peak * 0.8)))
    searched = plan_greedy(g, hw, offload=False, order="searched")
    tl = simulate(g, hw, searched)
    assert tl.valid, [v.describe() for v in tl.violations[:3]]
    assert sum(tl.metrics.bytes_moved.values()) == 0
    # The chains on the given order (bytes only, as the search counts them) re-run many more ops.
    given = plan_remat_chains(Context(g, hw, "graph", answers_of(True, False)), hw.hbm_bytes)
    assert given is not None and searched.count(StepKind.RECOMPUTE) < given.count(StepKind.RECOMPUTE)
