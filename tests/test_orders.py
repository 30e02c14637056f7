"""Compute orders: the store-back releases moved up, and the order names planners accept."""

import pytest
from conftest import GRAPHS, simple_hardware

from planner import api
from planner.executor import simulate
from planner.formats import load_graph
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.orders import ancestor_counts, lowest_peak_order, named_order, sampled_order, store_backs_first
from planner.planners.greedy import plan_greedy
from planner.planners.none import no_offload_program, plan_none


def training_graph(layers: int = 3) -> Graph:
    """Forward, backward, then (as graphs list it) one optimizer step per layer on host-pinned states."""
    t = [Tensor("x", 10, TensorKind.INPUT)]
    ops = []
    for i in range(layers):
        t += [Tensor(f"w{i}", 10, TensorKind.WEIGHT), Tensor(f"a{i}", 10),
              Tensor(f"s{i}", 5000, TensorKind.OPTIMIZER_STATE, home="host"), Tensor(f"g{i}", 10, TensorKind.GRADIENT)]
        ops.append(Op(f"F{i}", "F", ("x" if i == 0 else f"a{i - 1}", f"w{i}"), (f"a{i}",), duration_s=1e-6))
    for i in reversed(range(layers)):
        t += [Tensor(f"d{i}", 10)]
        reads = (f"a{i}", f"w{i}", f"d{i + 1}") if i + 1 < layers else (f"a{i}", f"w{i}")
        ops.append(Op(f"B{i}", "B", reads, (f"g{i}", f"d{i}"), duration_s=2e-6))
    for i in range(layers):
        ops.append(Op(f"opt{i}", "Adam", (f"g{i}",), (), (f"w{i}", f"s{i}"), duration_s=0.1e-6))
    return Graph.build("training", t, ops)


def test_store_back_releases_run_as_soon_as_their_gradient_is_ready():
    g = training_graph()
    base = named_order(g, "graph")
    early = store_backs_first(g, base)
    assert sorted(early) == sorted(base)
    assert early.index("opt2") == early.index("B2") + 1 and early.index("opt1") == early.index("B1") + 1
    others = [n for n in base if not n.startswith("opt")]
    assert [n for n in early if not n.startswith("opt")] == others  # everything else keeps its order
    # 5000 B of state take 5 us each way: stored back as the backward pass goes, they no longer all queue at the end.
    hw = simple_hardware(hbm=10**6, bw=1e9)
    late = simulate(g, hw, no_offload_program(g, hw, base))
    moved = simulate(g, hw, no_offload_program(g, hw, early))
    assert late.valid and moved.valid
    assert moved.metrics.makespan_ns < late.metrics.makespan_ns
    # The memory-aware order runs each optimizer step early too (it frees the gradient); ``auto`` is never later.
    assert simulate(g, hw, plan_none(g, hw)).metrics.makespan_ns == moved.metrics.makespan_ns


def test_nothing_moves_without_a_store_back():
    g = load_graph(GRAPHS / "deepseek-v3-nsa-64k-L3-1layer.json")  # inference: no update of a remote-pinned tensor
    assert named_order(g, "auto") == lowest_peak_order(g)


def test_greedy_auto_is_never_slower_than_the_lowest_peak_order():
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="1GB")
    auto = simulate(g, hw, plan_greedy(g, hw))
    assert auto.valid
    # auto plans both its order and the lowest-peak one, and keeps the faster.
    other = simulate(g, hw, plan_greedy(g, hw, order="lowest-peak"))
    assert other.valid and auto.metrics.makespan_ns <= other.metrics.makespan_ns


def test_unknown_order_name():
    with pytest.raises(ValueError, match="order: 'fastest' is not one of auto, lowest-peak, store-release, "
                                         "sources-first, graph"):
        named_order(training_graph(), "fastest")


def test_sampled_orders_are_topological_reproducible_and_named_by_their_seed():
    g = load_graph(GRAPHS / "transformer_block.json")
    orders = [sampled_order(g, k) for k in range(40)]
    for order in orders:
        assert sorted(order) == sorted(op.name for op in g.ops)
        pos = {name: i for i, name in enumerate(order)}
        assert all(pos[u] < pos[v] for u, v in g.dag.edges)
    assert sampled_order(g, 7) == orders[7] and named_order(g, "sampled-7") == orders[7]
    assert len({tuple(o) for o in orders}) > 30
    # The optimizer steps (in-place updates that feed nothing) go anywhere after their inputs: not always last.
    steps = [op.name for op in g.ops if op.updates]
    assert len({tuple(sorted(o.index(s) for s in steps)) for o in orders}) > 30
    assert any(o.index(s) < len(o) - len(steps) for o in orders for s in steps)
    with pytest.raises(ValueError, match="sampled-K or deferred-K"):
        named_order(g, "sampled-x")


def test_greedy_takes_a_sampled_order_by_name():
    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="1GB")
    plan = plan_greedy(g, hw, order="sampled-3")
    assert simulate(g, hw, plan).valid
    assert plan.compute_order() == sampled_order(g, 3)
    assert api.check_options(plan_greedy, "greedy", {"order": "sampled-3"}) == {"order": "sampled-3"}


def test_the_sweep_on_auto_is_never_slower_than_on_the_lowest_peak_order():
    from planner.planners.greedy_sweep import plan_greedy_sweep

    g = load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="1GB")
    grid = {"select_num": [0, 32], "release_distance": [1, 4]}
    auto = simulate(g, hw, plan_greedy_sweep(g, hw, grid=grid))
    assert auto.valid
    other = simulate(g, hw, plan_greedy_sweep(g, hw, grid=grid, order="lowest-peak"))
    assert other.valid and auto.metrics.makespan_ns <= other.metrics.makespan_ns


def accumulation_graph(layers: int = 3, micro_batches: int = 2) -> Graph:
    """Gradient accumulation: each micro-batch's backward adds to every layer's gradient, then one optimizer step
    per layer on host-pinned states (graph order: micro-batch by micro-batch, the optimizer last)."""
    t = [Tensor("x", 10, TensorKind.INPUT)]
    for i in range(layers):
        t += [Tensor(f"w{i}", 10, TensorKind.WEIGHT), Tensor(f"g{i}", 10, TensorKind.GRADIENT),
              Tensor(f"s{i}", 5000, TensorKind.OPTIMIZER_STATE, home="host")]
    ops = []
    for m in range(micro_batches):
        for i in range(layers):
            t.append(Tensor(f"a{m}_{i}", 10))
            ops.append(Op(f"F{m}_{i}", "F", ("x" if i == 0 else f"a{m}_{i - 1}", f"w{i}"), (f"a{m}_{i}",),
                          duration_s=1e-6))
        for i in reversed(range(layers)):
            t.append(Tensor(f"d{m}_{i}", 10))
            up = (f"d{m}_{i + 1}",) if i + 1 < layers else ()
            ops.append(Op(f"B{m}_{i}", "B", (f"a{m}_{i}", f"w{i}", f"g{i}") + up, (f"d{m}_{i}",), (f"g{i}",),
                          duration_s=2e-6))
    for i in range(layers):
        ops.append(Op(f"opt{i}", "Adam", (f"g{i}",), (), (f"w{i}", f"s{i}"), duration_s=0.1e-6))
    return Graph.build("accumulation", t, ops)


def test_the_store_release_order_runs_the_backward_layer_by_layer_across_micro_batches():
    g = accumulation_graph()
    order = named_order(g, "store-release")
    assert sorted(order) == sorted(op.name for op in g.ops)
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[p] < pos[s] for p, s in g.dag.edges)
    # The top layer's backward in both micro-batches, then its optimizer step, before any lower layer's backward.
    assert pos["B1_2"] < pos["opt2"] < pos["B0_1"]
    hw = simple_hardware(hbm=10**6, bw=1e9)
    auto = simulate(g, hw, no_offload_program(g, hw, named_order(g, "auto")))
    early = simulate(g, hw, no_offload_program(g, hw, order))
    assert auto.valid and early.valid
    assert early.metrics.makespan_ns < auto.metrics.makespan_ns
    # greedy's auto plans it too when the budget allows it.
    assert simulate(g, hw, plan_greedy(g, hw)).metrics.makespan_ns <= early.metrics.makespan_ns


def test_a_long_chain_into_a_store_back_is_moved_without_recursion():
    # Every op only leads to the update of a host-pinned state: all of them are "moved up", one chain deep.
    n = 5000
    t = [Tensor("x", 1, TensorKind.INPUT), Tensor("s", 10, TensorKind.OPTIMIZER_STATE, home="host")]
    ops = []
    for i in range(n):
        t.append(Tensor(f"a{i}", 1))
        ops.append(Op(f"op{i}", "F", ("x" if i == 0 else f"a{i - 1}",), (f"a{i}",), duration_s=1e-9))
    ops.append(Op("update", "Adam", (f"a{n - 1}",), (), ("s",), duration_s=1e-9))
    g = Graph.build("chain", t, ops)
    assert store_backs_first(g, named_order(g, "graph")) == [op.name for op in g.ops]


def prefill_graph(chunks: int = 4) -> Graph:
    """A chunked prefill: each chunk's embedding reads a 1000 B table (weights placed by the planner), then an
    attention whose 1500 B workspace leaves no room for the table beside the 600 B experts its MoE reads; each
    chunk's attention reads the last chunk's output."""
    t = [Tensor("table", 1000, TensorKind.WEIGHT, home=AUTO), Tensor("experts", 600, TensorKind.WEIGHT, home=AUTO)]
    ops = []
    for i in range(chunks):
        t += [Tensor(f"tok{i}", 1, TensorKind.INPUT), Tensor(f"e{i}", 10), Tensor(f"a{i}", 10), Tensor(f"y{i}", 10)]
        ops.append(Op(f"embed{i}", "Gather", (f"tok{i}", "table"), (f"e{i}",), duration_s=0.1e-6))
        ops.append(Op(f"attn{i}", "Attention", (f"e{i}",) + ((f"y{i - 1}",) if i else ()), (f"a{i}",),
                      workspace_bytes=1500, duration_s=1e-6))
        ops.append(Op(f"mlp{i}", "MoE", (f"a{i}", "experts"), (f"y{i}",), duration_s=0.2e-6))
    return Graph.build("prefill", t, ops)


def test_the_sources_first_order_reads_a_shared_table_once_for_every_chunk():
    g = prefill_graph()
    order = named_order(g, "sources-first")
    assert order[:4] == ["embed0", "embed1", "embed2", "embed3"]
    assert [n for n in order if not n.startswith("embed")] == [n for n in named_order(g, "auto")
                                                              if not n.startswith("embed")]
    hw = simple_hardware(hbm=2300)
    # In the chunk-by-chunk order the table or the experts come back for every chunk (4,602 B fetched); with the
    # embeddings first the table is fetched once and leaves for good, the experts stay.
    chunked = simulate(g, hw, plan_greedy(g, hw, order="lowest-peak"))
    first = simulate(g, hw, plan_greedy(g, hw, order="sources-first"))
    assert chunked.valid and first.valid
    assert first.metrics.bytes_moved["h2d"] < chunked.metrics.bytes_moved["h2d"]
    assert first.metrics.makespan_ns < chunked.metrics.makespan_ns
    # greedy's auto plans that order too.
    assert simulate(g, hw, plan_greedy(g, hw)).metrics.makespan_ns <= first.metrics.makespan_ns


def test_greedy_plans_sources_first_only_up_to_its_size_limit(monkeypatch):
    from planner.planners import greedy

    g = prefill_graph()
    hw = simple_hardware(hbm=2300)
    assert "sources-first" in [c.order_name for c in greedy.auto_contexts(g, hw)]
    monkeypatch.setattr(greedy, "SOURCES_FIRST_MAX_OPS", len(g.ops) - 1)
    assert "sources-first" not in [c.order_name for c in greedy.auto_contexts(g, hw)]


def test_without_sources_that_share_a_read_the_order_is_auto():
    g = training_graph()  # one source op (F0), which shares its weight with no other source
    assert named_order(g, "sources-first") == named_order(g, "auto")


@pytest.mark.parametrize("seed", range(5))
def test_ancestor_counts_are_networkx_s(seed):
    import networkx as nx
    import numpy as np

    rng = np.random.default_rng(seed)
    n = 60
    dag = nx.DiGraph()
    dag.add_nodes_from(f"o{i}" for i in range(n))
    for j in range(1, n):
        for i in rng.choice(j, size=min(j, int(rng.integers(0, 4))), replace=False):
            dag.add_edge(f"o{i}", f"o{j}")
    order = list(nx.lexicographical_topological_sort(dag, key=lambda s: -int(s[1:])))
    targets = [f"o{i}" for i in rng.choice(n, size=20, replace=False)]
    assert ancestor_counts(dag, order, targets) == {t: len(nx.ancestors(dag, t)) for t in targets}
